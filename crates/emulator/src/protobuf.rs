//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`) of the built-in kinds, decoded
//! into the JSON the rest of the emulator works on. kubectl sends them for its imperative commands
//! (`kubectl create namespace|configmap|secret|deployment|serviceaccount|role|rolebinding|job|...`)
//! and `kubectl run`.
//!
//! The wire format is Kubernetes' envelope: the magic `k8s\0`, then a `runtime.Unknown` holding the
//! `apiVersion` and `kind` and, as bytes, the object's own message (`k8s.io.api.core.v1.ConfigMap`).
//! The messages' schemas are the upstream `.proto` files vendored in `protos/` (refreshed by
//! `protos/refresh.sh`), compiled by `build.rs` and decoded with prost-reflect.
//!
//! The JSON is what the real API server would keep of the same body:
//! * Kubernetes' own JSON forms of its special messages: `Time` and `MicroTime` as RFC 3339, `Duration`
//!   as Go's duration string, `IntOrString` as a number or a string, `Quantity` as its string,
//!   `RawExtension` and `FieldsV1` as the JSON they carry; `bytes` as base64.
//! * The Go structs' zero values of non-pointer fields are always on the wire (gogo-protobuf writes
//!   them); Go's JSON leaves empty strings and the zero `Time` out, so this does too. Numbers, booleans
//!   and nested objects are kept as sent (a pointer's `0`, `false` or `{}`, as `replicas: 0` or
//!   `emptyDir: {}`, means something; a non-pointer's zero means what its absence means). The one
//!   pointer string whose empty value means something, `storageClassName`, is kept.

use std::sync::OnceLock;

use base64::Engine as _;
use prost_reflect::{
    DescriptorPool, DynamicMessage, MapKey, MessageDescriptor, ReflectMessage, Value as Field,
};
use serde_json::{Map, Value};

/// The media type of protobuf bodies.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// Kubernetes' envelope starts with these four bytes.
const MAGIC: &[u8] = b"k8s\0";

/// The vendored schemas, compiled by build.rs.
static DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kubernetes.fds"));

/// The API groups whose kinds are decoded (their `.proto` files are vendored).
pub const GROUPS: [&str; 11] = [
    "",
    "apps",
    "batch",
    "rbac.authorization.k8s.io",
    "networking.k8s.io",
    "policy",
    "scheduling.k8s.io",
    "authentication.k8s.io",
    "autoscaling",
    "coordination.k8s.io",
    "authorization.k8s.io",
];

pub(crate) fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(DESCRIPTORS).expect("build.rs wrote a valid descriptor set")
    })
}

fn message(name: &str) -> Option<MessageDescriptor> {
    pool().get_message_by_name(name)
}

/// Decodes a protobuf body into the object's JSON, with its `apiVersion` and `kind`; the error says
/// what is wrong with the body (a 400), or that its kind is not one the emulator decodes (a 415).
pub fn decode(body: &[u8]) -> Result<Value, Error> {
    let envelope = body.strip_prefix(MAGIC).ok_or_else(|| {
        Error::Invalid("the body does not start with the protobuf magic k8s\\0".into())
    })?;
    let unknown = message("k8s.io.apimachinery.pkg.runtime.Unknown").expect("vendored");
    let unknown = DynamicMessage::decode(unknown, envelope)
        .map_err(|e| Error::Invalid(format!("the envelope (runtime.Unknown): {e}")))?;
    let text = |m: &DynamicMessage, name: &str| match m.get_field_by_name(name).as_deref() {
        Some(Field::String(s)) => s.clone(),
        _ => String::new(),
    };
    let type_meta = match unknown.get_field_by_name("typeMeta").as_deref() {
        Some(Field::Message(m)) => m.clone(),
        _ => return Err(Error::Invalid("the envelope has no typeMeta".into())),
    };
    let (api_version, kind) = (text(&type_meta, "apiVersion"), text(&type_meta, "kind"));
    if api_version.is_empty() || kind.is_empty() {
        return Err(Error::Invalid(
            "the envelope's typeMeta has no apiVersion or kind".into(),
        ));
    }
    let encoding = text(&unknown, "contentEncoding");
    if !encoding.is_empty() {
        return Err(Error::Invalid(format!(
            "contentEncoding {encoding:?} is not supported"
        )));
    }
    let raw = match unknown.get_field_by_name("raw").as_deref() {
        Some(Field::Bytes(b)) => b.clone(),
        _ => Default::default(),
    };
    let descriptor = descriptor_of(&api_version, &kind)?;
    let object = DynamicMessage::decode(descriptor, raw)
        .map_err(|e| Error::Invalid(format!("the {kind} in the body: {e}")))?;
    let mut json = match to_json(&object)? {
        Some(Value::Object(map)) => map,
        _ => Map::new(),
    };
    json.insert("apiVersion".into(), Value::String(api_version));
    json.insert("kind".into(), Value::String(kind));
    Ok(Value::Object(json))
}

/// What is wrong with a protobuf body.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not a valid body (a 400).
    #[error("invalid protobuf body: {0}")]
    Invalid(String),
    /// A kind the emulator has no schema for (a 415: send it as JSON).
    #[error("{0}")]
    Unsupported(String),
}

/// `k8s.io.api.<package>.<version>.<Kind>` for `group/version`: the package is the group's first
/// label (`rbac.authorization.k8s.io` is `rbac`), `core` for the core group.
pub(crate) fn descriptor_of(api_version: &str, kind: &str) -> Result<MessageDescriptor, Error> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let name = format!("k8s.io.api.{}.{version}.{kind}", package_of(group));
    if GROUPS.contains(&group) {
        if let Some(descriptor) = message(&name) {
            return Ok(descriptor);
        }
    }
    Err(Error::Unsupported(format!(
        "the kactor emulator decodes protobuf bodies of the built-in kinds of {}, not {kind} of \
         {api_version:?}; send it as JSON",
        GROUPS
            .map(|g| if g.is_empty() { "core" } else { g })
            .join(", ")
    )))
}

/// The `.proto` package segment of an API group: its first label, `core` for the core group.
fn package_of(group: &str) -> &str {
    if group.is_empty() {
        "core"
    } else {
        group.split('.').next().unwrap_or(group)
    }
}

/// A message as Kubernetes' JSON; None for what Go's JSON would leave out (the zero `Time`).
fn to_json(message: &DynamicMessage) -> Result<Option<Value>, Error> {
    let descriptor = message.descriptor();
    let name = descriptor.full_name();
    let field = |field: &str| message.get_field_by_name(field);
    let special = match name {
        "k8s.io.apimachinery.pkg.apis.meta.v1.Time"
        | "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime" => {
            let seconds = field("seconds").and_then(|v| v.as_i64()).unwrap_or(0);
            let nanos = field("nanos").and_then(|v| v.as_i32()).unwrap_or(0);
            if seconds == 0 && nanos == 0 {
                return Ok(None);
            }
            let at = jiff::Timestamp::new(
                seconds,
                if name.ends_with("MicroTime") {
                    nanos
                } else {
                    0
                },
            )
            .map_err(|e| Error::Invalid(format!("a time out of range: {e}")))?;
            Some(Value::String(if name.ends_with("MicroTime") {
                format!("{at:.6}")
            } else {
                at.to_string()
            }))
        }
        "k8s.io.apimachinery.pkg.apis.meta.v1.Duration" => {
            let nanos = field("duration").and_then(|v| v.as_i64()).unwrap_or(0);
            Some(Value::String(go_duration(nanos)))
        }
        "k8s.io.apimachinery.pkg.util.intstr.IntOrString" => {
            let kind = field("type").and_then(|v| v.as_i64()).unwrap_or(0);
            Some(if kind == 1 {
                Value::String(
                    field("strVal")
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                )
            } else {
                Value::from(field("intVal").and_then(|v| v.as_i32()).unwrap_or(0))
            })
        }
        "k8s.io.apimachinery.pkg.api.resource.Quantity" => Some(Value::String(
            field("string")
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
        )),
        "k8s.io.apimachinery.pkg.runtime.RawExtension"
        | "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1" => {
            let key = if name.ends_with("FieldsV1") {
                "Raw"
            } else {
                "raw"
            };
            let raw = field(key)
                .and_then(|v| v.as_bytes().cloned())
                .unwrap_or_default();
            if raw.is_empty() {
                return Ok(None);
            }
            Some(serde_json::from_slice(&raw).map_err(|e| {
                Error::Invalid(format!(
                    "{name} holds no JSON (only JSON is decoded there): {e}"
                ))
            })?)
        }
        _ => None,
    };
    if special.is_some() {
        return Ok(special);
    }
    let mut object = Map::new();
    for (field, value) in message.fields() {
        let name = json_name(field.name());
        match value_json(value, &name)? {
            Some(Value::Object(members)) if is_inline(descriptor.name(), field.name()) => {
                object.extend(members);
            }
            Some(value) => {
                object.insert(name, value);
            }
            None => {}
        }
    }
    Ok(Some(Value::Object(object)))
}

/// Whether the field `field` of the message `message` (short names) is an embedded Go struct.
pub(crate) fn is_inline(message: &str, field: &str) -> bool {
    INLINE.contains(&(message, field))
}

/// The Go structs embedded in others (`json:",inline"`): a message field on the wire, their members
/// on the parent in JSON (a volume's `emptyDir` is on the volume, not in a `volumeSource`). Found in
/// the Go types of the vendored groups by protos/refresh.sh, which prints them.
const INLINE: [(&str, &str); 12] = [
    ("Volume", "volumeSource"),
    ("PersistentVolumeSpec", "persistentVolumeSource"),
    ("SecretProjection", "localObjectReference"),
    ("ConfigMapVolumeSource", "localObjectReference"),
    ("ConfigMapProjection", "localObjectReference"),
    ("ConfigMapKeySelector", "localObjectReference"),
    ("SecretKeySelector", "localObjectReference"),
    ("ConfigMapEnvSource", "localObjectReference"),
    ("SecretEnvSource", "localObjectReference"),
    ("Probe", "handler"),
    ("EphemeralContainer", "ephemeralContainerCommon"),
    ("IngressRule", "ingressRuleValue"),
];

/// One field's value; None for an empty string (Go's `omitempty`) but where it means something.
fn value_json(value: &Field, name: &str) -> Result<Option<Value>, Error> {
    Ok(match value {
        Field::Bool(b) => Some(Value::Bool(*b)),
        Field::I32(n) => Some(Value::from(*n)),
        Field::I64(n) => Some(Value::from(*n)),
        Field::U32(n) => Some(Value::from(*n)),
        Field::U64(n) => Some(Value::from(*n)),
        Field::F32(n) => Some(Value::from(f64::from(*n))),
        Field::F64(n) => Some(Value::from(*n)),
        Field::EnumNumber(n) => Some(Value::from(*n)),
        Field::String(s) if s.is_empty() && name != "storageClassName" => None,
        Field::String(s) => Some(Value::String(s.clone())),
        Field::Bytes(b) => Some(Value::String(
            base64::engine::general_purpose::STANDARD.encode(b),
        )),
        Field::Message(m) => to_json(m)?,
        Field::List(items) => {
            let mut list = Vec::with_capacity(items.len());
            for item in items {
                // A list keeps its empty strings: their places matter.
                list.push(match item {
                    Field::String(s) => Value::String(s.clone()),
                    other => value_json(other, "")?.unwrap_or(Value::Null),
                });
            }
            Some(Value::Array(list))
        }
        Field::Map(entries) => {
            let mut map = Map::new();
            for (key, value) in entries {
                let key = match key {
                    MapKey::String(s) => s.clone(),
                    MapKey::Bool(b) => b.to_string(),
                    MapKey::I32(n) => n.to_string(),
                    MapKey::I64(n) => n.to_string(),
                    MapKey::U32(n) => n.to_string(),
                    MapKey::U64(n) => n.to_string(),
                };
                // A map keeps its empty values (`data: {key: ""}` is a key with an empty value).
                let value = match value {
                    Field::String(s) => Value::String(s.clone()),
                    other => value_json(other, "")?.unwrap_or(Value::Null),
                };
                map.insert(key, value);
            }
            Some(Value::Object(map))
        }
    })
}

/// The JSON name of a field: the `.proto` files name fields as their JSON does, but for a few Go
/// names kept capitalised (`Webhooks`, `Expression`).
pub(crate) fn json_name(name: &str) -> String {
    let mut chars = name.chars();
    match chars.next() {
        Some(first) if first.is_ascii_uppercase() => {
            first.to_ascii_lowercase().to_string() + chars.as_str()
        }
        _ => name.to_owned(),
    }
}

/// Go's `time.Duration.String()`: `1h2m3.5s`, `1.5s`, `150ms`, `0s`.
fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    let fraction = |value: u64, unit: u64| {
        let (whole, rest) = (value / unit, value % unit);
        if rest == 0 {
            whole.to_string()
        } else {
            let digits = unit.to_string().len() - 1;
            let text = format!("{whole}.{rest:0digits$}");
            text.trim_end_matches('0').to_owned()
        }
    };
    if n < 1_000 {
        return format!("{sign}{n}ns");
    }
    if n < 1_000_000 {
        return format!("{sign}{}µs", fraction(n, 1_000));
    }
    if n < 1_000_000_000 {
        return format!("{sign}{}ms", fraction(n, 1_000_000));
    }
    let (hours, rest) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
    let (minutes, rest) = (rest / 60_000_000_000, rest % 60_000_000_000);
    let mut text = String::from(sign);
    if hours > 0 {
        text.push_str(&format!("{hours}h"));
    }
    if hours > 0 || minutes > 0 {
        text.push_str(&format!("{minutes}m"));
    }
    text.push_str(&format!("{}s", fraction(rest, 1_000_000_000)));
    text
}

#[cfg(test)]
mod tests {
    use prost_reflect::prost::Message as _;
    use serde_json::json;

    use super::*;

    /// Builds `name` from JSON-ish field values (prost-reflect sets them by field name).
    fn build(name: &str, fields: &[(&str, Field)]) -> DynamicMessage {
        let mut message = DynamicMessage::new(message(name).unwrap());
        for (field, value) in fields {
            message.set_field_by_name(field, value.clone());
        }
        message
    }

    fn string(s: &str) -> Field {
        Field::String(s.into())
    }

    fn envelope(api_version: &str, kind: &str, object: &DynamicMessage) -> Vec<u8> {
        let type_meta = build(
            "k8s.io.apimachinery.pkg.runtime.TypeMeta",
            &[("apiVersion", string(api_version)), ("kind", string(kind))],
        );
        let unknown = build(
            "k8s.io.apimachinery.pkg.runtime.Unknown",
            &[
                ("typeMeta", Field::Message(type_meta)),
                ("raw", Field::Bytes(object.encode_to_vec().into())),
                ("contentEncoding", string("")),
                ("contentType", string("")),
            ],
        );
        [MAGIC, &unknown.encode_to_vec()].concat()
    }

    /// ObjectMeta as gogo writes it: every non-pointer field, empty or not.
    fn meta(name: &str) -> DynamicMessage {
        let time = build(
            "k8s.io.apimachinery.pkg.apis.meta.v1.Time",
            &[("seconds", Field::I64(0)), ("nanos", Field::I32(0))],
        );
        build(
            "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta",
            &[
                ("name", string(name)),
                ("generateName", string("")),
                ("namespace", string("")),
                ("resourceVersion", string("")),
                ("generation", Field::I64(0)),
                ("creationTimestamp", Field::Message(time)),
            ],
        )
    }

    #[test]
    fn a_config_map_as_kubectl_create_configmap_sends_it() {
        let mut data = std::collections::HashMap::new();
        data.insert(MapKey::String("colour".into()), string("blue"));
        data.insert(MapKey::String("empty".into()), string(""));
        let mut binary = std::collections::HashMap::new();
        binary.insert(
            MapKey::String("blob".into()),
            Field::Bytes(vec![0u8, 1, 2].into()),
        );
        let config_map = build(
            "k8s.io.api.core.v1.ConfigMap",
            &[
                ("metadata", Field::Message(meta("settings"))),
                ("data", Field::Map(data)),
                ("binaryData", Field::Map(binary)),
            ],
        );
        let json = decode(&envelope("v1", "ConfigMap", &config_map)).unwrap();
        assert_eq!(
            json,
            json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "settings", "generation": 0},
                "data": {"colour": "blue", "empty": ""},
                "binaryData": {"blob": "AAEC"},
            })
        );
    }

    #[test]
    fn a_deployment_keeps_its_pointer_zeros_and_empty_objects() {
        let json = decode(&envelope("apps/v1", "Deployment", &deployment())).unwrap();
        assert_eq!(json["spec"]["replicas"], json!(0));
        assert_eq!(
            json["spec"]["strategy"]["rollingUpdate"],
            json!({"maxUnavailable": 1, "maxSurge": "25%"})
        );
        let pod = &json["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], json!(false));
        // Kubernetes' JSON names the volume source's members on the volume itself (inline).
        assert_eq!(
            pod["volumes"][0],
            json!({"name": "scratch", "emptyDir": {}})
        );
        assert_eq!(
            pod["containers"][0]["resources"]["limits"]["cpu"],
            json!("500m")
        );
        assert_eq!(
            pod["containers"][0]["ports"][0],
            json!({"containerPort": 80, "protocol": "TCP"})
        );
        assert_eq!(
            json["spec"]["template"]["metadata"],
            json!({"generation": 0})
        );
    }

    /// A Deployment with `replicas: 0`, a rolling update's IntOrStrings, a container with a port and
    /// a CPU limit, an `emptyDir` volume and `automountServiceAccountToken: false`.
    fn deployment() -> DynamicMessage {
        let int_or_string = |kind: i64, int: i32, text: &str| {
            Field::Message(build(
                "k8s.io.apimachinery.pkg.util.intstr.IntOrString",
                &[
                    ("type", Field::I64(kind)),
                    ("intVal", Field::I32(int)),
                    ("strVal", string(text)),
                ],
            ))
        };
        let port = build(
            "k8s.io.api.core.v1.ContainerPort",
            &[
                ("containerPort", Field::I32(80)),
                ("protocol", string("TCP")),
            ],
        );
        let limits = {
            let mut map = std::collections::HashMap::new();
            let quantity = build(
                "k8s.io.apimachinery.pkg.api.resource.Quantity",
                &[("string", string("500m"))],
            );
            map.insert(MapKey::String("cpu".into()), Field::Message(quantity));
            map
        };
        let resources = build(
            "k8s.io.api.core.v1.ResourceRequirements",
            &[("limits", Field::Map(limits))],
        );
        let container = build(
            "k8s.io.api.core.v1.Container",
            &[
                ("name", string("web")),
                ("image", string("nginx")),
                ("ports", Field::List(vec![Field::Message(port)])),
                ("resources", Field::Message(resources)),
            ],
        );
        let empty_dir = build("k8s.io.api.core.v1.EmptyDirVolumeSource", &[]);
        let source = build(
            "k8s.io.api.core.v1.VolumeSource",
            &[("emptyDir", Field::Message(empty_dir))],
        );
        let volume = build(
            "k8s.io.api.core.v1.Volume",
            &[
                ("name", string("scratch")),
                ("volumeSource", Field::Message(source)),
            ],
        );
        let pod_spec = build(
            "k8s.io.api.core.v1.PodSpec",
            &[
                ("containers", Field::List(vec![Field::Message(container)])),
                ("volumes", Field::List(vec![Field::Message(volume)])),
                ("automountServiceAccountToken", Field::Bool(false)),
            ],
        );
        let template = build(
            "k8s.io.api.core.v1.PodTemplateSpec",
            &[
                ("metadata", Field::Message(meta(""))),
                ("spec", Field::Message(pod_spec)),
            ],
        );
        let rolling = build(
            "k8s.io.api.apps.v1.RollingUpdateDeployment",
            &[
                ("maxUnavailable", int_or_string(0, 1, "")),
                ("maxSurge", int_or_string(1, 0, "25%")),
            ],
        );
        let strategy = build(
            "k8s.io.api.apps.v1.DeploymentStrategy",
            &[
                ("type", string("RollingUpdate")),
                ("rollingUpdate", Field::Message(rolling)),
            ],
        );
        let spec = build(
            "k8s.io.api.apps.v1.DeploymentSpec",
            &[
                ("replicas", Field::I32(0)),
                ("template", Field::Message(template)),
                ("strategy", Field::Message(strategy)),
            ],
        );
        build(
            "k8s.io.api.apps.v1.Deployment",
            &[
                ("metadata", Field::Message(meta("web"))),
                ("spec", Field::Message(spec)),
            ],
        )
    }

    #[test]
    fn times_durations_and_raw_json_take_their_json_forms() {
        let time = |seconds, nanos, micro: bool| {
            let name = if micro { "MicroTime" } else { "Time" };
            let m = build(
                &format!("k8s.io.apimachinery.pkg.apis.meta.v1.{name}"),
                &[
                    ("seconds", Field::I64(seconds)),
                    ("nanos", Field::I32(nanos)),
                ],
            );
            to_json(&m).unwrap()
        };
        assert_eq!(
            time(1_700_000_000, 5_000, false),
            Some(json!("2023-11-14T22:13:20Z"))
        );
        assert_eq!(
            time(1_700_000_000, 5_000, true),
            Some(json!("2023-11-14T22:13:20.000005Z"))
        );
        assert_eq!(time(0, 0, false), None);
        for (nanos, text) in [
            (0, "0s"),
            (1_500_000_000, "1.5s"),
            (150_000_000, "150ms"),
            (3_723_000_000_000, "1h2m3s"),
            (60_000_000_000, "1m0s"),
            (-2_000, "-2µs"),
        ] {
            assert_eq!(go_duration(nanos), text);
        }
        let raw = build(
            "k8s.io.apimachinery.pkg.runtime.RawExtension",
            &[("raw", Field::Bytes(br#"{"a":1}"#.to_vec().into()))],
        );
        assert_eq!(to_json(&raw).unwrap(), Some(json!({"a": 1})));
        let bad = build(
            "k8s.io.apimachinery.pkg.runtime.RawExtension",
            &[("raw", Field::Bytes(b"\x01\x02".to_vec().into()))],
        );
        assert!(matches!(to_json(&bad), Err(Error::Invalid(_))));
    }

    #[test]
    fn every_group_decoded_has_its_proto_vendored() {
        let files: Vec<String> = pool().files().map(|f| f.name().to_owned()).collect();
        for group in GROUPS {
            let file = format!("k8s.io/api/{}/v1/generated.proto", package_of(group));
            assert!(files.contains(&file), "{group:?}: {file} is not vendored");
        }
    }

    #[test]
    fn garbage_and_unknown_kinds_are_refused_with_what_is_wrong() {
        assert!(matches!(decode(b"{}"), Err(Error::Invalid(m)) if m.contains("magic")));
        assert!(matches!(
            decode(b"k8s\0\xff\xff\xff"),
            Err(Error::Invalid(_))
        ));
        let widget = build("k8s.io.api.core.v1.ConfigMap", &[]);
        let error = decode(&envelope("example.com/v1", "Widget", &widget)).unwrap_err();
        assert!(
            matches!(&error, Error::Unsupported(m) if m.contains("send it as JSON")),
            "{error}"
        );
        let error = decode(&envelope("v1", "Gadget", &widget)).unwrap_err();
        assert!(matches!(error, Error::Unsupported(_)));
        // A truncated object inside a valid envelope.
        let mut body = envelope(
            "v1",
            "ConfigMap",
            &build(
                "k8s.io.api.core.v1.ConfigMap",
                &[("metadata", Field::Message(meta("x")))],
            ),
        );
        body.truncate(body.len() - 3);
        assert!(decode(&body).is_err());
    }
}
