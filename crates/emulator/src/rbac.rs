//! RBAC mode: every request is authorized as the API server's RBAC authorizer does, by the Roles,
//! ClusterRoles, RoleBindings and ClusterRoleBindings stored in the emulator, so that a permission
//! an operator lacks is caught before a cluster does.
//!
//! **Expected flow** of a request ([`check`]):
//! 1. the bearer token says who sends it (`auth.rs`): the administrator, a service account, or an
//!    anonymous user; a token the emulator does not know is a 401;
//! 2. the path, method and query give the request's attributes ([`Attributes::of`]), as the API
//!    server's `RequestInfo`: verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
//!    `deletecollection`), API group, resource, subresource, namespace and name (a list or watch
//!    with the field selector `metadata.name=NAME` names that object);
//! 3. discovery, OpenAPI, `/version` and the health paths are open to everyone; members of
//!    `system:masters` (the administrator) may do anything;
//! 4. otherwise a rule must allow it: a rule of a ClusterRole bound by a ClusterRoleBinding (in every
//!    namespace and at the cluster scope), or of a Role or ClusterRole bound by a RoleBinding in the
//!    request's namespace. A rule allows when its `verbs`, `apiGroups` and `resources` (`plural`, or
//!    `plural/subresource`, or `*/subresource`) contain the request's, or `*`, and its
//!    `resourceNames` are empty or contain the request's name (so a rule with names never allows a
//!    `create`, nor a `list` without a name);
//! 5. a denial is the API server's 403: `widgets.example.com "w1" is forbidden: User
//!    "system:serviceaccount:ops:my-op" cannot patch resource "widgets/status" in API group
//!    "example.com" in the namespace "default"`.
//!
//! **Caveats**: ClusterRoles with an `aggregationRule` count only the rules written in them (no
//! controller aggregates them); nothing prevents privilege escalation through writing RBAC objects
//! (the API server refuses to grant what the writer does not have); an open watch is not closed when a
//! permission is revoked (as on a cluster).

use std::collections::HashMap;

use hyper::Method;
use serde_json::{json, Value};

use crate::auth::User;
use crate::registry::GroupResource;
use crate::status::{ApiError, ApiResult};
use crate::store::State;

/// The RBAC API group.
const GROUP: &str = "rbac.authorization.k8s.io";

/// What the authorizer is asked about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attributes {
    /// A request for objects, under `/api/v1/...` or `/apis/<group>/<version>/...`.
    Resource(ResourceAttributes),
    /// Any other path (discovery, OpenAPI, health, the emulator's own `/_emulator`).
    NonResource {
        /// The lowercase HTTP method (`get`, `post`, ...), as RBAC's non-resource verbs.
        verb: String,
        /// The path, with its leading `/`.
        path: String,
    },
}

/// The attributes of a resource request, as the API server's `RequestInfo` has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResourceAttributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete` or `deletecollection`.
    pub verb: String,
    /// The API group, `""` for the core group.
    pub group: String,
    /// The plural (`widgets`).
    pub resource: String,
    /// The subresource (`status`), or `""`.
    pub subresource: String,
    /// The namespace, or `""` for a cluster-scoped or all-namespaces request.
    pub namespace: String,
    /// The object's name, or `""` for a collection.
    pub name: String,
}

impl ResourceAttributes {
    /// `plural/subresource`, or the plural: what RBAC rules name.
    fn combined(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

impl Attributes {
    /// The attributes of a request, from its method, path segments (decoded) and query.
    pub(crate) fn of(method: &Method, segments: &[&str], query: &HashMap<String, String>) -> Self {
        let (group, rest) = match segments {
            ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
            ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
            _ => {
                return Attributes::NonResource {
                    verb: method.as_str().to_ascii_lowercase(),
                    path: format!("/{}", segments.join("/")),
                }
            }
        };
        // `namespaces/<ns>/<plural>/...` is in a namespace; `namespaces/<ns>[/status|/finalize]` is
        // the namespace itself, whose namespace is its own name (as on the API server).
        let (namespace, parts) = match rest {
            ["namespaces", namespace, resource, more @ ..]
                if !matches!(*resource, "status" | "finalize") =>
            {
                let mut parts = vec![*resource];
                parts.extend_from_slice(more);
                (*namespace, parts)
            }
            ["namespaces", namespace, ..] => (*namespace, rest.to_vec()),
            _ => ("", rest.to_vec()),
        };
        let name = parts.get(1).copied().unwrap_or_default();
        let collection = name.is_empty();
        let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
        let verb = match verb(method, collection, watch) {
            Some(verb) => verb.to_string(),
            None => method.as_str().to_ascii_lowercase(),
        };
        let name = if collection && (verb == "list" || verb == "watch") {
            query
                .get("fieldSelector")
                .and_then(|selector| exact_name(selector))
                .unwrap_or_default()
        } else {
            name.to_string()
        };
        Attributes::Resource(ResourceAttributes {
            verb,
            group: group.to_string(),
            resource: parts[0].to_string(),
            subresource: parts.get(2).copied().unwrap_or_default().to_string(),
            namespace: namespace.to_string(),
            name,
        })
    }
}

/// The Kubernetes verb of a request on a resource, as the API server's authorizer names it: a
/// collection is listed, watched, created into or deleted as a whole; a named object (or its
/// subresource) is got, created (a subresource such as `eviction`), updated, patched or deleted.
/// None for other methods.
pub(crate) fn verb(method: &Method, collection: bool, watch: bool) -> Option<&'static str> {
    Some(match *method {
        Method::GET | Method::HEAD if collection && watch => "watch",
        Method::GET | Method::HEAD if collection => "list",
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if collection => "deletecollection",
        Method::DELETE => "delete",
        _ => return None,
    })
}

/// The name a field selector requires exactly (`metadata.name=NAME` or `==`), as the API server
/// reads it for list and watch requests.
fn exact_name(selector: &str) -> Option<String> {
    selector.split(',').find_map(|term| {
        let (field, value) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .filter(|(field, _)| !field.ends_with('!'))?;
        (field.trim() == "metadata.name").then(|| value.trim().to_string())
    })
}

/// Whether a request is allowed: `Ok`, or the API server's 401 or 403.
pub(crate) fn check(
    state: &State,
    authorization: Option<&str>,
    attributes: &Attributes,
) -> ApiResult<()> {
    let user = crate::auth::authenticate(authorization, state)?;
    if user.is_superuser() {
        return Ok(());
    }
    let policy = Policy::of(state);
    match attributes {
        Attributes::NonResource { path, .. } if is_open(path) => Ok(()),
        // Asking what one may do is open to every user (the `system:basic-user` ClusterRole).
        Attributes::Resource(request) if is_self_review(request) => Ok(()),
        Attributes::NonResource { verb, path } => {
            if policy.allows_path(&user, verb, path) {
                Ok(())
            } else {
                Err(ApiError::forbidden(format!(
                    "forbidden: User \"{}\" cannot {verb} path \"{path}\"",
                    user.name
                )))
            }
        }
        Attributes::Resource(request) => {
            if policy.allows(&user, request) {
                Ok(())
            } else {
                Err(forbidden(&user, request))
            }
        }
    }
}

/// Whether a request creates a SelfSubjectAccessReview or SelfSubjectRulesReview.
fn is_self_review(request: &ResourceAttributes) -> bool {
    request.group == "authorization.k8s.io"
        && matches!(
            request.resource.as_str(),
            "selfsubjectaccessreviews" | "selfsubjectrulesreviews"
        )
        && request.verb == "create"
}

/// A `SelfSubjectAccessReview` (`kubectl auth can-i`): the review, with `status.allowed` for the
/// requesting user, as the RBAC mode decides it (without RBAC, everything is allowed).
pub(crate) fn self_review(
    state: &State,
    rbac: bool,
    authorization: Option<&str>,
    mut review: Value,
) -> ApiResult<Value> {
    if review["kind"] != "SelfSubjectAccessReview" {
        return Err(ApiError::bad_request(
            "the body must be a SelfSubjectAccessReview of authorization.k8s.io/v1",
        ));
    }
    let spec = &review["spec"];
    let allowed = if let Some(resource) = spec.get("resourceAttributes").filter(|r| r.is_object()) {
        let field = |name: &str| resource[name].as_str().unwrap_or_default().to_string();
        let request = ResourceAttributes {
            verb: field("verb"),
            group: field("group"),
            resource: field("resource"),
            subresource: field("subresource"),
            namespace: field("namespace"),
            name: field("name"),
        };
        if request.verb.is_empty() || request.resource.is_empty() {
            return Err(invalid_review("verb and resource are required"));
        }
        let user = crate::auth::authenticate(authorization, state)?;
        !rbac || user.is_superuser() || Policy::of(state).allows(&user, &request)
    } else if let Some(path) = spec.get("nonResourceAttributes").filter(|r| r.is_object()) {
        let verb = path["verb"].as_str().unwrap_or_default();
        let path = path["path"].as_str().unwrap_or_default();
        let user = crate::auth::authenticate(authorization, state)?;
        !rbac
            || user.is_superuser()
            || is_open(path)
            || Policy::of(state).allows_path(&user, verb, path)
    } else {
        return Err(invalid_review(
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    };
    review["status"] = if allowed {
        json!({"allowed": true, "reason": if rbac { "RBAC: allowed" } else { "the emulator's RBAC mode is off" }})
    } else {
        json!({"allowed": false})
    };
    if review.get("metadata").is_none_or(Value::is_null) {
        review["metadata"] = json!({});
    }
    Ok(review)
}

/// The 422 of a review without what it asks about.
fn invalid_review(message: &str) -> ApiError {
    ApiError::invalid(
        "authorization.k8s.io",
        "SelfSubjectAccessReview",
        "",
        vec![crate::status::Cause::new(
            "FieldValueRequired",
            "spec.resourceAttributes",
            message.to_string(),
        )],
    )
}

/// Whether a non-resource path is open to every user: discovery, OpenAPI, the version and health.
fn is_open(path: &str) -> bool {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("");
    matches!(
        first,
        "" | "api" | "apis" | "openapi" | "version" | "healthz" | "livez" | "readyz"
    )
}

/// The API server's 403 for a resource request, with its message and details.
fn forbidden(user: &User, request: &ResourceAttributes) -> ApiError {
    let qualified = if request.group.is_empty() {
        request.resource.clone()
    } else {
        format!("{}.{}", request.resource, request.group)
    };
    let place = if request.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", request.namespace)
    };
    let reason = format!(
        "User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {place}",
        user.name,
        request.verb,
        request.combined(),
        request.group,
    );
    let message = if request.name.is_empty() {
        format!("{qualified} is forbidden: {reason}")
    } else {
        format!("{qualified} \"{}\" is forbidden: {reason}", request.name)
    };
    let mut details = json!({"name": request.name, "kind": request.resource});
    if !request.group.is_empty() {
        details["group"] = json!(request.group);
    }
    ApiError {
        details: Some(details),
        ..ApiError::forbidden(message)
    }
}

/// The RBAC objects, indexed for one authorization.
#[derive(Debug, Default)]
pub(crate) struct Policy<'a> {
    cluster_roles: HashMap<&'a str, &'a Value>,
    roles: HashMap<(&'a str, &'a str), &'a Value>,
    cluster_role_bindings: Vec<&'a Value>,
    role_bindings: Vec<&'a Value>,
}

impl<'a> Policy<'a> {
    /// The RBAC objects stored in the emulator.
    pub(crate) fn of(state: &'a State) -> Self {
        let objects = [
            "clusterroles",
            "roles",
            "clusterrolebindings",
            "rolebindings",
        ]
        .into_iter()
        .flat_map(|plural| state.objects(&GroupResource::new(GROUP, plural)))
        .map(|object| &**object);
        Policy::new(objects)
    }

    /// A policy of these objects (others are ignored).
    pub(crate) fn new(objects: impl IntoIterator<Item = &'a Value>) -> Self {
        let mut policy = Policy::default();
        for object in objects {
            let name = text(&object["metadata"]["name"]);
            let namespace = text(&object["metadata"]["namespace"]);
            match text(&object["kind"]) {
                "ClusterRole" => {
                    policy.cluster_roles.insert(name, object);
                }
                "Role" => {
                    policy.roles.insert((namespace, name), object);
                }
                "ClusterRoleBinding" => policy.cluster_role_bindings.push(object),
                "RoleBinding" => policy.role_bindings.push(object),
                _ => {}
            }
        }
        policy
    }

    /// Whether a rule bound to `user` allows this resource request.
    pub(crate) fn allows(&self, user: &User, request: &ResourceAttributes) -> bool {
        self.bound_rules(user, &request.namespace)
            .any(|rule| rule_allows(rule, request))
    }

    /// Whether a rule bound to `user` at the cluster scope allows this non-resource request.
    fn allows_path(&self, user: &User, verb: &str, path: &str) -> bool {
        self.bound_rules(user, "").any(|rule| {
            contains(&rule["verbs"], verb)
                && strings(&rule["nonResourceURLs"]).any(|url| {
                    url == "*"
                        || url == path
                        || url.strip_suffix('*').is_some_and(|p| path.starts_with(p))
                })
        })
    }

    /// The rules that apply to `user` in `namespace` (`""`: at the cluster scope only).
    fn bound_rules<'p>(
        &'p self,
        user: &'p User,
        namespace: &'p str,
    ) -> impl Iterator<Item = &'a Value> + 'p {
        let cluster = self
            .cluster_role_bindings
            .iter()
            .filter(move |binding| binds(binding, user, ""))
            .filter_map(move |binding| match role_ref(binding) {
                ("ClusterRole", name) => self.cluster_roles.get(name).copied(),
                _ => None,
            });
        let namespaced = self
            .role_bindings
            .iter()
            .filter(move |binding| {
                !namespace.is_empty()
                    && text(&binding["metadata"]["namespace"]) == namespace
                    && binds(binding, user, namespace)
            })
            .filter_map(move |binding| match role_ref(binding) {
                ("ClusterRole", name) => self.cluster_roles.get(name).copied(),
                ("Role", name) => self.roles.get(&(namespace, name)).copied(),
                _ => None,
            });
        cluster
            .chain(namespaced)
            .flat_map(|role| role["rules"].as_array().into_iter().flatten())
    }
}

/// A binding's `roleRef`: its kind and name.
fn role_ref(binding: &Value) -> (&str, &str) {
    (
        text(&binding["roleRef"]["kind"]),
        text(&binding["roleRef"]["name"]),
    )
}

/// Whether a binding (in `namespace`, `""` for a ClusterRoleBinding) names `user` among its subjects.
fn binds(binding: &Value, user: &User, namespace: &str) -> bool {
    let subjects = binding["subjects"].as_array().into_iter().flatten();
    subjects.into_iter().any(|subject| {
        let name = text(&subject["name"]);
        match text(&subject["kind"]) {
            "User" => user.name == name,
            "Group" => user.groups.iter().any(|g| g == name),
            "ServiceAccount" => {
                let account_namespace = match text(&subject["namespace"]) {
                    "" => namespace,
                    given => given,
                };
                user.name == format!("system:serviceaccount:{account_namespace}:{name}")
            }
            _ => false,
        }
    })
}

/// Whether one rule allows a resource request.
fn rule_allows(rule: &Value, request: &ResourceAttributes) -> bool {
    let combined = request.combined();
    let any_subresource = format!("*/{}", request.subresource);
    contains(&rule["verbs"], &request.verb)
        && contains(&rule["apiGroups"], &request.group)
        && strings(&rule["resources"]).any(|resource| {
            resource == "*"
                || resource == combined
                || (!request.subresource.is_empty() && resource == any_subresource)
        })
        && {
            let mut names = strings(&rule["resourceNames"]).peekable();
            names.peek().is_none() || names.any(|name| name == request.name)
        }
}

/// Whether a list of strings holds `value`, or `*`.
fn contains(list: &Value, value: &str) -> bool {
    strings(list).any(|item| item == "*" || item == value)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(
        verb: &str,
        group: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> ResourceAttributes {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        ResourceAttributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn operator() -> User {
        User::service_account("ops", "my-op")
    }

    fn cluster_role(name: &str, rules: Value) -> Value {
        json!({"kind": "ClusterRole", "metadata": {"name": name}, "rules": rules})
    }

    fn role(namespace: &str, name: &str, rules: Value) -> Value {
        json!({"kind": "Role", "metadata": {"name": name, "namespace": namespace}, "rules": rules})
    }

    fn cluster_binding(role: &str, subjects: Value) -> Value {
        json!({
            "kind": "ClusterRoleBinding",
            "metadata": {"name": format!("{role}-binding")},
            "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": role},
            "subjects": subjects,
        })
    }

    fn binding(namespace: &str, kind: &str, role: &str, subjects: Value) -> Value {
        json!({
            "kind": "RoleBinding",
            "metadata": {"name": format!("{role}-binding"), "namespace": namespace},
            "roleRef": {"apiGroup": GROUP, "kind": kind, "name": role},
            "subjects": subjects,
        })
    }

    fn the_operator() -> Value {
        json!([{"kind": "ServiceAccount", "name": "my-op", "namespace": "ops"}])
    }

    fn widget_rules() -> Value {
        json!([
            {"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["list", "watch", "patch"]},
            {"apiGroups": ["example.com"], "resources": ["widgets/status"], "verbs": ["patch"]},
        ])
    }

    #[test]
    fn a_cluster_role_bound_cluster_wide_allows_its_verbs_everywhere_and_nothing_else() {
        let objects = [
            cluster_role("widgets", widget_rules()),
            cluster_binding("widgets", the_operator()),
        ];
        let policy = Policy::new(&objects);
        let user = operator();
        for allowed in [
            request("list", "example.com", "widgets", "", ""),
            request("watch", "example.com", "widgets", "team-a", ""),
            request("patch", "example.com", "widgets", "default", "w1"),
            request("patch", "example.com", "widgets/status", "default", "w1"),
        ] {
            assert!(policy.allows(&user, &allowed), "{allowed:?}");
        }
        for denied in [
            request("get", "example.com", "widgets", "default", "w1"),
            request("delete", "example.com", "widgets", "default", "w1"),
            request("update", "example.com", "widgets/status", "default", "w1"),
            request("patch", "example.com", "widgets/scale", "default", "w1"),
            request("list", "other.com", "widgets", "", ""),
            request("list", "example.com", "gadgets", "", ""),
        ] {
            assert!(!policy.allows(&user, &denied), "{denied:?}");
        }
    }

    #[test]
    fn rules_apply_only_to_the_bound_subjects() {
        let objects = [
            cluster_role("widgets", widget_rules()),
            cluster_binding("widgets", the_operator()),
        ];
        let policy = Policy::new(&objects);
        let list = request("list", "example.com", "widgets", "", "");
        assert!(!policy.allows(&User::service_account("other", "my-op"), &list));
        assert!(!policy.allows(&User::service_account("ops", "someone"), &list));
        assert!(!policy.allows(&User::anonymous(), &list));
    }

    #[test]
    fn a_role_binding_grants_only_in_its_namespace() {
        let objects = [
            role("team-a", "widgets", widget_rules()),
            binding("team-a", "Role", "widgets", the_operator()),
            cluster_role(
                "events",
                json!([{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]),
            ),
            binding("team-b", "ClusterRole", "events", the_operator()),
        ];
        let policy = Policy::new(&objects);
        let user = operator();
        assert!(policy.allows(
            &user,
            &request("list", "example.com", "widgets", "team-a", "")
        ));
        assert!(!policy.allows(
            &user,
            &request("list", "example.com", "widgets", "team-b", "")
        ));
        assert!(!policy.allows(&user, &request("list", "example.com", "widgets", "", "")));
        // A ClusterRole bound by a RoleBinding grants in that namespace only.
        assert!(policy.allows(&user, &request("create", "", "events", "team-b", "")));
        assert!(!policy.allows(&user, &request("create", "", "events", "team-a", "")));
        assert!(!policy.allows(&user, &request("create", "", "events", "", "")));
    }

    #[test]
    fn a_role_binding_refers_to_the_role_of_its_own_namespace() {
        let objects = [
            role("team-b", "widgets", widget_rules()),
            binding("team-a", "Role", "widgets", the_operator()),
        ];
        let policy = Policy::new(&objects);
        let list = request("list", "example.com", "widgets", "team-a", "");
        assert!(!policy.allows(&operator(), &list));
    }

    #[test]
    fn service_account_subjects_of_role_bindings_default_to_the_bindings_namespace() {
        let objects = [
            role(
                "ops",
                "leases",
                json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]),
            ),
            binding(
                "ops",
                "Role",
                "leases",
                json!([{"kind": "ServiceAccount", "name": "my-op"}]),
            ),
        ];
        let policy = Policy::new(&objects);
        let create = request("create", "coordination.k8s.io", "leases", "ops", "");
        assert!(policy.allows(&operator(), &create));
        assert!(!policy.allows(&User::service_account("other", "my-op"), &create));
    }

    #[test]
    fn users_and_groups_are_subjects_too() {
        let objects = [
            cluster_role("widgets", widget_rules()),
            cluster_binding(
                "widgets",
                json!([{"kind": "Group", "name": "system:serviceaccounts:ops", "apiGroup": GROUP}]),
            ),
            cluster_role(
                "events",
                json!([{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]),
            ),
            cluster_binding(
                "events",
                json!([{"kind": "User", "name": "system:serviceaccount:ops:my-op", "apiGroup": GROUP}]),
            ),
        ];
        let policy = Policy::new(&objects);
        assert!(policy.allows(
            &operator(),
            &request("list", "example.com", "widgets", "", "")
        ));
        assert!(policy.allows(&operator(), &request("create", "", "events", "default", "")));
        let stranger = User::service_account("elsewhere", "my-op");
        assert!(!policy.allows(
            &stranger,
            &request("list", "example.com", "widgets", "", "")
        ));
    }

    #[test]
    fn wildcards_match_every_verb_group_and_resource() {
        let objects = [
            cluster_role(
                "all",
                json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
            ),
            cluster_binding("all", the_operator()),
        ];
        let policy = Policy::new(&objects);
        for allowed in [
            request("deletecollection", "", "pods", "default", ""),
            request("patch", "example.com", "widgets/status", "default", "w1"),
            request(
                "list",
                "apiextensions.k8s.io",
                "customresourcedefinitions",
                "",
                "",
            ),
        ] {
            assert!(policy.allows(&operator(), &allowed), "{allowed:?}");
        }
    }

    #[test]
    fn a_star_subresource_matches_that_subresource_of_every_resource() {
        let objects = [
            cluster_role(
                "status",
                json!([{"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["patch"]}]),
            ),
            cluster_binding("status", the_operator()),
        ];
        let policy = Policy::new(&objects);
        assert!(policy.allows(
            &operator(),
            &request("patch", "example.com", "widgets/status", "default", "w1")
        ));
        assert!(!policy.allows(
            &operator(),
            &request("patch", "example.com", "widgets", "default", "w1")
        ));
        assert!(!policy.allows(
            &operator(),
            &request("patch", "example.com", "widgets/scale", "default", "w1")
        ));
    }

    #[test]
    fn resource_names_restrict_to_named_requests() {
        let objects = [
            role(
                "ops",
                "lease",
                json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["my-op"], "verbs": ["get", "update", "create", "list"]}]),
            ),
            binding("ops", "Role", "lease", the_operator()),
        ];
        let policy = Policy::new(&objects);
        let user = operator();
        assert!(policy.allows(
            &user,
            &request("get", "coordination.k8s.io", "leases", "ops", "my-op")
        ));
        assert!(policy.allows(
            &user,
            &request("update", "coordination.k8s.io", "leases", "ops", "my-op")
        ));
        assert!(!policy.allows(
            &user,
            &request("get", "coordination.k8s.io", "leases", "ops", "other")
        ));
        // Creations and unnamed lists carry no name, so named rules never allow them.
        assert!(!policy.allows(
            &user,
            &request("create", "coordination.k8s.io", "leases", "ops", "")
        ));
        assert!(!policy.allows(
            &user,
            &request("list", "coordination.k8s.io", "leases", "ops", "")
        ));
    }

    #[test]
    fn bindings_to_missing_roles_grant_nothing() {
        let objects = [
            cluster_binding("cluster-admin", the_operator()),
            binding("ops", "Role", "missing", the_operator()),
        ];
        let policy = Policy::new(&objects);
        assert!(!policy.allows(&operator(), &request("get", "", "pods", "ops", "p")));
    }

    fn attributes(method: Method, path: &str, query: &[(&str, &str)]) -> Attributes {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let query = query
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Attributes::of(&method, &segments, &query)
    }

    fn resource_request(attributes: Attributes) -> ResourceAttributes {
        match attributes {
            Attributes::Resource(request) => request,
            other => panic!("not a resource request: {other:?}"),
        }
    }

    #[test]
    fn request_attributes_are_read_from_paths_as_the_api_server_reads_them() {
        let cases = [
            (
                Method::GET,
                "/apis/example.com/v1/widgets",
                vec![],
                request("list", "example.com", "widgets", "", ""),
            ),
            (
                Method::GET,
                "/apis/example.com/v1/namespaces/default/widgets",
                vec![("watch", "true")],
                request("watch", "example.com", "widgets", "default", ""),
            ),
            (
                Method::GET,
                "/apis/example.com/v1/namespaces/default/widgets/w1",
                vec![],
                request("get", "example.com", "widgets", "default", "w1"),
            ),
            (
                Method::PATCH,
                "/apis/example.com/v1/namespaces/default/widgets/w1/status",
                vec![],
                request("patch", "example.com", "widgets/status", "default", "w1"),
            ),
            (
                Method::POST,
                "/api/v1/namespaces/default/events",
                vec![],
                request("create", "", "events", "default", ""),
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/ops/leases/my-op",
                vec![],
                request("update", "coordination.k8s.io", "leases", "ops", "my-op"),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/default/pods",
                vec![],
                request("deletecollection", "", "pods", "default", ""),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/default/pods/p",
                vec![],
                request("delete", "", "pods", "default", "p"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces",
                vec![("watch", "1")],
                request("watch", "", "namespaces", "", ""),
            ),
            // A namespace's own namespace is its name.
            (
                Method::GET,
                "/api/v1/namespaces/team-a",
                vec![],
                request("get", "", "namespaces", "team-a", "team-a"),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/team-a/finalize",
                vec![],
                request("update", "", "namespaces/finalize", "team-a", "team-a"),
            ),
            // A list or watch of one name, by field selector, names it.
            (
                Method::GET,
                "/apis/kopf.dev/v1/namespaces/ops/kopfpeerings",
                vec![("fieldSelector", "metadata.name=default")],
                request("list", "kopf.dev", "kopfpeerings", "ops", "default"),
            ),
            (
                Method::GET,
                "/api/v1/pods",
                vec![("fieldSelector", "metadata.name!=x")],
                request("list", "", "pods", "", ""),
            ),
        ];
        for (method, path, query, expected) in cases {
            assert_eq!(
                resource_request(attributes(method, path, &query)),
                expected,
                "{path}"
            );
        }
    }

    #[test]
    fn discovery_and_other_paths_are_non_resource_requests() {
        for path in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/example.com/v1",
            "/version",
            "/openapi/v3",
            "/_emulator/stats",
        ] {
            assert!(
                matches!(
                    attributes(Method::GET, path, &[]),
                    Attributes::NonResource { .. }
                ),
                "{path}"
            );
        }
    }

    fn state_with(objects: &[Value]) -> State {
        let mut state = State::new(100);
        let account =
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "my-op"}});
        state
            .create(
                &GroupResource::new("", "serviceaccounts"),
                Some("default"),
                account,
                Default::default(),
            )
            .unwrap();
        for object in objects {
            let plural = match object["kind"].as_str().unwrap() {
                "ClusterRole" => "clusterroles",
                "ClusterRoleBinding" => "clusterrolebindings",
                "Role" => "roles",
                _ => "rolebindings",
            };
            let mut body = object.clone();
            body["apiVersion"] = json!(format!("{GROUP}/v1"));
            let namespace = object["metadata"]["namespace"].as_str();
            state
                .create(
                    &GroupResource::new(GROUP, plural),
                    namespace,
                    body,
                    Default::default(),
                )
                .unwrap();
        }
        state
    }

    fn token() -> String {
        format!(
            "Bearer {}",
            crate::auth::service_account_token("default", "my-op")
        )
    }

    #[test]
    fn denials_are_the_api_servers_403_with_its_message() {
        let state = state_with(&[]);
        let patch = attributes(
            Method::PATCH,
            "/apis/example.com/v1/namespaces/default/widgets/w1/status",
            &[],
        );
        let error = check(&state, Some(&token()), &patch).unwrap_err();
        assert_eq!((error.code, error.reason), (403, "Forbidden"));
        assert_eq!(
            error.message,
            "widgets.example.com \"w1\" is forbidden: User \"system:serviceaccount:default:my-op\" \
             cannot patch resource \"widgets/status\" in API group \"example.com\" in the namespace \"default\""
        );
        assert_eq!(
            error.details,
            Some(json!({"name": "w1", "group": "example.com", "kind": "widgets"}))
        );
        let list = attributes(Method::GET, "/api/v1/nodes", &[]);
        let error = check(&state, Some(&token()), &list).unwrap_err();
        assert_eq!(
            error.message,
            "nodes is forbidden: User \"system:serviceaccount:default:my-op\" cannot list resource \
             \"nodes\" in API group \"\" at the cluster scope"
        );
    }

    #[test]
    fn stored_bindings_allow_what_they_grant() {
        let state = state_with(&[
            role("default", "widgets", widget_rules()),
            binding(
                "default",
                "Role",
                "widgets",
                json!([{"kind": "ServiceAccount", "name": "my-op", "namespace": "default"}]),
            ),
        ]);
        let patch = attributes(
            Method::PATCH,
            "/apis/example.com/v1/namespaces/default/widgets/w1/status",
            &[],
        );
        assert_eq!(check(&state, Some(&token()), &patch), Ok(()));
    }

    #[test]
    fn discovery_is_open_to_everyone_and_the_emulators_controls_to_the_admin_only() {
        let state = state_with(&[]);
        for path in [
            "/api",
            "/apis/example.com/v1",
            "/version",
            "/openapi/v2",
            "/healthz",
        ] {
            let request = attributes(Method::GET, path, &[]);
            assert_eq!(check(&state, None, &request), Ok(()), "{path}");
            assert_eq!(check(&state, Some(&token()), &request), Ok(()), "{path}");
        }
        let fault = attributes(Method::POST, "/_emulator/faults/reset", &[]);
        let error = check(&state, Some(&token()), &fault).unwrap_err();
        assert_eq!(
            error.message,
            "forbidden: User \"system:serviceaccount:default:my-op\" cannot post path \"/_emulator/faults/reset\""
        );
        assert_eq!(check(&state, Some("Bearer emulator"), &fault), Ok(()));
    }

    #[test]
    fn non_resource_urls_grant_paths() {
        let state = state_with(&[
            cluster_role(
                "faults",
                json!([{"nonResourceURLs": ["/_emulator/*"], "verbs": ["post"]}]),
            ),
            cluster_binding(
                "faults",
                json!([{"kind": "ServiceAccount", "name": "my-op", "namespace": "default"}]),
            ),
        ]);
        let fault = attributes(Method::POST, "/_emulator/faults/reset", &[]);
        assert_eq!(check(&state, Some(&token()), &fault), Ok(()));
        let stats = attributes(Method::GET, "/_emulator/stats", &[]);
        assert!(check(&state, Some(&token()), &stats).is_err());
    }

    #[test]
    fn anonymous_requests_are_denied_resources() {
        let state = state_with(&[]);
        let list = attributes(Method::GET, "/api/v1/namespaces/default/pods", &[]);
        let error = check(&state, None, &list).unwrap_err();
        assert!(
            error
                .message
                .contains("User \"system:anonymous\" cannot list"),
            "{}",
            error.message
        );
    }
}
