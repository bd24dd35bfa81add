//! Differential tests: the same requests to the emulator and to a real kube-apiserver, their status
//! codes and reasons compared, covering what operators rely on.
//!
//! Each case is a short sequence of raw requests in a namespace of its own. The table holds what the
//! real server answers (kube-apiserver 1.37, as built by this crate), so the suite checks both servers
//! in every pass: on the emulator (the default), that it answers as the real server does; with
//! `KACTOR_TEST_CLUSTER=apiserver`, that the table is still the real server's, and the emulator is
//! started beside it and compared request by request. Where the emulator knowingly differs, the case
//! says so (`differs`), with the emulator's answers and why; the emulator's README lists them.
//!
//! `KACTOR_DIFF_PRINT=1` prints every case's answers (to write a new case's expectations).

use std::fmt;

use http::{Method, Request};
use http_body_util::BodyExt;
use kactor_testenv::{Backend, TestCluster};
use serde_json::{json, Value};

/// One request: a method, a path (`{ns}` is the case's namespace), a content type and a body.
#[derive(Clone)]
struct Req {
    method: Method,
    path: String,
    content_type: &'static str,
    body: Option<Vec<u8>>,
}

fn get(path: &str) -> Req {
    Req {
        method: Method::GET,
        path: path.to_string(),
        content_type: "application/json",
        body: None,
    }
}

fn delete(path: &str) -> Req {
    Req {
        method: Method::DELETE,
        ..get(path)
    }
}

fn with_body(method: Method, path: &str, content_type: &'static str, body: Value) -> Req {
    Req {
        method,
        path: path.to_string(),
        content_type,
        body: Some(serde_json::to_vec(&body).unwrap()),
    }
}

fn post(path: &str, body: Value) -> Req {
    with_body(Method::POST, path, "application/json", body)
}

fn put(path: &str, body: Value) -> Req {
    with_body(Method::PUT, path, "application/json", body)
}

fn merge(path: &str, body: Value) -> Req {
    with_body(Method::PATCH, path, "application/merge-patch+json", body)
}

fn json_patch(path: &str, body: Value) -> Req {
    with_body(Method::PATCH, path, "application/json-patch+json", body)
}

fn strategic(path: &str, body: Value) -> Req {
    with_body(
        Method::PATCH,
        path,
        "application/strategic-merge-patch+json",
        body,
    )
}

fn apply(path: &str, body: Value) -> Req {
    with_body(Method::PATCH, path, "application/apply-patch+yaml", body)
}

fn raw(method: Method, path: &str, content_type: &'static str, body: &str) -> Req {
    Req {
        method,
        path: path.to_string(),
        content_type,
        body: Some(body.as_bytes().to_vec()),
    }
}

/// A body in Kubernetes' protobuf envelope, as kubectl's imperative commands send built-in kinds:
/// `k8s\0`, then a `runtime.Unknown` with the type and the object's own message as bytes.
fn protobuf(method: Method, path: &str, api_version: &str, kind: &str, object: &[u8]) -> Req {
    let type_meta = [field(1, api_version.as_bytes()), field(2, kind.as_bytes())].concat();
    let unknown = [field(1, &type_meta), field(2, object)].concat();
    Req {
        method,
        path: path.to_string(),
        content_type: "application/vnd.kubernetes.protobuf",
        body: Some([&b"k8s\0"[..], &unknown].concat()),
    }
}

/// A length-delimited protobuf field (wire type 2), for the short values of these cases.
fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
    let length = u8::try_from(bytes.len()).expect("under 128 bytes");
    assert!(length < 128 && number < 16);
    [&[(number << 3) | 2, length][..], bytes].concat()
}

/// `k8s.io.api.core.v1.ConfigMap` named `name` with `data: {a: "1"}`.
fn protobuf_config_map(name: &str) -> Vec<u8> {
    let metadata = field(1, name.as_bytes());
    let entry = [field(1, b"a"), field(2, b"1")].concat();
    [field(1, &metadata), field(2, &entry)].concat()
}

/// What a server answered: the code, and the reason of a `Status` body (empty for objects).
#[derive(Clone, PartialEq, Eq)]
struct Answer {
    code: u16,
    reason: String,
}

impl fmt::Debug for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.code == 0 {
            write!(f, "no answer")
        } else if self.reason.is_empty() {
            write!(f, "{}", self.code)
        } else {
            write!(f, "{} {}", self.code, self.reason)
        }
    }
}

/// One case: its requests, what the real server answers to each (`"201"`, `"409 AlreadyExists"`),
/// and, where the emulator knowingly differs, its answers and why.
struct Case {
    name: &'static str,
    requests: Vec<Req>,
    expect: &'static [&'static str],
    differs: Option<(&'static [&'static str], &'static str)>,
}

fn case(name: &'static str, requests: Vec<Req>, expect: &'static [&'static str]) -> Case {
    Case {
        name,
        requests,
        expect,
        differs: None,
    }
}

impl Case {
    /// The emulator knowingly answers `emulator` instead, for the reason `why`.
    fn differs(mut self, emulator: &'static [&'static str], why: &'static str) -> Case {
        self.differs = Some((emulator, why));
        self
    }
}

fn parse(expected: &str) -> Answer {
    if expected == "no answer" {
        return Answer {
            code: 0,
            reason: String::new(),
        };
    }
    let (code, reason) = expected.split_once(' ').unwrap_or((expected, ""));
    Answer {
        code: code.parse().expect("a status code"),
        reason: reason.to_string(),
    }
}

fn cm(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1"}})
}

fn widget(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec})
}

fn gadget(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": name}, "spec": spec})
}

const CMS: &str = "/api/v1/namespaces/{ns}/configmaps";
const WIDGETS: &str = "/apis/example.com/v1/namespaces/{ns}/widgets";
const GADGETS: &str = "/apis/example.com/v1/namespaces/{ns}/gadgets";

/// A CRD with the validations a schema may ask for: required, pattern, enum, bounds, lengths.
fn gadget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["code"],
                            "properties": {
                                "code": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
                                "color": {"type": "string", "enum": ["red", "blue"]},
                                "count": {"type": "integer", "minimum": 1, "maximum": 5},
                                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                            },
                        },
                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    },
                }},
            }],
        },
    })
}

#[allow(
    clippy::too_many_lines,
    reason = "the table of cases, one entry each, read top to bottom"
)]
fn cases() -> Vec<Case> {
    let one = format!("{CMS}/one");
    vec![
        // Create, read, replace, delete.
        case("create", vec![post(CMS, cm("one"))], &["201"]),
        case(
            "create twice",
            vec![post(CMS, cm("one")), post(CMS, cm("one"))],
            &["201", "409 AlreadyExists"],
        ),
        case(
            "get",
            vec![post(CMS, cm("one")), get(&one)],
            &["201", "200"],
        ),
        case("get a missing object", vec![get(&one)], &["404 NotFound"]),
        case(
            "an invalid name",
            vec![post(CMS, cm("Bad_Name"))],
            &["422 Invalid"],
        ),
        case(
            "neither name nor generateName",
            vec![post(CMS, json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}))],
            &["422 Invalid"],
        ),
        case(
            "generateName",
            vec![post(
                CMS,
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"generateName": "gen-"}}),
            )],
            &["201"],
        ),
        case(
            "a body's namespace that is not the path's",
            vec![post(
                CMS,
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "elsewhere"}}),
            )],
            &["400 BadRequest"],
        ),
        case(
            "a namespace that does not exist",
            vec![post("/api/v1/namespaces/no-such-namespace/configmaps", cm("x"))],
            &["404 NotFound"],
        ),
        case(
            "a resourceVersion on create",
            vec![post(
                CMS,
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "resourceVersion": "5"}}),
            )],
            &["500"],
        ),
        case(
            "replace with a stale resourceVersion",
            vec![
                post(CMS, cm("one")),
                put(
                    &one,
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one", "resourceVersion": "1"}}),
                ),
            ],
            &["201", "409 Conflict"],
        ),
        case(
            "replace without a resourceVersion",
            vec![post(CMS, cm("one")), put(&one, cm("one"))],
            &["201", "200"],
        ),
        case(
            "replace a missing object",
            vec![put(&one, cm("one"))],
            &["404 NotFound"],
        ),
        case(
            "replace under another name",
            vec![post(CMS, cm("one")), put(&one, cm("two"))],
            &["201", "400 BadRequest"],
        ),
        case(
            "delete, then delete again",
            vec![post(CMS, cm("one")), delete(&one), delete(&one)],
            &["201", "200", "404 NotFound"],
        ),
        case(
            "delete with a precondition on another uid",
            vec![
                post(CMS, cm("one")),
                with_body(
                    Method::DELETE,
                    &one,
                    "application/json",
                    json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}}),
                ),
            ],
            &["201", "409 Conflict"],
        ),
        case(
            "delete a collection by label",
            vec![
                post(CMS, cm("one")),
                delete(&format!("{CMS}?labelSelector=app%3Dx")),
            ],
            &["201", "200"],
        ),
        // Bodies and content types.
        case(
            "a number in a ConfigMap's data",
            vec![post(
                CMS,
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": 1}}),
            )],
            &["400 BadRequest"],
        ),
        case(
            "an invalid ConfigMap key",
            vec![post(
                CMS,
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"bad key!": "1"}}),
            )],
            &["422 Invalid"],
        ),
        case(
            "binaryData that is not base64",
            vec![post(
                CMS,
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "binaryData": {"a": "%%%"}}),
            )],
            &["400 BadRequest"],
        ),
        case(
            "an invalid label value",
            vec![post(
                CMS,
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "labels": {"app": "not valid!"}}}),
            )],
            &["422 Invalid"],
        ),
        case(
            "malformed JSON",
            vec![raw(Method::POST, CMS, "application/json", "{not json")],
            &["400 BadRequest"],
        ),
        case(
            "a protobuf ConfigMap (kubectl create configmap)",
            vec![
                protobuf(Method::POST, CMS, "v1", "ConfigMap", &protobuf_config_map("pb")),
                get(&format!("{CMS}/pb")),
                protobuf(Method::POST, CMS, "v1", "ConfigMap", &protobuf_config_map("pb")),
            ],
            &["201", "200", "409 AlreadyExists"],
        ),
        case(
            "a protobuf ConfigMap replaced",
            vec![
                post(CMS, cm("pb")),
                protobuf(Method::PUT, &format!("{CMS}/pb"), "v1", "ConfigMap", &protobuf_config_map("pb")),
            ],
            &["201", "200"],
        ),
        case(
            "a protobuf body of a custom resource",
            vec![protobuf(Method::POST, WIDGETS, "example.com/v1", "Widget", &protobuf_config_map("w"))],
            &["no answer"],
        )
        .differs(
            &["415 UnsupportedMediaType"],
            "a real server resets the HTTP/2 stream (INTERNAL_ERROR: its handler fails) rather than \
             answer; the emulator answers 415, as for any body it cannot decode",
        ),
        case(
            "a protobuf body that is not protobuf",
            vec![raw(Method::POST, CMS, "application/vnd.kubernetes.protobuf", "k8s\0\u{7f}garbage")],
            &["400 BadRequest"],
        ),
        case(
            "a service account's token (kubectl create token)",
            vec![
                post(
                    "/api/v1/namespaces/{ns}/serviceaccounts",
                    json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bot"}}),
                ),
                post(
                    "/api/v1/namespaces/{ns}/serviceaccounts/bot/token",
                    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
                ),
                post(
                    "/api/v1/namespaces/{ns}/serviceaccounts/nobody/token",
                    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}),
                ),
                post(
                    "/api/v1/namespaces/{ns}/serviceaccounts/bot/token",
                    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 60}}),
                ),
            ],
            &["201", "201", "404 NotFound", "422 Invalid"],
        ),
        case(
            "an unsupported content type",
            vec![raw(Method::POST, CMS, "text/plain", "hello")],
            &["415 UnsupportedMediaType"],
        ),
        case(
            "a kind that is not the resource's",
            vec![post(
                CMS,
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}}),
            )],
            &["400 BadRequest"],
        ),
        // Patches.
        case(
            "a merge patch",
            vec![post(CMS, cm("one")), merge(&one, json!({"data": {"b": "2"}}))],
            &["201", "200"],
        ),
        case(
            "a merge patch of a missing object",
            vec![merge(&one, json!({"data": {"b": "2"}}))],
            &["404 NotFound"],
        ),
        case(
            "a merge patch with a stale resourceVersion",
            vec![
                post(CMS, cm("one")),
                merge(&one, json!({"metadata": {"resourceVersion": "1"}, "data": {"b": "2"}})),
            ],
            &["201", "409 Conflict"],
        ),
        case(
            "a JSON patch",
            vec![
                post(CMS, cm("one")),
                json_patch(&one, json!([{"op": "add", "path": "/data/b", "value": "2"}])),
            ],
            &["201", "200"],
        ),
        case(
            "a JSON patch whose test fails",
            vec![
                post(CMS, cm("one")),
                json_patch(&one, json!([{"op": "test", "path": "/data/a", "value": "9"}])),
            ],
            &["201", "422 Invalid"],
        ),
        case(
            "a JSON patch of a path that is not there",
            vec![
                post(CMS, cm("one")),
                json_patch(&one, json!([{"op": "replace", "path": "/data/zzz", "value": "9"}])),
            ],
            &["201", "200"],
        ),
        case(
            "a strategic merge patch of a ConfigMap",
            vec![post(CMS, cm("one")), strategic(&one, json!({"data": {"b": "2"}}))],
            &["201", "200"],
        ),
        case(
            "a strategic merge patch of a custom resource",
            vec![
                post(WIDGETS, widget("w", json!({"size": 1}))),
                strategic(&format!("{WIDGETS}/w"), json!({"spec": {"size": 2}})),
            ],
            &["201", "415 UnsupportedMediaType"],
        ),
        case(
            "an apply without a field manager",
            vec![apply(&one, cm("one"))],
            &["422 Invalid"],
        ),
        case(
            "an apply that creates",
            vec![apply(&format!("{one}?fieldManager=a"), cm("one"))],
            &["201"],
        ),
        case(
            "an apply with a wrongly typed field of a custom resource",
            vec![apply(
                &format!("{WIDGETS}/w?fieldManager=a"),
                widget("w", json!({"size": "big"})),
            )],
            &["500"],
        )
        .differs(
            &["422 Invalid"],
            "a real server fails building the apply's typed value (an internal error, no reason); \
             the emulator answers as for a create with the same body",
        ),
        case(
            "an apply that conflicts with another manager",
            vec![
                apply(&format!("{one}?fieldManager=a"), cm("one")),
                apply(
                    &format!("{one}?fieldManager=b"),
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one"}, "data": {"a": "2"}}),
                ),
            ],
            &["201", "409 Conflict"],
        )
        .differs(
            &["201", "200"],
            "the emulator does not track which manager owns which field (no managedFields)",
        ),
        case(
            "a forced apply over another manager",
            vec![
                apply(&format!("{one}?fieldManager=a"), cm("one")),
                apply(
                    &format!("{one}?fieldManager=b&force=true"),
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one"}, "data": {"a": "2"}}),
                ),
            ],
            &["201", "200"],
        ),
        case(
            "an apply by the same manager again",
            vec![
                apply(&format!("{one}?fieldManager=a"), cm("one")),
                apply(
                    &format!("{one}?fieldManager=a"),
                    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one"}, "data": {"a": "2"}}),
                ),
            ],
            &["201", "200"],
        ),
        case(
            "an unknown patch type",
            vec![
                post(CMS, cm("one")),
                raw(Method::PATCH, &one, "application/x-nonsense", "{}"),
            ],
            &["201", "415 UnsupportedMediaType"],
        ),
        // Dry runs.
        case(
            "a dry-run create stores nothing",
            vec![post(&format!("{CMS}?dryRun=All"), cm("one")), get(&one)],
            &["201", "404 NotFound"],
        ),
        case(
            "a dry-run delete keeps the object",
            vec![post(CMS, cm("one")), delete(&format!("{one}?dryRun=All")), get(&one)],
            &["201", "200", "200"],
        ),
        // Lists and selectors.
        case("list", vec![get(CMS)], &["200"]),
        case(
            "a label selector that does not parse",
            vec![get(&format!("{CMS}?labelSelector=a%20in%20("))],
            &["400 BadRequest"],
        ),
        case(
            "a field selector on the name",
            vec![get(&format!("{CMS}?fieldSelector=metadata.name%3Done"))],
            &["200"],
        ),
        case(
            "a field selector on a field that is not indexed",
            vec![get(&format!("{CMS}?fieldSelector=data.a%3D1"))],
            &["400 BadRequest"],
        ),
        case(
            "a continue token that is not one",
            vec![get(&format!("{CMS}?limit=1&continue=nonsense"))],
            &["400 BadRequest"],
        ),
        case(
            "resourceVersion=0",
            vec![get(&format!("{CMS}?resourceVersion=0"))],
            &["200"],
        ),
        // Custom resources: schemas, status, finalizers.
        case(
            "a widget",
            vec![post(WIDGETS, widget("w", json!({"size": 1})))],
            &["201"],
        ),
        case(
            "a widget of the wrong type",
            vec![post(WIDGETS, widget("w", json!({"size": "big"})))],
            &["422 Invalid"],
        ),
        case(
            "a widget below its minimum",
            vec![post(WIDGETS, widget("w", json!({"size": -1})))],
            &["422 Invalid"],
        ),
        case(
            "a gadget",
            vec![post(GADGETS, gadget("g", json!({"code": "abc", "color": "red", "count": 2})))],
            &["201"],
        ),
        case(
            "a gadget without its required field",
            vec![post(GADGETS, gadget("g", json!({"color": "red"})))],
            &["422 Invalid"],
        ),
        case(
            "a gadget against its pattern",
            vec![post(GADGETS, gadget("g", json!({"code": "ABC"})))],
            &["422 Invalid"],
        ),
        case(
            "a gadget outside its enum",
            vec![post(GADGETS, gadget("g", json!({"code": "abc", "color": "green"})))],
            &["422 Invalid"],
        ),
        case(
            "a gadget above its maximum",
            vec![post(GADGETS, gadget("g", json!({"code": "abc", "count": 9})))],
            &["422 Invalid"],
        ),
        case(
            "a gadget over its maxLength",
            vec![post(GADGETS, gadget("g", json!({"code": "abcdefghijk"})))],
            &["422 Invalid"],
        ),
        case(
            "a gadget over its maxItems",
            vec![post(GADGETS, gadget("g", json!({"code": "abc", "tags": ["a", "b", "c"]})))],
            &["422 Invalid"],
        ),
        case(
            "an unknown field is pruned, not refused",
            vec![post(GADGETS, gadget("g", json!({"code": "abc", "extra": 1})))],
            &["201"],
        ),
        case(
            "a status patch",
            vec![
                post(WIDGETS, widget("w", json!({"size": 1}))),
                merge(&format!("{WIDGETS}/w/status"), json!({"status": {"ok": true}})),
            ],
            &["201", "200"],
        ),
        case(
            "a status patch of a ConfigMap, which has no status",
            vec![post(CMS, cm("one")), merge(&format!("{one}/status"), json!({"status": {}}))],
            &["201", "404 NotFound"],
        ),
        case(
            "a finalizer holds a deleted object until it is removed",
            vec![
                post(
                    WIDGETS,
                    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "finalizers": ["example.com/hold"]}, "spec": {"size": 1}}),
                ),
                delete(&format!("{WIDGETS}/w")),
                get(&format!("{WIDGETS}/w")),
                merge(&format!("{WIDGETS}/w"), json!({"metadata": {"finalizers": null}})),
                get(&format!("{WIDGETS}/w")),
            ],
            &["201", "200", "200", "200", "404 NotFound"],
        ),
        case(
            "a new finalizer on an object being deleted",
            vec![
                post(
                    WIDGETS,
                    json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "finalizers": ["example.com/hold"]}, "spec": {"size": 1}}),
                ),
                delete(&format!("{WIDGETS}/w")),
                merge(
                    &format!("{WIDGETS}/w"),
                    json!({"metadata": {"finalizers": ["example.com/hold", "example.com/another"]}}),
                ),
            ],
            &["201", "200", "422 Invalid"],
        ),
        // Built-in kinds' validation.
        case(
            "a Deployment",
            vec![post(
                "/apis/apps/v1/namespaces/{ns}/deployments",
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {
                    "selector": {"matchLabels": {"app": "d"}},
                    "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}),
            )],
            &["201"],
        ),
        case(
            "a Deployment whose selector does not match its pods",
            vec![post(
                "/apis/apps/v1/namespaces/{ns}/deployments",
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {
                    "selector": {"matchLabels": {"app": "d"}},
                    "template": {"metadata": {"labels": {"app": "other"}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}),
            )],
            &["422 Invalid"],
        ),
        case(
            "a Pod without containers",
            vec![post(
                "/api/v1/namespaces/{ns}/pods",
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": []}}),
            )],
            &["422 Invalid"],
        ),
        case(
            "an Event without its involved object",
            vec![post(
                "/api/v1/namespaces/{ns}/events",
                json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}, "reason": "Test", "message": "m"}),
            )],
            &["422 Invalid"],
        ),
        case(
            "a Lease",
            vec![post(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15}}),
            )],
            &["201"],
        ),
        case(
            "a Lease of a negative duration",
            vec![post(
                "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases",
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": -1}}),
            )],
            &["422 Invalid"],
        ),
        case(
            "a Secret whose data is not base64",
            vec![post(
                "/api/v1/namespaces/{ns}/secrets",
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"a": "%%%"}}),
            )],
            &["400 BadRequest"],
        ),
        case(
            "a ServiceAccount",
            vec![post(
                "/api/v1/namespaces/{ns}/serviceaccounts",
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa"}}),
            )],
            &["201"],
        ),
        case(
            "a Namespace of an invalid name",
            vec![post(
                "/api/v1/namespaces",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "Not_Valid"}}),
            )],
            &["422 Invalid"],
        ),
        // Discovery, paths and methods.
        case("/version", vec![get("/version")], &["200"]),
        case("/api", vec![get("/api")], &["200"]),
        case("/apis", vec![get("/apis")], &["200"]),
        case(
            "a group-version",
            vec![get("/apis/example.com/v1")],
            &["200"],
        ),
        case(
            "a group that is not served",
            vec![get("/apis/nothing.example.com/v1")],
            &["404"],
        )
        .differs(
            &["404 NotFound"],
            "the emulator answers a Status; a real server the text `404 page not found` (the same \
             code: clients read both as not found)",
        ),
        case(
            "a resource that is not served",
            vec![get("/api/v1/namespaces/{ns}/nothings")],
            &["404 NotFound"],
        ),
        case(
            "a cluster-scoped resource under a namespace",
            vec![get("/api/v1/namespaces/{ns}/nodes")],
            &["404 NotFound"],
        ),
        case(
            "replacing a whole collection",
            vec![put(CMS, cm("one"))],
            &["405 MethodNotAllowed"],
        ),
        case(
            "a SelfSubjectAccessReview",
            vec![post(
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "spec": {"resourceAttributes": {"verb": "get", "resource": "configmaps", "namespace": "default"}}}),
            )],
            &["201"],
        ),
    ]
}

/// Sends one request; what came back.
async fn send(client: &kube::Client, namespace: &str, req: &Req) -> Answer {
    let path = req.path.replace("{ns}", namespace);
    let request = Request::builder()
        .method(req.method.clone())
        .uri(&path)
        .header("content-type", req.content_type)
        .header("accept", "application/json")
        .body(kube::client::Body::from(
            req.body.clone().unwrap_or_default(),
        ))
        .unwrap();
    let response = match client.send(request).await {
        Ok(response) => response,
        // The stream reset before any answer (a real server does this for a few bodies).
        Err(_) => {
            return Answer {
                code: 0,
                reason: String::new(),
            }
        }
    };
    let code = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let reason = serde_json::from_slice::<Value>(&body)
        .ok()
        .filter(|v| v["kind"] == "Status" && v["status"] == "Failure")
        .and_then(|v| v["reason"].as_str().map(String::from))
        .unwrap_or_default();
    Answer { code, reason }
}

/// A cluster with the CRDs the cases use.
async fn prepared(backend: Backend) -> TestCluster {
    let cluster = TestCluster::builder()
        .backend(backend)
        .start()
        .await
        .unwrap();
    let client = cluster.client();
    kactor_emulator::samples::install_widgets(&client)
        .await
        .unwrap();
    let answer = send(
        &client,
        "",
        &post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            gadget_crd(),
        ),
    )
    .await;
    assert_eq!(answer.code, 201, "the gadgets CRD: {answer:?}");
    kactor_emulator::samples::until_established(&client, "gadgets.example.com")
        .await
        .unwrap();
    kactor_emulator::samples::until_discovered(&client, "example.com", "v1", "gadgets")
        .await
        .unwrap();
    cluster
}

/// Runs every case on `cluster`, each in a namespace of its own: the answers, by case.
async fn run(cluster: &TestCluster, cases: &[Case]) -> Vec<Vec<Answer>> {
    let client = cluster.client();
    let mut all = Vec::new();
    for (n, case) in cases.iter().enumerate() {
        let namespace = format!("diff-{n}");
        let created = send(
            &client,
            "",
            &post(
                "/api/v1/namespaces",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
            ),
        )
        .await;
        assert_eq!(created.code, 201, "namespace {namespace}: {created:?}");
        let mut answers = Vec::new();
        for req in &case.requests {
            answers.push(send(&client, &namespace, req).await);
        }
        all.push(answers);
    }
    all
}

fn expected(case: &Case, on_emulator: bool) -> Vec<Answer> {
    let table = match (on_emulator, case.differs) {
        (true, Some((emulator, _))) => emulator,
        _ => case.expect,
    };
    table.iter().map(|e| parse(e)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_answers_as_a_real_kube_apiserver_does() {
    let cases = cases();
    assert!(cases.len() >= 60, "{} cases", cases.len());
    for case in &cases {
        assert_eq!(case.requests.len(), case.expect.len(), "{}", case.name);
    }
    let print = std::env::var("KACTOR_DIFF_PRINT").is_ok();
    let backend = Backend::from_env().unwrap();
    let mut mismatches = Vec::new();

    // The real server, when this pass has it: the table must still be its answers.
    if backend == Backend::ApiServer {
        let real = prepared(Backend::ApiServer).await;
        let answers = run(&real, &cases).await;
        for (case, answers) in cases.iter().zip(&answers) {
            if print {
                println!("apiserver  {:<55} {answers:?}", case.name);
            }
            if *answers != expected(case, false) {
                mismatches.push(format!(
                    "real server, {}: answered {answers:?}, the table says {:?}",
                    case.name, case.expect
                ));
            }
        }
        real.shutdown().await;
    }

    // The emulator, in every pass.
    let emulator = prepared(Backend::Emulator).await;
    let answers = run(&emulator, &cases).await;
    for (case, answers) in cases.iter().zip(&answers) {
        if print {
            println!("emulator   {:<55} {answers:?}", case.name);
        }
        if *answers != expected(case, true) {
            mismatches.push(format!(
                "emulator, {}: answered {answers:?}, the real server {:?}",
                case.name, case.expect
            ));
        }
    }
    emulator.shutdown().await;
    assert!(
        mismatches.is_empty(),
        "{} of {} cases differ:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.join("\n")
    );
}

/// The OpenAPI v3 documents of the built-in kinds, which `kubectl explain` reads: the emulator makes
/// them from the upstream `.proto` files, a real server from the Go types. Compared definition by
/// definition: the same properties, each of the same type (or reference), and the same list and
/// patch markers. Only with the real server beside the emulator.
mod apiserver_only {
    use std::collections::BTreeSet;

    use super::*;

    async fn document(client: &kube::Client, path: &str) -> Value {
        let request = Request::get(path).body(Vec::new()).unwrap();
        client
            .request::<Value>(request)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// What a property is: its type and format, the definition it refers to, its items' type or
    /// reference, and the extensions clients read.
    fn shape(property: &Value) -> Value {
        let reference = |v: &Value| {
            v.get("$ref")
                .or_else(|| v.pointer("/allOf/0/$ref"))
                .cloned()
                .unwrap_or(Value::Null)
        };
        let mut shape = json!({
            "type": property.get("type"),
            "ref": reference(property),
            "items": property.get("items").map(|i| json!([i.get("type"), reference(i)])),
            "values": property.get("additionalProperties").map(|i| json!([i.get("type"), reference(i)])),
        });
        for key in [
            "x-kubernetes-patch-merge-key",
            "x-kubernetes-patch-strategy",
            "x-kubernetes-list-type",
            "x-kubernetes-list-map-keys",
        ] {
            shape[key] = property.get(key).cloned().unwrap_or(Value::Null);
        }
        shape
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_built_in_kinds_openapi_v3_schemas_are_the_real_servers() {
        if Backend::from_env().unwrap() != Backend::ApiServer {
            return;
        }
        let real = prepared(Backend::ApiServer).await;
        let emulator = prepared(Backend::Emulator).await;
        let kinds = [
            ("/openapi/v3/api/v1", "io.k8s.api.core.v1.ConfigMap"),
            ("/openapi/v3/api/v1", "io.k8s.api.core.v1.Secret"),
            ("/openapi/v3/api/v1", "io.k8s.api.core.v1.Pod"),
            ("/openapi/v3/api/v1", "io.k8s.api.core.v1.Service"),
            ("/openapi/v3/apis/apps/v1", "io.k8s.api.apps.v1.Deployment"),
            ("/openapi/v3/apis/batch/v1", "io.k8s.api.batch.v1.Job"),
            (
                "/openapi/v3/apis/rbac.authorization.k8s.io/v1",
                "io.k8s.api.rbac.v1.RoleBinding",
            ),
            (
                "/openapi/v3/apis/coordination.k8s.io/v1",
                "io.k8s.api.coordination.v1.Lease",
            ),
        ];
        let mut compared = 0;
        let mut differences = Vec::new();
        for (path, root) in kinds {
            let theirs = document(&real.client(), path).await;
            let ours = document(&emulator.client(), path).await;
            let (theirs, ours) = (
                &theirs["components"]["schemas"],
                &ours["components"]["schemas"],
            );
            // Every definition the kind reaches in the real document.
            let mut pending = vec![root.to_owned()];
            let mut seen = BTreeSet::new();
            while let Some(name) = pending.pop() {
                if !seen.insert(name.clone()) {
                    continue;
                }
                let Some(real_definition) = theirs.get(&name) else {
                    differences.push(format!("{name}: not in the real document"));
                    continue;
                };
                let Some(our_definition) = ours.get(&name) else {
                    differences.push(format!("{name}: not in the emulator's document"));
                    continue;
                };
                let empty = serde_json::Map::new();
                let real_properties = real_definition["properties"].as_object().unwrap_or(&empty);
                let our_properties = our_definition["properties"].as_object().unwrap_or(&empty);
                let names: BTreeSet<&String> = real_properties
                    .keys()
                    .chain(our_properties.keys())
                    .collect();
                for property in names {
                    let (a, b) = (real_properties.get(property), our_properties.get(property));
                    match (a, b) {
                        (Some(a), Some(b)) => {
                            compared += 1;
                            if shape(a) != shape(b) {
                                differences.push(format!(
                                    "{name}.{property}: real {} vs emulator {}",
                                    shape(a),
                                    shape(b)
                                ));
                            }
                            let text = a.to_string();
                            for reference in text.split("#/components/schemas/").skip(1) {
                                pending.push(reference[..reference.find('"').unwrap()].to_owned());
                            }
                        }
                        (Some(_), None) => differences
                            .push(format!("{name}.{property}: missing in the emulator's")),
                        (None, _) => {
                            differences.push(format!("{name}.{property}: only in the emulator's"))
                        }
                    }
                }
                if real_definition.get("type") != our_definition.get("type")
                    || real_definition.get("format") != our_definition.get("format")
                {
                    differences.push(format!("{name}: type or format differs"));
                }
            }
        }
        assert!(compared > 500, "only {compared} properties compared");
        assert!(
            differences.is_empty(),
            "{} of {compared} properties differ:\n{}",
            differences.len(),
            differences.join("\n")
        );
    }
}
