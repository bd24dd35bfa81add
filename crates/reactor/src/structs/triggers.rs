//! Why a reconcile handler runs besides a change of its own object: a related object changed (one it
//! owns, or one a watch maps to it), or a requeue came due. Gathered by the object's worker between
//! two cycles, coalesced, and given to the handler (`ctx.triggers()`).

use std::fmt;
use std::sync::Arc;

use crate::structs::names::EventType;
use crate::structs::resources::Resource;

/// At most this many related changes are kept between two runs (the newest per object); beyond,
/// [`Triggers::overflowed`] says some were left out (the handler is level-based: it looks at the
/// state anyway).
pub const RELATED_KEPT: usize = 64;

/// A change of an object related to the reconciled one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Related {
    /// The related object's resource (shown in kubectl's form, `deployments.v1.apps`).
    pub resource: Arc<Resource>,
    /// Its namespace (None for cluster-scoped objects).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
    /// What happened to it (the newest event, when several came).
    pub event: EventType,
    /// It names the reconciled object as its owner (`owns`), rather than being mapped to it by a
    /// watch (`watches`).
    pub owned: bool,
    /// The resourceVersion the event brought (None for a deletion found by a relist).
    pub version: Option<String>,
}

impl fmt::Display for Related {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let event = match self.event {
            EventType::Listed => "listed",
            EventType::Added => "added",
            EventType::Modified => "modified",
            EventType::Deleted => "deleted",
        };
        match &self.namespace {
            Some(namespace) => write!(f, "{} {namespace}/{} {event}", self.resource, self.name),
            None => write!(f, "{} {} {event}", self.resource, self.name),
        }
    }
}

/// What a trigger delivered to an object's worker is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// A watch event of the object itself (the usual case).
    Event,
    /// A related object changed.
    Related(Related),
    /// A requeue or a retry after an error came due.
    Requeue,
}

/// The triggers gathered since the last cycle, coalesced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Triggers {
    /// Related objects that changed, oldest first, one entry per object (its newest event).
    pub related: Vec<Related>,
    /// More related changes came than were kept ([`RELATED_KEPT`]).
    pub overflowed: bool,
    /// A requeue or a retry came due.
    pub requeued: bool,
}

impl Triggers {
    /// Adds a trigger (a watch event of the object itself adds nothing: the cycle compares the body
    /// with what was last reconciled).
    pub fn add(&mut self, trigger: Trigger) {
        match trigger {
            Trigger::Event => {}
            Trigger::Requeue => self.requeued = true,
            Trigger::Related(related) => {
                self.related.retain(|r| {
                    !(*r.resource == *related.resource
                        && r.namespace == related.namespace
                        && r.name == related.name)
                });
                if self.related.len() == RELATED_KEPT {
                    self.related.remove(0);
                    self.overflowed = true;
                }
                self.related.push(related);
            }
        }
    }

    /// Adds what `newer` gathered after these.
    pub fn absorb(&mut self, newer: Triggers) {
        self.overflowed |= newer.overflowed;
        self.requeued |= newer.requeued;
        for related in newer.related {
            self.add(Trigger::Related(related));
        }
    }

    /// Whether anything but the object's own events triggered.
    pub fn is_empty(&self) -> bool {
        self.related.is_empty() && !self.overflowed && !self.requeued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployments() -> Arc<Resource> {
        Arc::new(Resource::namespaced(
            "apps",
            "v1",
            "Deployment",
            "deployments",
        ))
    }

    fn related(name: &str, event: EventType) -> Trigger {
        Trigger::Related(Related {
            resource: deployments(),
            namespace: Some("ns".into()),
            name: name.into(),
            event,
            owned: true,
            version: None,
        })
    }

    #[test]
    fn triggers_coalesce_to_the_newest_per_object() {
        let mut triggers = Triggers::default();
        assert!(triggers.is_empty());
        triggers.add(Trigger::Event);
        assert!(triggers.is_empty());
        triggers.add(related("a", EventType::Added));
        triggers.add(related("b", EventType::Modified));
        triggers.add(related("a", EventType::Deleted));
        let names: Vec<String> = triggers.related.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            [
                "deployments.v1.apps ns/b modified",
                "deployments.v1.apps ns/a deleted"
            ]
        );
        triggers.add(Trigger::Requeue);
        assert!(triggers.requeued && !triggers.overflowed);
        let mut older = Triggers::default();
        older.add(related("b", EventType::Added));
        older.add(related("c", EventType::Added));
        older.absorb(triggers);
        let names: Vec<&str> = older.related.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["c", "b", "a"]);
        assert!(older.requeued);
    }

    #[test]
    fn too_many_related_changes_keep_the_newest_and_say_so() {
        let mut triggers = Triggers::default();
        for n in 0..(RELATED_KEPT + 3) {
            triggers.add(related(&format!("d{n}"), EventType::Modified));
        }
        assert_eq!(triggers.related.len(), RELATED_KEPT);
        assert!(triggers.overflowed);
        assert_eq!(triggers.related[0].name, "d3");
    }
}
