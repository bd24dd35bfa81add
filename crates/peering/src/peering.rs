//! Kopf-compatible peering: operators that share a peering object never work at once.
//!
//! Every operator writes a keep-alive record (its priority, lifetime and when it was last seen) into
//! the `status` of a peering object, and watches that object: while a live peer with a higher
//! priority is there, this operator pauses in its favour; while a live peer with the *same* priority
//! is there, every operator of that priority pauses, this one included (as in Kopf, there is no
//! tie-break). The records, the objects and the CRDs are Kopf's (`reference/kopf.md` §1.13, §2.8), so
//! kactor and Kopf operators peer with each other.
//!
//! * [`run`] is the one entry point: keep-alives, watching and the decision, until told to stop.
//! * [`PeeringSettings`] and [`PeeringMode`] say which peering object and how strictly.
//! * [`freeze`] and [`resume`] are `kopf freeze` and `kopf resume`; [`crds`] gives the CRDs.
//!
//! The decision itself is a pure function of the peering object, kept with its state machine in
//! `decision.rs`; `records.rs` reads and writes the records, `neighbourhood.rs` runs one peering
//! object (keep-alive and watch), `resources.rs` finds which peering CRDs the cluster serves.
//!
//! This is not an actix actor: it makes HTTP requests and decodes JSON, which never run on the
//! actors' thread (see `kactor-actors`' `system.rs`). It talks to the rest of the operator only
//! through the reactor's [`PauseSwitch`].

mod decision;
mod identity;
mod neighbourhood;
mod records;
mod resources;

use std::future::Future;
use std::time::Duration;

use kactor_reactor::pausing::PauseSwitch;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;

pub use decision::ring_identity;
pub use identity::{identity, manual_identity};
pub use resources::{crds, peering_object};

use neighbourhood::{Neighbourhood, Outcome};
use resources::{served_resources, PeeringResource};

/// The toggle of the [`PauseSwitch`] held while mandatory peering has no CRD (Kopf's toggle name).
pub const CRD_MISSING: &str = "peering CRD is missing";

/// The pause toggle of a mandatory peering between [`run`] being called and its first look at the
/// peering resources (replaced then by [`CRD_MISSING`] or the peering objects' own toggles).
pub const STARTING: &str = "peering is starting";

/// How often the served peering CRDs are looked for while there are none (or the last look failed).
const DETECTION_INTERVAL: Duration = Duration::from_secs(5);

/// How strictly this operator peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PeeringMode {
    /// Peer if the peering CRD is served and the peering object exists; otherwise warn once and work
    /// without peering (and start peering if both appear later). The default, as in Kopf.
    #[default]
    AutoDetect,
    /// Peer, and stay paused while the peering CRD or object is missing (Kopf's `--peering NAME`,
    /// `settings.peering.mandatory`). Until the first look at the peering object shows no conflict,
    /// the operator is paused.
    Mandatory,
    /// Do not peer at all: no record, no watch, never paused by peers (Kopf's `--standalone`).
    Standalone,
}

/// Which peering object to use, how, and with what priority. `PeeringSettings::default()` is Kopf's
/// `settings.peering`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeeringSettings {
    /// The peering object's name; different names are separate neighbourhoods that never see each
    /// other. Default `"default"`, as in Kopf.
    pub name: String,
    /// This operator's priority: a live peer with a higher one pauses it, an equal one pauses both.
    /// Default 0, as in Kopf; `--dev` sets 666, as in Kopf.
    pub priority: i64,
    /// How long this operator's record stays valid without a keep-alive: peers consider it dead after
    /// that. Whole seconds (at least 1 are written). Default 60 s, as in Kopf.
    pub lifetime: Duration,
    /// How strictly to peer. Default [`PeeringMode::AutoDetect`], as in Kopf.
    pub mode: PeeringMode,
    /// Peer through the cluster-scoped `ClusterKopfPeering` (true) or a namespaced `KopfPeering` in
    /// each of [`namespaces`](Self::namespaces) (false). Default false, as in Kopf; operators set it
    /// from `-A`.
    pub clusterwide: bool,
    /// The served namespaces, for namespaced peering: one `KopfPeering` named [`name`](Self::name) in
    /// each. Default none; operators set it from `-n`.
    pub namespaces: Vec<String>,
    /// Do not log the keep-alives (pauses, resumes and problems are still logged). Default false, as
    /// in Kopf.
    pub stealth: bool,
    /// In [`PeeringMode::Mandatory`]: create the peering object when its CRD is served and the
    /// object is missing, instead of staying paused until someone creates it (Kopf's behaviour, and
    /// the default, false). It is created empty, as Kopf's users create it; operators set it from
    /// `--create-peering`.
    pub create_missing: bool,
}

impl Default for PeeringSettings {
    fn default() -> Self {
        PeeringSettings {
            name: "default".to_string(),
            priority: 0,
            lifetime: Duration::from_secs(60),
            mode: PeeringMode::AutoDetect,
            clusterwide: false,
            namespaces: Vec::new(),
            stealth: false,
            create_missing: false,
        }
    }
}

/// Why [`freeze`] or [`resume`] could not write the record.
#[derive(Debug, thiserror::Error)]
pub enum PeeringError {
    /// Neither `kopf.dev/v1` nor the legacy `zalando.org/v1` serves the peering resource.
    #[error(
        "the peering CRD {plural}.kopf.dev is not installed (nor the legacy {plural}.zalando.org); \
         install it (`kactor peering crds` prints it) and create the peering object"
    )]
    NotServed {
        /// `clusterkopfpeerings` or `kopfpeerings`.
        plural: String,
    },
    /// The peering object does not exist.
    #[error(
        "peering object `{name}` not found {place}; create it (a {kind} named `{name}`) or use another \
         peering name"
    )]
    ObjectNotFound {
        /// The peering object's name.
        name: String,
        /// `cluster-wide` or `in namespace NS`.
        place: String,
        /// `ClusterKopfPeering` or `KopfPeering`.
        kind: String,
    },
    /// The API refused or failed the request.
    #[error("cannot write the peering record: {0}")]
    Api(#[from] kube::Error),
}

/// Runs this operator's peering until `stop` completes, pausing and resuming it through `switch`.
///
/// **Expected flow**
/// 1. [`PeeringMode::Standalone`]: nothing happens until `stop`.
/// 2. Otherwise, find which peering resource is served: `clusterkopfpeerings` (with
///    [`clusterwide`](PeeringSettings::clusterwide)) or `kopfpeerings` (one object per namespace of
///    [`namespaces`](PeeringSettings::namespaces)), in `kopf.dev/v1` or the legacy `zalando.org/v1`
///    (both, if both are served, as Kopf does). If none is, [`PeeringMode::Mandatory`] pauses with the
///    toggle [`CRD_MISSING`] and [`PeeringMode::AutoDetect`] warns once and works unpaused; either
///    looks again every few seconds.
/// 3. For each peering object: merge-patch this operator's record
///    `status.<identity> = {priority, lifetime, lastseen}` at once and then every
///    `min(lifetime, max(1, lifetime - rand(5..=10)))` seconds; watch the object, and on every change
///    decide: a live peer (other than `identity`) with a higher priority pauses ("Pausing operations
///    in favour of ..."), one with the same priority pauses everyone ("Possibly conflicting operators
///    with the same priority"), otherwise the toggle is lifted. Dead peers (`lastseen + lifetime <=
///    now`) are removed from the object. While paused, the next look is at the earliest blocking
///    peer's expiry, when this operator touches its own record to see the object afresh (as Kopf).
/// 4. When `stop` completes: remove this operator's record (`status.<identity>: null`) from every
///    peering object, then return.
///
/// **Guarantees**
/// * Each peering object has its own toggle in `switch`, keyed `peering <name> (<plural>.<group>)`
///   cluster-wide or `peering <name>@<namespace> (<plural>.<group>)`; any one of them pauses the
///   operator. A peer that leaves (its record removed) lifts the pause as soon as the watch event
///   arrives; one that dies lifts it at its expiry.
/// * In [`PeeringMode::Mandatory`], the operator is paused from the moment `run` is called, before
///   its future is first polled (the toggle [`STARTING`]), and every peering object's toggle is on
///   until the first look at it shows no conflict, and stays on while the object is missing.
/// * The records are byte-compatible with Kopf's: Kopf reads kactor's and kactor reads Kopf's.
/// * All writes of this operator's own record are made one after another by one task, so the
///   removal at the end is the last write.
///
/// **Assumptions**
/// * The clocks of the peers agree to well within a lifetime (the records carry wall-clock times).
/// * `identity` is unique among the peers ([`identity()`] makes one as Kopf does).
///
/// **Caveats**
/// * The toggles are left as they are when `run` returns: an operator on its way out does not resume
///   work because its peering stopped.
/// * An auto-detected peering object that is missing is only a warning: the operator works unpaused
///   next to whatever else runs.
/// * In [`PeeringMode::AutoDetect`] the toggles start off (as in Kopf): a lower-priority operator may
///   work for the moment between its start and its first look at the peering object.
/// * The removal of the record at the end waits at most 10 s for the API; a record that could not be
///   removed expires after its lifetime.
pub fn run(
    client: kube::Client,
    settings: PeeringSettings,
    identity: String,
    switch: PauseSwitch,
    stop: impl Future<Output = ()>,
) -> impl Future<Output = ()> {
    // Set before the future is first polled: a spawned peering that has not run yet must not leave
    // a mandatory operator working.
    if settings.mode == PeeringMode::Mandatory {
        switch.set(
            STARTING,
            Some(format!(
                "waiting for the first look at the peering `{}`",
                settings.name
            )),
        );
    }
    run_until(client, settings, identity, switch, stop)
}

async fn run_until(
    client: kube::Client,
    settings: PeeringSettings,
    identity: String,
    switch: PauseSwitch,
    stop: impl Future<Output = ()>,
) {
    if settings.mode == PeeringMode::Standalone {
        tracing::debug!("Peering is off (standalone mode).");
        stop.await;
        return;
    }
    let (stopping, stopped) = watch::channel(false);
    let peering = Peering {
        client,
        settings,
        identity,
        switch,
    };
    let body = peering.run(Stop(stopped));
    tokio::pin!(body);
    tokio::pin!(stop);
    tokio::select! {
        () = &mut body => {}
        () = &mut stop => {
            stopping.send_replace(true);
            body.await;
        }
    }
}

/// Writes a record of `identity` with this priority and lifetime into the peering object `name`
/// (cluster-wide, or in `namespace`): what `kopf freeze` does. Operators with a lower (or the same)
/// priority pause until the record expires or is removed by [`resume`].
///
/// A lifetime under 1 s removes the record instead, as in Kopf. If both `kopf.dev` and the legacy
/// `zalando.org` peering resources are served, the record is written to both.
pub async fn freeze(
    client: kube::Client,
    name: &str,
    namespace: Option<&str>,
    identity: &str,
    priority: i64,
    lifetime: Duration,
) -> Result<(), PeeringError> {
    let record = records::Record::now(priority, lifetime);
    write_record(&client, name, namespace, identity, record.as_patch_value()).await
}

/// Removes the record of `identity` from the peering object `name` (cluster-wide, or in
/// `namespace`): what `kopf resume` does, undoing [`freeze`].
pub async fn resume(
    client: kube::Client,
    name: &str,
    namespace: Option<&str>,
    identity: &str,
) -> Result<(), PeeringError> {
    write_record(&client, name, namespace, identity, serde_json::Value::Null).await
}

async fn write_record(
    client: &kube::Client,
    name: &str,
    namespace: Option<&str>,
    identity: &str,
    record: serde_json::Value,
) -> Result<(), PeeringError> {
    let resources = served_resources(client, namespace.is_some()).await?;
    let plural = PeeringResource::plural_for(namespace.is_some());
    if resources.is_empty() {
        return Err(PeeringError::NotServed {
            plural: plural.to_string(),
        });
    }
    let patch = json!({"status": {identity: record}});
    let mut written = false;
    for resource in &resources {
        let namespace = namespace.filter(|_| resource.namespaced);
        let api: kube::Api<kube::api::DynamicObject> = resource.api(client, namespace);
        let result = if resource.has_status {
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
        } else {
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
        };
        match result {
            Ok(_) => written = true,
            Err(error) if records::is_not_found(&error) => {}
            Err(error) => return Err(error.into()),
        }
    }
    if written {
        Ok(())
    } else {
        Err(PeeringError::ObjectNotFound {
            name: name.to_string(),
            place: records::place(namespace),
            kind: PeeringResource::kind_for(namespace.is_some()).to_string(),
        })
    }
}

/// A stop signal that many tasks can wait for.
#[derive(Debug, Clone)]
pub(crate) struct Stop(watch::Receiver<bool>);

impl Stop {
    /// Completes when the stop is signalled (or its sender is gone).
    pub(crate) async fn wait(&mut self) {
        let _ = self.0.wait_for(|stopped| *stopped).await;
    }

    /// Whether the stop is signalled.
    pub(crate) fn is_set(&self) -> bool {
        *self.0.borrow() || self.0.has_changed().is_err()
    }
}

/// The peering of one operator: finds the served peering resources and runs their neighbourhoods.
struct Peering {
    client: kube::Client,
    settings: PeeringSettings,
    identity: String,
    switch: PauseSwitch,
}

impl Peering {
    async fn run(&self, mut stop: Stop) {
        let namespaced = !self.settings.clusterwide;
        if namespaced && self.settings.namespaces.is_empty() {
            self.nothing_to_peer(&mut stop).await;
            return;
        }
        let mut warned = false;
        // The toggles of the neighbourhoods of the last generation (dropped once replaced).
        let mut stale: Vec<String> = Vec::new();
        while !stop.is_set() {
            let resources = tokio::select! {
                () = stop.wait() => return,
                found = served_resources(&self.client, namespaced) => found,
            };
            match resources {
                Err(error) => {
                    tracing::warn!(%error, "Cannot tell which peering resources are served; retrying in {:?}.", DETECTION_INTERVAL);
                }
                Ok(resources) if resources.is_empty() => {
                    let plural = PeeringResource::plural_for(namespaced);
                    if self.settings.mode == PeeringMode::Mandatory {
                        let reason = format!(
                            "the peering CRD is missing: neither {plural}.kopf.dev nor the legacy \
                             {plural}.zalando.org is served; install it (`kactor peering crds`) or \
                             run with --standalone"
                        );
                        if !warned {
                            tracing::error!("Pausing operations: {reason}.");
                            warned = true;
                        }
                        self.switch.set(CRD_MISSING, Some(reason));
                        self.switch.set(STARTING, None);
                    } else if !warned {
                        tracing::warn!(
                            "The peering CRD {plural}.kopf.dev is not installed: running without \
                             peering, next to whatever other operators run. Install it (`kactor \
                             peering crds`) and create the peering object `{}` to peer, or run with \
                             --standalone to silence this.",
                            self.settings.name
                        );
                        warned = true;
                    }
                    for key in stale.drain(..) {
                        self.switch.set(&key, None);
                    }
                }
                Ok(resources) => {
                    if self.switch.reasons().contains_key(CRD_MISSING) {
                        tracing::info!("The peering CRD is served now.");
                    }
                    warned = false;
                    let outcome = self.serve(&resources, &mut stale, stop.clone()).await;
                    if outcome == Outcome::Stopped || stop.is_set() {
                        return;
                    }
                    tracing::warn!(
                        "The peering resource is not served any more; looking for it again."
                    );
                    continue;
                }
            }
            tokio::select! {
                () = stop.wait() => return,
                () = tokio::time::sleep(DETECTION_INTERVAL) => {}
            }
        }
    }

    /// Namespaced peering with no namespace: there is no peering object to use.
    async fn nothing_to_peer(&self, stop: &mut Stop) {
        let message = "namespaced peering has no namespace to peer in: set the served namespaces, \
                       or peer cluster-wide";
        if self.settings.mode == PeeringMode::Mandatory {
            tracing::error!("Pausing operations: {message}.");
            self.switch.set(CRD_MISSING, Some(message.to_string()));
            self.switch.set(STARTING, None);
        } else {
            tracing::warn!("Running without peering: {message}.");
        }
        stop.wait().await;
    }

    /// Runs one neighbourhood per (served resource, namespace) until stopped or until a resource is
    /// not served any more; `stale` holds the toggles of the previous generation, and gets this one's.
    async fn serve(
        &self,
        resources: &[PeeringResource],
        stale: &mut Vec<String>,
        mut stop: Stop,
    ) -> Outcome {
        let mut hoods = Vec::new();
        for resource in resources {
            let namespaces: Vec<Option<String>> = if resource.namespaced {
                self.settings.namespaces.iter().cloned().map(Some).collect()
            } else {
                vec![None]
            };
            for namespace in namespaces {
                let hood = Neighbourhood::new(
                    &self.client,
                    resource.clone(),
                    namespace,
                    &self.settings,
                    &self.identity,
                );
                if hoods.iter().all(|h: &Neighbourhood| h.key() != hood.key()) {
                    hoods.push(hood);
                }
            }
        }
        // Turn the new toggles on (mandatory) before the old ones go, so that there is no gap.
        for hood in &hoods {
            hood.preactivate(&self.switch);
        }
        for key in stale.drain(..) {
            if hoods.iter().all(|h| h.key() != key) {
                self.switch.set(&key, None);
            }
        }
        stale.extend(hoods.iter().map(|h| h.key().to_string()));
        self.switch.set(CRD_MISSING, None);
        self.switch.set(STARTING, None);

        let (stopping, stopped) = watch::channel(false);
        let keepalives =
            futures::future::join_all(hoods.iter().map(|h| h.keepalive(Stop(stopped.clone()))));
        let mut observers: futures::stream::FuturesUnordered<_> = hoods
            .iter()
            .map(|h| h.observe(&self.switch, Stop(stopped.clone())))
            .collect();
        let supervise = async {
            use futures::StreamExt as _;
            let mut outcome = Outcome::Stopped;
            let mut signalled = false;
            loop {
                tokio::select! {
                    () = stop.wait(), if !signalled => {
                        signalled = true;
                        stopping.send_replace(true);
                    }
                    next = observers.next() => match next {
                        None => break,
                        Some(Outcome::Lost) => {
                            outcome = Outcome::Lost;
                            signalled = true;
                            stopping.send_replace(true);
                        }
                        Some(Outcome::Stopped) => {}
                    },
                }
            }
            outcome
        };
        let (_, outcome) = tokio::join!(keepalives, supervise);
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kopfs() {
        let settings = PeeringSettings::default();
        assert_eq!(settings.name, "default");
        assert_eq!(settings.priority, 0);
        assert_eq!(settings.lifetime, Duration::from_secs(60));
        assert_eq!(settings.mode, PeeringMode::AutoDetect);
        assert!(!settings.clusterwide);
        assert!(settings.namespaces.is_empty());
        assert!(!settings.stealth);
    }

    #[tokio::test]
    async fn stop_is_set_when_signalled_or_when_its_sender_is_gone() {
        let (tx, rx) = watch::channel(false);
        let mut stop = Stop(rx);
        assert!(!stop.is_set());
        tx.send_replace(true);
        assert!(stop.is_set());
        stop.wait().await;
        let (tx, rx) = watch::channel(false);
        let mut stop = Stop(rx);
        drop(tx);
        assert!(stop.is_set());
        stop.wait().await;
    }
}
