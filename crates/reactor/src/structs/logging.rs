//! The per-object logging context: one `tracing` span, created the same way by every crate.
//!
//! Kopf prefixes every message about an object with `[namespace/name] ` and puts the object's reference
//! into JSON logs. kactor does the same through a span: whatever is logged inside [`object_span`] is
//! about that object, and the root crate's log formatter (`kactor::logging`) prints the prefix or the
//! reference from the span's fields. Code that logs about an object enters the span (or instruments
//! its future with it) and logs plain messages; it never formats the object's name into the message.
//!
//! ```
//! use tracing::Instrument as _;
//!
//! let span = kactor_reactor::logging::object_span(
//!     "example.com/v1", "Widget", "demo", Some("default"), "0d9e7c5e-6f1d-4d8a-9b55-0a4f2c1e7b11",
//! );
//! let _entered = span.enter();
//! tracing::info!("Handler 'create_fn' succeeded.");   // [default/demo] Handler 'create_fn' succeeded.
//! ```

/// The name of the per-object span. Formatters recognise the span by this name.
pub const OBJECT_SPAN_NAME: &str = "object";

/// The `tracing` target of the per-object span.
///
/// It is fixed (rather than the module path of whoever creates the span) so that a log filter can keep
/// the span enabled at every verbosity: `kactor::logging::init` adds the directive `kactor::object=info`,
/// so a warning emitted with `-q` still knows its object.
pub const OBJECT_SPAN_TARGET: &str = "kactor::object";

/// The span that marks everything logged inside it as being about one Kubernetes object.
///
/// Its fields are exactly `api_version`, `kind`, `name`, `namespace` and `uid`, all strings;
/// `namespace` is empty for cluster-scoped objects. The span is at INFO level with the target
/// [`OBJECT_SPAN_TARGET`].
///
/// Besides the log prefix, the span lets a user filter the logs of one object:
/// `RUST_LOG='info,[object{name=demo}]=debug'`.
///
/// # Caveats
/// A subscriber whose filter disables INFO spans of [`OBJECT_SPAN_TARGET`] (a custom one, when kactor
/// is embedded) loses the object context; `kactor::logging::init` never does.
pub fn object_span(
    api_version: &str,
    kind: &str,
    name: &str,
    namespace: Option<&str>,
    uid: &str,
) -> tracing::Span {
    tracing::info_span!(
        target: OBJECT_SPAN_TARGET,
        "object",
        api_version = api_version,
        kind = kind,
        name = name,
        namespace = namespace.unwrap_or(""),
        uid = uid,
    )
}
