//! Bad input, tried as an attacker or a broken client would write it: every parser of what kactor
//! (and Kopf) keep on objects, fed arbitrary text and arbitrary JSON, must never panic and never loop;
//! garbage is absent, and the object keeps being served.
//!
//! Progress records, the diff-base and a cause's base, the touch annotation, timestamps, and the
//! essence of arbitrary bodies (huge and deeply nested values, control characters, escapes).

use std::collections::BTreeMap;

use kactor_reactor::diffbase::DiffBaseStorage;
use kactor_reactor::progress::{parse_timestamp, ProgressRecord, ProgressStorage};
use kube::api::DynamicObject;
use proptest::prelude::*;
use serde_json::{json, Value};

/// Arbitrary JSON: scalars of every kind (strings with any characters), arrays and objects, nested.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
        // What a record's fields look like, with garbage inside.
        prop_oneof![
            Just("2024-05-01T12:00:00.123456+00:00".to_string()),
            Just("2024-05-01T12:00:00".to_string()),
            Just("9999-99-99T99:99:99".to_string()),
            any::<String>(),
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
            prop::collection::btree_map(
                prop_oneof![
                    Just("started".to_string()),
                    Just("stopped".to_string()),
                    Just("delayed".to_string()),
                    Just("retries".to_string()),
                    Just("success".to_string()),
                    Just("failure".to_string()),
                    Just("message".to_string()),
                    Just("subrefs".to_string()),
                    Just("purpose".to_string()),
                    any::<String>(),
                ],
                inner,
                0..8
            )
            .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Annotation text: arbitrary strings, arbitrary JSON as text, and JSON nested far deeper than any
/// parser's recursion limit.
fn any_annotation() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        any_json().prop_map(|v| v.to_string()),
        (1usize..20_000).prop_map(|depth| "[".repeat(depth) + &"]".repeat(depth)),
        (1usize..20_000).prop_map(|depth| "{\"a\":".repeat(depth) + "1" + &"}".repeat(depth)),
    ]
}

/// A widget whose annotations hold `text` under every key kactor and Kopf read, and whose spec,
/// labels and status are arbitrary.
fn body(text: &str, spec: Value, status: Value, labels: BTreeMap<String, String>) -> DynamicObject {
    let keys = [
        "kopf.zalando.org/create_fn",
        "kopf.zalando.org/create_fn.spec.size",
        "kopf.zalando.org/last-handled-configuration",
        "kopf.zalando.org/cause-base-configuration",
        "kopf.zalando.org/touch-dummy",
        "kubectl.kubernetes.io/last-applied-configuration",
        "other.example.com/kopf-managed",
    ];
    let annotations: BTreeMap<&str, &str> = keys.iter().map(|k| (*k, text)).collect();
    serde_json::from_value(json!({
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w1", "namespace": "default", "annotations": annotations,
                     "labels": labels},
        "spec": spec,
        "status": status,
    }))
    .expect("a body with string annotations and labels is a DynamicObject")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_progress_record_of_any_text_is_read_or_refused(text in any_annotation()) {
        let _ = ProgressRecord::parse(&text);
    }

    #[test]
    fn a_progress_record_of_any_json_is_read_or_refused(value in any_json()) {
        if let Ok(record) = ProgressRecord::from_value(&value) {
            // What was read can be written back and read again.
            let text = record.to_annotation();
            prop_assert!(ProgressRecord::parse(&text).is_ok(), "{}", text);
        }
    }

    #[test]
    fn timestamps_of_any_text_are_read_or_absent(text in any::<String>()) {
        let _ = parse_timestamp(&text);
    }

    #[test]
    fn garbage_on_an_object_is_absent_and_the_object_still_has_an_essence(
        text in any_annotation(),
        spec in any_json(),
        status in any_json(),
        labels in prop::collection::btree_map(any::<String>(), any::<String>(), 0..4),
    ) {
        let body = body(&text, spec, status.clone(), labels);
        let progress = ProgressStorage::default();
        let _ = progress.fetch(&body, "create_fn");
        let _ = progress.fetch(&body, "create_fn/spec.size");
        let mut patch = json!({});
        progress.clear_touch(&body, &mut patch);
        progress.purge(&body, "create_fn", &mut patch);

        let diffbase = DiffBaseStorage::default();
        let _ = diffbase.fetch(&body);
        let _ = diffbase.fetch_cause_base(&body);
        let essence = diffbase.essence(&body, &[vec!["status".into(), "x".into()]]);
        prop_assert!(essence.is_object());
        // The essence is storable, or refused as too large; never a panic.
        let mut patch = json!({});
        let _ = diffbase.store(&body, &essence, &mut patch);
    }
}

#[test]
fn json_nested_beyond_the_parsers_limit_is_refused_not_a_stack_overflow() {
    let deep = "[".repeat(1_000_000) + &"]".repeat(1_000_000);
    assert!(ProgressRecord::parse(&deep).is_err());
    let body = body(&deep, json!({}), json!({}), BTreeMap::new());
    assert!(DiffBaseStorage::default().fetch(&body).is_none());
    assert!(ProgressStorage::default()
        .fetch(&body, "create_fn")
        .is_none());
}
