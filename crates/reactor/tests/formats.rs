//! Golden tests of the wire formats shared with Kopf: annotation keys, progress records, the
//! touch annotation, the diff-base, and diffs.
//!
//! Every expected value here was produced by Kopf 1.45.2's own code and embedded as a literal:
//! `StorageKeyFormingConvention.make_v2_key/make_v1_key/make_keys` for keys;
//! `HandlerState(...).for_storage()` stored by `AnnotationsProgressStorage.store` for records;
//! `SmartProgressStorage.purge/touch` for purge and touch patches;
//! `AnnotationsDiffBaseStorage.build` + `SmartProgressStorage.clear` + `.store` for diff-bases
//! (on bodies with sorted keys, as the API server sends them); `diffs.diff/reduce` for diffs.
//! No Python runs at test time.

use std::collections::BTreeMap;

use jiff::Timestamp;
use kactor_reactor::diffbase::DiffBaseStorage;
use kactor_reactor::diffs::{diff, parse_field, DiffOp};
use kactor_reactor::keys::KeyForming;
use kactor_reactor::progress::{
    format_timestamp, parse_timestamp, FormatError, ProgressRecord, ProgressStorage,
};
use kube::api::DynamicObject;
use serde_json::{json, Value};

fn s(text: &str) -> String {
    text.to_string()
}

fn ts(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

fn with_annotations(annotations: &[(&str, &str)]) -> DynamicObject {
    let mut body = object(json!({"apiVersion": "kopf.dev/v1", "kind": "KopfExample",
                                 "metadata": {"name": "ex1", "namespace": "default"}}));
    body.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    );
    body
}

// --- Annotation keys ---

#[test]
fn annotation_keys_match_kopf() {
    let p70 = "p".repeat(70);
    let cases: Vec<(&str, String, String, String)> = vec![
        ("kopf.zalando.org", s("create_fn"), s("kopf.zalando.org/create_fn"), s("kopf.zalando.org/create_fn")),
        ("kopf.zalando.org", s("create_fn/item1"), s("kopf.zalando.org/create_fn.item1"), s("kopf.zalando.org/create_fn.item1")),
        ("kopf.zalando.org", s("fn/spec.field"), s("kopf.zalando.org/fn.spec.field"), s("kopf.zalando.org/fn.spec.field")),
        ("kopf.zalando.org", s("a<b>c"), s("kopf.zalando.org/a_b_c"), s("kopf.zalando.org/a_b_c")),
        ("kopf.zalando.org", "x".repeat(47), s("kopf.zalando.org/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), s("kopf.zalando.org/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-xRCOAQ")),
        ("kopf.zalando.org", "x".repeat(48), s("kopf.zalando.org/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), s("kopf.zalando.org/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-PCd7lQ")),
        ("kopf.zalando.org", "x".repeat(64), s("kopf.zalando.org/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-SItAqA"), s("kopf.zalando.org/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-SItAqA")),
        ("kopf.zalando.org", "h".repeat(200), s("kopf.zalando.org/hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh-sG0kbg"), s("kopf.zalando.org/hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh-sG0kbg")),
        ("kopf.zalando.org", s("über-handler/ключ"), s("kopf.zalando.org/über-handler.ключ"), s("kopf.zalando.org/über-handler.ключ")),
        ("kopf.zalando.org", "ü".repeat(64), s("kopf.zalando.org/üüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüü-m0zvhA"), s("kopf.zalando.org/üüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüü-m0zvhA")),
        ("kopf.zalando.org", "emoji-🦀".repeat(10), s("kopf.zalando.org/emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀-u3GB7Q"), s("kopf.zalando.org/emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoj-u3GB7Q")),
        ("kopf.zalando.org", s("last-handled-configuration"), s("kopf.zalando.org/last-handled-configuration"), s("kopf.zalando.org/last-handled-configuration")),
        ("kopf.zalando.org", s("touch-dummy"), s("kopf.zalando.org/touch-dummy"), s("kopf.zalando.org/touch-dummy")),
        ("my-op.example.com", s("create_fn"), s("my-op.example.com/create_fn"), s("my-op.example.com/create_fn")),
        ("my-op.example.com", s("create_fn/item1"), s("my-op.example.com/create_fn.item1"), s("my-op.example.com/create_fn.item1")),
        ("my-op.example.com", s("fn/spec.field"), s("my-op.example.com/fn.spec.field"), s("my-op.example.com/fn.spec.field")),
        ("my-op.example.com", s("a<b>c"), s("my-op.example.com/a_b_c"), s("my-op.example.com/a_b_c")),
        ("my-op.example.com", "x".repeat(47), s("my-op.example.com/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), s("my-op.example.com/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-xRCOAQ")),
        ("my-op.example.com", "x".repeat(48), s("my-op.example.com/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), s("my-op.example.com/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-PCd7lQ")),
        ("my-op.example.com", "x".repeat(64), s("my-op.example.com/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-SItAqA"), s("my-op.example.com/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-SItAqA")),
        ("my-op.example.com", "h".repeat(200), s("my-op.example.com/hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh-sG0kbg"), s("my-op.example.com/hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh-sG0kbg")),
        ("my-op.example.com", s("über-handler/ключ"), s("my-op.example.com/über-handler.ключ"), s("my-op.example.com/über-handler.ключ")),
        ("my-op.example.com", "ü".repeat(64), s("my-op.example.com/üüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüü-m0zvhA"), s("my-op.example.com/üüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüü-m0zvhA")),
        ("my-op.example.com", "emoji-🦀".repeat(10), s("my-op.example.com/emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀-u3GB7Q"), s("my-op.example.com/emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀emo-u3GB7Q")),
        ("my-op.example.com", s("last-handled-configuration"), s("my-op.example.com/last-handled-configuration"), s("my-op.example.com/last-handled-configuration")),
        ("my-op.example.com", s("touch-dummy"), s("my-op.example.com/touch-dummy"), s("my-op.example.com/touch-dummy")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", s("create_fn"), s("a-very-long-operator-prefix-to-hit-limits.example.com/create_fn"), s("a-very-long-operator-prefix-to-hit-limits.example.com/create_fn")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", s("create_fn/item1"), s("a-very-long-operator-prefix-to-hit-limits.example.com/create_fn.item1"), s("a-very-long-operator-prefix-to-hit-limits.example.com/cr-BPvuug")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", s("fn/spec.field"), s("a-very-long-operator-prefix-to-hit-limits.example.com/fn.spec.field"), s("a-very-long-operator-prefix-to-hit-limits.example.com/fn-GK78jQ")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", s("a<b>c"), s("a-very-long-operator-prefix-to-hit-limits.example.com/a_b_c"), s("a-very-long-operator-prefix-to-hit-limits.example.com/a_b_c")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", "x".repeat(47), s("a-very-long-operator-prefix-to-hit-limits.example.com/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), s("a-very-long-operator-prefix-to-hit-limits.example.com/xx-xRCOAQ")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", "x".repeat(48), s("a-very-long-operator-prefix-to-hit-limits.example.com/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"), s("a-very-long-operator-prefix-to-hit-limits.example.com/xx-PCd7lQ")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", "x".repeat(64), s("a-very-long-operator-prefix-to-hit-limits.example.com/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-SItAqA"), s("a-very-long-operator-prefix-to-hit-limits.example.com/xx-SItAqA")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", "h".repeat(200), s("a-very-long-operator-prefix-to-hit-limits.example.com/hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh-sG0kbg"), s("a-very-long-operator-prefix-to-hit-limits.example.com/hh-sG0kbg")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", s("über-handler/ключ"), s("a-very-long-operator-prefix-to-hit-limits.example.com/über-handler.ключ"), s("a-very-long-operator-prefix-to-hit-limits.example.com/üb-Ylz38A")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", "ü".repeat(64), s("a-very-long-operator-prefix-to-hit-limits.example.com/üüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüüü-m0zvhA"), s("a-very-long-operator-prefix-to-hit-limits.example.com/üü-m0zvhA")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", "emoji-🦀".repeat(10), s("a-very-long-operator-prefix-to-hit-limits.example.com/emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀emoji-🦀-u3GB7Q"), s("a-very-long-operator-prefix-to-hit-limits.example.com/em-u3GB7Q")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", s("last-handled-configuration"), s("a-very-long-operator-prefix-to-hit-limits.example.com/last-handled-configuration"), s("a-very-long-operator-prefix-to-hit-limits.example.com/la-a.A3qw")),
        ("a-very-long-operator-prefix-to-hit-limits.example.com", s("touch-dummy"), s("a-very-long-operator-prefix-to-hit-limits.example.com/touch-dummy"), s("a-very-long-operator-prefix-to-hit-limits.example.com/to-EHvanA")),
        (&p70, s("create_fn"), format!("{p70}/create_fn"), format!("{p70}/-AZjFuA")),
        (&p70, "x".repeat(64), format!("{p70}/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-SItAqA"), format!("{p70}/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-SItAqA")),
        (&p70, "h".repeat(200), format!("{p70}/hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh-sG0kbg"), format!("{p70}/hhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhhh-sG0kbg")),
        (&p70, s("last-handled-configuration"), format!("{p70}/last-handled-configuration"), format!("{p70}/last-handle-a.A3qw")),
    ];
    for (prefix, name, v2, v1) in cases {
        let keys = KeyForming {
            prefix: prefix.to_string(),
            v1: true,
        };
        assert_eq!(keys.v2(&name), v2, "V2 of {name:?} under {prefix:?}");
        assert_eq!(keys.v1(&name), v1, "V1 of {name:?} under {prefix:?}");
        let expected = if v1 == v2 { vec![v2] } else { vec![v2, v1] };
        assert_eq!(
            keys.keys(&name),
            expected,
            "keys of {name:?} under {prefix:?}"
        );
    }
}

#[test]
fn only_non_kopf_prefixes_get_a_marker() {
    assert_eq!(KeyForming::default().marker(), None);
    let kopf_like = KeyForming::new("kopf.example.com").unwrap();
    assert_eq!(kopf_like.marker(), None);
    let custom = KeyForming::new("my-op.example.com").unwrap();
    assert_eq!(
        custom.marker().as_deref(),
        Some("my-op.example.com/kopf-managed")
    );
}

// --- Progress records ---

/// Annotation values as Kopf wrote them, by handler id.
const KOPF_RECORDS: &[(&str, &str)] = &[
    (
        "create_fn",
        r#"{"started":"2026-03-01T10:00:00.123456+00:00","delayed":"2026-03-01T10:01:00.123456+00:00","purpose":"create","retries":1,"success":false,"failure":false,"message":"Not ready yet."}"#,
    ),
    (
        "done_fn",
        r#"{"started":"2026-03-01T10:00:00.123456+00:00","stopped":"2026-03-01T10:00:05.123457+00:00","purpose":"update","retries":3,"success":true,"failure":false}"#,
    ),
    (
        "fail_fn",
        r#"{"started":"2026-03-01T10:00:00.123456+00:00","stopped":"2026-03-01T11:00:00.123456+00:00","purpose":"delete","retries":7,"success":false,"failure":true,"message":"Boom: \"quoted\"\nnewline \\ backslash \u00fcn\u00efc\u00f6d\u00e9 \ud83e\udd80 \u007f tab\t"}"#,
    ),
    (
        "parent_fn",
        r#"{"started":"2026-03-01T10:00:00.123456+00:00","purpose":"resume","retries":0,"success":false,"failure":false,"subrefs":["parent_fn/sub1","parent_fn/sub10","parent_fn/sub2"]}"#,
    ),
    (
        "nopurpose",
        r#"{"started":"2026-03-01T10:00:00.123456+00:00","retries":0,"success":false,"failure":false}"#,
    ),
    (
        "zero_micro",
        r#"{"started":"2026-03-01T10:00:00.000000+00:00","purpose":"create","retries":0,"success":false,"failure":false}"#,
    ),
];

#[test]
fn kopf_records_are_rewritten_byte_identically() {
    for (id, text) in KOPF_RECORDS {
        let record = ProgressRecord::parse(text).unwrap();
        assert_eq!(record.to_annotation(), *text, "record of {id}");
    }
}

#[test]
fn kopf_records_are_parsed_into_their_fields() {
    let record = ProgressRecord::parse(KOPF_RECORDS[2].1).unwrap();
    assert_eq!(
        record,
        ProgressRecord {
            started: Some(ts("2026-03-01T10:00:00.123456Z")),
            stopped: Some(ts("2026-03-01T11:00:00.123456Z")),
            delayed: None,
            purpose: Some(s("delete")),
            retries: Some(7),
            success: Some(false),
            failure: Some(true),
            message: Some(s(
                "Boom: \"quoted\"\nnewline \\ backslash ünïcödé 🦀 \u{7f} tab\t"
            )),
            subrefs: None,
        }
    );
    assert!(record.is_done());
}

#[test]
fn records_built_in_rust_match_kopf_records() {
    let record = ProgressRecord {
        started: Some(ts("2026-03-01T10:00:00.123456Z")),
        purpose: Some(s("resume")),
        retries: Some(0),
        success: Some(false),
        failure: Some(false),
        subrefs: Some(vec![
            s("parent_fn/sub2"),
            s("parent_fn/sub1"),
            s("parent_fn/sub10"),
        ]),
        ..Default::default()
    };
    assert_eq!(record.to_annotation(), KOPF_RECORDS[3].1);
}

#[test]
fn storing_a_record_writes_kopfs_patch() {
    let record = ProgressRecord::parse(KOPF_RECORDS[0].1).unwrap();
    let mut patch = json!({});
    ProgressStorage::default().store("create_fn", &record, &mut patch);
    assert_eq!(
        patch,
        json!({"metadata": {"annotations": {"kopf.zalando.org/create_fn": KOPF_RECORDS[0].1}}})
    );

    let custom = ProgressStorage {
        keys: KeyForming::new("my-op.example.com").unwrap(),
        ..Default::default()
    };
    let mut patch = json!({});
    custom.store("create_fn", &record, &mut patch);
    assert_eq!(
        patch,
        json!({"metadata": {"annotations": {
            "my-op.example.com/create_fn": KOPF_RECORDS[0].1,
            "my-op.example.com/kopf-managed": "yes",
        }}})
    );
}

#[test]
fn old_kopf_naive_timestamps_are_read_as_utc() {
    let record = ProgressRecord::parse(
        r#"{"started": "2020-02-14T16:58:25.396364", "stopped": "2020-02-14T16:58:25.401844", "retries": 1, "success": true}"#,
    )
    .unwrap();
    assert_eq!(record.started, Some(ts("2020-02-14T16:58:25.396364Z")));
    assert_eq!(
        record.to_annotation(),
        r#"{"started":"2020-02-14T16:58:25.396364+00:00","stopped":"2020-02-14T16:58:25.401844+00:00","retries":1,"success":true}"#
    );
}

#[test]
fn timestamps_in_every_form_kopf_reads_are_parsed() {
    // The UTC equivalents as Kopf's `parse_iso8601(...).astimezone(UTC)` gives them.
    let cases = [
        (
            "2020-02-14T16:58:25.396364",
            "2020-02-14T16:58:25.396364+00:00",
        ),
        ("2020-02-14T16:58:25Z", "2020-02-14T16:58:25.000000+00:00"),
        (
            "2020-02-14T16:58:25.396364+02:00",
            "2020-02-14T14:58:25.396364+00:00",
        ),
        (
            "2020-02-14T16:58:25.5-01:30",
            "2020-02-14T18:28:25.500000+00:00",
        ),
        (
            "2020-02-14T16:58:25.396364+00:00",
            "2020-02-14T16:58:25.396364+00:00",
        ),
    ];
    for (text, utc) in cases {
        let parsed = parse_timestamp(text).unwrap_or_else(|| panic!("{text} unparsed"));
        assert_eq!(format_timestamp(parsed), utc, "{text}");
    }
}

#[test]
fn garbage_records_are_errors() {
    assert!(matches!(
        ProgressRecord::parse("{not json"),
        Err(FormatError::InvalidJson(_))
    ));
    assert!(matches!(
        ProgressRecord::parse("[]"),
        Err(FormatError::NotAnObject { .. })
    ));
    assert!(matches!(
        ProgressRecord::parse(r#"{"retries":"x"}"#),
        Err(FormatError::WrongType { key: "retries", .. })
    ));
    assert!(matches!(
        ProgressRecord::parse(r#"{"success":"yes"}"#),
        Err(FormatError::WrongType { key: "success", .. })
    ));
    assert!(matches!(
        ProgressRecord::parse(r#"{"subrefs":[1]}"#),
        Err(FormatError::WrongType { key: "subrefs", .. })
    ));
}

#[test]
fn unknown_future_keys_are_ignored_and_not_rewritten() {
    let record =
        ProgressRecord::parse(r#"{"retries":2,"success":false,"priority":5,"owner":{"x":1}}"#)
            .unwrap();
    assert_eq!(record.retries, Some(2));
    assert_eq!(record.to_annotation(), r#"{"retries":2,"success":false}"#);
}

#[test]
fn garbage_annotations_are_fetched_as_absent() {
    let storage = ProgressStorage::default();
    for garbage in ["{not json", "[]", r#"{"retries":"x"}"#, "null", "\"text\""] {
        let body = with_annotations(&[("kopf.zalando.org/fn", garbage)]);
        assert_eq!(storage.fetch(&body, "fn"), None, "{garbage}");
    }
}

#[test]
fn a_record_with_an_unknown_future_key_is_fetched() {
    let body = with_annotations(&[("kopf.zalando.org/fn", r#"{"retries":3,"future":true}"#)]);
    let record = ProgressStorage::default().fetch(&body, "fn").unwrap();
    assert_eq!(record.retries, Some(3));
}

#[test]
fn v1_keys_are_read_when_the_v2_key_is_absent() {
    let v1_key = format!("kopf.zalando.org/{}-PCd7lQ", "x".repeat(39));
    let body = with_annotations(&[(&v1_key, r#"{"retries":4}"#)]);
    let record = ProgressStorage::default()
        .fetch(&body, &"x".repeat(48))
        .unwrap();
    assert_eq!(record.retries, Some(4));
}

#[test]
fn purging_and_clearing_the_touch_match_kopf() {
    let mut body = with_annotations(&[
        ("kopf.zalando.org/create_fn", "{}"),
        (&format!("kopf.zalando.org/{}-PCd7lQ", "x".repeat(39)), "{}"),
        (
            "kopf.zalando.org/touch-dummy",
            "2026-03-01T10:00:00.000000+00:00",
        ),
        ("other", "x"),
    ]);
    body.data =
        json!({"status": {"kopf": {"progress": {"create_fn": {"retries": 1}, "old_fn": null}}}});
    let storage = ProgressStorage::default();
    let mut patch = json!({"metadata": {"annotations": {"kopf.zalando.org/stored_fn": "{}"}}});
    for id in [
        "create_fn",
        &"x".repeat(48),
        "old_fn",
        "stored_fn",
        "absent_fn",
    ] {
        storage.purge(&body, id, &mut patch);
    }
    storage.clear_touch(&body, &mut patch);
    assert_eq!(
        patch,
        json!({
            "metadata": {"annotations": {
                "kopf.zalando.org/create_fn": null,
                "kopf.zalando.org/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-PCd7lQ": null,
                "kopf.zalando.org/touch-dummy": null,
            }},
            "status": {"kopf": {"progress": {"create_fn": null, "old_fn": null}}},
        })
    );
}

#[test]
fn touching_under_a_custom_prefix_matches_kopf() {
    let storage = ProgressStorage {
        keys: KeyForming::new("my-op.example.com").unwrap(),
        ..Default::default()
    };
    let body = with_annotations(&[("my-op.example.com/touch-dummy", "x")]);
    let mut patch = json!({});
    storage.clear_touch(&body, &mut patch);
    assert_eq!(
        patch,
        json!({"metadata": {"annotations": {
            "my-op.example.com/touch-dummy": null,
            "my-op.example.com/kopf-managed": "yes",
        }}})
    );
    let mut patch = json!({});
    storage.touch(&mut patch, ts("2026-03-01T10:00:00Z"));
    assert_eq!(
        patch,
        json!({"metadata": {"annotations": {
            "my-op.example.com/touch-dummy": "2026-03-01T10:00:00.000000+00:00",
            "my-op.example.com/kopf-managed": "yes",
        }}})
    );
}

// --- Diff-base ---

const DIFF_BASE_KEY: &str = "kopf.zalando.org/last-handled-configuration";

fn field(path: &str) -> Vec<String> {
    parse_field(path)
}

/// Builds the essence and stores it, returning the patch.
fn store_essence(storage: &DiffBaseStorage, body: &DynamicObject, extra: &[Vec<String>]) -> Value {
    let essence = storage.essence(body, extra);
    let mut patch = json!({});
    storage.store(body, &essence, &mut patch).unwrap();
    patch
}

fn stored(patch: &Value, key: &str) -> String {
    patch["metadata"]["annotations"][key]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn diff_base_of_a_typical_object_matches_kopf() {
    let body = object(json!({
        "apiVersion": "kopf.dev/v1", "kind": "KopfExample",
        "metadata": {"name": "ex1", "namespace": "default", "uid": "u1", "resourceVersion": "42",
                     "generation": 2, "labels": {"app": "demo", "tier": "x"},
                     "annotations": {
                         "kubectl.kubernetes.io/last-applied-configuration": "{\"x\":1}\n",
                         "kopf.zalando.org/create_fn": "{\"started\":\"2026-03-01T10:00:00.123456+00:00\"}",
                         "kopf.zalando.org/last-handled-configuration": "{\"spec\":{}}\n",
                         "other.kopf.zalando.org/x": "y",
                         "their-op.example.com/kopf-managed": "yes",
                         "their-op.example.com/fn": "{}",
                         "my-op.example.com/fn": "{}",
                         "example.com/keep": "kept"},
                     "finalizers": ["kopf.zalando.org/KopfFinalizerMarker"]},
        "spec": {"field": "value", "items": [1, 2.5, 1e20, 1e-7, null, true],
                 "nested": {"b": 1, "a": {"z": "ü🦀"}}},
        "status": {"kopf": {"progress": {"fn": {}}}, "x": 1},
    }));
    let patch = store_essence(&DiffBaseStorage::default(), &body, &[]);
    assert_eq!(
        stored(&patch, DIFF_BASE_KEY),
        concat!(
            r#"{"spec":{"field":"value","items":[1,2.5,1e+20,1e-07,null,true],"nested":{"a":{"z":"\u00fc\ud83e\udd80"},"b":1}},"metadata":{"labels":{"app":"demo","tier":"x"},"annotations":{"example.com/keep":"kept","my-op.example.com/fn":"{}"}}}"#,
            "\n"
        )
    );
    assert_eq!(
        patch["metadata"]["annotations"].as_object().unwrap().len(),
        1
    );
}

#[test]
fn diff_base_with_labels_and_a_status_field_matches_kopf() {
    let body = object(json!({
        "apiVersion": "kopf.dev/v1", "kind": "KopfExample",
        "metadata": {"name": "n", "labels": {"b": "2", "a": "1"}, "generation": 3},
        "spec": {"replicas": 3, "image": "nginx:1.27", "ports": [{"port": 80, "name": "http"}]},
        "status": {"phase": "Running", "replicas": 2, "kopf": {"progress": {}}},
    }));
    let patch = store_essence(&DiffBaseStorage::default(), &body, &[field("status.phase")]);
    assert_eq!(
        stored(&patch, DIFF_BASE_KEY),
        concat!(
            r#"{"spec":{"image":"nginx:1.27","ports":[{"name":"http","port":80}],"replicas":3},"metadata":{"labels":{"a":"1","b":"2"}},"status":{"phase":"Running"}}"#,
            "\n"
        )
    );
}

#[test]
fn diff_base_with_a_metadata_field_matches_kopf() {
    let body = object(json!({
        "apiVersion": "kopf.dev/v1", "kind": "KopfExample",
        "metadata": {"name": "n", "finalizers": ["f1"]}, "spec": {"z": {"y": 0.5}},
    }));
    let patch = store_essence(
        &DiffBaseStorage::default(),
        &body,
        &[field("metadata.finalizers")],
    );
    assert_eq!(
        stored(&patch, DIFF_BASE_KEY),
        concat!(
            r#"{"spec":{"z":{"y":0.5}},"metadata":{"finalizers":["f1"]}}"#,
            "\n"
        )
    );
}

#[test]
fn diff_base_of_an_object_with_nothing_essential_matches_kopf() {
    let body = object(json!({"apiVersion": "v1", "kind": "Thing",
        "metadata": {"name": "n", "labels": {}, "annotations": {"kopf.zalando.org/x": "y"}}}));
    let patch = store_essence(&DiffBaseStorage::default(), &body, &[]);
    assert_eq!(stored(&patch, DIFF_BASE_KEY), "{}\n");
}

#[test]
fn diff_base_drops_the_legacy_progress_from_extra_fields_as_kopf() {
    let body = object(
        json!({"apiVersion": "v1", "kind": "Thing", "metadata": {"name": "n"},
        "status": {"kopf": {"progress": {"a": {}}, "dummy": "x"}}}),
    );
    let patch = store_essence(&DiffBaseStorage::default(), &body, &[field("status.kopf")]);
    assert_eq!(
        stored(&patch, DIFF_BASE_KEY),
        concat!(r#"{"status":{"kopf":{"dummy":"x"}}}"#, "\n")
    );
}

#[test]
fn diff_base_with_several_extra_fields_has_kopfs_content() {
    let body = object(json!({"apiVersion": "v1", "kind": "Thing",
        "metadata": {"name": "n", "finalizers": ["a"]},
        "spec": {"a": 1}, "status": {"x": {"y": 2}, "kopf": {"progress": {"fn": {"retries": 1}}}},
        "data": {"k": "v"}}));
    let extra = [
        field("status.x"),
        field("metadata.finalizers"),
        field("status.missing"),
        field("spec.a"),
    ];
    let patch = store_essence(&DiffBaseStorage::default(), &body, &extra);
    // Kopf orders the extra fields as a Python set does, so only the parsed JSON is comparable.
    let kopf = r#"{"data":{"k":"v"},"spec":{"a":1},"status":{"x":{"y":2}},"metadata":{"finalizers":["a"]}}"#;
    let ours: Value = serde_json::from_str(&stored(&patch, DIFF_BASE_KEY)).unwrap();
    assert_eq!(ours, serde_json::from_str::<Value>(kopf).unwrap());
}

#[test]
fn diff_base_under_a_custom_prefix_matches_kopf() {
    let body = object(json!({"apiVersion": "v1", "kind": "Thing",
        "metadata": {"name": "n", "annotations": {
            "my-op.example.com/fn": "{}",
            "my-op.example.com/last-handled-configuration": "x",
            "a": "b"}},
        "spec": {"x": 1}}));
    let storage = DiffBaseStorage {
        keys: KeyForming::new("my-op.example.com").unwrap(),
        ..Default::default()
    };
    let patch = store_essence(&storage, &body, &[]);
    assert_eq!(
        patch,
        json!({"metadata": {"annotations": {
            "my-op.example.com/last-handled-configuration":
                concat!(r#"{"spec":{"x":1},"metadata":{"annotations":{"a":"b"}}}"#, "\n"),
            "my-op.example.com/kopf-managed": "yes",
        }}})
    );
}

#[test]
fn a_kopf_diff_base_is_fetched_and_equals_our_essence() {
    let kopf = concat!(r#"{"spec":{"x":1},"metadata":{"labels":{"a":"b"}}}"#, "\n");
    let mut body = with_annotations(&[(DIFF_BASE_KEY, kopf)]);
    body.metadata.labels = Some(BTreeMap::from([(s("a"), s("b"))]));
    body.data = json!({"spec": {"x": 1}});
    let storage = DiffBaseStorage::default();
    let old = storage.fetch(&body).unwrap();
    let new = storage.essence(&body, &[]);
    assert!(diff(Some(&old), Some(&new)).is_empty());
}

#[test]
fn garbage_diff_bases_are_fetched_as_absent() {
    for garbage in ["{not json", "[]", "\"text\"", "null", "1"] {
        let body = with_annotations(&[(DIFF_BASE_KEY, garbage)]);
        assert_eq!(DiffBaseStorage::default().fetch(&body), None, "{garbage}");
    }
}

// --- Diffs ---

#[test]
fn diffs_match_kopf() {
    // (old, new, Kopf's diff as JSON)
    let cases = [
        (json!(null), json!(null), json!([])),
        (
            json!(null),
            json!({"spec": {"x": 1}}),
            json!([["add", [], null, {"spec": {"x": 1}}]]),
        ),
        (
            json!({"spec": {"x": 1}}),
            json!(null),
            json!([["remove", [], {"spec": {"x": 1}}, null]]),
        ),
        (
            json!({"spec": {"x": 1}}),
            json!({"spec": {"x": 2}}),
            json!([["change", ["spec", "x"], 1, 2]]),
        ),
        (
            json!({"spec": {"x": 1}}),
            json!({"spec": {"y": 1}}),
            json!([
                ["add", ["spec", "y"], null, 1],
                ["remove", ["spec", "x"], 1, null]
            ]),
        ),
        (
            json!({"spec": {"x": 1, "l": [1, 2]}}),
            json!({"spec": {"x": 1.0, "l": [1, 2, 3]}}),
            json!([["change", ["spec", "l"], [1, 2], [1, 2, 3]]]),
        ),
        (json!({"a": true}), json!({"a": 1}), json!([])),
        (
            json!({"a": null}),
            json!({"a": 1}),
            json!([["add", ["a"], null, 1]]),
        ),
        (
            json!({"a": 1}),
            json!({"a": null}),
            json!([["remove", ["a"], 1, null]]),
        ),
        (json!({}), json!({"a": null}), json!([])),
        (
            json!({"a": "x"}),
            json!({"a": {"b": 1}}),
            json!([["change", ["a"], "x", {"b": 1}]]),
        ),
        (json!(1), json!(2), json!([["change", [], 1, 2]])),
        (json!("s"), json!(null), json!([["remove", [], "s", null]])),
        (json!({"a": 0}), json!({"a": false}), json!([])),
        (
            json!({"a": 1.5}),
            json!({"a": 1}),
            json!([["change", ["a"], 1.5, 1]]),
        ),
    ];
    for (old, new, expected) in cases {
        let d = diff(Some(&old), Some(&new));
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            expected,
            "{old} -> {new}"
        );
    }
}

#[test]
fn reduced_diffs_match_kopf() {
    let d = diff(
        Some(&json!({"spec": {"a": {"b": 1}, "c": 2}})),
        Some(&json!({"spec": {"a": {"b": 2}, "c": 2}})),
    );
    let cases = [
        ("", json!([["change", ["spec", "a", "b"], 1, 2]])),
        ("spec", json!([["change", ["a", "b"], 1, 2]])),
        ("spec.a", json!([["change", ["b"], 1, 2]])),
        ("spec.a.b", json!([["change", [], 1, 2]])),
        ("spec.c", json!([])),
        ("status", json!([])),
    ];
    for (path, expected) in cases {
        let path: Vec<String> = if path.is_empty() { vec![] } else { field(path) };
        assert_eq!(
            serde_json::to_value(d.reduce(&path)).unwrap(),
            expected,
            "{path:?}"
        );
    }

    let added = diff(None, Some(&json!({"spec": {"a": {"b": 1}}})));
    assert_eq!(
        serde_json::to_value(added.reduce(&field("spec.a"))).unwrap(),
        json!([["add", [], null, {"b": 1}]])
    );
    assert!(added.reduce(&field("spec.a.b.c")).is_empty());
    assert!(added.reduce(&field("spec.x")).is_empty());

    let retyped = diff(
        Some(&json!({"spec": "str"})),
        Some(&json!({"spec": {"a": {"b": 1}}})),
    );
    assert_eq!(retyped.0[0].op, DiffOp::Change);
    assert_eq!(
        serde_json::to_value(retyped.reduce(&field("spec.a"))).unwrap(),
        json!([["add", [], null, {"b": 1}]])
    );
}
