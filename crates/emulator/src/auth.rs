//! Who a request comes from, when the emulator runs in RBAC mode: its bearer token names the
//! emulator's administrator, a service account, or nobody (an anonymous request).
//!
//! The tokens are not secrets: the emulator is for tests and demos, and a service account's token is
//! made from its namespace and name ([`service_account_token`]). What the API server checks, the
//! emulator checks too: a service account's token is refused (401) once the ServiceAccount object is
//! gone, and a token the emulator did not make is refused.

use crate::registry::GroupResource;
use crate::status::{ApiError, ApiResult};
use crate::store::State;

/// The token of the emulator's administrator: [`Emulator::client`](crate::Emulator::client) and the
/// written kubeconfig carry it. In RBAC mode it may do anything, as a member of `system:masters`.
pub const ADMIN_TOKEN: &str = "emulator";

/// What service-account tokens start with; the namespace and the name follow, separated by `/`.
const SERVICE_ACCOUNT_TOKEN_PREFIX: &str = "kactor-emulator/serviceaccount/";

/// The group whose members pass every authorization check, as on a cluster.
const SUPERUSERS: &str = "system:masters";

/// An authenticated (or anonymous) user: the `user` and `groups` the authorizer sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user's name: `kactor-emulator-admin`, `system:serviceaccount:<ns>:<name>`,
    /// `system:anonymous`.
    pub name: String,
    /// The groups, as the API server gives them (`system:serviceaccounts`, `system:authenticated`, ...).
    pub groups: Vec<String>,
}

impl User {
    /// The emulator's administrator, a member of `system:masters`.
    pub fn admin() -> Self {
        User {
            name: "kactor-emulator-admin".to_string(),
            groups: vec![SUPERUSERS.to_string(), "system:authenticated".to_string()],
        }
    }

    /// The service account `namespace/name`, with the groups the API server gives it.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        User {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".to_string(),
            ],
        }
    }

    /// A request without credentials.
    pub fn anonymous() -> Self {
        User {
            name: "system:anonymous".to_string(),
            groups: vec!["system:unauthenticated".to_string()],
        }
    }

    /// Whether every request of this user is allowed (a member of `system:masters`).
    pub fn is_superuser(&self) -> bool {
        self.groups.iter().any(|g| g == SUPERUSERS)
    }
}

/// The bearer token of the service account `namespace/name` (see the module's documentation).
pub fn service_account_token(namespace: &str, name: &str) -> String {
    format!("{SERVICE_ACCOUNT_TOKEN_PREFIX}{namespace}/{name}")
}

/// `POST .../serviceaccounts/{name}/token` (`kubectl create token`): a `TokenRequest` answered with
/// the service account's token. The API server's checks are made (the account exists, the body is a
/// `TokenRequest`, `expirationSeconds` at least 600, 3600 by default) and the answer has its shape,
/// but the emulator's tokens do not expire: `status.expirationTimestamp` is what a real server's
/// would be.
pub(crate) fn token_request(
    state: &State,
    namespace: &str,
    name: &str,
    request: serde_json::Value,
) -> ApiResult<serde_json::Value> {
    let accounts = GroupResource::new("", "serviceaccounts");
    state.get(&accounts, &(namespace.to_string(), name.to_string()))?;
    if request["kind"] != "TokenRequest" {
        return Err(ApiError::bad_request(format!(
            "the body must be a TokenRequest of authentication.k8s.io/v1, not {}",
            request["kind"]
        )));
    }
    let seconds = match &request["spec"]["expirationSeconds"] {
        serde_json::Value::Null => 3600,
        value => value.as_i64().unwrap_or(0),
    };
    if seconds < 600 {
        return Err(ApiError::invalid(
            "authentication.k8s.io",
            "TokenRequest",
            name,
            vec![crate::status::Cause::new(
                "FieldValueInvalid",
                "spec.expirationSeconds",
                "may not specify a duration less than 10 minutes",
            )],
        ));
    }
    let now = jiff::Timestamp::now();
    let expires = now
        .checked_add(jiff::SignedDuration::from_secs(seconds))
        .unwrap_or(now)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let audiences = match &request["spec"]["audiences"] {
        serde_json::Value::Array(list) if !list.is_empty() => {
            serde_json::Value::Array(list.clone())
        }
        _ => serde_json::json!(["https://kubernetes.default.svc.cluster.local"]),
    };
    Ok(serde_json::json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": crate::store::now()},
        "spec": {
            "audiences": audiences,
            "expirationSeconds": seconds,
            "boundObjectRef": request["spec"]["boundObjectRef"],
        },
        "status": {"token": service_account_token(namespace, name), "expirationTimestamp": expires},
    }))
}

/// The user behind an `Authorization` header (None: an anonymous request), or 401 Unauthorized.
pub(crate) fn authenticate(authorization: Option<&str>, state: &State) -> ApiResult<User> {
    let Some(header) = authorization else {
        return Ok(User::anonymous());
    };
    let token = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
        .map(str::trim)
        .ok_or_else(unauthorized)?;
    if token == ADMIN_TOKEN {
        return Ok(User::admin());
    }
    let (namespace, name) = token
        .strip_prefix(SERVICE_ACCOUNT_TOKEN_PREFIX)
        .and_then(|rest| rest.split_once('/'))
        .ok_or_else(unauthorized)?;
    let accounts = GroupResource::new("", "serviceaccounts");
    state
        .get(&accounts, &(namespace.to_string(), name.to_string()))
        .map_err(|_| unauthorized())?;
    Ok(User::service_account(namespace, name))
}

/// The API server's answer to credentials it does not accept.
fn unauthorized() -> ApiError {
    ApiError::new(401, "Unauthorized", "Unauthorized")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Write;
    use serde_json::json;

    fn state_with_account(namespace: &str, name: &str) -> State {
        let mut state = State::new(100);
        let account =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}});
        state
            .create(
                &GroupResource::new("", "serviceaccounts"),
                Some(namespace),
                account,
                Write::default(),
            )
            .unwrap();
        state
    }

    #[test]
    fn the_admin_token_is_a_superuser() {
        let state = State::new(100);
        let user = authenticate(Some("Bearer emulator"), &state).unwrap();
        assert!(user.is_superuser());
    }

    #[test]
    fn no_credentials_is_anonymous() {
        let user = authenticate(None, &State::new(100)).unwrap();
        assert_eq!(user, User::anonymous());
        assert!(!user.is_superuser());
    }

    #[test]
    fn a_service_accounts_token_names_it_and_its_groups() {
        let state = state_with_account("default", "my-op");
        let header = format!("Bearer {}", service_account_token("default", "my-op"));
        let user = authenticate(Some(&header), &state).unwrap();
        assert_eq!(user.name, "system:serviceaccount:default:my-op");
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:default",
                "system:authenticated"
            ]
        );
    }

    #[test]
    fn the_token_of_a_missing_service_account_is_unauthorized() {
        let state = state_with_account("default", "my-op");
        let header = format!("Bearer {}", service_account_token("default", "other"));
        let error = authenticate(Some(&header), &state).unwrap_err();
        assert_eq!((error.code, error.reason), (401, "Unauthorized"));
    }

    #[test]
    fn unknown_tokens_and_other_schemes_are_unauthorized() {
        let state = State::new(100);
        for header in ["Bearer nonsense", "Basic dXNlcjpwYXNz"] {
            let error = authenticate(Some(header), &state).unwrap_err();
            assert_eq!(error.code, 401, "{header}");
        }
    }
}
