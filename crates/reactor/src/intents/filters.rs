//! Filters: which objects and which changes a handler is for (`reference/kopf.md` §1.10).
//!
//! Checked in Kopf's order, cheapest first, the `when` callback last: labels, annotations, the value of
//! a field, the change of a field (changing handlers with `field`), `when`. **Prematching** (used to
//! decide whether an object needs our finalizer, and whether any changing handler could ever run for it)
//! skips the change check, because it is about the object, not about one change.
//!
//! For changing causes a field's value passes if the **new or the old** essence matches (new first);
//! for other handlers the current body is checked.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::intents::context::Ctx;
use crate::structs::diffs::resolve;

/// A predicate over a label's or annotation's value (None when absent).
pub type MetaCheck = Arc<dyn Fn(Option<&str>) -> bool + Send + Sync>;

/// A predicate over a field's value (None when absent).
pub type ValueCheck = Arc<dyn Fn(Option<&Value>) -> bool + Send + Sync>;

/// A filter on one label or annotation.
#[derive(Clone)]
pub enum MetaFilter {
    /// This exact value (an empty string is a value).
    Is(String),
    /// Present, with any value.
    Present,
    /// Absent.
    Absent,
    /// A predicate over the value (None when absent).
    Check(MetaCheck),
}

impl MetaFilter {
    /// A predicate over the value (None when absent).
    pub fn check(f: impl Fn(Option<&str>) -> bool + Send + Sync + 'static) -> Self {
        MetaFilter::Check(Arc::new(f))
    }

    fn matches(&self, value: Option<&str>) -> bool {
        match self {
            MetaFilter::Is(expected) => value == Some(expected.as_str()),
            MetaFilter::Present => value.is_some(),
            MetaFilter::Absent => value.is_none(),
            MetaFilter::Check(f) => f(value),
        }
    }
}

impl From<&str> for MetaFilter {
    fn from(value: &str) -> Self {
        MetaFilter::Is(value.to_string())
    }
}

impl From<String> for MetaFilter {
    fn from(value: String) -> Self {
        MetaFilter::Is(value)
    }
}

impl fmt::Debug for MetaFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaFilter::Is(value) => write!(f, "{value:?}"),
            MetaFilter::Present => f.write_str("PRESENT"),
            MetaFilter::Absent => f.write_str("ABSENT"),
            MetaFilter::Check(_) => f.write_str("<callback>"),
        }
    }
}

/// A filter on a field's value (`value`, `old`, `new`).
#[derive(Clone)]
pub enum ValueFilter {
    /// Equal to this value.
    Is(Value),
    /// Present, with any value (null counts as present).
    Present,
    /// Absent.
    Absent,
    /// A predicate over the value (None when absent).
    Check(ValueCheck),
}

impl ValueFilter {
    /// A predicate over the value (None when absent).
    pub fn check(f: impl Fn(Option<&Value>) -> bool + Send + Sync + 'static) -> Self {
        ValueFilter::Check(Arc::new(f))
    }

    fn matches(&self, value: Option<&Value>) -> bool {
        match self {
            ValueFilter::Is(expected) => value == Some(expected),
            ValueFilter::Present => value.is_some(),
            ValueFilter::Absent => value.is_none(),
            ValueFilter::Check(f) => f(value),
        }
    }
}

impl From<Value> for ValueFilter {
    fn from(value: Value) -> Self {
        ValueFilter::Is(value)
    }
}

impl fmt::Debug for ValueFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueFilter::Is(value) => write!(f, "{value}"),
            ValueFilter::Present => f.write_str("PRESENT"),
            ValueFilter::Absent => f.write_str("ABSENT"),
            ValueFilter::Check(_) => f.write_str("<callback>"),
        }
    }
}

/// A `when` callback over the whole context.
pub type WhenFn = Arc<dyn Fn(&Ctx) -> bool + Send + Sync>;

/// All the filters of one handler. The default matches everything.
#[derive(Clone, Default)]
pub struct Filters {
    /// Label filters; all must pass.
    pub labels: Vec<(String, MetaFilter)>,
    /// Annotation filters; all must pass.
    pub annotations: Vec<(String, MetaFilter)>,
    /// The field the handler is about (`["spec", "size"]`).
    pub field: Option<Vec<String>>,
    /// The field's value; without it, the field must be present (when a field is given).
    pub value: Option<ValueFilter>,
    /// The field's old value (update and field handlers).
    pub old: Option<ValueFilter>,
    /// The field's new value (update and field handlers).
    pub new: Option<ValueFilter>,
    /// A last check over the whole context.
    pub when: Option<WhenFn>,
}

impl fmt::Debug for Filters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Filters")
            .field("labels", &self.labels)
            .field("annotations", &self.annotations)
            .field("field", &self.field.as_ref().map(|p| p.join(".")))
            .field("value", &self.value)
            .field("old", &self.old)
            .field("new", &self.new)
            .field("when", &self.when.as_ref().map(|_| "<callback>"))
            .finish()
    }
}

impl Filters {
    /// Whether the object could be handled: every filter but the change of the field.
    pub fn prematch(&self, ctx: &Ctx) -> bool {
        self.metadata_match(ctx) && self.field_values_match(ctx) && self.when_matches(ctx)
    }

    /// Whether the handler runs for this context. `needs_change`: the field must have changed
    /// (update and field handlers, when the context has a changing cause).
    pub fn matches(&self, ctx: &Ctx, needs_change: bool) -> bool {
        self.metadata_match(ctx)
            && self.field_values_match(ctx)
            && self.field_changes_match(ctx, needs_change)
            && self.when_matches(ctx)
    }

    fn metadata_match(&self, ctx: &Ctx) -> bool {
        let meta = &ctx.body.metadata;
        let labels = meta.labels.as_ref();
        let annotations = meta.annotations.as_ref();
        self.labels.iter().all(|(key, filter)| {
            filter.matches(labels.and_then(|l| l.get(key)).map(String::as_str))
        }) && self.annotations.iter().all(|(key, filter)| {
            filter.matches(annotations.and_then(|a| a.get(key)).map(String::as_str))
        })
    }

    fn field_values_match(&self, ctx: &Ctx) -> bool {
        let Some(field) = &self.field else {
            return true;
        };
        let values: Vec<Option<Cow<'_, Value>>> = match ctx.cause() {
            Some(cause) => vec![
                cause
                    .new
                    .as_deref()
                    .and_then(|v| resolve(v, field))
                    .map(Cow::Borrowed),
                cause
                    .old
                    .as_deref()
                    .and_then(|v| resolve(v, field))
                    .map(Cow::Borrowed),
            ],
            None => vec![body_field(ctx, field)],
        };
        match &self.value {
            None | Some(ValueFilter::Present) => values.iter().any(Option::is_some),
            Some(filter) => values.iter().any(|v| filter.matches(v.as_deref())),
        }
    }

    fn field_changes_match(&self, ctx: &Ctx, needs_change: bool) -> bool {
        let (Some(field), Some(cause)) = (&self.field, ctx.cause()) else {
            return true;
        };
        let old = cause.old.as_deref().and_then(|v| resolve(v, field));
        let new = cause.new.as_deref().and_then(|v| resolve(v, field));
        (!needs_change || old != new)
            && self.old.as_ref().is_none_or(|f| f.matches(old))
            && self.new.as_ref().is_none_or(|f| f.matches(new))
    }

    fn when_matches(&self, ctx: &Ctx) -> bool {
        self.when.as_ref().is_none_or(|when| when(ctx))
    }
}

/// A field of the current body: `metadata.*` through a JSON copy of the typed metadata (rare), the
/// rest borrowed from the data.
fn body_field<'a>(ctx: &'a Ctx, field: &[String]) -> Option<Cow<'a, Value>> {
    if field.first().map(String::as_str) == Some("metadata") {
        let metadata = serde_json::to_value(&ctx.body.metadata).ok()?;
        return resolve(&metadata, &field[1..]).cloned().map(Cow::Owned);
    }
    resolve(&ctx.body.data, field).map(Cow::Borrowed)
}
