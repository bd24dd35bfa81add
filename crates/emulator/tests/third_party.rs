//! Third-party clients, written against real clusters, used unchanged against the emulator:
//! `kubectl`, the official Python `kubernetes` client, and a Kopf operator.
//!
//! Each test starts its own cluster, writes its kubeconfig into a scratch directory, runs the tool as
//! a subprocess with `KUBECONFIG` set, and checks both what the tool printed and what the cluster then
//! holds (through the `kube` client). The tools are found through `KUBECTL` (default `kubectl`) and
//! `KACTOR_PYTHON` (default `python3`, which must import `kubernetes` and `kopf`), each a name on
//! `PATH` or an absolute path. A test whose tool is missing is skipped with a line saying so, unless
//! `KACTOR_REQUIRE_THIRD_PARTY=1`, when it fails: `scripts/test` installs the tools and sets that.

mod common;

use std::time::Duration;

use common::{eventually, run, run_ok, test_file, Background, Workdir};
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kactor_emulator::samples;
use kactor_testenv::TestCluster;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

/// The longest any one kubectl or Python call may take.
const CALL: Duration = Duration::from_secs(60);
/// The longest a test waits for a watcher or an operator to react to a change.
const REACT: Duration = Duration::from_secs(60);

fn widgets(cluster: &TestCluster) -> Api<DynamicObject> {
    Api::namespaced_with(cluster.client(), "default", &samples::widget_api_resource())
}

fn crds(cluster: &TestCluster) -> Api<DynamicObject> {
    Api::all_with(cluster.client(), &samples::crd_api_resource())
}

fn configmaps(cluster: &TestCluster) -> Api<ConfigMap> {
    Api::namespaced(cluster.client(), "default")
}

fn object<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("a valid object")
}

/// A Widget with these labels (and `spec.size`).
fn widget(name: &str, size: i64, labels: Value) -> DynamicObject {
    let mut widget = samples::widget(name, size);
    widget["metadata"]["labels"] = labels;
    object(widget)
}

/// A cluster with the sample CRD installed through the kube client, once its kind is served.
async fn cluster_with_widgets() -> TestCluster {
    let cluster = TestCluster::start().await.expect("the cluster starts");
    crds(&cluster)
        .create(&PostParams::default(), &object(samples::widget_crd()))
        .await
        .expect("the CRD is created");
    samples::until_served(&widgets(&cluster))
        .await
        .expect("the widgets are served");
    cluster
}

/// A field of a Widget as the cluster holds it now (`Value::Null` if absent, or the Widget is gone).
async fn field(api: &Api<DynamicObject>, name: &str, pointer: &str) -> Value {
    let widget = api.get_opt(name).await.expect("the Widget is read");
    widget
        .map(|w| serde_json::to_value(w).expect("a Widget is JSON"))
        .and_then(|w| w.pointer(pointer).cloned())
        .unwrap_or(Value::Null)
}

fn parse_json(text: &str, what: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{what} is not JSON ({e}):\n{text}"))
}

fn item_names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|item| item["metadata"]["name"].as_str().unwrap_or("?").to_string())
        .collect()
}

// ---- kubectl -------------------------------------------------------------------------------------

/// kubectl pointed at one cluster, from a fresh `HOME` (so its discovery cache starts empty).
struct Kubectl {
    program: String,
    dir: Workdir,
}

impl Kubectl {
    /// kubectl and a cluster for `test`, or `None` when kubectl is missing and the test is skipped.
    async fn start(test: &str) -> Option<(Kubectl, TestCluster)> {
        Self::start_with(test, false).await
    }

    /// The same, with RBAC enforced (`rbac`), as on a real cluster; the emulator then serves HTTPS,
    /// since kubectl (client-go) sends no bearer token over plain HTTP.
    async fn start_with(test: &str, rbac: bool) -> Option<(Kubectl, TestCluster)> {
        let program = common::kubectl(test).await?;
        let cluster = TestCluster::builder()
            .rbac(rbac)
            .emulator(|emulator| emulator.tls(rbac))
            .start()
            .await
            .expect("the cluster starts");
        let dir = Workdir::new(test, &cluster);
        Some((Kubectl { program, dir }, cluster))
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut command = self.dir.command(&self.program);
        command.args(args);
        command
    }

    /// Runs kubectl, which must succeed; its stdout.
    async fn ok(&self, args: &[&str]) -> String {
        run_ok(&mut self.command(args), CALL).await
    }

    /// Runs kubectl, which must fail; its stderr.
    async fn fails(&self, args: &[&str]) -> String {
        let output = run(&mut self.command(args), CALL).await;
        assert!(
            !output.status.success(),
            "`kubectl {}` succeeded, but was to fail:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// Applies the CRD fixture and waits for it to be established.
    async fn install_crd(&self) {
        let crd = test_file("fixtures/widget-crd.yaml");
        let applied = self.ok(&["apply", "-f", crd.to_str().unwrap()]).await;
        assert!(
            applied.contains("customresourcedefinition.apiextensions.k8s.io/widgets.example.com"),
            "{applied}"
        );
        let waited = self
            .ok(&[
                "wait",
                "--for",
                "condition=established",
                "--timeout=30s",
                "crd/widgets.example.com",
            ])
            .await;
        assert!(waited.contains("condition met"), "{waited}");
    }

    /// Applies the Widget fixture `gadget` (size 3, labels app=demo, tier=backend).
    async fn apply_widget(&self) -> String {
        let widget = test_file("fixtures/widget.yaml");
        self.ok(&["apply", "-f", widget.to_str().unwrap()]).await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_apply_registers_a_crd_that_becomes_established() {
    let Some((kubectl, cluster)) =
        Kubectl::start("kubectl_apply_registers_a_crd_that_becomes_established").await
    else {
        return;
    };
    kubectl.install_crd().await;

    let crd = crds(&cluster)
        .get("widgets.example.com")
        .await
        .expect("the CRD is stored");
    let crd = serde_json::to_value(crd).unwrap();
    let established = crd["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Established" && c["status"] == "True");
    assert!(established, "the CRD is not Established: {crd}");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["wd"]));

    // Discovery now serves the kind, under its short name too.
    let resources = kubectl
        .ok(&["api-resources", "--api-group=example.com", "-o", "wide"])
        .await;
    let line = resources
        .lines()
        .find(|l| l.starts_with("widgets"))
        .unwrap_or_else(|| panic!("no widgets in api-resources:\n{resources}"));
    assert!(line.contains(" wd ") && line.contains("Widget"), "{line}");

    // Applying the same thing again changes nothing.
    let crd_file = test_file("fixtures/widget-crd.yaml");
    let again = kubectl
        .ok(&["apply", "-f", crd_file.to_str().unwrap()])
        .await;
    assert!(again.contains("unchanged"), "{again}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_applies_a_custom_resource_and_gets_it_by_name() {
    let Some((kubectl, cluster)) =
        Kubectl::start("kubectl_applies_a_custom_resource_and_gets_it_by_name").await
    else {
        return;
    };
    kubectl.install_crd().await;
    let applied = kubectl.apply_widget().await;
    assert!(
        applied.contains("widget.example.com/gadget created"),
        "{applied}"
    );

    let stored = widgets(&cluster)
        .get("gadget")
        .await
        .expect("the Widget is stored");
    assert_eq!(stored.data["spec"], json!({"size": 3, "colour": "blue"}));
    assert_eq!(
        stored.metadata.labels.as_ref().unwrap()["tier"],
        "backend".to_string()
    );
    let last_applied = &stored.metadata.annotations.as_ref().unwrap()
        ["kubectl.kubernetes.io/last-applied-configuration"];
    assert!(
        last_applied.contains("\"colour\":\"blue\""),
        "{last_applied}"
    );

    // By name, as JSON: the very object the cluster holds.
    let got = parse_json(
        &kubectl.ok(&["get", "widget", "gadget", "-o", "json"]).await,
        "kubectl get -o json",
    );
    assert_eq!(got["kind"], "Widget");
    assert_eq!(got["apiVersion"], "example.com/v1");
    assert_eq!(got["metadata"]["name"], "gadget");
    assert_eq!(got["metadata"]["namespace"], "default");
    assert_eq!(
        got["metadata"]["uid"].as_str(),
        stored.metadata.uid.as_deref()
    );
    assert_eq!(
        got["metadata"]["resourceVersion"].as_str(),
        stored.metadata.resource_version.as_deref()
    );
    assert_eq!(got["spec"]["size"], 3);

    // By short name, as a table with the CRD's printer columns.
    let table = kubectl.ok(&["get", "wd", "gadget"]).await;
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "SIZE", "AGE"], "{table}");
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row[..2], ["gadget", "3"], "{table}");

    // A single field with jsonpath.
    let colour = kubectl
        .ok(&["get", "widget", "gadget", "-o", "jsonpath={.spec.colour}"])
        .await;
    assert_eq!(colour, "blue");

    // Re-applying an unchanged file is a no-op.
    let again = kubectl.apply_widget().await;
    assert!(
        again.contains("widget.example.com/gadget unchanged"),
        "{again}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_lists_custom_resources_by_label_selector() {
    let Some((kubectl, cluster)) =
        Kubectl::start("kubectl_lists_custom_resources_by_label_selector").await
    else {
        return;
    };
    kubectl.install_crd().await;
    kubectl.apply_widget().await;
    widgets(&cluster)
        .create(
            &PostParams::default(),
            &widget("sprocket", 1, json!({"app": "other"})),
        )
        .await
        .expect("the second Widget is created");

    let list = |selector: &'static str| {
        let kubectl = &kubectl;
        async move {
            let text = kubectl
                .ok(&["get", "widgets", "-l", selector, "-o", "json"])
                .await;
            item_names(&parse_json(&text, "kubectl get -l -o json"))
        }
    };
    assert_eq!(list("app=demo").await, ["gadget"]);
    assert_eq!(list("app!=demo").await, ["sprocket"]);
    assert_eq!(list("tier in (backend,frontend)").await, ["gadget"]);
    assert_eq!(list("app").await, ["gadget", "sprocket"]);
    assert!(list("app=nope").await.is_empty());
    assert!(list("app=demo,tier=frontend").await.is_empty());

    // A selector that matches nothing: kubectl says so on stderr and exits 0.
    let output = run(
        &mut kubectl.command(&["get", "widgets", "-l", "app=nope"]),
        CALL,
    )
    .await;
    assert!(output.status.success());
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("No resources found in default namespace."),
        "{stderr}"
    );

    // Across namespaces, names only.
    let names = kubectl
        .ok(&["get", "widgets", "-A", "-l", "app", "-o", "name"])
        .await;
    assert_eq!(
        names.lines().collect::<Vec<_>>(),
        ["widget.example.com/gadget", "widget.example.com/sprocket"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_patches_custom_resources_with_merge_and_json_patches() {
    let Some((kubectl, cluster)) =
        Kubectl::start("kubectl_patches_custom_resources_with_merge_and_json_patches").await
    else {
        return;
    };
    kubectl.install_crd().await;
    kubectl.apply_widget().await;
    let api = widgets(&cluster);

    // A merge patch changes one field and keeps the rest; a spec change bumps the generation.
    let patched = kubectl
        .ok(&[
            "patch",
            "widget",
            "gadget",
            "--type=merge",
            "-p",
            r#"{"spec":{"size":5}}"#,
        ])
        .await;
    assert!(
        patched.contains("widget.example.com/gadget patched"),
        "{patched}"
    );
    assert_eq!(
        field(&api, "gadget", "/spec").await,
        json!({"size": 5, "colour": "blue"})
    );
    assert_eq!(field(&api, "gadget", "/metadata/generation").await, 2);

    // A JSON patch: replace, add (a label), remove.
    kubectl
        .ok(&[
            "patch",
            "widget",
            "gadget",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/colour","value":"red"},
                {"op":"add","path":"/metadata/labels/stage","value":"two"},
                {"op":"remove","path":"/spec/size"}]"#,
        ])
        .await;
    assert_eq!(
        field(&api, "gadget", "/spec").await,
        json!({"colour": "red"})
    );
    assert_eq!(field(&api, "gadget", "/metadata/labels/stage").await, "two");
    assert_eq!(field(&api, "gadget", "/metadata/generation").await, 3);

    // A JSON patch whose `test` fails changes nothing; kubectl reports the 422 as an invalid request.
    let rv = field(&api, "gadget", "/metadata/resourceVersion").await;
    let error = kubectl
        .fails(&[
            "patch",
            "widget",
            "gadget",
            "--type=json",
            "-p",
            r#"[{"op":"test","path":"/spec/colour","value":"green"},
                {"op":"replace","path":"/spec/colour","value":"green"}]"#,
        ])
        .await;
    assert!(error.contains("The request is invalid"), "{error}");
    assert_eq!(field(&api, "gadget", "/spec/colour").await, "red");
    assert_eq!(field(&api, "gadget", "/metadata/resourceVersion").await, rv);

    // A merge patch that breaks the schema is refused.
    let error = kubectl
        .fails(&[
            "patch",
            "widget",
            "gadget",
            "--type=merge",
            "-p",
            r#"{"spec":{"size":-1}}"#,
        ])
        .await;
    assert!(error.contains("Invalid"), "{error}");

    // The status subresource: status changes, the generation does not.
    kubectl
        .ok(&[
            "patch",
            "widget",
            "gadget",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Ready"}}"#,
        ])
        .await;
    assert_eq!(field(&api, "gadget", "/status/phase").await, "Ready");
    assert_eq!(field(&api, "gadget", "/metadata/generation").await, 3);

    // kubectl label and annotate are merge patches too.
    kubectl
        .ok(&["label", "widget", "gadget", "stage=three", "--overwrite"])
        .await;
    kubectl
        .ok(&["annotate", "widget", "gadget", "note=hello"])
        .await;
    assert_eq!(
        field(&api, "gadget", "/metadata/labels/stage").await,
        "three"
    );
    assert_eq!(
        field(&api, "gadget", "/metadata/annotations/note").await,
        "hello"
    );
}

#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::too_many_lines, reason = "one scenario, read top to bottom")]
async fn kubectl_get_watch_streams_changes_as_they_happen() {
    let Some((kubectl, cluster)) =
        Kubectl::start("kubectl_get_watch_streams_changes_as_they_happen").await
    else {
        return;
    };
    kubectl.install_crd().await;
    kubectl.apply_widget().await;
    let api = widgets(&cluster);

    // Two watchers: JSON events for the kind, and a table for the one object (a field selector).
    let mut events = Background::spawn(
        "kubectl get widgets -w -o json",
        &mut kubectl.command(&[
            "get",
            "widgets",
            "-w",
            "--output-watch-events",
            "-o",
            "json",
        ]),
    );
    let mut table = Background::spawn(
        "kubectl get widget gadget -w",
        &mut kubectl.command(&["get", "widget", "gadget", "-w", "--output-watch-events"]),
    );
    // Both have listed (and so watch from there on) once they show the object as it is.
    eventually("both watchers to show the Widget", REACT, || {
        let (events, table) = (&events, &table);
        async move {
            events.assert_running();
            table.assert_running();
            (events.stdout().contains("\"gadget\"") && table.stdout().contains("gadget"))
                .then_some(())
        }
    })
    .await;

    kubectl
        .ok(&[
            "patch",
            "widget",
            "gadget",
            "--type=merge",
            "-p",
            r#"{"spec":{"size":5}}"#,
        ])
        .await;
    kubectl
        .ok(&["label", "widget", "gadget", "stage=two"])
        .await;
    api.create(
        &PostParams::default(),
        &widget("sprocket", 8, json!({"app": "other"})),
    )
    .await
    .expect("a second Widget is created");
    kubectl.ok(&["delete", "widget", "gadget"]).await;

    eventually("the JSON watcher to show the deletion", REACT, || {
        let events = &events;
        async move {
            events.assert_running();
            let output = events.stdout();
            (output.contains("\"DELETED\"")).then_some(())
        }
    })
    .await;
    eventually("the table watcher to show the deletion", REACT, || {
        let table = &table;
        async move {
            table.assert_running();
            table.stdout().contains("DELETED").then_some(())
        }
    })
    .await;
    events.kill().await;
    table.kill().await;

    // kubectl prints one JSON document per event: {"type": ..., "object": ...}.
    let output = events.stdout();
    let seen: Vec<(String, String, Value, Value)> = serde_json::Deserializer::from_str(&output)
        .into_iter::<Value>()
        .map(|event| {
            let event = event.unwrap_or_else(|e| panic!("bad watch output ({e}):\n{output}"));
            let object = &event["object"];
            (
                event["type"].as_str().unwrap_or("?").to_string(),
                object["metadata"]["name"]
                    .as_str()
                    .unwrap_or("?")
                    .to_string(),
                object["spec"]["size"].clone(),
                object["metadata"]["labels"]["stage"].clone(),
            )
        })
        .collect();
    let expected = [
        ("ADDED", "gadget", json!(3), Value::Null),
        ("MODIFIED", "gadget", json!(5), Value::Null),
        ("MODIFIED", "gadget", json!(5), json!("two")),
        ("ADDED", "sprocket", json!(8), Value::Null),
        ("DELETED", "gadget", json!(5), json!("two")),
    ];
    let expected: Vec<(String, String, Value, Value)> = expected
        .into_iter()
        .map(|(t, n, s, l)| (t.to_string(), n.to_string(), s, l))
        .collect();
    assert_eq!(seen, expected, "the JSON watch showed:\n{output}");

    // The table watch of `gadget` alone: its header, then one row per event, with the SIZE column.
    let output = table.stdout();
    let rows: Vec<Vec<&str>> = output
        .lines()
        .map(|l| l.split_whitespace().take(3).collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["EVENT", "NAME", "SIZE"],
            vec!["ADDED", "gadget", "3"],
            vec!["MODIFIED", "gadget", "5"],
            vec!["MODIFIED", "gadget", "5"],
            vec!["DELETED", "gadget", "5"],
        ],
        "the table watch showed:\n{output}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_delete_removes_a_custom_resource() {
    let Some((kubectl, cluster)) = Kubectl::start("kubectl_delete_removes_a_custom_resource").await
    else {
        return;
    };
    kubectl.install_crd().await;
    kubectl.apply_widget().await;
    let api = widgets(&cluster);

    let deleted = kubectl.ok(&["delete", "widget", "gadget"]).await;
    assert!(
        deleted.contains(r#"widget.example.com "gadget" deleted"#),
        "{deleted}"
    );
    assert!(api.get_opt("gadget").await.unwrap().is_none());
    let error = kubectl.fails(&["get", "widget", "gadget"]).await;
    assert!(
        error.contains(r#"widgets.example.com "gadget" not found"#),
        "{error}"
    );
    let error = kubectl.fails(&["delete", "widget", "gadget"]).await;
    assert!(error.contains("NotFound"), "{error}");

    // With a finalizer, deletion only marks the object; removing the finalizer lets it go.
    kubectl.apply_widget().await;
    api.patch(
        "gadget",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
    )
    .await
    .expect("the finalizer is added");
    kubectl
        .ok(&["delete", "widget", "gadget", "--wait=false"])
        .await;
    assert!(
        field(&api, "gadget", "/metadata/deletionTimestamp")
            .await
            .is_string(),
        "a Widget with a finalizer is only marked for deletion"
    );
    kubectl
        .ok(&[
            "patch",
            "widget",
            "gadget",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ])
        .await;
    assert!(api.get_opt("gadget").await.unwrap().is_none());

    // By file and by label.
    kubectl.apply_widget().await;
    let widget_file = test_file("fixtures/widget.yaml");
    let deleted = kubectl
        .ok(&["delete", "-f", widget_file.to_str().unwrap()])
        .await;
    assert!(deleted.contains("deleted"), "{deleted}");
    assert!(api.get_opt("gadget").await.unwrap().is_none());
    kubectl.apply_widget().await;
    kubectl.ok(&["delete", "widgets", "-l", "app=demo"]).await;
    assert!(api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
}

/// A built-in object as the cluster holds it, as JSON (Null when it is not there).
async fn built_in(cluster: &TestCluster, path: &str) -> Value {
    let request = http::Request::get(path).body(Vec::new()).unwrap();
    match cluster.client().request::<Value>(request).await {
        Ok(object) => object,
        Err(kube::Error::Api(e)) if e.code == 404 => Value::Null,
        Err(e) => panic!("GET {path}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::too_many_lines, reason = "one scenario, read top to bottom")]
async fn kubectl_imperative_commands_send_protobuf_and_create_what_they_say() {
    const TEST: &str = "kubectl_imperative_commands_send_protobuf_and_create_what_they_say";
    let Some((kubectl, cluster)) = Kubectl::start_with(TEST, true).await else {
        return;
    };
    // `kubectl create <kind>` and `kubectl run` send built-in kinds as protobuf, not JSON.
    let ns = "imperative";
    let created = kubectl.ok(&["create", "namespace", ns]).await;
    assert!(
        created.contains("namespace/imperative created"),
        "{created}"
    );
    let n = &["-n", ns][..];
    let commands: Vec<Vec<&str>> = vec![
        vec![
            "create",
            "configmap",
            "settings",
            "--from-literal=colour=blue",
            "--from-literal=empty=",
        ],
        vec![
            "create",
            "secret",
            "generic",
            "creds",
            "--from-literal=password=s3cret",
        ],
        vec![
            "create",
            "deployment",
            "web",
            "--image=nginx:1.27",
            "--replicas=0",
            "--port=8080",
        ],
        vec!["create", "serviceaccount", "bot"],
        vec![
            "create",
            "role",
            "reader",
            "--verb=get,list",
            "--resource=configmaps",
        ],
        vec![
            "create",
            "rolebinding",
            "reader-bot",
            "--role=reader",
            "--serviceaccount=imperative:bot",
        ],
        vec![
            "create",
            "job",
            "once",
            "--image=busybox",
            "--",
            "echo",
            "hi",
        ],
        vec!["create", "service", "clusterip", "web", "--tcp=80:8080"],
        vec![
            "run",
            "solo",
            "--image=nginx",
            "--labels=app=solo",
            "--restart=Never",
        ],
        vec![
            "create",
            "cronjob",
            "nightly",
            "--image=busybox",
            "--schedule=0 3 * * *",
        ],
        vec![
            "create",
            "ingress",
            "front",
            "--rule=shop.example.com/cart=web:80",
        ],
        vec![
            "create",
            "poddisruptionbudget",
            "web",
            "--selector=app=web",
            "--min-available=1",
        ],
        vec![
            "create",
            "quota",
            "small",
            "--hard=pods=2,requests.cpu=500m",
        ],
        vec![
            "create",
            "priorityclass",
            "imperative-high",
            "--value=1000",
            "--description=urgent",
        ],
    ];
    for command in &commands {
        // The namespace first: what follows `--` is the container's command.
        let output = kubectl.ok(&[n, command.as_slice()].concat()).await;
        assert!(
            output.contains("created"),
            "kubectl {}: {output}",
            command.join(" ")
        );
    }
    let path =
        |group: &str, plural: &str, name: &str| format!("{group}/namespaces/{ns}/{plural}/{name}");

    let namespace = built_in(&cluster, "/api/v1/namespaces/imperative").await;
    assert_eq!(namespace["metadata"]["name"], "imperative");

    let settings = built_in(&cluster, &path("/api/v1", "configmaps", "settings")).await;
    assert_eq!(settings["data"], json!({"colour": "blue", "empty": ""}));
    assert!(
        settings["metadata"]["creationTimestamp"].is_string(),
        "{settings}"
    );

    let creds = built_in(&cluster, &path("/api/v1", "secrets", "creds")).await;
    assert_eq!(
        creds["data"],
        json!({"password": "czNjcmV0"}),
        "base64 of s3cret"
    );
    assert_eq!(creds["type"], "Opaque");

    let web = built_in(&cluster, &path("/apis/apps/v1", "deployments", "web")).await;
    assert_eq!(
        web["spec"]["replicas"], 0,
        "a pointer's zero is kept: {web}"
    );
    assert_eq!(
        web["spec"]["selector"],
        json!({"matchLabels": {"app": "web"}})
    );
    let container = &web["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "nginx:1.27");
    assert_eq!(container["ports"][0]["containerPort"], 8080);
    assert_eq!(
        web["spec"]["template"]["metadata"]["labels"],
        json!({"app": "web"})
    );

    let bot = built_in(&cluster, &path("/api/v1", "serviceaccounts", "bot")).await;
    assert_eq!(bot["metadata"]["name"], "bot");

    let role = built_in(
        &cluster,
        &path("/apis/rbac.authorization.k8s.io/v1", "roles", "reader"),
    )
    .await;
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}])
    );
    let binding = built_in(
        &cluster,
        &path(
            "/apis/rbac.authorization.k8s.io/v1",
            "rolebindings",
            "reader-bot",
        ),
    )
    .await;
    assert_eq!(
        binding["roleRef"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"})
    );
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "bot", "namespace": "imperative"}])
    );

    let once = built_in(&cluster, &path("/apis/batch/v1", "jobs", "once")).await;
    let job_container = &once["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(job_container["command"], json!(["echo", "hi"]), "{once}");
    assert_eq!(once["spec"]["template"]["spec"]["restartPolicy"], "Never");

    let service = built_in(&cluster, &path("/api/v1", "services", "web")).await;
    // The target port is an IntOrString: a number here, as kubectl sent it.
    assert_eq!(service["spec"]["ports"][0]["port"], 80);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], 8080);
    assert_eq!(service["spec"]["type"], "ClusterIP");

    let solo = built_in(&cluster, &path("/api/v1", "pods", "solo")).await;
    assert_eq!(solo["metadata"]["labels"], json!({"app": "solo"}));
    assert_eq!(solo["spec"]["containers"][0]["image"], "nginx");
    assert_eq!(solo["spec"]["restartPolicy"], "Never");

    let nightly = built_in(&cluster, &path("/apis/batch/v1", "cronjobs", "nightly")).await;
    assert_eq!(nightly["spec"]["schedule"], "0 3 * * *");
    let front = built_in(
        &cluster,
        &path("/apis/networking.k8s.io/v1", "ingresses", "front"),
    )
    .await;
    let rule = &front["spec"]["rules"][0];
    assert_eq!(rule["host"], "shop.example.com");
    assert_eq!(rule["http"]["paths"][0]["path"], "/cart");
    assert_eq!(
        rule["http"]["paths"][0]["backend"]["service"]["port"]["number"],
        80
    );
    let pdb = built_in(
        &cluster,
        &path("/apis/policy/v1", "poddisruptionbudgets", "web"),
    )
    .await;
    assert_eq!(
        pdb["spec"]["minAvailable"], 1,
        "an IntOrString's number: {pdb}"
    );
    let quota = built_in(&cluster, &path("/api/v1", "resourcequotas", "small")).await;
    assert_eq!(
        quota["spec"]["hard"],
        json!({"pods": "2", "requests.cpu": "500m"})
    );
    let class = built_in(
        &cluster,
        "/apis/scheduling.k8s.io/v1/priorityclasses/imperative-high",
    )
    .await;
    assert_eq!(
        (&class["value"], &class["description"]),
        (&json!(1000), &json!("urgent"))
    );

    // `kubectl auth can-i` sends its SelfSubjectAccessReview in protobuf too (the test clusters'
    // kubeconfigs are an administrator's).
    let can = kubectl
        .ok(&[n, &["auth", "can-i", "create", "configmaps"][..]].concat())
        .await;
    assert_eq!(can.trim(), "yes");
    // `kubectl create token`: a service account's token (a TokenRequest, in protobuf), which then
    // authenticates as that account (its RoleBinding lets it list ConfigMaps).
    let token = kubectl
        .ok(&[n, &["create", "token", "bot"][..]].concat())
        .await;
    let token = token.trim();
    assert!(
        !token.is_empty() && !token.contains(char::is_whitespace),
        "{token:?}"
    );
    let as_bot = kubectl
        .ok(&[
            n,
            &["auth", "can-i", "list", "configmaps", "--token", token][..],
        ]
        .concat())
        .await;
    assert_eq!(as_bot.trim(), "yes");
    let output = run(
        &mut kubectl.command(
            &[
                n,
                &["auth", "can-i", "create", "configmaps", "--token", token][..],
            ]
            .concat(),
        ),
        CALL,
    )
    .await;
    let answer = String::from_utf8_lossy(&output.stdout);
    assert_eq!(answer.trim(), "no", "RBAC holds for the token");
    let error = kubectl
        .fails(&[n, &["create", "token", "nobody"][..]].concat())
        .await;
    assert!(error.contains("not found"), "{error}");
    // What the cluster refuses, it refuses as for JSON: a second create is a conflict.
    let error = kubectl
        .fails(&[&["create", "configmap", "settings"][..], n].concat())
        .await;
    assert!(
        error.contains("AlreadyExists") || error.contains("already exists"),
        "{error}"
    );
    // And kubectl reads back what it created.
    let listed = kubectl
        .ok(&[
            &["get", "configmaps,secrets,deployments,roles", "-o", "name"][..],
            n,
        ]
        .concat())
        .await;
    for name in [
        "configmap/settings",
        "secret/creds",
        "deployment.apps/web",
        "role.rbac.authorization.k8s.io/reader",
    ] {
        assert!(listed.contains(name), "{name} in:\n{listed}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_explain_describes_built_in_and_custom_kinds() {
    const TEST: &str = "kubectl_explain_describes_built_in_and_custom_kinds";
    let Some((kubectl, _cluster)) = Kubectl::start(TEST).await else {
        return;
    };
    // A built-in kind: its documentation and fields (the emulator's come from the upstream .proto).
    let config_map = kubectl.ok(&["explain", "configmap"]).await;
    for expected in [
        "KIND:",
        "ConfigMap",
        "VERSION:",
        "ConfigMap holds configuration data",
        "FIELDS:",
    ] {
        assert!(
            config_map.contains(expected),
            "{expected:?} in:\n{config_map}"
        );
    }
    let data = config_map
        .lines()
        .find(|l| l.trim_start().starts_with("data"))
        .unwrap_or_else(|| panic!("no data field in:\n{config_map}"));
    assert!(data.contains("<map[string]string>"), "{data}");
    // A path into a kind, through references and lists.
    let image = kubectl
        .ok(&["explain", "deployment.spec.template.spec.containers.image"])
        .await;
    assert!(image.contains("Container image name"), "{image}");
    assert!(image.contains("<string>"), "{image}");
    let replicas = kubectl.ok(&["explain", "deployments.spec.replicas"]).await;
    assert!(replicas.contains("<integer>"), "{replicas}");
    // An embedded struct's members are the parent's fields, as in the objects' JSON.
    let volumes = kubectl.ok(&["explain", "pod.spec.volumes"]).await;
    assert!(volumes.contains("emptyDir"), "{volumes}");
    assert!(!volumes.contains("volumeSource"), "{volumes}");
    let error = kubectl.fails(&["explain", "configmap.nonsense"]).await;
    assert!(error.contains("nonsense"), "{error}");
    // A custom kind: the CRD's schema (a real server publishes it a few seconds after the CRD is
    // established; the emulator at once).
    kubectl.install_crd().await;
    let spec = eventually("kubectl explain widgets.spec", REACT, || async {
        let output = run(&mut kubectl.command(&["explain", "widgets.spec"]), CALL).await;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    })
    .await;
    assert!(spec.contains("size"), "{spec}");
}

// ---- the Python `kubernetes` client -------------------------------------------------------------

/// The JSON lines `client_watch.py` printed.
fn lines_of(output: &str) -> Vec<Value> {
    output
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| parse_json(l, "a line of client_watch.py"))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::too_many_lines, reason = "one scenario, read top to bottom")]
async fn python_client_lists_and_watches_custom_objects_and_configmaps() {
    const TEST: &str = "python_client_lists_and_watches_custom_objects_and_configmaps";
    let Some(python) = common::python(TEST, &["kubernetes"]).await else {
        return;
    };
    let cluster = cluster_with_widgets().await;
    let dir = Workdir::new(TEST, &cluster);
    let api = widgets(&cluster);
    let cms = configmaps(&cluster);
    let post = PostParams::default();
    let configmap = |name: &str, app: &str| -> ConfigMap {
        object(json!({"metadata": {"name": name, "labels": {"app": app}}, "data": {"a": "1"}}))
    };
    api.create(&post, &widget("alpha", 1, json!({"app": "demo"})))
        .await
        .unwrap();
    api.create(&post, &widget("outsider", 2, json!({"app": "other"})))
        .await
        .unwrap();
    cms.create(&post, &configmap("settings", "demo"))
        .await
        .unwrap();
    cms.create(&post, &configmap("unrelated", "other"))
        .await
        .unwrap();

    let script = test_file("python/client_watch.py");
    let mut command = dir.command(&python);
    command.arg(&script).args([
        "--selector",
        "app=demo",
        "--unmatched-selector",
        "app=nope",
        "--stop-widget",
        "beta",
        "--stop-configmap",
        "settings",
        "--timeout",
        "45",
    ]);
    let mut client = Background::spawn("client_watch.py", &mut command);

    let listed = eventually("client_watch.py to list", REACT, || {
        let client = &client;
        async move {
            client.assert_running();
            lines_of(&client.stdout())
                .into_iter()
                .find(|l| l["phase"] == "listed")
        }
    })
    .await;
    let version = match cluster.backend() {
        kactor_testenv::Backend::Emulator => kactor_emulator::KUBERNETES_VERSION,
        kactor_testenv::Backend::ApiServer => kactor_testenv::apiserver::KUBERNETES_VERSION,
    };
    assert_eq!(listed["server"], version);
    assert_eq!(listed["widgets_kind"], "WidgetList");
    assert_eq!(listed["widgets"], json!(["alpha"]));
    assert_eq!(listed["widgets_unmatched"], json!([]));
    assert_eq!(listed["configmaps"], json!(["settings"]));
    assert_eq!(listed["configmaps_unmatched"], json!([]));

    // Changes while it watches: each watch started at its list's resourceVersion, so sees them all.
    api.create(&post, &widget("beta", 3, json!({"app": "demo"})))
        .await
        .unwrap();
    api.patch(
        "alpha",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": 10}})),
    )
    .await
    .unwrap();
    // Label changes move objects into and out of the selected set.
    api.patch(
        "outsider",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "demo"}}})),
    )
    .await
    .unwrap();
    api.patch(
        "alpha",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "other"}}})),
    )
    .await
    .unwrap();
    api.delete("beta", &DeleteParams::default()).await.unwrap();
    cms.patch(
        "settings",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"b": "2"}})),
    )
    .await
    .unwrap();
    cms.create(&post, &configmap("late", "demo")).await.unwrap();
    cms.create(&post, &configmap("late-other", "other"))
        .await
        .unwrap();
    cms.delete("settings", &DeleteParams::default())
        .await
        .unwrap();

    let status = client.wait(REACT).await;
    assert!(
        status.success(),
        "client_watch.py failed:\n{}",
        client.report()
    );
    let lines = lines_of(&client.stdout());
    let events = |watch: &str| -> Vec<(String, String)> {
        lines
            .iter()
            .filter(|l| l["watch"] == watch && l["type"].is_string())
            .map(|l| {
                (
                    l["type"].as_str().unwrap().to_string(),
                    l["name"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(t, n)| (t.to_string(), n.to_string()))
            .collect()
    };
    assert_eq!(
        events("widgets"),
        pairs(&[
            ("ADDED", "beta"),
            ("MODIFIED", "alpha"),
            ("ADDED", "outsider"),
            ("DELETED", "alpha"),
            ("DELETED", "beta"),
        ]),
        "{}",
        client.report()
    );
    assert_eq!(
        events("configmaps"),
        pairs(&[
            ("MODIFIED", "settings"),
            ("ADDED", "late"),
            ("DELETED", "settings"),
        ]),
        "{}",
        client.report()
    );
    let modified = lines
        .iter()
        .find(|l| l["type"] == "MODIFIED" && l["name"] == "alpha")
        .unwrap();
    assert_eq!(modified["spec"]["size"], 10);
    assert_eq!(modified["generation"], 2);
    let changed = lines
        .iter()
        .find(|l| l["type"] == "MODIFIED" && l["name"] == "settings")
        .unwrap();
    assert_eq!(changed["data"], json!({"a": "1", "b": "2"}));
    for watch in ["widgets", "configmaps"] {
        assert!(
            lines
                .iter()
                .any(|l| l["watch"] == watch && l["phase"] == "ended" && l["reason"] == "deleted"),
            "the {watch} watch did not end on its deletion:\n{}",
            client.report()
        );
    }
    assert_eq!(lines.last().unwrap()["phase"], "done");
}

// ---- Kopf ------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
#[allow(clippy::too_many_lines, reason = "one scenario, read top to bottom")]
async fn kopf_operator_handles_create_update_and_delete() {
    const TEST: &str = "kopf_operator_handles_create_update_and_delete";
    const FINALIZER: &str = "kopf.zalando.org/KopfFinalizerMarker";
    let Some(python) = common::python(TEST, &["kopf", "kubernetes"]).await else {
        return;
    };
    let cluster = cluster_with_widgets().await;
    let dir = Workdir::new(TEST, &cluster);
    let api = widgets(&cluster);

    let operator = test_file("python/kopf_operator.py");
    let mut command = dir.command(&python);
    command.args(["-m", "kopf", "run", "--standalone", "-A", "--verbose"]);
    command.arg(&operator);
    let mut kopf = Background::spawn("kopf", &mut command);

    api.create(
        &PostParams::default(),
        &widget("kopf-widget", 3, json!({"app": "demo"})),
    )
    .await
    .expect("the Widget is created");

    // The create handler ran: its result is in the status, and Kopf's finalizer guards the object.
    let created = eventually(
        "the create handler's result and the finalizer",
        REACT,
        || {
            let (api, kopf) = (&api, &kopf);
            async move {
                kopf.assert_running();
                let widget = serde_json::to_value(api.get("kopf-widget").await.ok()?).ok()?;
                let finalized = widget["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|f| f == FINALIZER));
                (finalized && widget["status"]["create_fn"].is_object()).then_some(widget)
            }
        },
    )
    .await;
    assert_eq!(
        created["status"]["create_fn"],
        json!({"message": "created kopf-widget", "size": 3})
    );
    assert!(
        created["metadata"]["annotations"]["kopf.zalando.org/last-handled-configuration"]
            .is_string(),
        "Kopf keeps the last handled state: {created}"
    );

    // The Event it posted about the Widget.
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    eventually("Kopf's Event about the Widget", REACT, || {
        let (events, kopf) = (&events, &kopf);
        async move {
            kopf.assert_running();
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("WidgetCreated")
                        && e.involved_object.name.as_deref() == Some("kopf-widget")
                })
                .map(|_| ())
        }
    })
    .await;

    // A spec change runs the update handler.
    api.patch(
        "kopf-widget",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": 7}})),
    )
    .await
    .expect("the Widget is changed");
    eventually("the update handler's result", REACT, || {
        let (api, kopf) = (&api, &kopf);
        async move {
            kopf.assert_running();
            let result = field(api, "kopf-widget", "/status/update_fn").await;
            (result == json!({"message": "updated kopf-widget", "size": 7})).then_some(())
        }
    })
    .await;
    assert_eq!(
        field(&api, "kopf-widget", "/status/create_fn/size").await,
        3,
        "the create handler does not run again"
    );

    // Deletion waits for the delete handler, which leaves a marker; then the finalizer goes, and so
    // does the Widget.
    api.delete("kopf-widget", &DeleteParams::default())
        .await
        .expect("the Widget is deleted");
    eventually("the Widget to be gone", REACT, || {
        let (api, kopf) = (&api, &kopf);
        async move {
            kopf.assert_running();
            api.get_opt("kopf-widget")
                .await
                .ok()
                .and_then(|w| w.is_none().then_some(()))
        }
    })
    .await;
    let marker = configmaps(&cluster)
        .get_opt("kopf-widget-deleted")
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("the delete handler left no marker:\n{}", kopf.report()));
    assert_eq!(
        marker.data.unwrap_or_default()["size"],
        "7",
        "the delete handler saw the last spec"
    );

    kopf.kill().await;
    let log = kopf.report();
    for line in [
        "Handler 'create_fn' succeeded",
        "Handler 'update_fn' succeeded",
        "Handler 'delete_fn' succeeded",
    ] {
        assert!(log.contains(line), "no {line:?} in Kopf's log:\n{log}");
    }
    for problem in ["Traceback", "[ERROR"] {
        assert!(!log.contains(problem), "Kopf logged {problem:?}:\n{log}");
    }
}
