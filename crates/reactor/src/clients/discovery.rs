//! Discovery: what the cluster serves ([`scan`]), and which one resource a user's name means
//! ([`Selector::resolve`]).
//!
//! Both follow Kopf (`reference/kopf.md` §1.11): the scan reads the legacy discovery documents
//! (`/api`, `/api/{version}`, `/apis`, `/apis/{group}/{version}`) of every group and version, and a
//! selector resolves against the scanned list with Kopf's rules for versions, ambiguity and the core
//! group's priority.

use futures::future::join_all;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIResource, APIResourceList};

use crate::structs::resources::{Resource, Selector};

/// Why discovery could not tell what the cluster serves.
///
/// Each message is one line that says what happened and what to do; the [`kube::Error`] behind it is
/// the [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// Nothing answered: the connection failed (refused, DNS, TLS, timeout) or the client could not
    /// authenticate before sending the request.
    #[error(
        "cannot reach the Kubernetes API: {reason}; check KUBECONFIG or the in-cluster service account"
    )]
    Unreachable {
        /// What failed, in the words of the lowest-level error (`connection refused`).
        reason: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The API server answered a discovery request with an error status.
    #[error("{}", refused_message(path, *code, message))]
    Refused {
        /// The discovery path (`/apis`).
        path: String,
        /// The HTTP status code; 0 when the server's error body was JSON but no `Status`, which
        /// kube-client cannot tell apart from a `Status` without a code.
        code: u16,
        /// The server's message, on one line (may be empty).
        message: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The server answered with something that is not a discovery document.
    #[error(
        "the server answered {path} with something that is not Kubernetes discovery ({reason}); \
         check that KUBECONFIG points at a Kubernetes API server"
    )]
    Malformed {
        /// The discovery path (`/api`).
        path: String,
        /// Why it could not be read.
        reason: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

impl DiscoveryError {
    fn new(path: &str, error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) => DiscoveryError::Refused {
                path: path.to_string(),
                code: status.code,
                message: one_line(&status.message),
                source: kube::Error::Api(status),
            },
            kube::Error::SerdeError(_) | kube::Error::FromUtf8(_) => DiscoveryError::Malformed {
                path: path.to_string(),
                reason: one_line(&error.to_string()),
                source: error,
            },
            error => DiscoveryError::Unreachable {
                reason: root_cause(&error),
                source: error,
            },
        }
    }
}

fn refused_message(path: &str, code: u16, message: &str) -> String {
    let advice = match code {
        401 => "the credentials were rejected; refresh them in KUBECONFIG or check the service account token",
        403 => "the operator's service account needs get on /api and /apis (the system:discovery ClusterRole)",
        404 => "the server does not serve discovery; check that KUBECONFIG points at a Kubernetes API server",
        429 | 500..=599 => "the API server is overloaded or unhealthy; retry later",
        _ => "check the API server's health and the operator's permissions",
    };
    let status = match status_text(code) {
        Some(text) => format!("{code} {text}"),
        None if code == 0 => "an error with no status code".to_string(),
        None => format!("HTTP {code}"),
    };
    if message.is_empty() {
        format!("the Kubernetes API refused discovery of {path} ({status}): {advice}")
    } else {
        format!("the Kubernetes API refused discovery of {path} ({status}: {message}): {advice}")
    }
}

/// The reason phrases of the statuses an API server gives discovery requests.
fn status_text(code: u16) -> Option<&'static str> {
    Some(match code {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        406 => "Not Acceptable",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => return None,
    })
}

/// The innermost error's words, as a person would say them: `connection refused`, not
/// `client error (Connect)` nor `Connection refused (os error 111)`.
fn root_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut innermost = error;
    while let Some(source) = innermost.source() {
        innermost = source;
    }
    let text = one_line(&innermost.to_string());
    let text = match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_string(),
        _ => text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) if chars.clone().next().is_some_and(char::is_lowercase) => {
            first.to_lowercase().chain(chars).collect()
        }
        _ => text,
    }
}

/// Server messages may span lines (HTML error pages from proxies); an error message must not: the
/// text on one line, whitespace folded, cut at 300 characters.
pub fn one_line(text: &str) -> String {
    const LIMIT: usize = 300;
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match text.char_indices().nth(LIMIT) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

/// Whether a group-version's failure means "this group is not usable now" rather than "discovery is
/// broken": 403 (RBAC), 404 (the group went away between the two requests), 503 (an aggregated API
/// whose backend is down, such as metrics-server).
fn is_skippable(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if matches!(status.code, 403 | 404 | 503))
}

/// One group-version to read the resources of.
struct GroupVersion {
    group: String,
    version: String,
    preferred: bool,
}

impl GroupVersion {
    fn path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    async fn fetch(&self, client: &kube::Client) -> Result<APIResourceList, kube::Error> {
        if self.group.is_empty() {
            client.list_core_api_resources(&self.version).await
        } else {
            client
                .list_api_group_resources(&format!("{}/{}", self.group, self.version))
                .await
        }
    }
}

/// Every resource the cluster serves, in every served version: what [`Selector::resolve`] resolves
/// against.
///
/// **Expected flow**
/// 1. `/api` and `/apis` are read (concurrently): the core group's versions, and every other group
///    with its versions and its `preferredVersion`.
/// 2. The resource list of every group-version is read, all concurrently.
/// 3. Each list becomes [`Resource`]s: entries named `plural/sub` are subresources and go into their
///    parent's [`subresources`](Resource::subresources) (`status`, `scale`), not into the result.
///
/// **Guarantees**
/// * [`preferred`](Resource::preferred) is true for the group's `preferredVersion` (or, if the
///   server names none, its first listed version) and, as in Kopf, for every version of the core
///   group (there is only `v1`).
/// * [`singular`](Resource::singular) is never empty: where the server gives none (built-ins before
///   Kubernetes 1.27, K3s), it is the lowercase kind, as kubectl assumes.
/// * The order is stable: the core group first, then the groups and versions in the server's order.
///
/// **Errors**
/// A failure of `/api` or `/apis`, or a group-version failing with anything but 403, 404 or 503, is a
/// [`DiscoveryError`]. A group-version failing with 403 (RBAC), 404 (deleted meanwhile) or 503 (an
/// aggregated API that is down) is left out with a warning, so one broken extension does not stop
/// the operator; its resources then resolve as not found.
///
/// **Caveats**
/// * kube's default client retries 429, 503 and 504 answers itself (up to 15 times with exponential
///   backoff), so an aggregated API that stays down delays the scan by minutes before it is skipped;
///   a client built with `default_retry = false` skips it at once.
/// * This is one snapshot: a CRD created later is found by the next scan (Kopf rescans when CRDs
///   change).
pub async fn scan(client: &kube::Client) -> Result<Vec<Resource>, DiscoveryError> {
    let (core, groups) =
        futures::future::join(client.list_core_api_versions(), client.list_api_groups()).await;
    let core = core.map_err(|error| DiscoveryError::new("/api", error))?;
    let groups = groups.map_err(|error| DiscoveryError::new("/apis", error))?;

    let mut targets: Vec<GroupVersion> = core
        .versions
        .into_iter()
        .map(|version| GroupVersion {
            group: String::new(),
            version,
            preferred: true,
        })
        .collect();
    for group in groups.groups {
        let preferred = group
            .preferred_version
            .as_ref()
            .or(group.versions.first())
            .map(|v| v.version.clone());
        for version in group.versions {
            targets.push(GroupVersion {
                preferred: preferred.as_deref() == Some(version.version.as_str()),
                group: group.name.clone(),
                version: version.version,
            });
        }
    }

    let lists = join_all(targets.iter().map(|target| target.fetch(client))).await;
    let mut resources = Vec::new();
    for (target, list) in targets.iter().zip(lists) {
        match list {
            Ok(list) => resources.extend(read_resource_list(
                &target.group,
                &target.version,
                target.preferred,
                &list.resources,
            )),
            Err(error) if is_skippable(&error) => {
                let code = match &error {
                    kube::Error::Api(status) => status.code,
                    _ => 0,
                };
                tracing::warn!(
                    path = %target.path(),
                    code,
                    error = %one_line(&error.to_string()),
                    "Discovery skips {}: the server answered {code}; its resources are not served \
                     until a rescan succeeds.",
                    target.path(),
                );
            }
            Err(error) => return Err(DiscoveryError::new(&target.path(), error)),
        }
    }
    tracing::debug!(
        resources = resources.len(),
        group_versions = targets.len(),
        "Discovery scanned the cluster."
    );
    Ok(resources)
}

/// The resources of one group-version's list, with subresources folded into their parents.
fn read_resource_list(
    group: &str,
    version: &str,
    preferred: bool,
    entries: &[APIResource],
) -> Vec<Resource> {
    let mut resources: Vec<Resource> = entries
        .iter()
        .filter(|entry| !entry.name.contains('/'))
        .map(|entry| Resource {
            group: group.to_string(),
            version: version.to_string(),
            plural: entry.name.clone(),
            kind: entry.kind.clone(),
            singular: if entry.singular_name.is_empty() {
                entry.kind.to_lowercase()
            } else {
                entry.singular_name.clone()
            },
            short_names: entry.short_names.clone().unwrap_or_default(),
            categories: entry.categories.clone().unwrap_or_default(),
            namespaced: entry.namespaced,
            preferred,
            verbs: entry.verbs.clone(),
            subresources: Vec::new(),
        })
        .collect();
    for (parent, sub) in entries
        .iter()
        .filter_map(|entry| entry.name.split_once('/'))
    {
        if let Some(resource) = resources.iter_mut().find(|r| r.plural == parent) {
            if !resource.subresources.iter().any(|s| s == sub) {
                resource.subresources.push(sub.to_string());
            }
        }
    }
    resources
}

/// Why a [`Selector`] does not resolve to exactly one servable [`Resource`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    /// Nothing served matches. As in Kopf, a selector without a version matches preferred versions
    /// only.
    #[error("{}", not_found_message(selector, *checked, in_other_versions))]
    NotFound {
        /// The selector, as the user wrote it (`gizmos`, `widgets.v2.example.com`).
        selector: String,
        /// How many resources were checked.
        checked: usize,
        /// The same name served in other versions than the selector asked for, in kubectl form.
        in_other_versions: Vec<String>,
    },
    /// Several resources match and none of them is in the core group; as in Kopf, such a selector
    /// serves none of them.
    #[error("{}", ambiguous_message(selector, matches))]
    Ambiguous {
        /// The selector, as the user wrote it.
        selector: String,
        /// Every match.
        matches: Vec<Resource>,
    },
    /// The one match cannot be listed and watched, so kactor cannot serve it (as in Kopf, which
    /// skips it).
    #[error(
        "the resource {resource} cannot be listed and watched (its verbs: {}); kactor can only serve \
         resources with the list and watch verbs",
        if resource.verbs.is_empty() { "none".to_string() } else { resource.verbs.join(", ") }
    )]
    NotWatchable {
        /// The match (boxed: it is the largest part of this error).
        resource: Box<Resource>,
    },
}

fn not_found_message(selector: &str, checked: usize, in_other_versions: &[String]) -> String {
    if in_other_versions.is_empty() {
        format!(
            "no resource \"{selector}\" is served by the cluster (checked {checked} resources); \
             is its CRD installed?"
        )
    } else {
        format!(
            "no resource \"{selector}\" is served by the cluster (checked {checked} resources), but {} \
             is; use a served version",
            in_other_versions.join(", ")
        )
    }
}

fn ambiguous_message(selector: &str, matches: &[Resource]) -> String {
    let names: Vec<String> = matches.iter().map(ToString::to_string).collect();
    let example = match matches.first() {
        Some(first) if matches.iter().filter(|r| r.group == first.group).count() == 1 => {
            if first.group.is_empty() {
                format!("{}.{}", first.plural, first.version)
            } else {
                format!("{}.{}", first.plural, first.group)
            }
        }
        Some(first) => format!(
            "({:?}, {:?}, {:?})",
            first.group, first.version, first.plural
        ),
        None => "plural.group".to_string(),
    };
    format!(
        "the resource name \"{selector}\" is ambiguous: {}; use a qualified name such as {example}",
        names.join(", ")
    )
}

impl Selector {
    /// The one resource this selector means, among those the cluster serves ([`scan`]).
    ///
    /// The rules are Kopf's (`reference/kopf.md` §1.11):
    /// * without a version, only [`preferred`](Resource::preferred) versions match;
    /// * if several resources match and some are in the core group (`""`), only those count: `pods`
    ///   is `pods.v1`, not `pods.v1beta1.metrics.k8s.io`, as in kubectl;
    /// * several matches left are [`ResolveError::Ambiguous`], none is [`ResolveError::NotFound`];
    /// * a match without the `list` and `watch` verbs is [`ResolveError::NotWatchable`].
    ///
    /// ```
    /// use kactor_reactor::resources::{Resource, Selector};
    ///
    /// # fn widgets() -> Resource {
    /// #     Resource {
    /// #         group: "example.com".into(), version: "v1".into(), plural: "widgets".into(),
    /// #         kind: "Widget".into(), singular: "widget".into(), short_names: vec!["wd".into()],
    /// #         categories: vec![], namespaced: true, preferred: true,
    /// #         verbs: vec!["list".into(), "watch".into()], subresources: vec![],
    /// #     }
    /// # }
    /// let served = vec![widgets()];
    /// let resource = Selector::parse("wd").resolve(&served).unwrap();
    /// assert_eq!(resource.to_string(), "widgets.v1.example.com");
    /// ```
    pub fn resolve<'a>(&self, resources: &'a [Resource]) -> Result<&'a Resource, ResolveError> {
        let mut matches: Vec<&Resource> = resources.iter().filter(|r| self.matches(r)).collect();
        if self.version.is_none() {
            // Each resource in its preferred version; one its group does not serve in the group's
            // preferred version (another kind of the group moved on to v2) in the versions it has,
            // as Kopf selects.
            let preferred: Vec<(&str, &str)> = matches
                .iter()
                .filter(|r| r.preferred)
                .map(|r| (r.group.as_str(), r.plural.as_str()))
                .collect();
            matches.retain(|r| {
                r.preferred || !preferred.contains(&(r.group.as_str(), r.plural.as_str()))
            });
        }
        if matches.iter().any(|r| r.group.is_empty()) {
            matches.retain(|r| r.group.is_empty());
        }
        match matches.as_slice() {
            [] => {
                let any_version = Selector {
                    version: None,
                    ..self.clone()
                };
                Err(ResolveError::NotFound {
                    selector: self.to_string(),
                    checked: resources.len(),
                    in_other_versions: resources
                        .iter()
                        .filter(|r| any_version.matches(r))
                        .map(ToString::to_string)
                        .collect(),
                })
            }
            [one] if one.is_watchable() => Ok(one),
            [one] => Err(ResolveError::NotWatchable {
                resource: Box::new((*one).clone()),
            }),
            many => Err(ResolveError::Ambiguous {
                selector: self.to_string(),
                matches: many.iter().map(|r| (*r).clone()).collect(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(group: &str, version: &str, plural: &str, kind: &str, preferred: bool) -> Resource {
        Resource {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            kind: kind.into(),
            singular: kind.to_lowercase(),
            short_names: vec![],
            categories: vec![],
            namespaced: true,
            preferred,
            verbs: ["get", "list", "watch", "patch"].map(String::from).to_vec(),
            subresources: vec![],
        }
    }

    fn served() -> Vec<Resource> {
        vec![
            resource("", "v1", "pods", "Pod", true),
            resource("", "v1", "configmaps", "ConfigMap", true),
            resource("metrics.k8s.io", "v1beta1", "pods", "PodMetrics", true),
            resource("example.com", "v1", "widgets", "Widget", true),
            resource("example.com", "v1beta1", "widgets", "Widget", false),
        ]
    }

    fn resolve(
        selector: impl Into<Selector>,
        resources: &[Resource],
    ) -> Result<&Resource, ResolveError> {
        selector.into().resolve(resources)
    }

    #[test]
    fn names_without_a_version_resolve_in_the_preferred_version_only() {
        let served = served();
        assert_eq!(resolve("widgets", &served).unwrap().version, "v1");
        assert_eq!(resolve("Widget", &served).unwrap().version, "v1");
        assert_eq!(
            resolve("widgets.example.com", &served).unwrap().version,
            "v1"
        );
        assert_eq!(
            resolve(("example.com", "widgets"), &served)
                .unwrap()
                .version,
            "v1"
        );
    }

    #[test]
    fn a_kind_its_group_serves_only_outside_the_preferred_version_resolves_there() {
        // Gadgets moved the group on to v2; widgets are served in v1 only.
        let served = vec![
            resource("example.com", "v1", "widgets", "Widget", false),
            resource("example.com", "v1", "gadgets", "Gadget", false),
            resource("example.com", "v2", "gadgets", "Gadget", true),
        ];
        assert_eq!(
            resolve("widgets.example.com", &served).unwrap().version,
            "v1"
        );
        assert_eq!(
            resolve("gadgets.example.com", &served).unwrap().version,
            "v2"
        );
        // Two versions and none preferred: which one is the user's to say.
        let two = vec![
            resource("example.com", "v1", "widgets", "Widget", false),
            resource("example.com", "v2", "widgets", "Widget", false),
        ];
        assert!(matches!(
            resolve("widgets", &two),
            Err(ResolveError::Ambiguous { .. })
        ));
    }

    #[test]
    fn names_with_a_version_resolve_in_that_version_even_if_not_preferred() {
        let served = served();
        assert_eq!(
            resolve("widgets.v1beta1.example.com", &served)
                .unwrap()
                .version,
            "v1beta1"
        );
        assert_eq!(
            resolve(("example.com", "v1beta1", "widgets"), &served)
                .unwrap()
                .version,
            "v1beta1"
        );
    }

    #[test]
    fn the_core_group_wins_over_other_groups_with_the_same_name() {
        let served = served();
        let pods = resolve("pods", &served).unwrap();
        assert_eq!(pods.to_string(), "pods.v1");
        assert_eq!(
            resolve("pods.metrics.k8s.io", &served).unwrap().kind,
            "PodMetrics"
        );
    }

    #[test]
    fn the_same_kind_in_two_groups_is_ambiguous_and_the_message_lists_both() {
        let mut served = served();
        served.push(resource("example.org", "v1", "widgets", "Widget", true));
        let error = resolve("Widget", &served).unwrap_err();
        let ResolveError::Ambiguous { matches, .. } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(matches.len(), 2);
        assert_eq!(
            error.to_string(),
            "the resource name \"Widget\" is ambiguous: widgets.v1.example.com, widgets.v1.example.org; \
             use a qualified name such as widgets.example.com"
        );
        assert_eq!(
            resolve("widgets.example.org", &served).unwrap().group,
            "example.org"
        );
    }

    #[test]
    fn two_matches_in_one_group_suggest_the_exact_triple() {
        let mut served = served();
        let mut gadgets = resource("example.com", "v1", "gadgets", "Gadget", true);
        gadgets.short_names = vec!["widget".into()];
        served.push(gadgets);
        let message = resolve("widget", &served).unwrap_err().to_string();
        assert!(
            message.ends_with("such as (\"example.com\", \"v1\", \"widgets\")"),
            "{message}"
        );
    }

    #[test]
    fn unknown_names_are_not_found_and_the_message_asks_about_the_crd() {
        let served = served();
        let error = resolve("gizmos", &served).unwrap_err();
        assert_eq!(
            error.to_string(),
            "no resource \"gizmos\" is served by the cluster (checked 5 resources); is its CRD installed?"
        );
    }

    #[test]
    fn an_unserved_version_is_not_found_and_the_message_names_the_served_ones() {
        let served = served();
        let error = resolve("widgets.v2.example.com", &served).unwrap_err();
        assert_eq!(
            error.to_string(),
            "no resource \"widgets.v2.example.com\" is served by the cluster (checked 5 resources), \
             but widgets.v1.example.com, widgets.v1beta1.example.com is; use a served version"
        );
    }

    #[test]
    fn a_resource_without_list_and_watch_is_not_watchable() {
        let mut bindings = resource("", "v1", "bindings", "Binding", true);
        bindings.verbs = vec!["create".into()];
        let served = vec![bindings];
        let error = resolve("bindings", &served).unwrap_err();
        assert!(matches!(error, ResolveError::NotWatchable { .. }));
        assert_eq!(
            error.to_string(),
            "the resource bindings.v1 cannot be listed and watched (its verbs: create); kactor can only \
             serve resources with the list and watch verbs"
        );
    }

    fn entry(name: &str, kind: &str, singular: &str) -> APIResource {
        APIResource {
            name: name.into(),
            kind: kind.into(),
            singular_name: singular.into(),
            namespaced: true,
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..APIResource::default()
        }
    }

    #[test]
    fn subresources_fold_into_their_parent_and_are_not_resources() {
        let entries = vec![
            entry("widgets", "Widget", "widget"),
            entry("widgets/status", "Widget", ""),
            entry("widgets/scale", "Scale", ""),
        ];
        let resources = read_resource_list("example.com", "v1", true, &entries);
        assert_eq!(resources.len(), 1);
        assert_eq!(resources[0].subresources, vec!["status", "scale"]);
        assert!(resources[0].has_status());
        assert!(resources[0].preferred);
    }

    #[test]
    fn an_empty_singular_name_falls_back_to_the_lowercase_kind() {
        let resources = read_resource_list("", "v1", true, &[entry("configmaps", "ConfigMap", "")]);
        assert_eq!(resources[0].singular, "configmap");
    }

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "Forbidden")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn only_forbidden_missing_and_unavailable_groups_are_skipped() {
        for code in [403, 404, 503] {
            assert!(is_skippable(&api_error(code, "")), "{code}");
        }
        for code in [0, 401, 429, 500] {
            assert!(!is_skippable(&api_error(code, "")), "{code}");
        }
    }

    #[test]
    fn a_refused_discovery_says_what_permission_is_missing_on_one_line() {
        let error = DiscoveryError::new(
            "/apis",
            api_error(
                403,
                "forbidden: User \"system:anonymous\"\ncannot get path \"/apis\"",
            ),
        );
        assert_eq!(
            error.to_string(),
            "the Kubernetes API refused discovery of /apis (403 Forbidden: forbidden: User \
             \"system:anonymous\" cannot get path \"/apis\"): the operator's service account needs get \
             on /api and /apis (the system:discovery ClusterRole)"
        );
    }

    #[test]
    fn root_causes_read_as_plain_words() {
        let io = std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused (os error 111)",
        );
        assert_eq!(root_cause(&io), "connection refused");
    }

    /// Against the emulator, over real HTTP with the real client.
    mod emulated {
        use super::*;
        use kactor_emulator::{samples, Emulator};
        use kube::api::{Api, DynamicObject, PostParams};
        use serde_json::{json, Value};

        async fn create_crd(client: &kube::Client, crd: Value) {
            let api: Api<DynamicObject> =
                Api::all_with(client.clone(), &samples::crd_api_resource());
            api.create(
                &PostParams::default(),
                &serde_json::from_value(crd).unwrap(),
            )
            .await
            .unwrap();
        }

        /// The sample `widgets` CRD, in another group.
        fn widget_crd_in(group: &str) -> Value {
            let mut crd = samples::widget_crd();
            crd["metadata"]["name"] = json!(format!("widgets.{group}"));
            crd["spec"]["group"] = json!(group);
            crd
        }

        fn find<'a>(
            resources: &'a [Resource],
            group: &str,
            version: &str,
            plural: &str,
        ) -> &'a Resource {
            resources
                .iter()
                .find(|r| r.group == group && r.version == version && r.plural == plural)
                .unwrap_or_else(|| panic!("{plural}.{version}.{group} is not in {resources:#?}"))
        }

        #[tokio::test]
        async fn scan_finds_built_ins_with_their_short_names_and_groups() {
            let emulator = Emulator::start().await.unwrap();
            let resources = scan(&emulator.client()).await.unwrap();

            let configmaps = find(&resources, "", "v1", "configmaps");
            assert_eq!(configmaps.kind, "ConfigMap");
            assert_eq!(configmaps.short_names, ["cm"]);
            assert!(configmaps.preferred && configmaps.namespaced && configmaps.is_watchable());

            let deployments = find(&resources, "apps", "v1", "deployments");
            assert_eq!(deployments.kind, "Deployment");
            assert!(deployments.preferred && deployments.has_status());
            assert_eq!(deployments.api_version(), "apps/v1");

            assert!(!find(&resources, "", "v1", "namespaces").namespaced);
            assert!(resources
                .iter()
                .all(|r| !r.plural.contains('/') && !r.singular.is_empty()));
        }

        #[tokio::test]
        async fn scan_finds_a_crds_resource_right_after_the_crd_is_created() {
            let emulator = Emulator::start().await.unwrap();
            let client = emulator.client();
            let before = scan(&client).await.unwrap();
            assert!(!before.iter().any(|r| r.group == "example.com"));

            create_crd(&client, samples::widget_crd()).await;
            let after = scan(&client).await.unwrap();
            let widgets = find(&after, "example.com", "v1", "widgets");
            assert_eq!(widgets.kind, "Widget");
            assert_eq!(widgets.singular, "widget");
            assert_eq!(widgets.short_names, ["wd"]);
            assert_eq!(widgets.categories, ["all"]);
            assert_eq!(widgets.subresources, ["status"]);
            assert!(
                widgets.preferred
                    && widgets.namespaced
                    && widgets.has_status()
                    && widgets.is_watchable()
            );
            assert_eq!(after.len(), before.len() + 1);
        }

        #[tokio::test]
        async fn a_crd_with_two_versions_is_preferred_in_the_newest_stable_one() {
            let emulator = Emulator::start().await.unwrap();
            let client = emulator.client();
            let mut crd = samples::widget_crd();
            let mut beta = crd["spec"]["versions"][0].clone();
            beta["name"] = json!("v1beta1");
            beta["storage"] = json!(false);
            crd["spec"]["versions"]
                .as_array_mut()
                .unwrap()
                .insert(0, beta);
            create_crd(&client, crd).await;

            let resources = scan(&client).await.unwrap();
            assert!(find(&resources, "example.com", "v1", "widgets").preferred);
            assert!(!find(&resources, "example.com", "v1beta1", "widgets").preferred);
            assert_eq!(
                Selector::parse("widgets")
                    .resolve(&resources)
                    .unwrap()
                    .version,
                "v1"
            );
            let beta = Selector::parse("widgets.v1beta1.example.com")
                .resolve(&resources)
                .unwrap();
            assert_eq!(beta.version, "v1beta1");
        }

        #[tokio::test]
        async fn selectors_resolve_every_name_users_write() {
            let emulator = Emulator::start().await.unwrap();
            let client = emulator.client();
            create_crd(&client, samples::widget_crd()).await;
            let resources = scan(&client).await.unwrap();

            let mut selectors: Vec<Selector> = [
                "wd",
                "Widget",
                "widget",
                "widgets",
                "widgets.example.com",
                "widgets.v1.example.com",
            ]
            .into_iter()
            .map(Selector::parse)
            .collect();
            selectors.push(Selector::new("example.com", "v1", "widgets"));
            selectors.push(("example.com/v1", "widgets").into());
            selectors.push(("example.com", "widgets").into());
            for selector in selectors {
                let resolved = selector.resolve(&resources);
                assert_eq!(
                    resolved.map(ToString::to_string),
                    Ok("widgets.v1.example.com".to_string()),
                    "{selector}"
                );
            }

            let configmaps =
                Selector::of::<k8s_openapi::api::core::v1::ConfigMap>().resolve(&resources);
            assert_eq!(configmaps.unwrap().to_string(), "configmaps.v1");
            for name in ["pods", "pods.v1", "Pod", "pod", "po"] {
                assert_eq!(
                    Selector::parse(name)
                        .resolve(&resources)
                        .unwrap()
                        .to_string(),
                    "pods.v1",
                    "{name}"
                );
            }
            for name in [
                "deployments.v1.apps",
                "deployments.apps",
                "deploy",
                "Deployment",
            ] {
                let resolved = Selector::parse(name).resolve(&resources).unwrap();
                assert_eq!(resolved.to_string(), "deployments.v1.apps", "{name}");
            }
        }

        #[tokio::test]
        async fn two_crds_with_the_same_kind_make_the_bare_kind_ambiguous() {
            let emulator = Emulator::start().await.unwrap();
            let client = emulator.client();
            create_crd(&client, samples::widget_crd()).await;
            create_crd(&client, widget_crd_in("example.org")).await;
            let resources = scan(&client).await.unwrap();

            for name in ["Widget", "widgets", "wd"] {
                let error = Selector::parse(name).resolve(&resources).unwrap_err();
                assert!(
                    matches!(error, ResolveError::Ambiguous { .. }),
                    "{name}: {error:?}"
                );
                let message = error.to_string();
                assert!(
                    message.contains("widgets.v1.example.com")
                        && message.contains("widgets.v1.example.org"),
                    "{message}"
                );
                assert!(
                    message.contains("use a qualified name such as widgets.example."),
                    "{message}"
                );
            }
            let org = Selector::parse("widgets.example.org")
                .resolve(&resources)
                .unwrap();
            assert_eq!(org.group, "example.org");
        }

        #[tokio::test]
        async fn a_crd_whose_plural_is_pods_does_not_make_pods_ambiguous() {
            let emulator = Emulator::start().await.unwrap();
            let client = emulator.client();
            let mut crd = widget_crd_in("metrics.example.com");
            crd["metadata"]["name"] = json!("pods.metrics.example.com");
            crd["spec"]["names"] =
                json!({"plural": "pods", "singular": "pod", "kind": "PodMetrics"});
            create_crd(&client, crd).await;
            let resources = scan(&client).await.unwrap();

            assert_eq!(
                Selector::parse("pods")
                    .resolve(&resources)
                    .unwrap()
                    .to_string(),
                "pods.v1"
            );
            let metrics = Selector::parse("pods.metrics.example.com")
                .resolve(&resources)
                .unwrap();
            assert_eq!(metrics.kind, "PodMetrics");
        }

        #[tokio::test]
        async fn a_name_nothing_serves_is_not_found() {
            let emulator = Emulator::start().await.unwrap();
            let resources = scan(&emulator.client()).await.unwrap();
            let error = Selector::parse("gizmos").resolve(&resources).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!(
                    "no resource \"gizmos\" is served by the cluster (checked {} resources); is its CRD installed?",
                    resources.len()
                )
            );
        }

        #[tokio::test]
        async fn an_unreachable_api_is_a_one_line_discovery_error() {
            let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
            let client = kube::Client::try_from(config).unwrap();
            let error = scan(&client).await.unwrap_err();
            let message = error.to_string();
            assert!(
                matches!(error, DiscoveryError::Unreachable { .. }),
                "{error:?}"
            );
            assert_eq!(
                message,
                "cannot reach the Kubernetes API: connection refused; check KUBECONFIG or the in-cluster \
                 service account"
            );
        }
    }

    /// Against a fake API server that gives fixed answers per path: for the answers the emulator
    /// never gives (a failing group, a refused `/apis`).
    mod fake_server {
        use super::*;
        use serde_json::{json, Value};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        fn status(code: u16, reason: &str) -> Value {
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
                   "message": format!("{reason} (fake)")})
        }

        fn list(group_version: &str, plural: &str, kind: &str) -> Value {
            json!({"kind": "APIResourceList", "groupVersion": group_version, "resources": [
                {"name": plural, "singularName": "", "namespaced": true, "kind": kind, "verbs": ["list", "watch"]},
            ]})
        }

        /// A cluster with configmaps, `widgets.example.com` and `pods.metrics.k8s.io`, with
        /// `answer` for the metrics group's resource list.
        fn routes(metrics: (u16, Value)) -> Vec<(&'static str, u16, Value)> {
            vec![
                (
                    "/api",
                    200,
                    json!({"kind": "APIVersions", "versions": ["v1"]}),
                ),
                ("/api/v1", 200, list("v1", "configmaps", "ConfigMap")),
                (
                    "/apis",
                    200,
                    json!({"kind": "APIGroupList", "groups": [
                        {"name": "example.com", "versions": [{"groupVersion": "example.com/v1", "version": "v1"}],
                         "preferredVersion": {"groupVersion": "example.com/v1", "version": "v1"}},
                        {"name": "metrics.k8s.io", "versions": [{"groupVersion": "metrics.k8s.io/v1beta1", "version": "v1beta1"}],
                         "preferredVersion": {"groupVersion": "metrics.k8s.io/v1beta1", "version": "v1beta1"}},
                    ]}),
                ),
                (
                    "/apis/example.com/v1",
                    200,
                    list("example.com/v1", "widgets", "Widget"),
                ),
                ("/apis/metrics.k8s.io/v1beta1", metrics.0, metrics.1),
            ]
        }

        /// Serves `routes` (404 elsewhere), one request per connection; a client without kube's
        /// retries, so that a 503 is seen at once.
        async fn fake_api(routes: Vec<(&'static str, u16, Value)>) -> kube::Client {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(async move {
                while let Ok((mut stream, _)) = listener.accept().await {
                    let routes = routes.clone();
                    tokio::spawn(async move {
                        let mut head = Vec::new();
                        let mut chunk = [0u8; 1024];
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let head = String::from_utf8_lossy(&head);
                        let path = head.split_whitespace().nth(1).unwrap_or("/");
                        let (code, body) = routes
                            .iter()
                            .find(|(p, ..)| *p == path)
                            .map_or((404, status(404, "NotFound")), |(_, code, body)| {
                                (*code, body.clone())
                            });
                        let body = body.to_string();
                        let response = format!(
                            "HTTP/1.1 {code} Fake\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                             Connection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = stream.write_all(response.as_bytes()).await;
                    });
                }
            });
            let mut config = kube::Config::new(url.parse().unwrap());
            config.default_retry = false;
            kube::Client::try_from(config).unwrap()
        }

        #[tokio::test]
        async fn scan_skips_a_group_that_is_forbidden_gone_or_unavailable() {
            for (code, reason) in [
                (403, "Forbidden"),
                (404, "NotFound"),
                (503, "ServiceUnavailable"),
            ] {
                let client = fake_api(routes((code, status(code, reason)))).await;
                let resources = scan(&client).await.unwrap();
                let names: Vec<String> = resources.iter().map(ToString::to_string).collect();
                assert_eq!(names, ["configmaps.v1", "widgets.v1.example.com"], "{code}");
                assert_eq!(resources[0].singular, "configmap");
            }
        }

        /// kube-client reads any JSON error body as a `Status`, so one that is not (a proxy's
        /// `{"error": ...}`) loses its HTTP code: the group cannot be known to be skippable.
        #[tokio::test]
        async fn a_json_error_that_is_no_status_fails_the_scan_without_a_code() {
            let client = fake_api(routes((403, json!({"error": "nope"})))).await;
            let error = scan(&client).await.unwrap_err();
            assert!(
                matches!(error, DiscoveryError::Refused { code: 0, .. }),
                "{error:?}"
            );
            assert_eq!(
                error.to_string(),
                "the Kubernetes API refused discovery of /apis/metrics.k8s.io/v1beta1 (an error with no \
                 status code): check the API server's health and the operator's permissions"
            );
        }

        #[tokio::test]
        async fn scan_fails_when_a_group_fails_otherwise() {
            let client = fake_api(routes((500, status(500, "InternalError")))).await;
            let error = scan(&client).await.unwrap_err();
            assert_eq!(
                error.to_string(),
                "the Kubernetes API refused discovery of /apis/metrics.k8s.io/v1beta1 (500 Internal Server \
                 Error: InternalError (fake)): the API server is overloaded or unhealthy; retry later"
            );
        }

        #[tokio::test]
        async fn a_refused_group_list_is_a_one_line_discovery_error() {
            let mut routes = routes((200, list("metrics.k8s.io/v1beta1", "pods", "PodMetrics")));
            routes[2] = ("/apis", 403, status(403, "Forbidden"));
            let client = fake_api(routes).await;
            let error = scan(&client).await.unwrap_err();
            assert!(
                matches!(error, DiscoveryError::Refused { code: 403, .. }),
                "{error:?}"
            );
            assert_eq!(
                error.to_string(),
                "the Kubernetes API refused discovery of /apis (403 Forbidden: Forbidden (fake)): the \
                 operator's service account needs get on /api and /apis (the system:discovery ClusterRole)"
            );
        }

        #[tokio::test]
        async fn an_answer_that_is_not_discovery_is_malformed() {
            let mut routes = routes((200, list("metrics.k8s.io/v1beta1", "pods", "PodMetrics")));
            routes[0] = ("/api", 200, json!(["not", "discovery"]));
            let client = fake_api(routes).await;
            let error = scan(&client).await.unwrap_err();
            assert!(
                matches!(error, DiscoveryError::Malformed { .. }),
                "{error:?}"
            );
            assert!(error.to_string().starts_with(
                "the server answered /api with something that is not Kubernetes discovery ("
            ));
        }
    }
}
