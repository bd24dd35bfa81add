//! API errors, and the `Status` bodies the API server answers them with.
//!
//! Clients branch on `code` and `reason` (kube-rs's `ErrorResponse`, client-go's `errors.IsConflict`,
//! Kopf's `APIConflictError`), so both are exactly the API server's for each failure.

use serde_json::{json, Value};

/// One failed request, as the API server reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status code, repeated as `code` in the body.
    pub code: u16,
    /// The machine-readable `reason`: `NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, ...
    pub reason: &'static str,
    /// The human-readable message.
    pub message: String,
    /// `details`: name, group, kind and causes, when the API server would give them.
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header (429 and 503 from fault injection).
    pub retry_after: Option<u32>,
}

/// The result of anything that can fail as an API request does.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error with no details.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// 400 BadRequest: a malformed body or query.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 404 NotFound for a named object: `widgets.example.com "w1" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let message = format!("{} \"{}\" not found", qualified(group, plural), name);
        Self::new(404, "NotFound", message).with_details(name, group, plural, None)
    }

    /// 404 NotFound for a path that serves nothing.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let message = format!("{} \"{}\" already exists", qualified(group, plural), name);
        Self::new(409, "AlreadyExists", message).with_details(name, group, plural, None)
    }

    /// 409 Conflict: a stale resourceVersion or a failed precondition.
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{}\": {}",
            qualified(group, plural),
            name,
            why
        );
        Self::new(409, "Conflict", message).with_details(name, group, plural, None)
    }

    /// 409 Conflict for a stale resourceVersion, in the API server's words.
    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid, with one cause per invalid field.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let summary: Vec<String> = causes.iter().map(Cause::describe).collect();
        let message = format!(
            "{} \"{}\" is invalid: {}",
            qualified_kind(group, kind),
            name,
            summary.join(", ")
        );
        let causes = causes.iter().map(Cause::to_json).collect();
        Self::new(422, "Invalid", message).with_details(name, group, kind, Some(causes))
    }

    /// 403 Forbidden.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 410 Expired (Gone): a resourceVersion or continue token older than the kept history.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {content_type:?})"))
    }

    /// A status chosen by fault injection, with the reason the API server gives that code.
    pub fn injected(code: u16, retry_after: Option<u32>, message: Option<String>) -> Self {
        let reason = reason_for(code);
        let message = message.unwrap_or_else(|| format!("injected fault: {reason} ({code})"));
        ApiError {
            retry_after,
            ..Self::new(code, reason, message)
        }
    }

    fn with_details(
        mut self,
        name: &str,
        group: &str,
        kind: &str,
        causes: Option<Vec<Value>>,
    ) -> Self {
        let mut details = json!({"name": name, "kind": kind});
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        if let Some(causes) = causes {
            details["causes"] = Value::Array(causes);
        }
        self.details = Some(details);
        self
    }

    /// The `Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        if let Some(seconds) = self.retry_after {
            let details = status.as_object_mut().and_then(|s| {
                s.entry("details").or_insert_with(|| json!({}));
                s.get_mut("details")
            });
            if let Some(details) = details {
                details["retryAfterSeconds"] = json!(seconds);
            }
        }
        status
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// One invalid field of a 422 answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueForbidden`, ...
    pub reason: &'static str,
    /// The field's path: `metadata.name`, `spec.size`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl Cause {
    /// A cause of the given reason.
    pub fn new(reason: &'static str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause {
            reason,
            field: field.into(),
            message: message.into(),
        }
    }

    fn describe(&self) -> String {
        let kind = match self.reason {
            "FieldValueRequired" => "Required value",
            "FieldValueForbidden" => "Forbidden",
            "FieldValueNotSupported" => "Unsupported value",
            "FieldValueTypeInvalid" => "Invalid value",
            "FieldValueDuplicate" => "Duplicate value",
            _ => "Invalid value",
        };
        format!("{}: {}: {}", self.field, kind, self.message)
    }

    fn to_json(&self) -> Value {
        json!({"reason": self.reason, "message": self.describe(), "field": self.field})
    }
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn qualified_kind(group: &str, kind: &str) -> String {
    if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    }
}

/// The `reason` the API server gives a status code.
pub fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflict_status_has_the_api_servers_reason_code_and_details() {
        let status = ApiError::stale("example.com", "widgets", "w1").to_status();
        assert_eq!(status["reason"], "Conflict");
        assert_eq!(status["code"], 409);
        assert_eq!(status["details"]["group"], "example.com");
        assert!(status["message"]
            .as_str()
            .unwrap()
            .starts_with("Operation cannot be fulfilled on widgets.example.com \"w1\""));
    }

    #[test]
    fn invalid_status_lists_each_cause() {
        let error = ApiError::invalid(
            "",
            "ConfigMap",
            "Bad_Name",
            vec![Cause::new(
                "FieldValueInvalid",
                "metadata.name",
                "must be lowercase",
            )],
        );
        let status = error.to_status();
        assert_eq!(status["code"], 422);
        assert_eq!(status["details"]["causes"][0]["field"], "metadata.name");
        assert!(status["message"]
            .as_str()
            .unwrap()
            .contains("ConfigMap \"Bad_Name\" is invalid: metadata.name: Invalid value"));
    }

    #[test]
    fn injected_429_carries_retry_after_seconds() {
        let status = ApiError::injected(429, Some(3), None).to_status();
        assert_eq!(status["reason"], "TooManyRequests");
        assert_eq!(status["details"]["retryAfterSeconds"], 3);
    }
}
