//! Related kinds: the watch streams of the kinds that reconcile handlers own, watch or read. Each
//! keeps the kind's shared cache ([`Store`]) up to date and routes every change to the workers of
//! the objects it concerns, through their supervisors ([`Poke`]).
//!
//! **Expected flow**: one stream per (kind, served namespace), as supervisors have; it runs as a
//! task on the operator's runtime (no actor: it keeps no per-object state but the store). For each
//! event, the store first (a handler never reads a cache older than its trigger), then the routes:
//! * **owns**: the object's `ownerReferences` of the reconciled kind (the `controller: true` one by
//!   default) name the objects to trigger, by uid;
//! * **watches**: the user's map names them, by namespace and name.
//!
//! **Guarantees**
//! * The initial listing fills the store without triggering anything (the reconciled objects are
//!   listed too, and run then); a relist (410 Gone, a reconnect) triggers for the objects that
//!   changed or vanished during the gap, as their events would have.
//! * An event bringing a version the store already holds triggers nothing: it is the echo of a
//!   write a handler remembered ([`Cache::remember`](kactor_reactor::cache::Cache::remember)),
//!   which that handler knows (controller-runtime's "expectations", without the bookkeeping).
//! * Nothing is routed to a paused supervisor's workers (the supervisor drops it; the listing after
//!   the resume brings every object back).
//! * The stream's health is on the watch board (`/healthz`, `/readyz`), as the supervisors' are.
//! * What is kept is bounded: `metadata.managedFields` is dropped, and the user's transform runs
//!   (`Operator::cache_transform`) before the store keeps an object. A kind marked
//!   `Operator::cache_metadata_only` is listed and watched as `PartialObjectMetadata`: the server
//!   sends, and the store keeps, each object's metadata alone.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use actix::Addr;
use kactor_reactor::cache::{Store, Transform};
use kactor_reactor::observe::Observer;
use kactor_reactor::reconcile::{MapFn, OwnerRefs};
use kactor_reactor::resources::Resource;
use kactor_reactor::settings::Settings;
use kactor_reactor::triggers::Related;
use kactor_reactor::watching::{EventType, WatchItem, WatchStatus, Watcher};
use kube::api::DynamicObject;

use crate::supervisor::{Poke, ResourceSupervisor};

/// The running supervisors, by resource (kubectl's form) and namespace (None: cluster-wide): where
/// triggers go.
pub type Directory = Arc<RwLock<HashMap<(String, Option<String>), Addr<ResourceSupervisor>>>>;

/// How a related kind's changes reach reconciled objects.
#[derive(Clone)]
pub enum RouteKind {
    /// Through the changed object's owner references.
    Owns(OwnerRefs),
    /// Through the user's map.
    Watches(MapFn),
}

/// One way a related kind's changes reach the objects of one reconciled resource.
#[derive(Clone)]
pub struct Route {
    /// The reconciled resource.
    pub parent: Arc<Resource>,
    /// How.
    pub kind: RouteKind,
}

/// What a related stream needs.
pub struct RelatedConfig {
    /// The related kind.
    pub resource: Arc<Resource>,
    /// The namespace, or None for cluster-wide (and for cluster-scoped kinds).
    pub namespace: Option<String>,
    /// The client.
    pub client: kube::Client,
    /// The operator's settings (watching, networking).
    pub settings: Arc<Settings>,
    /// Hooks for metrics.
    pub observer: Arc<dyn Observer>,
    /// The kind's shared cache.
    pub store: Store,
    /// Where its changes go.
    pub routes: Vec<Route>,
    /// The running supervisors.
    pub directory: Directory,
    /// How objects are changed before the cache keeps them (after `managedFields` is dropped).
    pub transform: Option<Transform>,
    /// The kind is listed and watched as `PartialObjectMetadata`: the cache keeps each object's
    /// metadata alone (owner references and labels route and select as ever).
    pub metadata_only: bool,
}

/// A related stream: its watcher, ready to run.
pub struct RelatedWatch {
    config: RelatedConfig,
    watcher: Watcher,
    label: Arc<str>,
}

impl RelatedWatch {
    /// The stream of `config`'s kind and namespace.
    pub fn new(config: RelatedConfig) -> Self {
        let resource = &config.resource;
        let api = kactor_reactor::slim::api(
            config.client.clone(),
            config.namespace.as_deref().filter(|_| resource.namespaced),
            &resource.api_resource(),
        );
        let label: Arc<str> = match &config.namespace {
            Some(namespace) => Arc::from(format!("{resource} in {namespace} (cached)")),
            None => Arc::from(format!("{resource} (cached)")),
        };
        let watcher = Watcher::new(
            api,
            label.to_string(),
            config.settings.watching.clone(),
            config.settings.networking.clone(),
        )
        .observed(config.observer.clone(), resource.to_string());
        let watcher = if config.metadata_only {
            config.store.keep_metadata_only();
            watcher.metadata_only()
        } else {
            watcher
        };
        RelatedWatch {
            config,
            watcher,
            label,
        }
    }

    /// The stream's health, for the watch board.
    pub fn status(&self) -> Arc<WatchStatus> {
        self.watcher.status()
    }

    /// The stream's label.
    pub fn label(&self) -> Arc<str> {
        self.label.clone()
    }

    /// Runs until the stream ends for good (the kind is no longer served, or the request is
    /// rejected: logged), or until the task is aborted.
    pub async fn run(mut self) {
        let namespace = self.config.namespace.clone();
        let mut listed_once = false;
        self.config.store.listing_started(namespace.as_deref());
        loop {
            let items = match self.watcher.next_batch().await {
                Ok(items) => items,
                Err(error) => {
                    tracing::error!(stream = %self.label, %error, "the cache of a related kind stops following it");
                    return;
                }
            };
            for item in items {
                match item {
                    WatchItem::Listed(object) => {
                        let object = self.kept(object);
                        if self.config.store.apply(EventType::Listed, &object) && listed_once {
                            self.route(&object, EventType::Modified);
                        }
                    }
                    WatchItem::ListDone => {
                        let vanished = self.config.store.listing_done(namespace.as_deref());
                        if listed_once {
                            for object in vanished {
                                self.route(&object, EventType::Deleted);
                            }
                        }
                        listed_once = true;
                        // The next listing (a relist) is watched for what vanished.
                        self.config.store.listing_started(namespace.as_deref());
                    }
                    WatchItem::Event(event_type, object) => {
                        let object = self.kept(object);
                        let changed = self.config.store.apply(event_type, &object);
                        // A version the cache held already is the echo of a write a handler
                        // remembered: that handler knows it, and nobody else changed anything.
                        if changed || event_type == EventType::Deleted {
                            self.route(&object, event_type);
                        }
                    }
                }
            }
        }
    }

    /// The object as the cache keeps it (the watcher decoded it without `managedFields`).
    fn kept(&self, mut object: DynamicObject) -> Arc<DynamicObject> {
        if let Some(transform) = &self.config.transform {
            transform(&mut object);
        }
        Arc::new(object)
    }

    /// Tells the change to the workers of the objects it concerns.
    fn route(&self, object: &DynamicObject, event: EventType) {
        let Some(name) = object.metadata.name.clone() else {
            return;
        };
        let related = Related {
            resource: self.config.resource.clone(),
            namespace: object.metadata.namespace.clone(),
            name,
            event,
            owned: false,
            version: object.metadata.resource_version.clone(),
        };
        let directory = self
            .config
            .directory
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for route in &self.config.routes {
            let parent = &route.parent;
            let pokes: Vec<Poke> = match &route.kind {
                RouteKind::Owns(owners) => owned_by(object, parent, *owners)
                    .map(|(uid, owner)| Poke {
                        uid: Some(uid),
                        namespace: parent
                            .namespaced
                            .then(|| object.metadata.namespace.clone())
                            .flatten(),
                        name: owner,
                        related: Related {
                            owned: true,
                            ..related.clone()
                        },
                    })
                    .collect(),
                RouteKind::Watches(map) => map(object)
                    .into_iter()
                    .map(|(namespace, name)| Poke {
                        uid: None,
                        namespace: namespace.filter(|_| parent.namespaced),
                        name,
                        related: related.clone(),
                    })
                    .collect(),
            };
            let label = parent.to_string();
            for poke in pokes {
                let supervisor = directory
                    .get(&(label.clone(), poke.namespace.clone()))
                    .or_else(|| directory.get(&(label.clone(), None)));
                if let Some(supervisor) = supervisor {
                    supervisor.do_send(poke);
                }
            }
        }
    }
}

/// The owners of `object` of the `parent` kind that count: (uid, name).
fn owned_by<'a>(
    object: &'a DynamicObject,
    parent: &'a Resource,
    owners: OwnerRefs,
) -> impl Iterator<Item = (String, String)> + 'a {
    object
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(move |owner| {
            let group = owner
                .api_version
                .rsplit_once('/')
                .map_or("", |(group, _)| group);
            owner.kind == parent.kind
                && group == parent.group
                && (owners == OwnerRefs::All || owner.controller == Some(true))
        })
        .map(|owner| (owner.uid.clone(), owner.name.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn memcacheds() -> Resource {
        Resource::namespaced("cache.example.com", "v1alpha1", "Memcached", "memcacheds")
    }

    #[test]
    fn owners_of_the_reconciled_kind_count_the_controller_by_default() {
        let object: DynamicObject = serde_json::from_value(json!({
            "metadata": {"name": "d", "namespace": "n", "ownerReferences": [
                {"apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached", "name": "a", "uid": "u1", "controller": true},
                {"apiVersion": "cache.example.com/v1beta1", "kind": "Memcached", "name": "b", "uid": "u2"},
                {"apiVersion": "other.example.com/v1alpha1", "kind": "Memcached", "name": "c", "uid": "u3", "controller": true},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "d", "uid": "u4"},
            ]}
        }))
        .unwrap();
        let parent = memcacheds();
        let names = |mode| -> Vec<String> {
            owned_by(&object, &parent, mode)
                .map(|(uid, name)| format!("{uid}:{name}"))
                .collect()
        };
        assert_eq!(names(OwnerRefs::Controller), ["u1:a"]);
        assert_eq!(
            names(OwnerRefs::All),
            ["u1:a", "u2:b"],
            "any version of the kind's group"
        );
    }
}
