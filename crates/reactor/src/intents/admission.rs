//! Admission handlers: validating and mutating webhooks of the operator's own webhook server
//! (Kopf's `@kopf.on.validate` and `@kopf.on.mutate`; `reference/kopf.md` §1.14, §2.10). The
//! server, its certificate and the webhook configurations are `kactor-webhooks`'; this is what
//! users register and what their handlers are given.
//!
//! **Expected flow**: the API server sends an `AdmissionReview` to `/<handler id>`; the handler's
//! filters are checked against the object (labels, annotations, a field's value, `when`); the
//! handler runs with an [`AdmissionCtx`]: the object (the old one for a deletion), the old object
//! for an update, the operation, the user, whether it is a dry run. It allows by returning `Ok`,
//! denies with [`AdmissionError::deny`] (a message and an HTTP code, 500 by default) or any other
//! error (code 500), adds warnings with [`AdmissionCtx::warn`], and a mutating handler changes the
//! object through `ctx.patch()`, sent back as a JSON patch.
//!
//! **Guarantees**
//! * A panic, a timeout or an error of the handler denies the request with its message: a webhook
//!   never allows what its handler did not see through.
//! * Mutating handlers do not run for deletions unless `DELETE` is their only operation (as Kopf).
//! * Nothing is stored between requests: the memo is a fresh one per request.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use kube::api::DynamicObject;
use serde_json::Value;

use crate::intents::context::{Ctx, HandlerError};
use crate::intents::filters::{Filters, MetaFilter, ValueFilter, WhenFn};
use crate::structs::resources::Selector;

/// What an admission request asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `CREATE`.
    Create,
    /// `UPDATE`.
    Update,
    /// `DELETE`.
    Delete,
    /// `CONNECT`.
    Connect,
}

impl Operation {
    /// The API's name: `CREATE`, `UPDATE`, `DELETE`, `CONNECT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }

    /// From the API's name.
    pub fn parse(text: &str) -> Option<Operation> {
        match text {
            "CREATE" => Some(Operation::Create),
            "UPDATE" => Some(Operation::Update),
            "DELETE" => Some(Operation::Delete),
            "CONNECT" => Some(Operation::Connect),
            _ => None,
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Validating (may deny) or mutating (may also change the object).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionKind {
    /// `on_validate`: a `ValidatingWebhookConfiguration` entry.
    Validating,
    /// `on_mutate`: a `MutatingWebhookConfiguration` entry.
    Mutating,
}

/// Why a request is denied.
pub enum AdmissionError {
    /// Denied on purpose, with a message for the user and an HTTP status code (Kopf's
    /// `kopf.AdmissionError(message, code)`).
    Denied {
        /// What the user is told (kubectl prints it).
        message: String,
        /// The HTTP status code of the denial.
        code: u16,
    },
    /// The handler failed: denied with its message and code 500.
    Failed(HandlerError),
}

impl AdmissionError {
    /// Denies with this message, and code 500 unless [`AdmissionError::code`] changes it.
    pub fn deny(message: impl Into<String>) -> Self {
        AdmissionError::Denied {
            message: message.into(),
            code: 500,
        }
    }

    /// The same denial with this HTTP status code (for example 400 or 403).
    pub fn code(self, code: u16) -> Self {
        match self {
            AdmissionError::Denied { message, .. } => AdmissionError::Denied { message, code },
            other => other,
        }
    }

    /// The message and code the response carries.
    pub fn status(&self) -> (String, u16) {
        match self {
            AdmissionError::Denied { message, code } => (message.clone(), *code),
            AdmissionError::Failed(HandlerError::Permanent(message))
            | AdmissionError::Failed(HandlerError::Temporary { message, .. }) => {
                (message.clone(), 500)
            }
            AdmissionError::Failed(error) => (error.to_string(), 500),
        }
    }
}

impl<E: Into<HandlerError>> From<E> for AdmissionError {
    fn from(error: E) -> Self {
        AdmissionError::Failed(error.into())
    }
}

impl fmt::Display for AdmissionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (message, code) = self.status();
        write!(f, "{message} (code {code})")
    }
}

impl fmt::Debug for AdmissionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What an admission handler is given: the object as a [`Ctx`] (`ctx.name()`, `ctx.spec()`,
/// `ctx.labels()`, `ctx.patch()`, ...), and the request.
pub struct AdmissionCtx {
    ctx: Ctx,
    /// What the request asks to do.
    pub operation: Operation,
    /// The object before an update or a deletion (the body is the old one for a deletion too).
    pub old: Option<Arc<DynamicObject>>,
    /// Who asks (the request's `userInfo`: `username`, `uid`, `groups`, `extra`).
    pub user_info: Value,
    /// A dry run: the handler must have no side effects.
    pub dry_run: bool,
    /// The subresource asked for (`status`, `scale`), if any.
    pub subresource: Option<String>,
    warnings: Arc<Mutex<Vec<String>>>,
}

impl AdmissionCtx {
    /// The context of one request: `ctx` holds the object (with an empty patch and a fresh memo).
    pub fn new(
        ctx: Ctx,
        operation: Operation,
        old: Option<Arc<DynamicObject>>,
        user_info: Value,
        dry_run: bool,
        subresource: Option<String>,
    ) -> Self {
        AdmissionCtx {
            ctx,
            operation,
            old,
            user_info,
            dry_run,
            subresource,
            warnings: Arc::default(),
        }
    }

    /// Adds a warning: the API server gives it to the client (kubectl prints `Warning: ...`),
    /// whether the request is allowed or not.
    pub fn warn(&self, warning: impl Into<String>) {
        self.warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(warning.into());
    }

    /// The warnings added so far.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The object as a handler context (what `Deref` gives too).
    pub fn ctx(&self) -> &Ctx {
        &self.ctx
    }
}

impl Deref for AdmissionCtx {
    type Target = Ctx;

    fn deref(&self) -> &Ctx {
        &self.ctx
    }
}

/// An admission handler's function.
pub type AdmissionFn =
    Arc<dyn Fn(Arc<AdmissionCtx>) -> BoxFuture<'static, Result<(), AdmissionError>> + Send + Sync>;

/// Wraps an async function as an [`AdmissionFn`].
pub fn admission_fn<F, Fut>(f: F) -> AdmissionFn
where
    F: Fn(Arc<AdmissionCtx>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), AdmissionError>> + Send + 'static,
{
    Arc::new(move |ctx| f(ctx).boxed())
}

/// An admission handler's registration (Kopf's decorator arguments): the id (its URL path and its
/// webhook's name), the operations, the filters, and how the API server treats the webhook.
///
/// ```
/// # use kactor_reactor::admission::{Admission, Operation};
/// let admission = Admission::id("check-size")
///     .operations([Operation::Create, Operation::Update])
///     .label("app", "demo")
///     .persistent();
/// ```
#[derive(Clone, Debug)]
pub struct Admission {
    /// The id: the URL path (`/<id>`) and the webhook's name (`<id>.<managed>`).
    pub id: String,
    /// The operations it is for; empty: all of them.
    pub operations: Vec<Operation>,
    /// The subresource it is for (`status`, `scale`); None: the object itself.
    pub subresource: Option<String>,
    /// Which objects (labels are also the webhook's `objectSelector`, so the API server does not
    /// even ask about others).
    pub filters: Filters,
    /// The handler has side effects (`sideEffects: NoneOnDryRun` rather than `None`; it is then
    /// told of dry runs).
    pub side_effects: bool,
    /// Kept in the webhook configuration when the operator exits (else removed then).
    pub persistent: bool,
    /// When the webhook cannot be reached, the API server lets the request through
    /// (`failurePolicy: Ignore`) instead of refusing it (`Fail`).
    pub ignore_failures: bool,
    /// How long the API server waits for the answer (`timeoutSeconds`, 1 to 30; 30 by default).
    pub timeout: Option<Duration>,
}

impl Admission {
    /// A handler with this id, for every operation.
    pub fn id(id: impl Into<String>) -> Self {
        Admission {
            id: id.into(),
            operations: Vec::new(),
            subresource: None,
            filters: Filters::default(),
            side_effects: false,
            persistent: false,
            ignore_failures: false,
            timeout: None,
        }
    }

    /// Only for these operations.
    pub fn operations(mut self, operations: impl IntoIterator<Item = Operation>) -> Self {
        self.operations = operations.into_iter().collect();
        self
    }

    /// For a subresource (`status`, `scale`) instead of the object.
    pub fn subresource(mut self, subresource: impl Into<String>) -> Self {
        self.subresource = Some(subresource.into());
        self
    }

    /// Only objects whose label passes the filter. A plain value, `Present` or `Absent` also goes
    /// into the webhook's `objectSelector`.
    pub fn label(mut self, key: impl Into<String>, filter: impl Into<MetaFilter>) -> Self {
        self.filters.labels.push((key.into(), filter.into()));
        self
    }

    /// Only objects whose annotation passes the filter.
    pub fn annotation(mut self, key: impl Into<String>, filter: impl Into<MetaFilter>) -> Self {
        self.filters.annotations.push((key.into(), filter.into()));
        self
    }

    /// Only objects whose field (`spec.size`) passes the filter.
    pub fn field(mut self, field: &str, filter: impl Into<ValueFilter>) -> Self {
        self.filters.field = Some(field.split('.').map(String::from).collect());
        self.filters.value = Some(filter.into());
        self
    }

    /// A last check over the object.
    pub fn when(mut self, when: impl Fn(&Ctx) -> bool + Send + Sync + 'static) -> Self {
        let when: WhenFn = Arc::new(when);
        self.filters.when = Some(when);
        self
    }

    /// The handler has side effects (it is told of dry runs, `ctx.dry_run`, and must skip them).
    pub fn side_effects(mut self) -> Self {
        self.side_effects = true;
        self
    }

    /// The webhook stays configured after the operator exits (requests then fail or pass per
    /// [`Admission::ignore_failures`] while no operator serves them).
    pub fn persistent(mut self) -> Self {
        self.persistent = true;
        self
    }

    /// Requests pass when the webhook cannot be reached (`failurePolicy: Ignore`).
    pub fn ignore_failures(mut self) -> Self {
        self.ignore_failures = true;
        self
    }

    /// How long the API server waits for the answer (at most 30 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

impl From<&str> for Admission {
    fn from(id: &str) -> Self {
        Admission::id(id)
    }
}

impl From<String> for Admission {
    fn from(id: String) -> Self {
        Admission::id(id)
    }
}

/// A registered admission handler.
#[derive(Clone)]
pub struct AdmissionHandler {
    /// Validating or mutating.
    pub kind: AdmissionKind,
    /// Which resource it serves.
    pub selector: Selector,
    /// The id, operations, filters and webhook options.
    pub admission: Admission,
    /// The function.
    pub func: AdmissionFn,
}

impl AdmissionHandler {
    /// Whether it runs for this operation: mutating handlers skip deletions unless `DELETE` is
    /// their only operation (Kopf's rule: a mutation of a deleted object is pointless).
    pub fn serves(&self, operation: Operation) -> bool {
        let operations = &self.admission.operations;
        if !operations.is_empty() && !operations.contains(&operation) {
            return false;
        }
        !(self.kind == AdmissionKind::Mutating
            && operation == Operation::Delete
            && operations.as_slice() != [Operation::Delete])
    }
}

/// A conversion function of a custom resource, from one served version to another: the object
/// (all of it, `apiVersion` and `metadata` included) in, the object in the other version out.
pub type ConvertFn = Arc<dyn Fn(Value) -> Result<Value, HandlerError> + Send + Sync>;

/// Wraps a typed conversion (`From` and `To` are the two versions' types, or `serde_json::Value`)
/// as a [`ConvertFn`].
pub fn convert_fn<From, To, F>(f: F) -> ConvertFn
where
    From: serde::de::DeserializeOwned,
    To: serde::Serialize,
    F: Fn(From) -> Result<To, HandlerError> + Send + Sync + 'static,
{
    Arc::new(move |object| {
        let typed: From = serde_json::from_value(object).map_err(|e| {
            HandlerError::msg(format!(
                "the object does not fit the old version's type: {e}"
            ))
        })?;
        let converted = f(typed)?;
        serde_json::to_value(converted).map_err(|e| {
            HandlerError::msg(format!("the converted object cannot be serialised: {e}"))
        })
    })
}

/// A registered conversion of a custom resource (a CRD conversion webhook; controller-runtime's
/// `Convertible`, which Kopf does not have): from one version to another.
#[derive(Clone)]
pub struct ConversionHandler {
    /// The custom resource (any of its versions names it).
    pub selector: Selector,
    /// The version converted from (`v1`).
    pub from: String,
    /// The version converted to (`v2`).
    pub to: String,
    /// The function.
    pub func: ConvertFn,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handler(kind: AdmissionKind, operations: Vec<Operation>) -> AdmissionHandler {
        AdmissionHandler {
            kind,
            selector: Selector::parse("widgets.example.com"),
            admission: Admission::id("h").operations(operations),
            func: admission_fn(|_| async { Ok(()) }),
        }
    }

    #[test]
    fn mutations_skip_deletions_unless_deletion_is_all_they_are_for() {
        let all = handler(AdmissionKind::Mutating, vec![]);
        assert!(all.serves(Operation::Create) && !all.serves(Operation::Delete));
        let both = handler(
            AdmissionKind::Mutating,
            vec![Operation::Update, Operation::Delete],
        );
        assert!(!both.serves(Operation::Delete) && !both.serves(Operation::Create));
        let delete = handler(AdmissionKind::Mutating, vec![Operation::Delete]);
        assert!(delete.serves(Operation::Delete));
        let validating = handler(AdmissionKind::Validating, vec![]);
        assert!(validating.serves(Operation::Delete));
    }

    #[test]
    fn denials_carry_their_code_and_failures_500() {
        let denied = AdmissionError::deny("too big").code(400);
        assert_eq!(denied.status(), ("too big".to_string(), 400));
        let failed: AdmissionError = HandlerError::permanent("no").into();
        assert_eq!(failed.status(), ("no".to_string(), 500));
        let other: AdmissionError = HandlerError::msg("boom").into();
        assert_eq!(other.status(), ("boom".to_string(), 500));
    }
}
