//! Kopf-like log output through `tracing`: the `full`, `plain` and `json` formats, the `[namespace/name] `
//! prefix, and the filter that keeps dependencies quiet.
//!
//! An operator calls [`init`] once with the [`LogSettings`] from its command line
//! ([`crate::cli::RunArgs::log_settings`]); everything logged through `tracing` then looks as in Kopf:
//!
//! ```text
//! full:   [2026-11-22 11:14:40,123] k.reactor.watching   [INFO    ] [default/demo] Handler 'create_fn' succeeded.
//! plain:  [default/demo] Handler 'create_fn' succeeded.
//! json:   {"message":"Handler 'create_fn' succeeded.","timestamp":"2026-11-22T10:14:40.123456+00:00","severity":"info","object":{"apiVersion":"example.com/v1","kind":"Widget","name":"demo","uid":"0d9e…","namespace":"default"}}
//! ```
//!
//! Messages are about an object when they are emitted inside its [`object_span`]; the formatter finds
//! the innermost such span and prints its reference. Other spans are not printed.

use std::fmt::{self, Write as _};
use std::str::FromStr;

use compact_str::CompactString;
use jiff::tz::TimeZone;
use jiff::Timestamp;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{Directive, EnvFilter, ParseError};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

pub use kactor_reactor::logging::{object_span, OBJECT_SPAN_NAME, OBJECT_SPAN_TARGET};

/// The environment variable that, when set and not empty, replaces the verbosity flags' filter.
pub const FILTER_ENV: &str = "RUST_LOG";

/// Crates whose own logs are capped at WARN unless `RUST_LOG` says otherwise: their DEBUG output is the
/// HTTP and TLS wire and the actor system's internals, which drown an operator's messages (as Kopf
/// silences `asyncio`). Targets match by prefix, so `hyper` also covers `hyper_util`.
const QUIET_DEPENDENCIES: &[&str] = &[
    "actix",
    "h2",
    "hyper",
    "kube_client",
    "kube_core",
    "kube_runtime",
    "mio",
    "rustls",
    "tokio_util",
    "tower",
    "want",
];

/// The width of the logger name in the `full` format, as Kopf's `%(name)-20.20s`.
const NAME_WIDTH: usize = 20;

/// How log messages look. The default is [`LogFormat::Full`], as in Kopf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// `[2026-11-22 11:14:40,123] k.reactor.watching   [INFO    ] [ns/name] message key=value`:
    /// the local time with milliseconds, the logger (the `tracing` target, dotted, shortened to 20
    /// columns), the level padded to 8, then the message and its fields.
    #[default]
    Full,
    /// `[ns/name] message key=value`: the message and its fields only, for terminals and for log
    /// collectors that add their own timestamps.
    Plain,
    /// One JSON object per line: `message`, `timestamp` (RFC 3339, UTC), `severity`
    /// (`debug`/`info`/`warn`/`error`), the object's reference under the refkey, then the event's
    /// fields.
    Json,
}

impl LogFormat {
    /// Whether the `[namespace/name] ` prefix is on when neither `--log-prefix` nor `--no-log-prefix`
    /// is given: on for the text formats, off for JSON (which carries the reference as a field), as in
    /// Kopf.
    pub fn default_prefix(self) -> bool {
        !matches!(self, LogFormat::Json)
    }

    /// The name used on the command line: `full`, `plain` or `json`.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Full => "full",
            LogFormat::Plain => "plain",
            LogFormat::Json => "json",
        }
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LogFormat {
    type Err = LoggingError;

    /// Parses `full`, `plain` or `json`, ignoring case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "full" => Ok(LogFormat::Full),
            "plain" => Ok(LogFormat::Plain),
            "json" => Ok(LogFormat::Json),
            _ => Err(LoggingError::UnknownFormat(s.to_owned())),
        }
    }
}

/// What [`init`] installs: the verbosity, the format and the object reference's presentation.
///
/// Usually built from the command line by [`crate::cli::RunArgs::log_settings`]. The default is Kopf's
/// default: INFO, `full`, refkey `object`, prefix on.
#[derive(Debug, Clone, PartialEq)]
pub struct LogSettings {
    /// The most verbose level shown, for the operator's own messages and the user's (dependencies stay
    /// at WARN; see [`init`]). `-v`/`-d` give DEBUG, `-q` gives WARN, else INFO.
    pub level: Level,
    /// How messages look.
    pub format: LogFormat,
    /// The JSON key holding the object's reference (`--log-refkey`, default `object` as in Kopf).
    /// Only the `json` format uses it.
    pub refkey: String,
    /// Whether messages about an object start with `[namespace/name] ` (or `[name] ` for a
    /// cluster-scoped object). In JSON the prefix goes into `message`.
    pub prefix: bool,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            level: Level::INFO,
            format: LogFormat::Full,
            refkey: "object".to_owned(),
            prefix: true,
        }
    }
}

/// Why the logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// Another global `tracing` subscriber was installed first (the program embeds kactor and set up
    /// its own logging, or a test did). Nothing was changed; callers usually ignore this.
    #[error(
        "a global tracing subscriber is already installed, so kactor's log format is not used; \
         this is expected when the program sets up its own logging"
    )]
    AlreadyInitialized,
    /// `RUST_LOG` is set but is not a valid `tracing` filter.
    #[error(
        "{FILTER_ENV}={value:?} is not a valid log filter ({reason}); \
         fix it (e.g. RUST_LOG=info,kactor=debug) or unset it to use -v/-q"
    )]
    InvalidFilter {
        /// The variable's value.
        value: String,
        /// What the parser did not accept.
        reason: ParseError,
    },
    /// A log format name that is not `full`, `plain` or `json`.
    #[error("unknown log format {0:?}; use full, plain or json")]
    UnknownFormat(String),
}

/// Installs kactor's log output as the global `tracing` subscriber, writing to stderr (as Kopf's
/// logging does), and forwards the `log` crate's records to it.
///
/// # Expected flow
/// An operator's `main` (or `Operator::run_from_args`) calls it once, first thing, with the settings
/// from the command line.
///
/// # Guarantees
/// * The filter is `RUST_LOG` when it is set and not empty (full control, `-v`/`-q` are ignored).
///   Otherwise it is `settings.level` for everything (kactor's crates and the operator's own), except
///   the noisy dependencies (hyper, h2, tower, rustls, kube's client and runtime, actix, ...), which
///   stay at WARN at every level, `-d` included: to see their debug output, use
///   `RUST_LOG=debug`. So `-v` and `-d` are synonyms (Kopf's `-d` also un-silences `asyncio`;
///   `RUST_LOG` is the Rust way to do that, and more selectively).
/// * The [`object_span`] stays enabled whatever the filter says, so that a warning logged with `-q`
///   still carries its object's prefix or reference.
/// * `RUST_LOG='info,[object{name=demo}]=debug'` shows DEBUG messages about one object only.
///
/// # Caveats
/// * If a global subscriber is already installed, this returns [`LoggingError::AlreadyInitialized`]
///   and changes nothing.
/// * If another `log` logger is already installed (but no `tracing` subscriber), kactor's subscriber
///   is installed and the `log` records keep going to that logger.
pub fn init(settings: &LogSettings) -> Result<(), LoggingError> {
    let filter = env_filter(settings)?;
    if tracing::dispatcher::has_been_set() {
        return Err(LoggingError::AlreadyInitialized);
    }
    match subscriber(settings, filter, std::io::stderr).try_init() {
        Ok(()) => Ok(()),
        // `try_init` sets the subscriber first and the `log` bridge second: if the subscriber is in
        // place, only the bridge failed, because the program has its own `log` logger.
        Err(_) if tracing::dispatcher::has_been_set() => Ok(()),
        Err(_) => Err(LoggingError::AlreadyInitialized),
    }
}

/// The filter [`init`] uses: `RUST_LOG` if set and not empty, else [`default_filter`].
fn env_filter(settings: &LogSettings) -> Result<EnvFilter, LoggingError> {
    filter(settings, std::env::var(FILTER_ENV).ok().as_deref())
}

/// The filter for `rust_log` (the value of `RUST_LOG`) if it is not empty, else for the settings;
/// with the directive that keeps [`object_span`] enabled in both cases.
fn filter(settings: &LogSettings, rust_log: Option<&str>) -> Result<EnvFilter, LoggingError> {
    match rust_log {
        Some(value) if !value.trim().is_empty() => {
            let filter = EnvFilter::builder().parse(value).map_err(|reason| {
                LoggingError::InvalidFilter {
                    value: value.to_owned(),
                    reason,
                }
            })?;
            Ok(with_object_span(filter))
        }
        _ => Ok(default_filter(settings)),
    }
}

/// The filter for `settings.level` with the noisy dependencies at WARN, and the object span on.
fn default_filter(settings: &LogSettings) -> EnvFilter {
    let level = settings.level.as_str().to_ascii_lowercase();
    let mut directives = level;
    for target in QUIET_DEPENDENCIES {
        directives.push_str(&format!(",{target}=warn"));
    }
    with_object_span(EnvFilter::builder().parse_lossy(directives))
}

/// Adds `kactor::object=info`, so that the object span is never filtered out.
fn with_object_span(filter: EnvFilter) -> EnvFilter {
    match format!("{OBJECT_SPAN_TARGET}=info").parse::<Directive>() {
        Ok(directive) => filter.add_directive(directive),
        // The directive is a constant target and level, which always parses.
        Err(_) => filter,
    }
}

/// The whole subscriber: the filter, the layer that remembers object spans, and the formatter writing
/// to `writer`. [`init`] installs it globally; tests use it with `tracing::subscriber::with_default`.
pub(crate) fn subscriber<W>(
    settings: &LogSettings,
    filter: EnvFilter,
    writer: W,
) -> impl Subscriber + Send + Sync + for<'a> LookupSpan<'a> + 'static
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let format = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .fmt_fields(NoSpanFields)
        .event_format(KopfFormat::new(settings))
        .with_writer(writer);
    tracing_subscriber::registry()
        .with(filter)
        .with(ObjectRefLayer)
        .with(format)
}

/// The reference of the object a span is about, as Kopf's `build_object_reference`. Made for
/// every cycle's span: its strings are inline up to 24 bytes (a uid, 36, takes an allocation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ObjectRef {
    api_version: CompactString,
    kind: CompactString,
    name: CompactString,
    /// Empty for cluster-scoped objects.
    namespace: CompactString,
    uid: CompactString,
}

impl ObjectRef {
    /// `[namespace/name] ` or `[name] `.
    fn write_prefix(&self, out: &mut String) {
        if self.namespace.is_empty() {
            let _ = write!(out, "[{}] ", self.name);
        } else {
            let _ = write!(out, "[{}/{}] ", self.namespace, self.name);
        }
    }

    /// `{"apiVersion", "kind", "name", "uid", "namespace"}` in this order; no namespace for
    /// cluster-scoped objects, as in Kopf.
    fn write_json(&self, out: &mut String) -> Result<(), fmt::Error> {
        out.push('{');
        write_json_member(out, "apiVersion", &self.api_version.as_str().into())?;
        write_json_member(out, "kind", &self.kind.as_str().into())?;
        write_json_member(out, "name", &self.name.as_str().into())?;
        write_json_member(out, "uid", &self.uid.as_str().into())?;
        if !self.namespace.is_empty() {
            write_json_member(out, "namespace", &self.namespace.as_str().into())?;
        }
        out.push('}');
        Ok(())
    }
}

impl Visit for ObjectRef {
    fn record_str(&mut self, field: &Field, value: &str) {
        let slot = match field.name() {
            "api_version" => &mut self.api_version,
            "kind" => &mut self.kind,
            "name" => &mut self.name,
            "namespace" => &mut self.namespace,
            "uid" => &mut self.uid,
            _ => return,
        };
        *slot = CompactString::new(value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

/// Stores an [`ObjectRef`] in the extensions of every span named [`OBJECT_SPAN_NAME`], for the
/// formatter to find.
struct ObjectRefLayer;

impl<S> tracing_subscriber::Layer<S> for ObjectRefLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != OBJECT_SPAN_NAME {
            return;
        }
        if let Some(span) = ctx.span(id) {
            let mut object = ObjectRef::default();
            attrs.record(&mut object);
            span.extensions_mut().insert(object);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(object) = span.extensions_mut().get_mut::<ObjectRef>() {
                values.record(object);
            }
        }
    }
}

/// Span fields are not printed (Kopf prints the object prefix only), so the formatting layer does not
/// render them at all.
struct NoSpanFields;

impl<'w> FormatFields<'w> for NoSpanFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        _writer: Writer<'w>,
        _fields: R,
    ) -> fmt::Result {
        Ok(())
    }
}

/// One field value of an event, kept typed so that JSON gets numbers and booleans.
#[derive(Debug)]
enum FieldValue {
    Str(String),
    /// A `?value`, `%value` or error, already rendered.
    Rendered(String),
    I64(i64),
    U64(u64),
    I128(i128),
    U128(u128),
    F64(f64),
    Bool(bool),
}

impl FieldValue {
    fn to_json(&self) -> serde_json::Value {
        match self {
            FieldValue::Str(s) | FieldValue::Rendered(s) => s.clone().into(),
            FieldValue::I64(v) => (*v).into(),
            FieldValue::U64(v) => (*v).into(),
            // JSON numbers beyond 64 bits lose precision in most readers: keep them exact as text.
            FieldValue::I128(v) => v.to_string().into(),
            FieldValue::U128(v) => v.to_string().into(),
            FieldValue::F64(v) => serde_json::Number::from_f64(*v)
                .map(serde_json::Value::Number)
                .unwrap_or_else(|| v.to_string().into()),
            FieldValue::Bool(v) => (*v).into(),
        }
    }

    /// `key=value` text: strings bare when unambiguous, quoted otherwise.
    fn write_text(&self, out: &mut String) {
        let _ = match self {
            FieldValue::Str(s) if is_bare(s) => write!(out, "{s}"),
            FieldValue::Str(s) => write!(out, "{s:?}"),
            FieldValue::Rendered(s) => write!(out, "{s}"),
            FieldValue::I64(v) => write!(out, "{v}"),
            FieldValue::U64(v) => write!(out, "{v}"),
            FieldValue::I128(v) => write!(out, "{v}"),
            FieldValue::U128(v) => write!(out, "{v}"),
            FieldValue::F64(v) => write!(out, "{v}"),
            FieldValue::Bool(v) => write!(out, "{v}"),
        };
    }
}

/// Whether a string field can be printed without quotes and still be read back as one value.
fn is_bare(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| !c.is_whitespace() && !c.is_control() && c != '"' && c != '=')
}

/// The message and fields of one event.
#[derive(Debug, Default)]
struct EventFields {
    message: String,
    fields: Vec<(&'static str, FieldValue)>,
    /// The `log` crate's target, for records forwarded from `log`.
    log_target: Option<String>,
}

impl EventFields {
    fn record(&mut self, field: &Field, value: FieldValue) {
        match (field.name(), value) {
            ("message", FieldValue::Str(s) | FieldValue::Rendered(s)) => self.message = s,
            ("log.target", FieldValue::Str(s) | FieldValue::Rendered(s)) => {
                self.log_target = Some(s)
            }
            // The rest of the `log` metadata (module path, file, line) is not shown, as for events.
            (name, _) if name.starts_with("log.") => {}
            (name, value) => self.fields.push((name, value)),
        }
    }
}

impl Visit for EventFields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.record(field, FieldValue::F64(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.record(field, FieldValue::I64(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.record(field, FieldValue::U64(value));
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        self.record(field, FieldValue::I128(value));
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        self.record(field, FieldValue::U128(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.record(field, FieldValue::Bool(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record(field, FieldValue::Str(value.to_owned()));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.record(field, FieldValue::Rendered(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record(field, FieldValue::Rendered(format!("{value:?}")));
    }
}

/// The event formatter for the three formats.
struct KopfFormat {
    format: LogFormat,
    refkey: String,
    prefix: bool,
    /// The zone of the `full` format's timestamps: the system's, as Python's `asctime`; UTC when the
    /// system's cannot be found (as in a minimal container).
    timezone: TimeZone,
}

impl KopfFormat {
    fn new(settings: &LogSettings) -> Self {
        KopfFormat {
            format: settings.format,
            refkey: settings.refkey.clone(),
            prefix: settings.prefix,
            timezone: TimeZone::try_system().unwrap_or(TimeZone::UTC),
        }
    }

    fn format_text(
        &self,
        now: Timestamp,
        target: &str,
        level: Level,
        object: Option<&ObjectRef>,
        fields: &EventFields,
    ) -> String {
        let mut line = String::with_capacity(128);
        if self.format == LogFormat::Full {
            let time = now.to_zoned(self.timezone.clone());
            let _ = write!(line, "[{}] ", time.strftime("%Y-%m-%d %H:%M:%S,%3f"));
            write_logger_name(&mut line, target, NAME_WIDTH);
            let _ = write!(line, " [{:<8}] ", level_name(level));
        }
        let start = line.len();
        self.write_message(&mut line, object, fields);
        for (name, value) in &fields.fields {
            if line.len() > start {
                line.push(' ');
            }
            line.push_str(name);
            line.push('=');
            value.write_text(&mut line);
        }
        let mut sanitized = sanitize(line);
        sanitized.push('\n');
        sanitized
    }

    fn format_json(
        &self,
        now: Timestamp,
        level: Level,
        object: Option<&ObjectRef>,
        fields: &EventFields,
    ) -> Result<String, fmt::Error> {
        let mut message = String::new();
        self.write_message(&mut message, object, fields);
        let mut timestamp = String::with_capacity(32);
        write!(timestamp, "{}", now.strftime("%Y-%m-%dT%H:%M:%S%.6f+00:00"))?;
        // Written by hand to keep Kopf's key order; each key and value is encoded by serde_json, which
        // escapes newlines, so a record is always one line.
        let mut line = String::with_capacity(256);
        line.push('{');
        let mut reserved = vec!["message", "timestamp", "severity"];
        write_json_member(&mut line, "message", &message.into())?;
        write_json_member(&mut line, "timestamp", &timestamp.into())?;
        write_json_member(&mut line, "severity", &severity(level).into())?;
        if let Some(object) = object {
            write_json_key(&mut line, &self.refkey)?;
            object.write_json(&mut line)?;
            reserved.push(&self.refkey);
        }
        for (name, value) in &fields.fields {
            // A field named like a standard key must not make a second `message` (JSON readers keep
            // one of the two, arbitrarily): it is kept under `fields.<name>`.
            if reserved.contains(name) {
                write_json_member(&mut line, &format!("fields.{name}"), &value.to_json())?;
            } else {
                write_json_member(&mut line, name, &value.to_json())?;
            }
        }
        line.push_str("}\n");
        Ok(line)
    }

    /// The prefix (if on and about an object) and the message.
    fn write_message(&self, out: &mut String, object: Option<&ObjectRef>, fields: &EventFields) {
        if let (true, Some(object)) = (self.prefix, object) {
            object.write_prefix(out);
        }
        out.push_str(&fields.message);
        if fields.message.is_empty() && out.ends_with(' ') {
            out.pop();
        }
    }
}

impl<S, N> FormatEvent<S, N> for KopfFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let now = Timestamp::now();
        let mut fields = EventFields::default();
        event.record(&mut fields);
        // The innermost object span, if the line shows it; its reference is borrowed, not copied.
        let shows_object = self.prefix || self.format == LogFormat::Json;
        let object_span = ctx
            .event_scope()
            .filter(|_| shows_object)
            .and_then(|scope| {
                scope
                    .into_iter()
                    .find(|span| span.extensions().get::<ObjectRef>().is_some())
            });
        let extensions = object_span.as_ref().map(|span| span.extensions());
        let object = extensions.as_ref().and_then(|ext| ext.get::<ObjectRef>());
        let metadata = event.metadata();
        let line = match self.format {
            LogFormat::Full | LogFormat::Plain => {
                let target = fields.log_target.as_deref().unwrap_or(metadata.target());
                self.format_text(now, target, *metadata.level(), object, &fields)
            }
            LogFormat::Json => self.format_json(now, *metadata.level(), object, &fields)?,
        };
        writer.write_str(&line)
    }
}

/// Appends `"key":value` to an object being written, with a comma unless it is the first member.
fn write_json_member(
    out: &mut String,
    key: &str,
    value: &serde_json::Value,
) -> Result<(), fmt::Error> {
    write_json_key(out, key)?;
    // Serialising a `Value` cannot fail (its map keys are strings); the error is only serde's contract.
    out.push_str(&serde_json::to_string(value).map_err(|_| fmt::Error)?);
    Ok(())
}

/// Appends `"key":` to an object being written, with a comma unless it is the first member.
fn write_json_key(out: &mut String, key: &str) -> Result<(), fmt::Error> {
    if !out.ends_with('{') {
        out.push(',');
    }
    out.push_str(&serde_json::to_string(key).map_err(|_| fmt::Error)?);
    out.push(':');
    Ok(())
}

/// Python's level names, padded by the caller: `WARNING`, not `WARN`, as Kopf users know them.
fn level_name(level: Level) -> &'static str {
    match level {
        Level::TRACE => "TRACE",
        Level::DEBUG => "DEBUG",
        Level::INFO => "INFO",
        Level::WARN => "WARNING",
        Level::ERROR => "ERROR",
    }
}

/// Kopf's JSON severities (python-json-logger's); TRACE has none there and is `debug`.
fn severity(level: Level) -> &'static str {
    match level {
        Level::TRACE | Level::DEBUG => "debug",
        Level::INFO => "info",
        Level::WARN => "warn",
        Level::ERROR => "error",
    }
}

/// The logger name of a `tracing` target, in Python's dotted style and at most `width` characters:
/// `kactor_reactor::watching` is `kactor.reactor.watching`, then leading segments are shortened to
/// their first letter until it fits (`k.reactor.watching`); a name still too long is cut, as Python's
/// `%(name)-20.20s` does.
#[cfg(test)]
fn logger_name(target: &str, width: usize) -> String {
    let mut name = String::new();
    write_logger_name(&mut name, target, width);
    name.trim_end().to_owned()
}

/// Appends the logger name of `target` (see `logger_name`), padded with spaces to `width`
/// characters as `%(name)-20.20s` pads it. On every log line: the segments are slices of the
/// target in an array, nothing is allocated (a target of more than 16 segments keeps its first 16).
fn write_logger_name(out: &mut String, target: &str, width: usize) {
    const MOST: usize = 16;
    let mut segments = [""; MOST];
    let mut count = 0;
    let (head, rest) = match target.strip_prefix("kactor_") {
        Some(rest) => (Some("kactor"), rest),
        None => (None, target),
    };
    let parts = head
        .into_iter()
        .chain(rest.split("::").flat_map(|part| part.split('.')));
    for part in parts {
        if let Some(slot) = segments.get_mut(count) {
            *slot = part;
        }
        count += 1;
    }
    let segments = &mut segments[..count.min(MOST)];
    let length = |segments: &[&str]| {
        segments.iter().map(|s| s.chars().count()).sum::<usize>() + segments.len().saturating_sub(1)
    };
    let last = segments.len().saturating_sub(1);
    for index in 0..last {
        if length(segments) <= width {
            break;
        }
        if let Some(first) = segments[index].chars().next() {
            segments[index] = &segments[index][..first.len_utf8()];
        }
    }
    let mut written = 0;
    let dotted = segments.iter().enumerate().flat_map(|(index, segment)| {
        (index > 0)
            .then_some('.')
            .into_iter()
            .chain(segment.chars())
    });
    for c in dotted.take(width) {
        out.push(c);
        written += 1;
    }
    out.extend(std::iter::repeat_n(' ', width - written));
}

/// Whether a character could drive a terminal (ESC, BEL, BS, FF, DEL, C1).
fn is_unsafe(c: char) -> bool {
    matches!(
        c,
        '\x1b' | '\x07' | '\x08' | '\x0c' | '\x7f' | '\u{80}'..='\u{9f}'
    )
}

/// Escapes the control characters that could drive a terminal (ESC, BEL, BS, FF, DEL, C1), as
/// tracing-subscriber's own formatter does; newlines and tabs are kept. A line without any is
/// returned as it is.
fn sanitize(line: String) -> String {
    if !line.chars().any(is_unsafe) {
        return line;
    }
    let mut out = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        if is_unsafe(c) {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A `MakeWriter` collecting everything written, for the tests to read.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl Buffer {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = Buffer;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    fn settings(format: LogFormat) -> LogSettings {
        LogSettings {
            format,
            prefix: format.default_prefix(),
            ..LogSettings::default()
        }
    }

    /// Runs `emit` under a subscriber with `settings` and the default filter; returns the output.
    fn capture(settings: &LogSettings, emit: impl FnOnce()) -> String {
        let buffer = Buffer::default();
        let subscriber = subscriber(settings, default_filter(settings), buffer.clone());
        tracing::subscriber::with_default(subscriber, emit);
        buffer.text()
    }

    fn widget_span() -> tracing::Span {
        object_span(
            "example.com/v1",
            "Widget",
            "demo",
            Some("default"),
            "uid-1234",
        )
    }

    fn namespace_span() -> tracing::Span {
        object_span("v1", "Namespace", "team-a", None, "uid-5678")
    }

    #[test]
    fn full_format_has_time_logger_level_prefix_message_and_fields() {
        let output = capture(&settings(LogFormat::Full), || {
            let _entered = widget_span().entered();
            tracing::info!(
                target: "kactor_reactor::watching",
                handler = "create_fn",
                retries = 3,
                "Handler 'create_fn' succeeded."
            );
        });
        let line = output.strip_suffix('\n').unwrap();
        assert!(!line.contains('\n'));
        // [2026-11-22 11:14:40,123] — 23 characters of local time with milliseconds.
        assert_eq!(&line[..1], "[");
        let time = &line[1..24];
        assert_eq!(&line[24..26], "] ");
        assert!(
            jiff::civil::DateTime::strptime("%Y-%m-%d %H:%M:%S,%3f", time).is_ok(),
            "{time}"
        );
        assert_eq!(
            &line[26..],
            "k.reactor.watching   [INFO    ] [default/demo] Handler 'create_fn' succeeded. \
             handler=create_fn retries=3"
        );
    }

    #[test]
    fn full_format_without_object_has_no_prefix() {
        let output = capture(&settings(LogFormat::Full), || {
            tracing::warn!(target: "my_operator", "Something odd.");
        });
        assert!(output.ends_with("] my_operator          [WARNING ] Something odd.\n"));
    }

    #[test]
    fn full_format_pads_and_cuts_logger_names_to_twenty_columns() {
        assert_eq!(logger_name("my_operator", 20), "my_operator");
        assert_eq!(
            logger_name("kactor_actors::worker", 20),
            "kactor.actors.worker"
        );
        assert_eq!(
            logger_name("kactor_reactor::watching", 20),
            "k.reactor.watching"
        );
        assert_eq!(
            logger_name("kactor_reactor::handlers::registry", 20),
            "k.r.h.registry"
        );
        assert_eq!(
            logger_name("an_unusually_long_crate_name", 20),
            "an_unusually_long_cr"
        );
        // Padded to the width, with the characters counted, not the bytes.
        let mut padded = String::new();
        write_logger_name(&mut padded, "ünï::x", 20);
        assert_eq!(padded, format!("{:<20}", "ünï.x"));
    }

    #[test]
    fn plain_format_is_prefix_message_and_fields() {
        let output = capture(&settings(LogFormat::Plain), || {
            let _entered = widget_span().entered();
            tracing::info!(size = 5, note = "two words", "Resized.");
        });
        assert_eq!(
            output,
            "[default/demo] Resized. size=5 note=\"two words\"\n"
        );
    }

    #[test]
    fn plain_format_prefixes_cluster_scoped_objects_with_the_name_only() {
        let output = capture(&settings(LogFormat::Plain), || {
            let _entered = namespace_span().entered();
            tracing::info!("Namespace seen.");
        });
        assert_eq!(output, "[team-a] Namespace seen.\n");
    }

    #[test]
    fn plain_format_without_object_is_the_message_only() {
        let output = capture(&settings(LogFormat::Plain), || {
            tracing::info!("Starting.");
        });
        assert_eq!(output, "Starting.\n");
    }

    #[test]
    fn prefix_can_be_turned_off_for_text() {
        let settings = LogSettings {
            format: LogFormat::Plain,
            prefix: false,
            ..LogSettings::default()
        };
        let output = capture(&settings, || {
            let _entered = widget_span().entered();
            tracing::info!("Resized.");
        });
        assert_eq!(output, "Resized.\n");
    }

    #[test]
    fn innermost_object_span_wins() {
        let output = capture(&settings(LogFormat::Plain), || {
            let _outer = namespace_span().entered();
            let _handler = tracing::info_span!("handler", id = "create_fn").entered();
            let _inner = widget_span().entered();
            tracing::info!("Nested.");
        });
        assert_eq!(output, "[default/demo] Nested.\n");
    }

    #[test]
    fn text_formats_escape_terminal_control_characters() {
        let output = capture(&settings(LogFormat::Plain), || {
            tracing::info!("red \x1b[31m alert");
        });
        assert_eq!(output, "red \\x1b[31m alert\n");
    }

    fn json_lines(output: &str) -> Vec<serde_json::Value> {
        output
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    #[test]
    fn json_format_puts_the_reference_under_the_refkey() {
        let settings = LogSettings {
            refkey: "k8s_obj".into(),
            ..settings(LogFormat::Json)
        };
        let output = capture(&settings, || {
            let _entered = widget_span().entered();
            tracing::warn!(
                handler = "create_fn",
                attempt = 2,
                done = false,
                "Handler failed."
            );
        });
        let records = json_lines(&output);
        assert_eq!(records.len(), 1);
        let record = &records[0];
        assert_eq!(record["message"], "Handler failed.");
        assert_eq!(record["severity"], "warn");
        assert_eq!(
            record["k8s_obj"],
            serde_json::json!({
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "name": "demo",
                "uid": "uid-1234",
                "namespace": "default",
            })
        );
        assert_eq!(record["handler"], "create_fn");
        assert_eq!(record["attempt"], 2);
        assert_eq!(record["done"], false);
        let timestamp = record["timestamp"].as_str().unwrap();
        assert!(timestamp.parse::<Timestamp>().is_ok(), "{timestamp}");
        assert!(timestamp.ends_with("+00:00"), "{timestamp}");
        assert!(output.starts_with("{\"message\":"), "Kopf's key order");
        assert!(
            output.contains(
                "\"k8s_obj\":{\"apiVersion\":\"example.com/v1\",\"kind\":\"Widget\",\
                 \"name\":\"demo\",\"uid\":\"uid-1234\",\"namespace\":\"default\"}"
            ),
            "Kopf's key order in the reference: {output}"
        );
    }

    #[test]
    fn json_format_without_object_has_no_reference() {
        let output = capture(&settings(LogFormat::Json), || {
            tracing::error!("Boom.");
        });
        let record = &json_lines(&output)[0];
        assert_eq!(record["message"], "Boom.");
        assert_eq!(record["severity"], "error");
        assert!(record.get("object").is_none());
        let keys: Vec<_> = record.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys.len(), 3, "{keys:?}");
    }

    #[test]
    fn json_format_omits_the_namespace_of_cluster_scoped_objects() {
        let settings = LogSettings {
            level: Level::DEBUG,
            ..settings(LogFormat::Json)
        };
        let output = capture(&settings, || {
            let _entered = namespace_span().entered();
            tracing::debug!("Seen.");
        });
        let record = &json_lines(&output)[0];
        assert_eq!(record["severity"], "debug");
        assert_eq!(record["message"], "Seen.", "no prefix in JSON by default");
        assert_eq!(record["object"]["name"], "team-a");
        assert!(record["object"].get("namespace").is_none());
    }

    #[test]
    fn json_format_keeps_multiline_messages_on_one_line() {
        let output = capture(&settings(LogFormat::Json), || {
            let _entered = widget_span().entered();
            tracing::info!(detail = "a\nb", "first\nsecond");
            tracing::info!("third");
        });
        assert_eq!(output.lines().count(), 2, "{output}");
        let records = json_lines(&output);
        assert_eq!(records[0]["message"], "first\nsecond");
        assert_eq!(records[0]["detail"], "a\nb");
        assert_eq!(records[1]["message"], "third");
    }

    #[test]
    fn json_format_with_prefix_puts_it_into_the_message() {
        let settings = LogSettings {
            prefix: true,
            ..settings(LogFormat::Json)
        };
        let output = capture(&settings, || {
            let _entered = widget_span().entered();
            tracing::info!("Hello.");
        });
        assert_eq!(json_lines(&output)[0]["message"], "[default/demo] Hello.");
    }

    #[test]
    fn json_format_renames_fields_that_clash_with_standard_keys() {
        let output = capture(&settings(LogFormat::Json), || {
            let _entered = widget_span().entered();
            tracing::info!(severity = "high", object = "other", "Clash.");
        });
        let record = &json_lines(&output)[0];
        assert_eq!(record["severity"], "info");
        assert_eq!(record["fields.severity"], "high");
        assert_eq!(record["object"]["name"], "demo");
        assert_eq!(record["fields.object"], "other");
    }

    #[test]
    fn quiet_level_hides_info_but_warnings_keep_their_object() {
        let settings = LogSettings {
            level: Level::WARN,
            ..settings(LogFormat::Plain)
        };
        let output = capture(&settings, || {
            let _entered = widget_span().entered();
            tracing::info!("Hidden.");
            tracing::warn!("Shown.");
        });
        assert_eq!(output, "[default/demo] Shown.\n");
    }

    #[test]
    fn default_filter_keeps_dependencies_at_warn_even_when_debugging() {
        let settings = LogSettings {
            level: Level::DEBUG,
            ..settings(LogFormat::Plain)
        };
        let output = capture(&settings, || {
            tracing::debug!(target: "hyper_util::client", "wire noise");
            tracing::warn!(target: "kube_client::client", "kube warning");
            tracing::debug!(target: "kactor_actors::worker", "ours");
            tracing::debug!(target: "my_operator", "theirs");
        });
        assert_eq!(output, "kube warning\nours\ntheirs\n");
    }

    #[test]
    fn rust_log_replaces_the_verbosity_flags_and_keeps_the_object_span() {
        let settings = LogSettings {
            level: Level::WARN,
            ..settings(LogFormat::Plain)
        };
        let buffer = Buffer::default();
        let filter = filter(&settings, Some("error,my_operator=debug")).unwrap();
        let subscriber = subscriber(&settings, filter, buffer.clone());
        tracing::subscriber::with_default(subscriber, || {
            let _entered = widget_span().entered();
            tracing::debug!(target: "my_operator", "mine");
            tracing::warn!(target: "kactor_actors::worker", "hidden");
        });
        assert_eq!(buffer.text(), "[default/demo] mine\n");
    }

    #[test]
    fn empty_rust_log_means_the_verbosity_flags() {
        let settings = settings(LogFormat::Plain);
        let output = |rust_log| {
            let buffer = Buffer::default();
            let subscriber = subscriber(
                &settings,
                filter(&settings, rust_log).unwrap(),
                buffer.clone(),
            );
            tracing::subscriber::with_default(subscriber, || {
                tracing::debug!("debug");
                tracing::info!("info");
            });
            buffer.text()
        };
        assert_eq!(output(None), "info\n");
        assert_eq!(output(Some(" ")), "info\n");
        assert_eq!(output(Some("debug")), "debug\ninfo\n");
    }

    #[test]
    fn invalid_rust_log_is_an_error_that_names_it() {
        let error = filter(&LogSettings::default(), Some("kactor=loud")).unwrap_err();
        assert!(
            matches!(&error, LoggingError::InvalidFilter { value, .. } if value == "kactor=loud")
        );
        assert!(error
            .to_string()
            .starts_with("RUST_LOG=\"kactor=loud\" is not a valid log filter"));
    }

    #[test]
    fn log_format_parses_from_its_names() {
        assert_eq!("full".parse::<LogFormat>().unwrap(), LogFormat::Full);
        assert_eq!("Plain".parse::<LogFormat>().unwrap(), LogFormat::Plain);
        assert_eq!("json".parse::<LogFormat>().unwrap(), LogFormat::Json);
        assert!(matches!(
            "xml".parse::<LogFormat>(),
            Err(LoggingError::UnknownFormat(name)) if name == "xml"
        ));
        assert_eq!(LogFormat::Json.to_string(), "json");
    }

    #[test]
    fn init_reports_an_already_installed_subscriber() {
        // Whichever test gets here first may install it; the second call must then say so.
        let first = init(&LogSettings::default());
        assert!(matches!(
            first,
            Ok(()) | Err(LoggingError::AlreadyInitialized)
        ));
        assert!(matches!(
            init(&LogSettings::default()),
            Err(LoggingError::AlreadyInitialized)
        ));
    }
}
