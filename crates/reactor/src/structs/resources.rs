//! Resources: what the cluster serves ([`Resource`]), and how users name them ([`Selector`]).
//!
//! Users name resources the way Kopf lets them (`reference/kopf.md` §1.11): a group, version and plural
//! (`("example.com", "v1", "widgets")`), a kubectl-style dotted name (`"widgets.example.com"`,
//! `"pods.v1"`, `"deployments.v1.apps"`), or a bare kind, plural, singular or short name (`"Widget"`,
//! `"widgets"`, `"widget"`, `"wd"`), and typed resources (`kube::Resource` types). A selector is resolved
//! against discovery (`discovery.rs`) into exactly one [`Resource`].

use std::fmt;
use std::sync::Arc;

use kube::api::DynamicObject;
use kube::discovery::ApiResource;

/// A resource as the cluster serves it, in one version.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Resource {
    /// The API group; `""` for the core group.
    pub group: String,
    /// The version (`v1`, `v1beta1`).
    pub version: String,
    /// The plural name, as in URLs (`widgets`).
    pub plural: String,
    /// The kind (`Widget`).
    pub kind: String,
    /// The singular name (`widget`).
    pub singular: String,
    /// kubectl's short names (`wd`).
    pub short_names: Vec<String>,
    /// Categories (`all`).
    pub categories: Vec<String>,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether this is the group's preferred version.
    pub preferred: bool,
    /// The verbs the resource supports (`list`, `watch`, `patch`, ...).
    pub verbs: Vec<String>,
    /// Subresources (`status`, `scale`).
    pub subresources: Vec<String>,
}

impl Resource {
    /// A namespaced resource known without discovery (tests, tools): the preferred version of its
    /// group, its singular the lowercase kind, no short names, categories, verbs or subresources.
    pub fn namespaced(group: &str, version: &str, kind: &str, plural: &str) -> Self {
        Resource {
            group: group.to_string(),
            version: version.to_string(),
            plural: plural.to_string(),
            kind: kind.to_string(),
            singular: kind.to_lowercase(),
            short_names: vec![],
            categories: vec![],
            namespaced: true,
            preferred: true,
            verbs: vec![],
            subresources: vec![],
        }
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// For `kube::Api::*_with`.
    pub fn api_resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version: self.api_version(),
            kind: self.kind.clone(),
            plural: self.plural.clone(),
        }
    }

    /// Whether it can be listed and watched (what kactor needs to serve it).
    pub fn is_watchable(&self) -> bool {
        self.verbs.iter().any(|v| v == "list") && self.verbs.iter().any(|v| v == "watch")
    }

    /// Whether it has the status subresource (status patches go to `/status`).
    pub fn has_status(&self) -> bool {
        self.subresources.iter().any(|s| s == "status")
    }
}

impl fmt::Display for Resource {
    /// kubectl's form: `widgets.v1.example.com`, `pods.v1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}.{}", self.plural, self.version)
        } else {
            write!(f, "{}.{}.{}", self.plural, self.version, self.group)
        }
    }
}

/// How a user names a resource; resolved against discovery into one [`Resource`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Selector {
    /// The group, when given (`Some("")` is the core group).
    pub group: Option<String>,
    /// The version, when given; without one, each resource in its preferred version (or, for a
    /// kind not served in its group's preferred version, in the versions it has).
    pub version: Option<String>,
    /// A name to match against plural, kind, singular or short names (or exactly the plural when
    /// `group` and `version` both come from the user, as in `("example.com", "v1", "widgets")`).
    pub name: String,
    /// Whether `name` is the exact plural (a full group/version/plural or a typed resource), so that
    /// the resource may appear later (its CRD created after the operator starts).
    pub exact: bool,
}

impl Selector {
    /// An exact group, version and plural (`""` for the core group).
    pub fn new(group: &str, version: &str, plural: &str) -> Self {
        Selector {
            group: Some(group.to_string()),
            version: Some(version.to_string()),
            name: plural.to_string(),
            exact: true,
        }
    }

    /// A typed resource: a `k8s-openapi` type or a `#[derive(CustomResource)]` struct.
    pub fn of<K: kube::Resource<DynamicType = ()>>() -> Self {
        Selector::new(&K::group(&()), &K::version(&()), &K::plural(&()))
    }

    /// Parses the names users write:
    /// * `group/version` and a plural: use [`Selector::new`];
    /// * `plural.group` (`widgets.example.com`), `plural.version` (`pods.v1`) and
    ///   `plural.version.group` (`deployments.v1.apps`), as kubectl reads them;
    /// * a bare kind, plural, singular or short name (`Widget`, `widgets`, `widget`, `wd`).
    pub fn parse(text: &str) -> Self {
        let text = text.trim();
        let Some((name, rest)) = text.split_once('.') else {
            return Selector {
                group: None,
                version: None,
                name: text.to_string(),
                exact: false,
            };
        };
        let (version, group) = match rest.split_once('.') {
            Some((first, tail)) if is_version(first) => {
                (Some(first.to_string()), Some(tail.to_string()))
            }
            None if is_version(rest) => (Some(rest.to_string()), Some(String::new())),
            _ => (None, Some(rest.to_string())),
        };
        Selector {
            group,
            version,
            name: name.to_string(),
            exact: false,
        }
    }

    /// Whether a resource matches this selector (ignoring the preferred-version rule).
    pub fn matches(&self, resource: &Resource) -> bool {
        if self.group.as_ref().is_some_and(|g| *g != resource.group) {
            return false;
        }
        if self
            .version
            .as_ref()
            .is_some_and(|v| *v != resource.version)
        {
            return false;
        }
        if self.exact {
            return resource.plural == self.name;
        }
        let name = self.name.as_str();
        resource.plural == name
            || resource.kind == name
            || resource.singular == name
            || resource.short_names.iter().any(|s| s == name)
            || (!resource.kind.is_empty()
                && resource.kind.eq_ignore_ascii_case(name)
                && name.chars().all(|c| c.is_ascii_lowercase()))
    }
}

/// `v1`, `v2beta1`, `v1alpha3`: Kopf's `^v\d+((alpha|beta)\d+)?$`.
fn is_version(text: &str) -> bool {
    let Some(rest) = text.strip_prefix('v') else {
        return false;
    };
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    if digits == 0 {
        return false;
    }
    let tail = &rest[digits..];
    tail.is_empty()
        || ["alpha", "beta"].iter().any(|stage| {
            tail.strip_prefix(stage)
                .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
}

impl From<&str> for Selector {
    fn from(text: &str) -> Self {
        Selector::parse(text)
    }
}

impl From<String> for Selector {
    fn from(text: String) -> Self {
        Selector::parse(&text)
    }
}

impl From<(&str, &str, &str)> for Selector {
    /// `("example.com", "v1", "widgets")`; `("", "v1", "pods")` or `("v1", "pods")`-style core names.
    fn from((group, version, plural): (&str, &str, &str)) -> Self {
        Selector::new(group, version, plural)
    }
}

impl From<(&str, &str)> for Selector {
    /// `("example.com/v1", "widgets")`, `("v1", "pods")` (core), or `("apps", "deployments")` (a group,
    /// its preferred version).
    fn from((group_version, plural): (&str, &str)) -> Self {
        match group_version.split_once('/') {
            Some((group, version)) => Selector::new(group, version, plural),
            None if is_version(group_version) => Selector::new("", group_version, plural),
            None => Selector {
                group: Some(group_version.to_string()),
                version: None,
                name: plural.to_string(),
                exact: true,
            },
        }
    }
}

impl From<&Resource> for Selector {
    fn from(resource: &Resource) -> Self {
        Selector::new(&resource.group, &resource.version, &resource.plural)
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.group, &self.version) {
            (Some(g), Some(v)) if g.is_empty() => write!(f, "{}.{v}", self.name),
            (Some(g), Some(v)) => write!(f, "{}.{v}.{g}", self.name),
            (Some(g), None) if !g.is_empty() => write!(f, "{}.{g}", self.name),
            _ => f.write_str(&self.name),
        }
    }
}

/// The routing key of an object: its uid, or Kopf's fallback
/// `kind//apiVersion//name//namespace//creationTimestamp` (with `-` for missing parts).
pub fn object_key(resource: &Resource, object: &DynamicObject) -> Arc<str> {
    if let Some(uid) = object.metadata.uid.as_deref().filter(|u| !u.is_empty()) {
        return Arc::from(uid);
    }
    let api_version = object
        .types
        .as_ref()
        .map_or_else(|| resource.api_version(), |t| t.api_version.clone());
    let kind = object
        .types
        .as_ref()
        .map_or(resource.kind.as_str(), |t| t.kind.as_str())
        .to_string();
    let part = |value: Option<&str>| value.filter(|v| !v.is_empty()).unwrap_or("-").to_string();
    let created = object
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string());
    Arc::from(format!(
        "{}//{}//{}//{}//{}",
        part(Some(&kind)),
        part(Some(&api_version)),
        part(object.metadata.name.as_deref()),
        part(object.metadata.namespace.as_deref()),
        part(created.as_deref())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn widget(version: &str, preferred: bool) -> Resource {
        Resource {
            group: "example.com".into(),
            version: version.into(),
            plural: "widgets".into(),
            kind: "Widget".into(),
            singular: "widget".into(),
            short_names: vec!["wd".into()],
            categories: vec![],
            namespaced: true,
            preferred,
            verbs: vec!["list".into(), "watch".into(), "patch".into()],
            subresources: vec!["status".into()],
        }
    }

    #[test]
    fn dotted_names_parse_as_kubectl_reads_them() {
        assert_eq!(
            Selector::parse("widgets.example.com"),
            Selector {
                group: Some("example.com".into()),
                version: None,
                name: "widgets".into(),
                exact: false
            }
        );
        assert_eq!(
            Selector::parse("pods.v1"),
            Selector {
                group: Some(String::new()),
                version: Some("v1".into()),
                name: "pods".into(),
                exact: false
            }
        );
        assert_eq!(
            Selector::parse("deployments.v1.apps").group.as_deref(),
            Some("apps")
        );
        assert_eq!(Selector::parse("Widget").group, None);
    }

    #[test]
    fn bare_names_match_plural_kind_singular_and_short_names() {
        let resource = widget("v1", true);
        for name in ["widgets", "Widget", "widget", "wd"] {
            assert!(Selector::parse(name).matches(&resource), "{name}");
        }
        assert!(!Selector::parse("gadgets").matches(&resource));
        assert!(!Selector::parse("widgets.other.com").matches(&resource));
    }

    #[test]
    fn exact_selectors_match_only_the_plural_in_that_group_and_version() {
        assert!(Selector::new("example.com", "v1", "widgets").matches(&widget("v1", true)));
        assert!(!Selector::new("example.com", "v1", "widget").matches(&widget("v1", true)));
        assert!(!Selector::new("example.com", "v2", "widgets").matches(&widget("v1", true)));
        assert_eq!(
            Selector::from(("v1", "pods")),
            Selector::new("", "v1", "pods")
        );
        assert_eq!(
            Selector::from(("example.com/v1", "widgets")),
            Selector::new("example.com", "v1", "widgets")
        );
    }

    #[test]
    fn typed_resources_give_exact_selectors() {
        let selector = Selector::of::<k8s_openapi::api::core::v1::ConfigMap>();
        assert_eq!(selector, Selector::new("", "v1", "configmaps"));
    }

    #[test]
    fn versions_follow_kopfs_pattern() {
        for good in ["v1", "v10", "v1beta1", "v2alpha3"] {
            assert!(is_version(good), "{good}");
        }
        for bad in ["v", "1", "vbeta1", "v1beta", "v1gamma1", "example"] {
            assert!(!is_version(bad), "{bad}");
        }
    }
}

#[cfg(test)]
mod key_tests {
    use super::*;

    fn resource() -> Resource {
        Resource::namespaced("example.com", "v1", "Widget", "widgets")
    }

    #[test]
    fn objects_are_keyed_by_uid() {
        let mut object = DynamicObject::new("w", &resource().api_resource());
        object.metadata.uid = Some("1234".into());
        assert_eq!(&*object_key(&resource(), &object), "1234");
    }

    #[test]
    fn objects_without_uid_get_kopfs_fallback_key() {
        let mut object = DynamicObject::new("w", &resource().api_resource()).within("ns1");
        assert_eq!(
            &*object_key(&resource(), &object),
            "Widget//example.com/v1//w//ns1//-"
        );
        object.metadata.namespace = None;
        object.types = None;
        assert_eq!(
            &*object_key(&resource(), &object),
            "Widget//example.com/v1//w//-//-"
        );
    }
}
