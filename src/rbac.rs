//! The RBAC an operator needs, derived from what it does: the rules `rbac generate` prints and
//! `rbac verify` checks (Kopf's list, `reference/kopf.md` §2.13, made exact for one operator).
//!
//! Start with [`requirements`]: it gives the [`Requirements`] of an operator run with some options,
//! as [`Permission`]s (verbs on a resource, in a [`Place`], and why). [`Requirements::to_yaml`]
//! renders them as manifests; [`Requirements::verify`] checks manifests against them.
//!
//! **What an operator requests**
//! * Every handled resource: `list` and `watch` (its watch streams), `patch` (progress and diff-base
//!   annotations, the finalizer, handlers' own patches), and `patch` on `<plural>/status` (results
//!   land in `status.<handler id>`, through the status subresource when the resource has one).
//! * Core `events`: `create`, in the namespace of each handled object (for cluster-scoped objects, in
//!   the service account's namespace, the client's default); warnings are posted even with
//!   `posting.enabled` off, as in Kopf.
//! * `customresourcedefinitions.apiextensions.k8s.io`: `list` and `watch`, always (kactor serves a
//!   handled resource as soon as its CRD appears).
//! * `namespaces`: `list` and `watch`, when `-n` has globs or negations (namespaces are followed).
//! * Peering, unless standalone: `clusterkopfpeerings.kopf.dev` (cluster-wide operators and `-n`
//!   with globs) or `kopfpeerings.kopf.dev` in each served namespace: `list` and `watch`, and `get` and
//!   `patch` of the peering object (Kopf's verbs), and `create` with `--create-peering`. Whether the CRD is served is read from discovery,
//!   which needs no permission.
//! * Leader election: `leases.coordination.k8s.io` in the lease's namespace: `create`, and `get` and
//!   `update` of the lease itself.
//!
//! **Where**: with `-A` (or no `-n`), or `-n` with globs (the namespaces are known only at run
//! time), everything goes to one ClusterRole; with `-n` naming exact namespaces, what is namespaced
//! goes to a Role in each of them, and only what is cluster-wide (CRDs, cluster-scoped resources)
//! to the ClusterRole.
//!
//! **Assumptions**: a resource named by group and plural (`("example.com", "v1", "widgets")`,
//! `"widgets.example.com"`) is resolved offline: its scope and status subresource come from a CRD
//! declared with [`Operator::crd`], or from the built-in resources' scopes; an unknown custom
//! resource is taken as namespaced, with the status subresource. Other names (a kind, a short name)
//! are resolved through discovery, with the operator's client or the usual credentials.

use std::fmt;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kactor_peering::peering::PeeringMode;
use kactor_reactor::discovery;
use kactor_reactor::resources::Selector;
use serde_json::Value;

use crate::cli::RbacArgs;
pub use crate::error::RbacError;
use crate::error::Result;
use crate::operator::{Blueprint, Connection, Extra, Operator};
use crate::scope::Served;

/// The RBAC API group.
const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Where a permission applies.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Place {
    /// In every namespace and at the cluster scope: a ClusterRole bound by a ClusterRoleBinding.
    Cluster,
    /// In one namespace: a Role there, bound by a RoleBinding there.
    Namespace(String),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Cluster => f.write_str("cluster-wide"),
            Place::Namespace(namespace) => write!(f, "in the namespace \"{namespace}\""),
        }
    }
}

/// One rule an operator needs: verbs on a resource (or a subresource), in a place, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    /// Where.
    pub place: Place,
    /// The API group, `""` for the core group.
    pub group: String,
    /// The plural, or `plural/subresource`.
    pub resource: String,
    /// The objects it is restricted to; empty: all of them.
    pub resource_names: Vec<String>,
    /// The verbs.
    pub verbs: Vec<String>,
    /// Why the operator needs it, on one line.
    pub why: String,
}

impl Permission {
    /// Verbs on a resource (`plural` or `plural/subresource`) of an API group (`""`: core), in a
    /// place, and why, for rules an application adds to [`Requirements::permissions`] (what its
    /// handlers do with their own clients is not derived).
    ///
    /// ```
    /// use kactor::rbac::{Permission, Place};
    /// let children = Permission::new(
    ///     Place::Namespace("team-a".into()),
    ///     "apps",
    ///     "deployments",
    ///     &["get", "create", "patch", "delete"],
    ///     "the handlers of memcacheds.cache.example.com own a Deployment each",
    /// );
    /// ```
    pub fn new(place: Place, group: &str, resource: &str, verbs: &[&str], why: &str) -> Self {
        Permission {
            place,
            group: group.to_string(),
            resource: resource.to_string(),
            resource_names: Vec::new(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            why: why.to_string(),
        }
    }

    /// Restricts it to the object `name`.
    pub fn named(mut self, name: &str) -> Self {
        self.resource_names = vec![name.to_string()];
        self
    }
}

/// The service account an operator runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl Account {
    /// The user name the API server gives it: `system:serviceaccount:<namespace>:<name>`.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

/// Everything an operator needs in RBAC, for one way of running it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirements {
    /// Who the operator runs as.
    pub account: Account,
    /// How it runs, in a few words (scope, peering, leader election), for the manifests' header.
    pub summary: String,
    /// The rules: cluster-wide ones first, then each namespace's (by name), each place's in the
    /// order the needs were found.
    pub permissions: Vec<Permission>,
}

/// The RBAC of `operator` run with `args`: the rules as [`Requirements::to_yaml`] renders them.
///
/// ```no_run
/// # async fn example() -> kactor::Result<()> {
/// use kactor::cli::{Command, Manifests, OperatorCli, RbacCommand};
/// use kactor::prelude::*;
///
/// let operator = Operator::new().on_create(("example.com", "v1", "widgets"), "create_fn", |_: Ctx| async { Ok(()) });
/// let cli = OperatorCli::parse_from(["my-operator", "rbac", "generate", "-n", "team-a"]).unwrap();
/// if let Command::Manifests(Manifests::Rbac(RbacCommand::Generate(args))) = cli.command() {
///     println!("{}", kactor::rbac::generate(&operator, &args.rbac).await?);
/// }
/// # Ok(())
/// # }
/// ```
pub async fn generate(operator: &Operator, args: &RbacArgs) -> Result<String> {
    Ok(requirements(operator, args).await?.to_yaml())
}

/// Checks RBAC manifests (YAML) against what `operator` run with `args` needs.
pub async fn verify(operator: &Operator, args: &RbacArgs, manifests: &str) -> Result<Verification> {
    requirements(operator, args).await?.verify(manifests)
}

/// What `operator`, run with `args` (the options of `run`, as [`Operator::with_args`] applies them,
/// and its service account), needs in RBAC.
///
/// Resources named by group and plural are resolved offline; others through discovery, with the
/// operator's client if it has one, else with the usual credentials.
pub async fn requirements(operator: &Operator, args: &RbacArgs) -> Result<Requirements> {
    let blueprint = operator.blueprint();
    let setup = Setup::new(&blueprint, args)?;
    let handled = resolve(&blueprint).await?;
    let cached = resolve_cached(&blueprint).await?;
    Ok(setup.requirements(&handled, &cached))
}

/// How the operator runs, as far as its permissions go: its options applied as
/// [`Operator::with_args`] applies them.
struct Setup {
    account: Account,
    served: Served,
    /// The peering mode and object's name; None: standalone.
    peering: Option<(PeeringMode, String)>,
    /// Whether it creates a missing peering object (`--create-peering`, with `--peering`).
    create_peering: bool,
    /// The lease's name and namespace; None: no leader election.
    lease: Option<(String, String)>,
    /// Sharded: the ring's name and its Leases' namespace.
    ring: Option<(String, String)>,
    /// The handlers' own needs.
    extra: Vec<Extra>,
    /// The managed webhook configurations' name, when there are admission handlers.
    webhooks: Option<String>,
    /// Whether the operator points CRDs at its conversion webhook.
    conversions: bool,
}

impl Setup {
    fn new(blueprint: &Blueprint<'_>, args: &RbacArgs) -> Result<Self> {
        let run = &args.run;
        let served = run.scope().served()?;
        let peering = if run.standalone {
            None
        } else if let Some(name) = &run.peering {
            Some((PeeringMode::Mandatory, name.clone()))
        } else {
            match blueprint.peering.mode {
                PeeringMode::Standalone => None,
                mode => Some((mode, blueprint.peering.name.clone())),
            }
        };
        let lease = if run.leader_election {
            Some((
                run.lease_name_or_default(),
                run.lease_namespace_or_default(),
            ))
        } else {
            blueprint
                .leader_election
                .map(|lease| (lease.name.clone(), lease.namespace.clone()))
        };
        let ring = match (run.ring(), blueprint.sharding) {
            (Some(ring), _) => Some((ring, run.lease_namespace_or_default())),
            (None, Some(ring)) => Some((ring.ring.clone(), ring.namespace.clone())),
            (None, None) => None,
        };
        Ok(Setup {
            ring,
            account: Account {
                namespace: args.service_account_namespace(),
                name: args.service_account_name(),
            },
            served,
            create_peering: run.create_peering
                && matches!(peering, Some((PeeringMode::Mandatory, _))),
            peering,
            lease,
            extra: blueprint.extra.to_vec(),
            webhooks: blueprint.webhooks.map(String::from),
            conversions: !blueprint.conversions.is_empty(),
        })
    }

    /// Where the rules for a resource go: cluster-wide, or in each served namespace.
    fn places(&self, namespaced: bool) -> Vec<Place> {
        match &self.served {
            Served::Fixed(names) if namespaced => {
                names.iter().cloned().map(Place::Namespace).collect()
            }
            _ => vec![Place::Cluster],
        }
    }

    fn summary(&self) -> String {
        let scope = match &self.served {
            Served::ClusterWide => "all namespaces".to_string(),
            Served::Fixed(names) => format!("the namespaces {}", names.join(", ")),
            Served::Patterns { given, .. } => {
                format!("the namespaces matching {}", given.join(" "))
            }
        };
        let peering = match &self.peering {
            None => "standalone".to_string(),
            Some((PeeringMode::Mandatory, name)) => format!("peering through `{name}`"),
            Some((_, name)) => format!("peering through `{name}` if its CRD is installed"),
        };
        let election = match &self.lease {
            Some((name, namespace)) => format!("leader election with the Lease {namespace}/{name}"),
            None => "no leader election".to_string(),
        };
        format!("serving {scope}; {peering}; {election}")
    }

    #[allow(
        clippy::too_many_lines,
        reason = "one rule per kind of handler and setting, read as a table"
    )]
    fn requirements(&self, handled: &[Handled], cached: &[Handled]) -> Requirements {
        let mut permissions = Vec::new();
        // Where events are posted, and whether only about cluster-scoped objects.
        let mut events: Vec<(Place, bool)> = Vec::new();
        let runtime_namespaces = match &self.served {
            Served::Patterns { given, .. } => format!(
                " (cluster-wide: the namespaces matching {} are known only at run time)",
                given.join(" ")
            ),
            _ => String::new(),
        };
        for resource in handled {
            let namespaced = resource.namespaced.unwrap_or(true);
            let assumed = match (&self.served, resource.namespaced) {
                (Served::Fixed(_), None) => {
                    " (assumed namespaced; declare its CRD with Operator::crd to be sure)"
                }
                _ => "",
            };
            let places = self.places(namespaced);
            let why = format!(
                "{} is handled by {}: kactor lists and watches it, and patches its objects (progress \
                 and diff-base annotations, the finalizer, the handlers' patches){runtime_namespaces}{assumed}",
                resource.label,
                resource.handlers.join(", ")
            );
            for place in &places {
                permissions.push(Permission::new(
                    place.clone(),
                    &resource.group,
                    &resource.plural,
                    &["list", "watch", "patch"],
                    &why,
                ));
            }
            if resource.status != Some(false) {
                let maybe = if resource.status.is_none() {
                    " if it has one"
                } else {
                    ""
                };
                let why = format!(
                    "the results of {}'s handlers land in status.<handler id>, patched through the \
                     status subresource{maybe}",
                    resource.label
                );
                for place in &places {
                    permissions.push(Permission::new(
                        place.clone(),
                        &resource.group,
                        &format!("{}/status", resource.plural),
                        &["patch"],
                        &why,
                    ));
                }
            }
            // Events about cluster-scoped objects go to the client's default namespace: in a pod,
            // the service account's.
            let event_places = if namespaced {
                places
            } else {
                vec![Place::Namespace(self.account.namespace.clone())]
            };
            for place in event_places {
                match events.iter_mut().find(|(known, _)| *known == place) {
                    Some((_, cluster_scoped_only)) => *cluster_scoped_only &= !namespaced,
                    None => events.push((place, !namespaced)),
                }
            }
        }
        if events.iter().any(|(place, _)| *place == Place::Cluster) {
            events.retain(|(place, _)| *place == Place::Cluster);
        }
        for (place, cluster_scoped_only) in events {
            let why = if cluster_scoped_only {
                "kactor posts Kubernetes Events about handled cluster-scoped objects (handler \
                 outcomes, ctx.info/warn) in its own namespace; warnings are posted even with posting \
                 disabled"
            } else {
                "kactor posts Kubernetes Events about handled objects (handler outcomes, \
                 ctx.info/warn); warnings are posted even with posting disabled"
            };
            permissions.push(Permission::new(place, "", "events", &["create"], why));
        }
        for resource in cached {
            let namespaced = resource.namespaced.unwrap_or(true);
            let why = format!(
                "{} is cached for {} (owned, watched or read): kactor lists and watches it{runtime_namespaces}",
                resource.label,
                resource.handlers.join(", ")
            );
            for place in self.places(namespaced) {
                permissions.push(Permission::new(
                    place,
                    &resource.group,
                    &resource.plural,
                    &["list", "watch"],
                    &why,
                ));
            }
        }
        if let Some(name) = &self.webhooks {
            for plural in [
                "validatingwebhookconfigurations",
                "mutatingwebhookconfigurations",
            ] {
                permissions.push(Permission::new(
                    Place::Cluster,
                    "admissionregistration.k8s.io",
                    plural,
                    &["get", "create", "patch", "delete"],
                    &format!(
                        "kactor keeps the webhook configuration `{name}` (settings.admission.managed) \
                         pointed at its webhook server, and withdraws it at exit"
                    ),
                ));
            }
        }
        if self.conversions {
            permissions.push(Permission::new(
                Place::Cluster,
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                &["get", "patch"],
                "kactor points the CRDs it converts at its conversion webhook (spec.conversion, \
                 with settings.admission.managed)",
            ));
        }
        permissions.push(Permission::new(
            Place::Cluster,
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            &["list", "watch"],
            "kactor follows CRDs, so that a handled resource whose CRD appears (or comes back) later \
             is served at once",
        ));
        if let Served::Patterns { given, .. } = &self.served {
            permissions.push(Permission::new(
                Place::Cluster,
                "",
                "namespaces",
                &["list", "watch"],
                &format!(
                    "kactor follows the namespaces matching {} as they come and go",
                    given.join(" ")
                ),
            ));
        }
        if let Some((mode, name)) = &self.peering {
            let how = match mode {
                PeeringMode::Mandatory => format!("peering through `{name}` (--peering)"),
                _ => format!(
                    "peering, auto-detected (--standalone turns it off): kactor peers through \
                     `{name}` if the peering CRD is installed"
                ),
            };
            let (plural, places) = match &self.served {
                Served::Fixed(names) => (
                    "kopfpeerings",
                    names.iter().cloned().map(Place::Namespace).collect(),
                ),
                _ => ("clusterkopfpeerings", vec![Place::Cluster]),
            };
            for place in places {
                permissions.push(Permission::new(
                    place.clone(),
                    "kopf.dev",
                    plural,
                    &["list", "watch"],
                    &format!("{how}; it watches the peering object"),
                ));
                permissions.push(
                    Permission::new(
                        place.clone(),
                        "kopf.dev",
                        plural,
                        &["get", "patch"],
                        &format!("{how}; it writes its keep-alive record into the peering object"),
                    )
                    .named(name),
                );
                if self.create_peering {
                    // `create` cannot be limited by resourceNames: the name is not known before.
                    permissions.push(Permission::new(
                        place,
                        "kopf.dev",
                        plural,
                        &["create"],
                        &format!("{how}; it creates the peering object when it is missing (--create-peering)"),
                    ));
                }
            }
        }
        for extra in self.extra.iter() {
            let plural = extra.resource.split('/').next().unwrap_or_default();
            let namespaced = builtin_scope(&extra.group, plural).unwrap_or(true);
            let verbs: Vec<&str> = extra.verbs.iter().map(String::as_str).collect();
            for place in self.places(namespaced) {
                permissions.push(Permission::new(
                    place,
                    &extra.group,
                    &extra.resource,
                    &verbs,
                    &extra.why,
                ));
            }
        }
        if let Some((name, namespace)) = &self.lease {
            let place = Place::Namespace(namespace.clone());
            permissions.push(Permission::new(
                place.clone(),
                "coordination.k8s.io",
                "leases",
                &["create"],
                &format!("leader election: the first candidate creates the Lease `{name}`"),
            ));
            permissions.push(
                Permission::new(
                    place,
                    "coordination.k8s.io",
                    "leases",
                    &["get", "update"],
                    &format!(
                        "leader election: the candidates read the Lease `{name}`, and renew, take \
                         over or release it"
                    ),
                )
                .named(name),
            );
        }
        if let Some((ring, namespace)) = &self.ring {
            permissions.push(Permission::new(
                Place::Namespace(namespace.clone()),
                "coordination.k8s.io",
                "leases",
                &["create", "delete", "get", "list", "update", "watch"],
                &format!(
                    "sharding: each replica keeps its Lease `{ring}-<replica>`, the assigner reads the ring's, takes a dead one over and deletes it; the Lease `{ring}` elects the assigner"
                ),
            ));
        }
        // Cluster-wide rules first (the ClusterRole), then each namespace's (its Role); stable within.
        permissions.sort_by(|a, b| a.place.cmp(&b.place));
        Requirements {
            account: self.account.clone(),
            summary: self.summary(),
            permissions,
        }
    }
}

/// A handled resource, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Handled {
    group: String,
    plural: String,
    /// Whether it is namespaced; None: not known offline.
    namespaced: Option<bool>,
    /// Whether it has the status subresource; None: not known offline.
    status: Option<bool>,
    /// `plural.group`, or `plural` in the core group.
    label: String,
    /// The ids of its handlers.
    handlers: Vec<String>,
}

/// Resolves every handled resource: offline when it is named by group and plural, through discovery
/// otherwise. Several selectors of one resource make one entry.
async fn resolve(blueprint: &Blueprint<'_>) -> Result<Vec<Handled>> {
    let mut served: Option<Vec<kactor_reactor::resources::Resource>> = None;
    let handled = blueprint.selectors.iter().map(|selector| {
        let handlers = blueprint.registry.handlers_for(selector);
        let ids = handlers.ids().into_iter().map(String::from).collect();
        (selector, ids)
    });
    resolve_all(blueprint, handled, &mut served).await
}

/// Resolves every kind that reconcile handlers cache (owned, watched, read): kactor lists and
/// watches them.
async fn resolve_cached(blueprint: &Blueprint<'_>) -> Result<Vec<Handled>> {
    let mut served: Option<Vec<kactor_reactor::resources::Resource>> = None;
    let kinds = blueprint.registry.cached_kinds();
    let cached = kinds.iter().map(|selector| {
        let ids = blueprint
            .registry
            .reconcile_handlers
            .iter()
            .filter(|h| h.options.cached_kinds().contains(selector))
            .map(|h| h.id().to_string())
            .collect();
        (selector, ids)
    });
    resolve_all(blueprint, cached, &mut served).await
}

/// Resolves each selector, with the ids of what needs it; several selectors of one resource make
/// one entry.
async fn resolve_all<'s>(
    blueprint: &Blueprint<'_>,
    selectors: impl Iterator<Item = (&'s Selector, Vec<String>)>,
    served: &mut Option<Vec<kactor_reactor::resources::Resource>>,
) -> Result<Vec<Handled>> {
    let mut handled: Vec<Handled> = Vec::new();
    for (selector, ids) in selectors {
        let resource = match offline(selector, blueprint.crds) {
            Some(resource) => resource,
            None => {
                if served.is_none() {
                    *served = Some(discover(blueprint, selector).await?);
                }
                let resources = served.as_deref().unwrap_or_default();
                let resource =
                    selector
                        .resolve(resources)
                        .map_err(|error| RbacError::Unresolved {
                            selector: selector.to_string(),
                            reason: error.to_string(),
                        })?;
                Handled {
                    group: resource.group.clone(),
                    plural: resource.plural.clone(),
                    namespaced: Some(resource.namespaced),
                    status: Some(resource.has_status()),
                    label: label(&resource.group, &resource.plural),
                    handlers: Vec::new(),
                }
            }
        };
        match handled
            .iter_mut()
            .find(|h| h.group == resource.group && h.plural == resource.plural)
        {
            Some(known) => {
                for id in ids {
                    if !known.handlers.contains(&id) {
                        known.handlers.push(id);
                    }
                }
            }
            None => handled.push(Handled {
                handlers: ids,
                ..resource
            }),
        }
    }
    Ok(handled)
}

/// What the cluster serves, with the operator's client or the usual credentials.
async fn discover(
    blueprint: &Blueprint<'_>,
    selector: &Selector,
) -> Result<Vec<kactor_reactor::resources::Resource>> {
    let unresolved = |reason: String| RbacError::Unresolved {
        selector: selector.to_string(),
        reason,
    };
    let connection = Connection::resolve(blueprint.connection)
        .await
        .map_err(|e| {
            unresolved(format!(
                "no usable Kubernetes credentials ({})",
                discovery::one_line(&e.to_string())
            ))
        })?;
    let client = match connection {
        Connection::Client(client) => client,
        Connection::Config(config) => kube::Client::try_from(*config)
            .map_err(|e| unresolved(discovery::one_line(&e.to_string())))?,
    };
    Ok(discovery::scan(&client)
        .await
        .map_err(|e| unresolved(e.to_string()))?)
}

/// A resource named by group and plural, resolved without the cluster; None if it needs discovery.
fn offline(selector: &Selector, crds: &[CustomResourceDefinition]) -> Option<Handled> {
    let group = selector.group.as_deref()?;
    let name = selector.name.as_str();
    let is_plural_like = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !selector.exact && !is_plural_like {
        return None;
    }
    let crd = crds.iter().find(|crd| {
        let names = &crd.spec.names;
        crd.spec.group == group
            && (names.plural == name
                || (!selector.exact
                    && (names.singular.as_deref() == Some(name)
                        || names.kind.to_ascii_lowercase() == name
                        || names
                            .short_names
                            .iter()
                            .flatten()
                            .any(|short| short == name))))
    });
    let (plural, namespaced, status) = match crd {
        Some(crd) => {
            let version = crd.spec.versions.iter().find(|v| match &selector.version {
                Some(version) => v.name == *version,
                None => v.storage,
            });
            let status =
                version.map(|v| v.subresources.as_ref().is_some_and(|s| s.status.is_some()));
            (
                crd.spec.names.plural.clone(),
                Some(crd.spec.scope == "Namespaced"),
                status,
            )
        }
        None => (name.to_string(), builtin_scope(group, name), None),
    };
    Some(Handled {
        label: label(group, &plural),
        group: group.to_string(),
        plural,
        namespaced,
        status,
        handlers: Vec::new(),
    })
}

fn label(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

/// The cluster-scoped resources of Kubernetes 1.34 (`kubectl api-resources --namespaced=false`).
const CLUSTER_SCOPED: &[(&str, &str)] = &[
    ("", "componentstatuses"),
    ("", "namespaces"),
    ("", "nodes"),
    ("", "persistentvolumes"),
    ("admissionregistration.k8s.io", "mutatingadmissionpolicies"),
    (
        "admissionregistration.k8s.io",
        "mutatingadmissionpolicybindings",
    ),
    (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
    ),
    (
        "admissionregistration.k8s.io",
        "validatingadmissionpolicies",
    ),
    (
        "admissionregistration.k8s.io",
        "validatingadmissionpolicybindings",
    ),
    (
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
    ),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("apiregistration.k8s.io", "apiservices"),
    ("authentication.k8s.io", "selfsubjectreviews"),
    ("authentication.k8s.io", "tokenreviews"),
    ("authorization.k8s.io", "selfsubjectaccessreviews"),
    ("authorization.k8s.io", "selfsubjectrulesreviews"),
    ("authorization.k8s.io", "subjectaccessreviews"),
    ("certificates.k8s.io", "certificatesigningrequests"),
    ("certificates.k8s.io", "clustertrustbundles"),
    ("flowcontrol.apiserver.k8s.io", "flowschemas"),
    (
        "flowcontrol.apiserver.k8s.io",
        "prioritylevelconfigurations",
    ),
    ("networking.k8s.io", "ingressclasses"),
    ("networking.k8s.io", "ipaddresses"),
    ("networking.k8s.io", "servicecidrs"),
    ("node.k8s.io", "runtimeclasses"),
    ("rbac.authorization.k8s.io", "clusterrolebindings"),
    ("rbac.authorization.k8s.io", "clusterroles"),
    ("resource.k8s.io", "deviceclasses"),
    ("resource.k8s.io", "resourceslices"),
    ("scheduling.k8s.io", "priorityclasses"),
    ("storage.k8s.io", "csidrivers"),
    ("storage.k8s.io", "csinodes"),
    ("storage.k8s.io", "storageclasses"),
    ("storage.k8s.io", "volumeattachments"),
    ("storage.k8s.io", "volumeattributesclasses"),
    ("storagemigration.k8s.io", "storageversionmigrations"),
];

/// The API groups of Kubernetes itself: their resources are namespaced unless in [`CLUSTER_SCOPED`].
const BUILTIN_GROUPS: &[&str] = &[
    "",
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apps",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "storagemigration.k8s.io",
];

/// Whether a built-in resource is namespaced; None for resources of other groups.
fn builtin_scope(group: &str, plural: &str) -> Option<bool> {
    if CLUSTER_SCOPED.contains(&(group, plural)) {
        Some(false)
    } else {
        BUILTIN_GROUPS.contains(&group).then_some(true)
    }
}

impl Requirements {
    /// The user name of the service account.
    pub fn user(&self) -> String {
        self.account.user()
    }

    /// The manifests: the ServiceAccount; a ClusterRole with the cluster-wide rules and its
    /// ClusterRoleBinding; a Role and a RoleBinding in each namespace that has rules. Every rule
    /// carries a comment saying why it is needed. Roles and bindings are named as the service account.
    pub fn to_yaml(&self) -> String {
        let account = &self.account;
        let mut out = String::new();
        out.push_str(&format!(
            "# The RBAC of the operator running as {}, as `rbac generate` derives it from its \
             handlers and options:\n# {}.\n",
            account.user(),
            self.summary
        ));
        out.push_str(&format!(
            "---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {}\n  namespace: {}\n",
            scalar(&account.name),
            scalar(&account.namespace)
        ));
        let mut places: Vec<&Place> = Vec::new();
        for permission in &self.permissions {
            if !places.contains(&&permission.place) {
                places.push(&permission.place);
            }
        }
        for place in places {
            let (role, binding, namespace) = match place {
                Place::Cluster => ("ClusterRole", "ClusterRoleBinding", None),
                Place::Namespace(namespace) => ("Role", "RoleBinding", Some(namespace)),
            };
            let metadata = match namespace {
                Some(namespace) => format!(
                    "metadata:\n  name: {}\n  namespace: {}\n",
                    scalar(&account.name),
                    scalar(namespace)
                ),
                None => format!("metadata:\n  name: {}\n", scalar(&account.name)),
            };
            out.push_str(&format!(
                "---\napiVersion: {RBAC_GROUP}/v1\nkind: {role}\n{metadata}rules:\n"
            ));
            for permission in self.permissions.iter().filter(|p| p.place == *place) {
                out.push_str(&format!("  # {}\n", permission.why));
                out.push_str(&format!("  - apiGroups: {}\n", flow(&[&permission.group])));
                out.push_str(&format!(
                    "    resources: {}\n",
                    flow(&[&permission.resource])
                ));
                if !permission.resource_names.is_empty() {
                    let names: Vec<&str> = permission
                        .resource_names
                        .iter()
                        .map(String::as_str)
                        .collect();
                    out.push_str(&format!("    resourceNames: {}\n", flow(&names)));
                }
                let verbs: Vec<&str> = permission.verbs.iter().map(String::as_str).collect();
                out.push_str(&format!("    verbs: {}\n", flow(&verbs)));
            }
            out.push_str(&format!(
                "---\napiVersion: {RBAC_GROUP}/v1\nkind: {binding}\n{metadata}roleRef:\n  apiGroup: \
                 {RBAC_GROUP}\n  kind: {role}\n  name: {}\nsubjects:\n  - kind: ServiceAccount\n    \
                 name: {}\n    namespace: {}\n",
                scalar(&account.name),
                scalar(&account.name),
                scalar(&account.namespace),
            ));
        }
        out
    }

    /// Checks RBAC manifests (YAML documents; `kind: List` is read too) against these requirements:
    /// each needed verb on each resource in each place is present when a rule bound to the service
    /// account grants it, as the API server's RBAC authorizer would (wildcards, subresources,
    /// resource names, Roles only in their namespace, ClusterRoles cluster-wide only through a
    /// ClusterRoleBinding).
    pub fn verify(&self, manifests: &str) -> Result<Verification> {
        let documents: Vec<Value> = serde_saphyr::from_multiple(manifests)
            .map_err(|e| RbacError::Manifests(discovery::one_line(&e.to_string())))?;
        let mut objects = Vec::new();
        for document in documents {
            match document["items"].as_array() {
                Some(items) if text(&document["kind"]).ends_with("List") => {
                    objects.extend(items.iter().cloned())
                }
                _ if document.is_object() => objects.push(document),
                _ => {
                    return Err(RbacError::Manifests(
                        "a document is not a Kubernetes object".to_string(),
                    )
                    .into())
                }
            }
        }
        let policy = Policy::new(&objects, &self.account);
        let mut checks = Vec::new();
        for permission in &self.permissions {
            for verb in &permission.verbs {
                let names: Vec<Option<&str>> = if permission.resource_names.is_empty() {
                    vec![None]
                } else {
                    permission
                        .resource_names
                        .iter()
                        .map(|n| Some(n.as_str()))
                        .collect()
                };
                for name in names {
                    checks.push(Check {
                        place: permission.place.clone(),
                        verb: verb.clone(),
                        group: permission.group.clone(),
                        resource: permission.resource.clone(),
                        resource_name: name.map(String::from),
                        why: permission.why.clone(),
                        present: policy.allows(&permission.place, verb, permission, name),
                    });
                }
            }
        }
        Ok(Verification {
            user: self.user(),
            checks,
            notes: policy.notes,
        })
    }
}

/// What `rbac verify` found: each needed permission, present or missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// The service account's user name.
    pub user: String,
    /// One check per verb, resource (and resource name) and place.
    pub checks: Vec<Check>,
    /// What in the manifests could not be counted (a binding of the service account to a role that
    /// is not in them).
    pub notes: Vec<String>,
}

/// One needed permission, and whether the manifests grant it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Where it is needed.
    pub place: Place,
    /// The verb.
    pub verb: String,
    /// The API group.
    pub group: String,
    /// The plural, or `plural/subresource`.
    pub resource: String,
    /// The object it is needed on; None: any.
    pub resource_name: Option<String>,
    /// Why it is needed.
    pub why: String,
    /// Whether it is granted.
    pub present: bool,
}

impl Verification {
    /// The permissions that are missing.
    pub fn missing(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|check| !check.present)
    }

    /// Whether every needed permission is granted.
    pub fn is_complete(&self) -> bool {
        self.missing().next().is_none()
    }

    /// `Ok` when complete, else [`RbacError::Missing`].
    pub fn into_result(self) -> Result<Self> {
        let missing = self.missing().count();
        if missing == 0 {
            Ok(self)
        } else {
            Err(RbacError::Missing {
                missing,
                needed: self.checks.len(),
                user: self.user,
            }
            .into())
        }
    }
}

impl fmt::Display for Check {
    /// `present: list resource "widgets" in API group "example.com" cluster-wide (why)`, as the API
    /// server words its denials.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let named = match &self.resource_name {
            Some(name) => format!(" named \"{name}\""),
            None => String::new(),
        };
        write!(
            f,
            "{}: {} resource \"{}\"{named} in API group \"{}\" {} ({})",
            if self.present { "present" } else { "MISSING" },
            self.verb,
            self.resource,
            self.group,
            self.place,
            self.why
        )
    }
}

impl fmt::Display for Verification {
    /// One line per permission, the notes, and a summary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for check in &self.checks {
            writeln!(f, "{check}")?;
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        let missing = self.missing().count();
        if missing == 0 {
            write!(
                f,
                "all {} permissions are present for {}",
                self.checks.len(),
                self.user
            )
        } else {
            write!(
                f,
                "{missing} of {} permissions are missing for {}",
                self.checks.len(),
                self.user
            )
        }
    }
}

/// The rules of the manifests bound to one service account, as the API server's RBAC authorizer
/// sees them.
struct Policy<'a> {
    /// The rules of ClusterRoles bound by ClusterRoleBindings: granted everywhere.
    cluster: Vec<&'a Value>,
    /// The rules of Roles and ClusterRoles bound by RoleBindings, by the bindings' namespace.
    namespaced: Vec<(&'a str, &'a Value)>,
    notes: Vec<String>,
}

impl<'a> Policy<'a> {
    fn new(objects: &'a [Value], account: &Account) -> Self {
        let find = |kind: &str, namespace: &str, name: &str| {
            objects.iter().find(|o| {
                text(&o["kind"]) == kind
                    && text(&o["metadata"]["name"]) == name
                    && (kind == "ClusterRole" || text(&o["metadata"]["namespace"]) == namespace)
            })
        };
        let mut policy = Policy {
            cluster: Vec::new(),
            namespaced: Vec::new(),
            notes: Vec::new(),
        };
        for binding in objects {
            let kind = text(&binding["kind"]);
            let namespace = text(&binding["metadata"]["namespace"]);
            let cluster_wide = match kind {
                "ClusterRoleBinding" => true,
                "RoleBinding" => false,
                _ => continue,
            };
            if !binds(binding, account, namespace) {
                continue;
            }
            let (role_kind, role_name) = (
                text(&binding["roleRef"]["kind"]),
                text(&binding["roleRef"]["name"]),
            );
            if cluster_wide && role_kind != "ClusterRole" {
                continue;
            }
            let Some(role) = find(role_kind, namespace, role_name) else {
                let binding_name = text(&binding["metadata"]["name"]);
                let place = if cluster_wide {
                    String::new()
                } else {
                    format!(" in {namespace}")
                };
                policy.notes.push(format!(
                    "{kind} `{binding_name}`{place} binds the {role_kind} `{role_name}`, which is not \
                     in the manifests: its rules are not counted"
                ));
                continue;
            };
            for rule in role["rules"].as_array().into_iter().flatten() {
                if cluster_wide {
                    policy.cluster.push(rule);
                } else {
                    policy.namespaced.push((namespace, rule));
                }
            }
        }
        policy
    }

    fn allows(
        &self,
        place: &Place,
        verb: &str,
        permission: &Permission,
        name: Option<&str>,
    ) -> bool {
        let mut rules = self.cluster.iter().copied().chain(
            self.namespaced
                .iter()
                .filter(|(namespace, _)| matches!(place, Place::Namespace(n) if n == namespace))
                .map(|(_, rule)| *rule),
        );
        rules.any(|rule| rule_allows(rule, verb, &permission.group, &permission.resource, name))
    }
}

/// Whether a binding (in `namespace`, `""` for a ClusterRoleBinding) names the service account, as a
/// service account, a user, or one of its groups.
fn binds(binding: &Value, account: &Account, namespace: &str) -> bool {
    let groups = [
        "system:serviceaccounts".to_string(),
        format!("system:serviceaccounts:{}", account.namespace),
        "system:authenticated".to_string(),
    ];
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|subject| {
            let name = text(&subject["name"]);
            match text(&subject["kind"]) {
                "ServiceAccount" => {
                    let subject_namespace = match text(&subject["namespace"]) {
                        "" => namespace,
                        given => given,
                    };
                    name == account.name && subject_namespace == account.namespace
                }
                "User" => name == account.user(),
                "Group" => groups.iter().any(|g| g == name),
                _ => false,
            }
        })
}

/// Whether one rule grants `verb` on `resource` (`plural` or `plural/subresource`) of `group`, for
/// the object `name` (None: a request that names no object).
fn rule_allows(rule: &Value, verb: &str, group: &str, resource: &str, name: Option<&str>) -> bool {
    let subresource = resource.split_once('/').map(|(_, sub)| sub);
    let contains = |list: &Value, value: &str| strings(list).any(|s| s == "*" || s == value);
    contains(&rule["verbs"], verb)
        && contains(&rule["apiGroups"], group)
        && strings(&rule["resources"]).any(|r| {
            r == "*"
                || r == resource
                || subresource.is_some_and(|sub| r.strip_prefix("*/") == Some(sub))
        })
        && {
            let mut names = strings(&rule["resourceNames"]).peekable();
            names.peek().is_none() || name.is_some_and(|name| names.any(|n| n == name))
        }
}

fn strings(list: &Value) -> impl Iterator<Item = &str> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// A YAML flow sequence of scalars: `[list, watch]`.
fn flow(items: &[&str]) -> String {
    let items: Vec<String> = items.iter().map(|item| scalar(item)).collect();
    format!("[{}]", items.join(", "))
}

/// A string as a YAML scalar: plain when every YAML reader takes it as that string, double-quoted
/// otherwise (empty, `*`, words YAML 1.1 reads as booleans or null, numbers).
fn scalar(text: &str) -> String {
    let plain = text
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/' | ':'))
        && !text.ends_with(':')
        && !matches!(
            text.to_ascii_lowercase().as_str(),
            "y" | "yes" | "n" | "no" | "true" | "false" | "on" | "off" | "null"
        )
        && text.parse::<f64>().is_err()
        && !text.starts_with("0x")
        && !text.starts_with("0o");
    if plain {
        text.to_string()
    } else {
        Value::String(text.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Command, Manifests, RbacCommand};
    use kactor_peering::lease::LeaseSettings;
    use kactor_reactor::daemons::Timer;
    use kactor_reactor::handlers::Ctx;
    use serde_json::json;
    use std::time::Duration;

    /// The options of `my-operator rbac generate ARGS...`, as the service account `ops/my-op`.
    fn args(args: &[&str]) -> RbacArgs {
        let mut argv = vec![
            "rbac",
            "generate",
            "--service-account",
            "my-op",
            "--service-account-namespace",
            "ops",
        ];
        argv.extend_from_slice(args);
        match crate::cli::tests::cli(&argv).unwrap().command() {
            Command::Manifests(Manifests::Rbac(RbacCommand::Generate(generate))) => generate.rbac,
            other => panic!("not rbac generate: {other:?}"),
        }
    }

    /// An operator with creation and update handlers and a timer on widgets.
    fn widgets_operator() -> Operator {
        let widgets = ("example.com", "v1", "widgets");
        Operator::new()
            .on_create(widgets, "create_fn", |_: Ctx| async { Ok(()) })
            .on_update(widgets, "update_fn", |_: Ctx| async { Ok(()) })
            .timer(
                "widgets.example.com",
                "tick",
                Timer::every(Duration::from_secs(60)),
                |_: Ctx| async { Ok(()) },
            )
    }

    /// Each permission as `place group resource verbs [names]`.
    fn rules(requirements: &Requirements) -> Vec<String> {
        requirements
            .permissions
            .iter()
            .map(|p| {
                let place = match &p.place {
                    Place::Cluster => "cluster".to_string(),
                    Place::Namespace(namespace) => namespace.clone(),
                };
                let names = if p.resource_names.is_empty() {
                    String::new()
                } else {
                    format!(" {:?}", p.resource_names)
                };
                format!(
                    "{place} {:?} {} {}{names}",
                    p.group,
                    p.resource,
                    p.verbs.join(",")
                )
            })
            .collect()
    }

    async fn derive(operator: &Operator, options: &[&str]) -> Requirements {
        requirements(operator, &args(options)).await.unwrap()
    }

    fn crd(value: Value) -> CustomResourceDefinition {
        serde_json::from_value(value).unwrap()
    }

    #[tokio::test]
    async fn managed_webhooks_need_their_configurations_and_unmanaged_ones_nothing() {
        let admitting = |managed: Option<&str>| {
            let managed = managed.map(String::from);
            widgets_operator()
                .settings(move |s| s.admission.managed = managed.clone())
                .on_validate(
                    "widgets.example.com",
                    "check",
                    |_: std::sync::Arc<kactor_reactor::admission::AdmissionCtx>| async { Ok(()) },
                )
        };
        let managed = rules(&derive(&admitting(Some("auto.example.com")), &["-A"]).await);
        for plural in [
            "validatingwebhookconfigurations",
            "mutatingwebhookconfigurations",
        ] {
            let rule = format!(
                r#"cluster "admissionregistration.k8s.io" {plural} get,create,patch,delete"#
            );
            assert!(managed.contains(&rule), "{managed:#?}");
        }
        let unmanaged = rules(&derive(&admitting(None), &["-A"]).await);
        assert!(!unmanaged
            .iter()
            .any(|r| r.contains("admissionregistration")));
        let converting = widgets_operator()
            .settings(|s| s.admission.managed = Some("auto.example.com".into()))
            .convert("widgets.example.com", "v1", "v2", |w: serde_json::Value| {
                Ok(w)
            });
        let rules = rules(&derive(&converting, &["-A"]).await);
        let rule = r#"cluster "apiextensions.k8s.io" customresourcedefinitions get,patch"#;
        assert!(rules.contains(&rule.to_string()), "{rules:#?}");
    }

    #[tokio::test]
    async fn cluster_wide_operators_need_one_cluster_role() {
        let requirements = derive(&widgets_operator(), &["-A"]).await;
        assert_eq!(
            rules(&requirements),
            [
                r#"cluster "example.com" widgets list,watch,patch"#,
                r#"cluster "example.com" widgets/status patch"#,
                r#"cluster "" events create"#,
                r#"cluster "apiextensions.k8s.io" customresourcedefinitions list,watch"#,
                r#"cluster "kopf.dev" clusterkopfpeerings list,watch"#,
                r#"cluster "kopf.dev" clusterkopfpeerings get,patch ["default"]"#,
            ]
        );
        assert_eq!(requirements.user(), "system:serviceaccount:ops:my-op");
        assert!(requirements.permissions[0]
            .why
            .starts_with("widgets.example.com is handled by create_fn, update_fn, tick:"));
    }

    #[tokio::test]
    async fn creating_the_peering_object_needs_create_in_each_place_and_only_when_mandatory() {
        let requirements = derive(
            &widgets_operator(),
            &["-n", "team-a", "--peering", "ops", "--create-peering"],
        )
        .await;
        let namespaced = rules(&requirements);
        assert!(
            namespaced.contains(&r#"team-a "kopf.dev" kopfpeerings create"#.to_string()),
            "{namespaced:?}"
        );
        let cluster_wide = derive(
            &widgets_operator(),
            &["-A", "-P", "ops", "--create-peering"],
        )
        .await;
        assert!(rules(&cluster_wide)
            .contains(&r#"cluster "kopf.dev" clusterkopfpeerings create"#.to_string()));
        // Auto-detected or standalone peering creates nothing: the option needs --peering.
        for options in [
            &["-A", "--create-peering"][..],
            &["-A", "--standalone", "-P", "ops", "--create-peering"],
        ] {
            let requirements = derive(&widgets_operator(), options).await;
            assert!(
                !rules(&requirements)
                    .iter()
                    .any(|rule| rule.ends_with(" create") && rule.contains("peerings")),
                "{options:?}"
            );
        }
    }

    #[tokio::test]
    async fn exact_namespaces_need_a_role_in_each_and_a_cluster_role_for_crds() {
        let requirements = derive(&widgets_operator(), &["-n", "team-a", "-n", "team-b"]).await;
        assert_eq!(
            rules(&requirements),
            [
                r#"cluster "apiextensions.k8s.io" customresourcedefinitions list,watch"#,
                r#"team-a "example.com" widgets list,watch,patch"#,
                r#"team-a "example.com" widgets/status patch"#,
                r#"team-a "" events create"#,
                r#"team-a "kopf.dev" kopfpeerings list,watch"#,
                r#"team-a "kopf.dev" kopfpeerings get,patch ["default"]"#,
                r#"team-b "example.com" widgets list,watch,patch"#,
                r#"team-b "example.com" widgets/status patch"#,
                r#"team-b "" events create"#,
                r#"team-b "kopf.dev" kopfpeerings list,watch"#,
                r#"team-b "kopf.dev" kopfpeerings get,patch ["default"]"#,
            ]
        );
        assert!(requirements.permissions[1]
            .why
            .ends_with("(assumed namespaced; declare its CRD with Operator::crd to be sure)"));
    }

    #[tokio::test]
    async fn namespace_patterns_are_served_cluster_wide_and_follow_namespaces() {
        let requirements = derive(&widgets_operator(), &["-n", "team-*", "--standalone"]).await;
        assert_eq!(
            rules(&requirements),
            [
                r#"cluster "example.com" widgets list,watch,patch"#,
                r#"cluster "example.com" widgets/status patch"#,
                r#"cluster "" events create"#,
                r#"cluster "apiextensions.k8s.io" customresourcedefinitions list,watch"#,
                r#"cluster "" namespaces list,watch"#,
            ]
        );
        assert!(requirements.permissions[0]
            .why
            .contains("the namespaces matching team-* are known only at run time"));
    }

    #[tokio::test]
    async fn standalone_operators_need_no_peering_and_mandatory_peering_names_its_object() {
        let standalone = derive(&widgets_operator(), &["-A", "--standalone"]).await;
        assert!(!rules(&standalone).iter().any(|r| r.contains("kopf.dev")));
        let coded = derive(&widgets_operator().standalone(), &["-A"]).await;
        assert_eq!(rules(&coded), rules(&standalone));

        let mandatory = derive(&widgets_operator(), &["-n", "team-a", "--peering", "team"]).await;
        let peering: Vec<String> = rules(&mandatory)
            .into_iter()
            .filter(|r| r.contains("kopf.dev"))
            .collect();
        assert_eq!(
            peering,
            [
                r#"team-a "kopf.dev" kopfpeerings list,watch"#,
                r#"team-a "kopf.dev" kopfpeerings get,patch ["team"]"#,
            ]
        );
        assert!(mandatory.summary.contains("peering through `team`"));
    }

    #[tokio::test]
    async fn leader_election_needs_to_create_and_renew_its_lease() {
        let requirements = derive(
            &widgets_operator(),
            &[
                "-A",
                "--standalone",
                "--leader-election",
                "--lease-name",
                "my-lease",
                "--lease-namespace",
                "ops",
            ],
        )
        .await;
        let leases: Vec<String> = rules(&requirements)
            .into_iter()
            .filter(|r| r.contains("leases"))
            .collect();
        assert_eq!(
            leases,
            [
                r#"ops "coordination.k8s.io" leases create"#,
                r#"ops "coordination.k8s.io" leases get,update ["my-lease"]"#,
            ]
        );
        // Set in code rather than on the command line, the same.
        let coded = widgets_operator().leader_election(LeaseSettings::new("my-lease", "ops", "me"));
        assert_eq!(
            rules(&derive(&coded, &["-A", "--standalone"]).await),
            rules(&requirements)
        );
    }

    #[tokio::test]
    async fn a_ring_needs_every_lease_verb_in_its_namespace() {
        let requirements = derive(
            &widgets_operator(),
            &[
                "-A",
                "--standalone",
                "--shards",
                "auto",
                "--lease-namespace",
                "ops",
            ],
        )
        .await;
        let leases: Vec<String> = rules(&requirements)
            .into_iter()
            .filter(|r| r.contains("leases"))
            .collect();
        assert_eq!(
            leases,
            [r#"ops "coordination.k8s.io" leases create,delete,get,list,update,watch"#]
        );
        let coded = widgets_operator().shards(kactor_peering::sharding::RingSettings::new(
            "widgets", "ops", "me",
        ));
        assert_eq!(
            rules(&derive(&coded, &["-A", "--standalone"]).await),
            rules(&requirements)
        );
    }

    #[tokio::test]
    async fn cluster_scoped_resources_are_granted_cluster_wide_with_events_in_the_accounts_namespace(
    ) {
        let operator =
            Operator::new().on_create(("", "v1", "nodes"), "label_node", |_: Ctx| async { Ok(()) });
        let requirements = derive(&operator, &["-n", "team-a", "--standalone"]).await;
        assert_eq!(
            rules(&requirements),
            [
                r#"cluster "" nodes list,watch,patch"#,
                r#"cluster "" nodes/status patch"#,
                r#"cluster "apiextensions.k8s.io" customresourcedefinitions list,watch"#,
                r#"ops "" events create"#,
            ]
        );
        assert!(requirements.permissions[3]
            .why
            .contains("cluster-scoped objects"));
    }

    #[tokio::test]
    async fn the_handlers_own_permissions_go_where_the_operator_serves() {
        let operator = Operator::new()
            .on_create(("", "v1", "configmaps"), "copy", |_: Ctx| async { Ok(()) })
            .permission(
                "apps",
                "deployments",
                &["get", "create"],
                "each copy owns a Deployment",
            )
            .permission("", "nodes", &["list"], "placement looks at the nodes");
        let requirements =
            derive(&operator, &["-n", "team-a", "-n", "team-b", "--standalone"]).await;
        let granted = rules(&requirements);
        for expected in [
            r#"cluster "" nodes list"#,
            r#"team-a "apps" deployments get,create"#,
            r#"team-b "apps" deployments get,create"#,
        ] {
            assert!(
                granted.iter().any(|r| r == expected),
                "{expected} in {granted:?}"
            );
        }
        let why = requirements
            .permissions
            .iter()
            .find(|p| p.resource == "deployments")
            .map(|p| p.why.as_str());
        assert_eq!(why, Some("each copy owns a Deployment"));
        let everywhere = derive(&operator, &["-A", "--standalone"]).await;
        assert!(
            rules(&everywhere).contains(&r#"cluster "apps" deployments get,create"#.to_string())
        );
    }

    #[tokio::test]
    async fn declared_crds_give_plural_scope_and_status_offline() {
        let gizmos = crd(json!({
            "metadata": {"name": "gizmos.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Cluster",
                "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo", "shortNames": ["gz"]},
                "versions": [{"name": "v1", "served": true, "storage": true}],
            },
        }));
        let operator = Operator::new()
            .crd(gizmos)
            .on_create("gizmo.example.com", "create_fn", |_: Ctx| async { Ok(()) })
            .on_delete("gz.example.com", "delete_fn", |_: Ctx| async { Ok(()) });
        let requirements = derive(&operator, &["-n", "team-a", "--standalone"]).await;
        assert_eq!(
            rules(&requirements),
            [
                r#"cluster "example.com" gizmos list,watch,patch"#,
                r#"cluster "apiextensions.k8s.io" customresourcedefinitions list,watch"#,
                r#"ops "" events create"#,
            ]
        );
        assert!(requirements.permissions[0]
            .why
            .starts_with("gizmos.example.com is handled by create_fn, delete_fn:"));
    }

    #[tokio::test]
    async fn the_manifests_bind_each_role_to_the_service_account_and_say_why() {
        let operator =
            Operator::new().on_event(("", "v1", "configmaps"), "audit", |_: Ctx| async { Ok(()) });
        let requirements = derive(&operator, &["-n", "default", "--standalone"]).await;
        assert_eq!(
            requirements.to_yaml(),
            format!(
                r#"# The RBAC of the operator running as system:serviceaccount:ops:my-op, as `rbac generate` derives it from its handlers and options:
# serving the namespaces default; standalone; no leader election.
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: my-op
  namespace: ops
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: my-op
rules:
  # {crds}
  - apiGroups: [apiextensions.k8s.io]
    resources: [customresourcedefinitions]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: my-op
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: my-op
subjects:
  - kind: ServiceAccount
    name: my-op
    namespace: ops
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: my-op
  namespace: default
rules:
  # {handled}
  - apiGroups: [""]
    resources: [configmaps]
    verbs: [list, watch, patch]
  # {status}
  - apiGroups: [""]
    resources: [configmaps/status]
    verbs: [patch]
  # {events}
  - apiGroups: [""]
    resources: [events]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: my-op
  namespace: default
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: my-op
subjects:
  - kind: ServiceAccount
    name: my-op
    namespace: ops
"#,
                crds = requirements.permissions[0].why,
                handled = requirements.permissions[1].why,
                status = requirements.permissions[2].why,
                events = requirements.permissions[3].why,
            )
        );
    }

    #[test]
    fn scalars_are_quoted_when_yaml_would_read_them_otherwise() {
        for (text, expected) in [
            ("example.com", "example.com"),
            ("widgets/status", "widgets/status"),
            ("system:serviceaccounts", "system:serviceaccounts"),
            ("", r#""""#),
            ("*", r#""*""#),
            ("yes", r#""yes""#),
            ("On", r#""On""#),
            ("null", r#""null""#),
            ("123", r#""123""#),
            ("1e3", r#""1e3""#),
            ("team a", r#""team a""#),
        ] {
            assert_eq!(scalar(text), expected, "{text:?}");
            let parsed: String = serde_saphyr::from_str(&scalar(text)).unwrap();
            assert_eq!(parsed, text);
        }
    }

    async fn requirements_for_verify() -> Requirements {
        derive(
            &widgets_operator(),
            &[
                "-n",
                "default",
                "--leader-election",
                "--lease-name",
                "my-op",
                "--lease-namespace",
                "ops",
            ],
        )
        .await
    }

    #[tokio::test]
    async fn the_generated_manifests_grant_every_permission() {
        let requirements = requirements_for_verify().await;
        let verification = requirements.verify(&requirements.to_yaml()).unwrap();
        assert!(verification.is_complete(), "{verification}");
        assert!(verification.notes.is_empty());
        // Each verb (and named object) of each rule is one check.
        let checks: usize = requirements
            .permissions
            .iter()
            .map(|p| p.verbs.len() * p.resource_names.len().max(1))
            .sum();
        assert_eq!(verification.checks.len(), checks);
        assert!(verification.to_string().ends_with(&format!(
            "all {checks} permissions are present for system:serviceaccount:ops:my-op"
        )));
    }

    /// The manifests with the rules of `resource` removed from every role.
    fn without(yaml: &str, resource: &str) -> String {
        let mut documents: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap();
        for document in &mut documents {
            if let Some(rules) = document["rules"].as_array_mut() {
                rules.retain(|rule| rule["resources"][0] != resource);
            }
        }
        serde_saphyr::to_string_multiple(&documents).unwrap()
    }

    #[tokio::test]
    async fn a_removed_rule_is_reported_missing_with_why() {
        let requirements = requirements_for_verify().await;
        let manifests = without(&requirements.to_yaml(), "widgets/status");
        let verification = requirements.verify(&manifests).unwrap();
        let missing: Vec<String> = verification.missing().map(ToString::to_string).collect();
        assert_eq!(
            missing,
            [format!(
                "MISSING: patch resource \"widgets/status\" in API group \"example.com\" in the \
                 namespace \"default\" ({})",
                requirements.permissions[2].why
            )]
        );
        let error = verification.into_result().unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "1 of {} permissions are missing for system:serviceaccount:ops:my-op; grant them \
                 (`rbac generate` prints them all)",
                requirements.verify(&manifests).unwrap().checks.len()
            )
        );
    }

    fn cluster_role_for_the_operator(rules: Value) -> String {
        let documents = [
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "everything"}, "rules": rules}),
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "everything"},
                "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "everything"},
                "subjects": [{"kind": "ServiceAccount", "name": "my-op", "namespace": "ops"}],
            }),
        ];
        serde_saphyr::to_string_multiple(&documents).unwrap()
    }

    #[tokio::test]
    async fn wildcards_grant_every_verb_group_and_resource() {
        let requirements = requirements_for_verify().await;
        let all = cluster_role_for_the_operator(
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
        );
        assert!(requirements.verify(&all).unwrap().is_complete());
        // `*/status` is the status of every resource, and nothing else.
        let status = cluster_role_for_the_operator(
            json!([{"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["*"]}]),
        );
        let verification = requirements.verify(&status).unwrap();
        let present: Vec<&str> = verification
            .checks
            .iter()
            .filter(|c| c.present)
            .map(|c| c.resource.as_str())
            .collect();
        assert_eq!(present, ["widgets/status"]);
    }

    #[tokio::test]
    async fn only_rules_bound_to_the_service_account_count() {
        let requirements = requirements_for_verify().await;
        let yaml = requirements.to_yaml().replace(
            "name: my-op\n    namespace: ops",
            "name: someone-else\n    namespace: ops",
        );
        let verification = requirements.verify(&yaml).unwrap();
        assert_eq!(verification.missing().count(), verification.checks.len());
        // A Role in another namespace does not count either, nor one bound to a missing role.
        let elsewhere = requirements
            .to_yaml()
            .replace("namespace: default", "namespace: elsewhere");
        let verification = requirements.verify(&elsewhere).unwrap();
        assert!(verification
            .missing()
            .any(|c| c.resource == "widgets" && c.place == Place::Namespace("default".into())));
        let dangling = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "admin"},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "Group", "name": "system:serviceaccounts:ops"}],
        });
        let verification = requirements.verify(&dangling.to_string()).unwrap();
        assert_eq!(
            verification.notes,
            ["ClusterRoleBinding `admin` binds the ClusterRole `cluster-admin`, which is not in the \
              manifests: its rules are not counted"]
        );
    }

    #[tokio::test]
    async fn lists_as_kubectl_prints_them_are_read() {
        let requirements = requirements_for_verify().await;
        let items: Vec<Value> = serde_saphyr::from_multiple(&requirements.to_yaml()).unwrap();
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
        assert!(requirements
            .verify(&list.to_string())
            .unwrap()
            .is_complete());
    }

    #[tokio::test]
    async fn what_is_not_yaml_of_objects_is_an_error() {
        let requirements = requirements_for_verify().await;
        for text in ["[unclosed", "- a\n- b\n"] {
            let error = requirements.verify(text).unwrap_err();
            assert!(
                error
                    .to_string()
                    .starts_with("cannot read the RBAC manifests: "),
                "{error}"
            );
        }
    }
}
