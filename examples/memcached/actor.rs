//! The same memcached operator, written as one actor per `Memcached` (`memcached --actor`).
//!
//! The handlers in `operator.rs` are functions: what they need across events lives on the object
//! (Kopf's progress, `status`) or in a memo. Here each `Memcached` has a [`MemcachedActor`] of its
//! own, alive as long as the object is served: its lifecycle methods are the create, resume, update
//! and delete handlers (with the same Kopf guarantees), and it remembers what it did. It checks for
//! drift by sending itself a message every `check_every` ([`ActorRef::schedule`]) rather than
//! through a timer, and anyone holding [`Operator::actors`] can ask it for a [`Report`].
//!
//! | when                            | method / message | what it does                                   |
//! |---------------------------------|------------------|------------------------------------------------|
//! | a `Memcached` appears           | `on_create`      | applies the Deployment                         |
//! | the operator starts, finds one  | `on_resume`      | applies it again (it may have drifted)         |
//! | its spec changes                | `on_update`      | scales the Deployment if the size changed      |
//! | every `check_every`             | `CheckDrift`     | repairs drift, fills `status.nodes`            |
//! | someone asks                    | `Report`         | answers what it set and how many checks ran    |
//! | the `Memcached` is deleted      | `on_delete`      | deletes the Deployment                         |

use std::time::Duration;

use kactor::actors::{ActorCtx, ActorOptions, ActorRef, ObjectActor};
use kactor::prometheus::IntCounterVec;
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;

use super::*;

/// The actor of one `Memcached`.
pub struct MemcachedActor {
    /// The replicas it last gave the Deployment (None until it did).
    replicas: Option<i32>,
    /// The `Memcached` as its last lifecycle call saw it, and the client to reach the cluster with:
    /// what a drift check works from.
    last: Option<(Memcached, kube::Client)>,
    /// Drift checks run, and repairs made.
    checks: u64,
    repairs: u64,
    check_every: Duration,
    changes: IntCounterVec,
}

/// What can be sent to a [`MemcachedActor`].
#[derive(Debug)]
pub enum Request {
    /// Check for drift now (the actor sends itself one every `check_every`).
    CheckDrift,
    /// Answer a [`Report`].
    Report,
}

/// What a [`MemcachedActor`] knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The replicas it last gave the Deployment.
    pub replicas: Option<i32>,
    /// Drift checks run.
    pub checks: u64,
    /// Drift repaired.
    pub repairs: u64,
}

/// The operator: a [`MemcachedActor`] per `Memcached`, the probe and the metric of `operator.rs`.
/// Its handler ids are `memcached/create`, `memcached/resume`, `memcached/update` and
/// `memcached/delete` (results in `status["memcached/create"]`, ...).
///
/// It fails only if the metric cannot be registered (a name clash on the operator's registry).
pub fn operator(check_every: Duration) -> kactor::Result<Operator> {
    let (operator, changes) = base()?;
    let probe = probe(changes.clone());
    Ok(operator
        // `.delete()`: kactor holds its finalizer on every `Memcached`, so `on_delete` runs even if
        // the operator was down when the object was deleted.
        .actor(
            Selector::of::<Memcached>(),
            ActorOptions::new("memcached").resume().delete(),
            move |_: &Memcached| MemcachedActor {
                replicas: None,
                last: None,
                checks: 0,
                repairs: 0,
                check_every,
                changes: changes.clone(),
            },
        )
        .on_probe("deployment_changes", probe))
}

impl ObjectActor for MemcachedActor {
    type Resource = Memcached;
    type Message = Request;
    type Reply = Report;

    async fn started(&mut self, me: &ActorRef<Self>) {
        me.schedule(self.check_every, Request::CheckDrift);
    }

    async fn on_create(&mut self, ctx: &ActorCtx<Self>) -> Result<Value, HandlerError> {
        self.apply(ctx).await
    }

    async fn on_resume(&mut self, ctx: &ActorCtx<Self>) -> Result<Value, HandlerError> {
        self.apply(ctx).await
    }

    /// Any change of the spec, labels or annotations: the actor knows the replicas it set, so it
    /// needs no field handler to see whether the size changed.
    async fn on_update(&mut self, ctx: &ActorCtx<Self>) -> Result<Value, HandlerError> {
        let memcached = memcached_of(ctx)?;
        let size = memcached.spec.size;
        self.last = Some((memcached.clone(), ctx.client()));
        if self.replicas == Some(size) {
            return Ok(Value::Null);
        }
        scale_deployment(ctx.client(), &memcached).await?;
        let message = format!(
            "Scaled the Deployment from {} to {size} replicas.",
            self.replicas.map_or("?".to_string(), |r| r.to_string())
        );
        self.replicas = Some(size);
        self.changes.with_label_values(&["scaled"]).inc();
        ctx.logger().info(&message);
        ctx.info("Scaled", &message);
        Ok(json!({"replicas": size}))
    }

    async fn on_delete(&mut self, ctx: &ActorCtx<Self>) -> Result<Value, HandlerError> {
        delete_deployment((**ctx).clone(), self.changes.clone()).await?;
        self.replicas = None;
        Ok(Value::Null)
    }

    async fn on_message(&mut self, request: Request, me: &ActorRef<Self>) -> Report {
        if let Request::CheckDrift = request {
            if let Err(error) = self.check_drift().await {
                tracing::warn!(memcached = %me.key(), %error, "the drift check failed; it runs again later");
            }
            // The next check: cancelled with the actor (the object is deleted, the operator pauses).
            me.schedule(self.check_every, Request::CheckDrift);
        }
        Report {
            replicas: self.replicas,
            checks: self.checks,
            repairs: self.repairs,
        }
    }
}

impl MemcachedActor {
    /// Create and resume: the Deployment the `Memcached` asks for, created if missing.
    async fn apply(&mut self, ctx: &ActorCtx<Self>) -> Result<Value, HandlerError> {
        let memcached = memcached_of(ctx)?;
        let deployment = apply_deployment(ctx.client(), &memcached).await?;
        self.replicas = Some(memcached.spec.size);
        self.last = Some((memcached.clone(), ctx.client()));
        self.changes.with_label_values(&["applied"]).inc();
        let message = format!(
            "Deployment {} has {} replicas of {IMAGE}.",
            deployment.name_any(),
            memcached.spec.size
        );
        ctx.logger().info(&message);
        ctx.info("Deployment", &message);
        Ok(json!({"deployment": deployment.name_any(), "replicas": memcached.spec.size}))
    }

    /// Puts back a deleted Deployment or replicas changed by hand, and lists the pods in
    /// `status.nodes` (patched by the actor itself: a message has no handler cycle to patch with).
    async fn check_drift(&mut self) -> Result<(), HandlerError> {
        let Some((memcached, client)) = self.last.clone() else {
            return Ok(()); // nothing applied yet
        };
        self.checks += 1;
        let name = memcached.name_any();
        let current = deployments_of(client.clone(), &memcached)
            .get_opt(&name)
            .await
            .map_err(|error| retry("cannot read the Deployment", error))?;
        let replicas = current.map(|d| d.spec.and_then(|s| s.replicas).unwrap_or(1));
        if replicas != self.replicas {
            tracing::warn!(
                "Drift: the Deployment {name} has {replicas:?} replicas instead of {:?}; applying it again.",
                self.replicas
            );
            apply_deployment(client.clone(), &memcached).await?;
            self.repairs += 1;
            self.changes.with_label_values(&["repaired"]).inc();
        }
        let nodes = nodes_of(client.clone(), &memcached).await?;
        if memcached.status.as_ref().map(|s| &s.nodes) != Some(&nodes) {
            let memcacheds: Api<Memcached> = Api::namespaced(client, &namespace_of(&memcached));
            memcacheds
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"nodes": nodes}})),
                )
                .await
                .map_err(|error| retry("cannot patch status.nodes", error))?;
            if let Some((last, _)) = &mut self.last {
                last.status.get_or_insert_with(Default::default).nodes = nodes;
            }
        }
        Ok(())
    }
}
