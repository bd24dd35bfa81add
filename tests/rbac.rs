//! `rbac generate`, `rbac verify` and `crds`, end to end: the generated RBAC, applied to a cluster
//! that authorizes as a cluster does, lets the operator do all its work as its service account, and
//! a rule taken out of it is both a 403 for the operator and a missing permission for `rbac verify`.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kactor::cli::{Command, Manifests, OperatorCli, RbacArgs, RbacCommand};
use kactor::emulator::samples;
use kactor::observe::Observer;
use kactor::prelude::*;
use kactor::rbac::RbacError;
use kactor_testenv::TestCluster;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use serde_json::Value;
use support::{has_finalizer, status, until, WAIT};

/// The operator's service account.
const NAMESPACE: &str = "ops";
const ACCOUNT: &str = "my-op";

/// Counts the API's 403 answers to the operator's requests.
#[derive(Default)]
struct Denials {
    verbs: Mutex<Vec<&'static str>>,
    count: AtomicUsize,
    notify: tokio::sync::Notify,
}

impl Observer for Denials {
    fn api_request(&self, verb: &'static str, code: Option<u16>, _: Duration) {
        if code == Some(403) {
            self.verbs.lock().unwrap().push(verb);
            self.count.fetch_add(1, Ordering::SeqCst);
            self.notify.notify_waiters();
        }
    }
}

impl Denials {
    fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Waits for the first 403, or fails after [`WAIT`].
    async fn first(&self) {
        let wait = async {
            loop {
                let notified = self.notify.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.count() > 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(WAIT, wait)
            .await
            .expect("the operator is denied something");
    }
}

/// The handlers of the operator under test: creation, update and deletion (with the finalizer) and
/// a timer on widgets; Kubernetes Events are posted about each of them (with `posting.loggers` on).
fn handlers(operator: Operator) -> Operator {
    let widgets = ("example.com", "v1", "widgets");
    operator
        .on_create(widgets, "create_fn", |ctx: Ctx| async move {
            ctx.info("Creating", "a widget is born");
            Ok(json!({"size": ctx.spec()["size"]}))
        })
        .on_update(widgets, "update_fn", |ctx: Ctx| async move {
            Ok(json!({"size": ctx.spec()["size"]}))
        })
        .on_delete(widgets, "delete_fn", |_: Ctx| async { Ok(()) })
        .timer(
            widgets,
            "tick",
            Timer::every(Duration::from_millis(100)),
            |_: Ctx| async { Ok(json!({"ticked": true})) },
        )
}

/// The options of `my-op rbac generate ARGS...` for the service account `ops/my-op`.
fn rbac_args(args: &[&str]) -> RbacArgs {
    match command(&["rbac", "generate"], args) {
        Manifests::Rbac(RbacCommand::Generate(generate)) => generate.rbac,
        other => panic!("not rbac generate: {other:?}"),
    }
}

/// The command `my-op PREFIX... --service-account my-op --service-account-namespace ops ARGS...`.
fn command(prefix: &[&str], args: &[&str]) -> Manifests {
    let mut argv = vec!["my-op"];
    argv.extend_from_slice(prefix);
    if prefix.first() == Some(&"rbac") {
        argv.extend([
            "--service-account",
            ACCOUNT,
            "--service-account-namespace",
            NAMESPACE,
        ]);
    }
    argv.extend_from_slice(args);
    match OperatorCli::parse_from(argv).unwrap().command() {
        Command::Manifests(manifests) => manifests,
        other => panic!("not a manifests command: {other:?}"),
    }
}

/// A cluster in RBAC mode with widgets, the operator's namespace, the peering CRDs and a
/// `KopfPeering` in `default`.
async fn cluster() -> (TestCluster, Api<DynamicObject>) {
    let cluster = TestCluster::builder()
        .rbac(true)
        .emulator(|e| e.bookmark_interval(Duration::from_millis(200)))
        .start()
        .await
        .unwrap();
    let admin = cluster.client();
    let widgets = samples::install_widgets(&admin).await.unwrap();
    let namespace = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    let mut objects = vec![namespace];
    objects.extend(kactor::peering::peering::crds());
    objects.push(kactor::peering::peering::peering_object(
        "default",
        Some("default"),
    ));
    for object in objects {
        create(&admin, object).await;
    }
    (cluster, widgets)
}

/// Creates an object as the administrator, finding its resource through discovery.
async fn create(client: &kube::Client, object: Value) {
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    let types = object.types.clone().expect("apiVersion and kind");
    let (group, version) = match types.api_version.split_once('/') {
        Some((group, version)) => (group.to_string(), version.to_string()),
        None => (String::new(), types.api_version.clone()),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, &types.kind);
    // A CRD created just before is served a moment later on a real API server.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (resource, capabilities) = loop {
        match kube::discovery::pinned_kind(client, &gvk).await {
            Ok(found) => break found,
            Err(e) if tokio::time::Instant::now() >= deadline => panic!("{gvk:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let api: Api<DynamicObject> = match &object.metadata.namespace {
        Some(namespace) if capabilities.scope == kube::discovery::Scope::Namespaced => {
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("{} {:?}: {e}", types.kind, object.metadata.name));
}

/// Applies manifests (YAML documents) as the administrator.
async fn apply(cluster: &TestCluster, manifests: &str) {
    let documents: Vec<Value> = serde_saphyr::from_multiple(manifests).unwrap();
    for document in documents {
        create(&cluster.client(), document).await;
    }
}

/// The manifests without the rules on `resource`.
fn without(manifests: &str, resource: &str) -> String {
    let mut documents: Vec<Value> = serde_saphyr::from_multiple(manifests).unwrap();
    let mut removed = 0;
    for document in &mut documents {
        if let Some(rules) = document["rules"].as_array_mut() {
            let before = rules.len();
            rules.retain(|rule| rule["resources"][0] != resource);
            removed += before - rules.len();
        }
    }
    assert!(removed > 0, "no rule on {resource} in:\n{manifests}");
    serde_saphyr::to_string_multiple(&documents).unwrap()
}

/// The operator as its service account, with quick retries, run with these options.
async fn operator(cluster: &TestCluster, args: &RbacArgs, denials: &Arc<Denials>) -> Operator {
    let client = cluster
        .client_as_service_account(NAMESPACE, ACCOUNT)
        .await
        .unwrap();
    handlers(Operator::new())
        .client(client)
        .observer(denials.clone())
        .settings(|s| {
            s.watching.reconnect_backoff = Duration::from_millis(10);
            s.networking.error_backoffs = vec![Duration::from_millis(20); 3];
            s.posting.default_backoffs = vec![Duration::from_millis(20); 2];
            // The handlers' outcomes are posted too (Kopf's `posting.loggers`, off by default).
            s.posting.loggers = true;
            s.queueing.exit_timeout = Duration::from_millis(500);
            // The timer's status patches race the handlers' own patches, after which kactor waits
            // for its own version to come back through the watch: not 5 s here.
            s.persistence.consistency_timeout = Duration::from_millis(200);
        })
        .with_args(&args.run)
}

fn result<'a>(object: Option<&'a DynamicObject>, handler: &str) -> Option<&'a Value> {
    object
        .map(status)
        .and_then(|status| status.get(handler))
        .filter(|value| !value.is_null())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generated_rbac_lets_the_operator_do_all_its_work_without_a_single_403() {
    let (cluster, widgets) = cluster().await;
    let args = rbac_args(&[
        "-n",
        "default",
        "--leader-election",
        "--lease-name",
        ACCOUNT,
        "--lease-namespace",
        NAMESPACE,
    ]);
    let manifests = kactor::rbac::generate(&handlers(Operator::new()), &args)
        .await
        .unwrap();
    apply(&cluster, &manifests).await;

    let denials = Arc::new(Denials::default());
    let running = support::spawn(operator(&cluster, &args, &denials).await);
    let widget = serde_json::from_value(samples::widget("w1", 1)).unwrap();
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    until(&widgets, "w1", "create_fn's result", |w| {
        result(w, "create_fn").is_some() && w.is_some_and(has_finalizer)
    })
    .await;
    widgets
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}})),
        )
        .await
        .unwrap();
    until(&widgets, "w1", "update_fn's result", |w| {
        result(w, "update_fn") == Some(&json!({"size": 2}))
    })
    .await;
    until(&widgets, "w1", "the timer's result", |w| {
        result(w, "tick").is_some()
    })
    .await;

    // It peered and led: its record is in the peering object, and the Lease is its.
    let peerings: Api<DynamicObject> = Api::namespaced_with(
        cluster.client(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kopf.dev", "v1", "KopfPeering"),
            "kopfpeerings",
        ),
    );
    let peering = peerings.get("default").await.unwrap();
    assert!(
        status(&peering).as_object().is_some_and(|s| !s.is_empty()),
        "no keep-alive record: {peering:?}"
    );
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(cluster.client(), NAMESPACE);
    let lease = leases.get(ACCOUNT).await.unwrap();
    assert!(lease.spec.and_then(|s| s.holder_identity).is_some());

    widgets.delete("w1", &Default::default()).await.unwrap();
    until(&widgets, "w1", "the deletion", |w| w.is_none()).await;
    // Events are posted in the background: wait for them.
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(cluster.client(), "default");
    let expected = [
        "a widget is born",
        "Handler 'create_fn' succeeded.",
        "Handler 'update_fn' succeeded.",
        "Handler 'delete_fn' succeeded.",
    ];
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let messages: Vec<String> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|e| e.message)
            .collect();
        if expected.iter().all(|e| messages.iter().any(|m| m == e)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every event {expected:?} is among {messages:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    running.stop().await;
    assert_eq!(
        *denials.verbs.lock().unwrap(),
        Vec::<&str>::new(),
        "the operator was denied requests"
    );

    // `rbac verify` agrees.
    let verification = kactor::rbac::verify(&handlers(Operator::new()), &args, &manifests)
        .await
        .unwrap();
    assert!(verification.is_complete(), "{verification}");
}

/// Takes the rules on `resource` out of the generated RBAC: the operator is denied, and
/// `rbac verify` says what is missing and why.
async fn without_the_rule_on(resource: &str, denied_verb: &str) {
    let (cluster, widgets) = cluster().await;
    let args = rbac_args(&["-n", "default", "--standalone"]);
    let full = kactor::rbac::generate(&handlers(Operator::new()), &args)
        .await
        .unwrap();
    let manifests = without(&full, resource);
    apply(&cluster, &manifests).await;

    let denials = Arc::new(Denials::default());
    let running = support::spawn(operator(&cluster, &args, &denials).await);
    let widget = serde_json::from_value(samples::widget("w1", 1)).unwrap();
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    denials.first().await;
    running.stop().await;
    assert!(
        denials.verbs.lock().unwrap().contains(&denied_verb),
        "{:?}",
        denials.verbs.lock().unwrap()
    );

    let verification = kactor::rbac::verify(&handlers(Operator::new()), &args, &manifests)
        .await
        .unwrap();
    let missing: Vec<&str> = verification
        .missing()
        .map(|check| check.resource.as_str())
        .collect();
    assert_eq!(missing, [resource], "{verification}");

    // The same through the command line: the report on stdout, and an error (exit status 1).
    let file = std::env::temp_dir()
        .join(format!("kactor-rbac-{}-{resource}.yaml", std::process::id()).replace('/', "-"));
    std::fs::write(&file, &manifests).unwrap();
    let verify = command(
        &["rbac", "verify"],
        &[
            "-n",
            "default",
            "--standalone",
            "-f",
            file.to_str().unwrap(),
        ],
    );
    let mut output = Vec::new();
    let error = verify
        .execute(
            &handlers(Operator::new()),
            &mut std::io::empty(),
            &mut output,
            &mut std::io::sink(),
        )
        .await
        .unwrap_err();
    let _ = std::fs::remove_file(&file);
    assert!(
        matches!(
            error,
            kactor::Error::Rbac(RbacError::Missing { missing: 1, .. })
        ),
        "{error}"
    );
    let report = String::from_utf8(output).unwrap();
    let line = report
        .lines()
        .find(|line| line.starts_with("MISSING"))
        .unwrap_or_else(|| panic!("no missing permission in:\n{report}"));
    assert!(
        line.starts_with(&format!(
            "MISSING: {denied_verb} resource \"{resource}\" in API group \""
        )),
        "{line}"
    );
    assert!(report.ends_with(" permissions are missing for system:serviceaccount:ops:my-op\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_status_patches_the_operator_is_denied_and_verify_says_so() {
    without_the_rule_on("widgets/status", "patch").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_events_the_operator_is_denied_and_verify_says_so() {
    without_the_rule_on("events", "create").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcards_grant_everything_to_the_operator_and_to_verify() {
    let (cluster, widgets) = cluster().await;
    let manifests = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {ACCOUNT}, namespace: {NAMESPACE}}}\n\
         ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: all}}\n\
         rules:\n  - {{apiGroups: ['*'], resources: ['*'], verbs: ['*']}}\n\
         ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: all}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: all}}\n\
         subjects: [{{kind: ServiceAccount, name: {ACCOUNT}, namespace: {NAMESPACE}}}]\n"
    );
    apply(&cluster, &manifests).await;
    let args = rbac_args(&["-A"]);
    let denials = Arc::new(Denials::default());
    let running = support::spawn(operator(&cluster, &args, &denials).await);
    let widget = serde_json::from_value(samples::widget("w1", 1)).unwrap();
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    until(&widgets, "w1", "create_fn's result", |w| {
        result(w, "create_fn").is_some()
    })
    .await;
    running.stop().await;
    assert_eq!(denials.count(), 0, "{:?}", denials.verbs.lock().unwrap());
    let verification = kactor::rbac::verify(&handlers(Operator::new()), &args, &manifests)
        .await
        .unwrap();
    assert!(verification.is_complete(), "{verification}");
}

#[tokio::test]
async fn a_denied_request_is_the_api_servers_403() {
    let (cluster, widgets) = cluster().await;
    let args = rbac_args(&["-n", "default", "--standalone"]);
    let full = kactor::rbac::generate(&handlers(Operator::new()), &args)
        .await
        .unwrap();
    apply(&cluster, &without(&full, "widgets/status")).await;
    let widget = serde_json::from_value(samples::widget("w1", 1)).unwrap();
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .unwrap();
    let client = cluster
        .client_as_service_account(NAMESPACE, ACCOUNT)
        .await
        .unwrap();
    let as_operator: Api<DynamicObject> =
        Api::namespaced_with(client, "default", &samples::widget_api_resource());
    let patch = Patch::Merge(json!({"status": {"create_fn": {}}}));
    let error = as_operator
        .patch_status("w1", &PatchParams::default(), &patch)
        .await
        .unwrap_err();
    let kube::Error::Api(status) = error else {
        panic!("not an API error: {error}");
    };
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        "widgets.example.com \"w1\" is forbidden: User \"system:serviceaccount:ops:my-op\" cannot \
         patch resource \"widgets/status\" in API group \"example.com\" in the namespace \"default\""
    );
    // What the Role still grants is allowed.
    as_operator
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"seen": "yes"}}})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn generate_writes_a_file_that_verify_reads_from_a_file_or_stdin() {
    let file = std::env::temp_dir().join(format!("kactor-rbac-{}.yaml", std::process::id()));
    let path = file.to_str().unwrap();
    let operator = handlers(Operator::new());
    let mut messages = Vec::new();
    command(&["rbac", "generate"], &["-A", "-o", path])
        .execute(
            &operator,
            &mut std::io::empty(),
            &mut std::io::sink(),
            &mut messages,
        )
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8(messages).unwrap(),
        format!("wrote the RBAC manifests to {path}\n")
    );
    let manifests = std::fs::read_to_string(&file).unwrap();
    assert!(manifests.contains("kind: ClusterRoleBinding"));

    for (args, input) in [
        (vec!["-A", "-f", path], String::new()),
        (vec!["-A", "-f", "-"], manifests.clone()),
        (vec!["-A"], manifests.clone()),
    ] {
        let mut output = Vec::new();
        command(&["rbac", "verify"], &args)
            .execute(
                &operator,
                &mut input.as_bytes(),
                &mut output,
                &mut std::io::sink(),
            )
            .await
            .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let report = String::from_utf8(output).unwrap();
        assert!(
            report.lines().all(|line| !line.starts_with("MISSING")),
            "{report}"
        );
        assert!(
            report.ends_with(" permissions are present for system:serviceaccount:ops:my-op\n"),
            "{report}"
        );
        assert!(report.starts_with(
            "present: list resource \"widgets\" in API group \"example.com\" cluster-wide (widgets.example.com is handled by create_fn, update_fn, delete_fn, tick:"
        ), "{report}");
    }
    let _ = std::fs::remove_file(&file);

    // A verification with other options needs other permissions.
    let mut output = Vec::new();
    let error = command(&["rbac", "verify"], &["-n", "default", "--leader-election"])
        .execute(
            &operator,
            &mut manifests.as_bytes(),
            &mut output,
            &mut std::io::sink(),
        )
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("permissions are missing for system:serviceaccount:ops:my-op"),
        "{error}"
    );

    // What is not YAML is a clear error.
    let error = command(&["rbac", "verify"], &["-A"])
        .execute(
            &operator,
            &mut "{not: [yaml".as_bytes(),
            &mut Vec::new(),
            &mut std::io::sink(),
        )
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("cannot read stdin: not RBAC manifests ("),
        "{error}"
    );
}

#[tokio::test]
async fn resources_named_by_kind_are_resolved_through_discovery() {
    let cluster = TestCluster::start().await.unwrap();
    samples::install_widgets(&cluster.client()).await.unwrap();
    let operator = Operator::new()
        .client(cluster.client())
        .on_create("Widget", "create_fn", |_: Ctx| async { Ok(()) })
        .on_update("wd", "update_fn", |_: Ctx| async { Ok(()) });
    let requirements =
        kactor::rbac::requirements(&operator, &rbac_args(&["-n", "default", "--standalone"]))
            .await
            .unwrap();
    let widgets: Vec<(String, String, Vec<String>)> = requirements
        .permissions
        .iter()
        .filter(|p| p.group == "example.com")
        .map(|p| (p.place.to_string(), p.resource.clone(), p.verbs.clone()))
        .collect();
    let default = "in the namespace \"default\"".to_string();
    assert_eq!(
        widgets,
        [
            (
                default.clone(),
                "widgets".into(),
                vec!["list".into(), "watch".into(), "patch".into()]
            ),
            (default, "widgets/status".into(), vec!["patch".into()]),
        ]
    );
    assert!(requirements.permissions[1]
        .why
        .starts_with("widgets.example.com is handled by create_fn, update_fn:"));

    let unknown =
        Operator::new()
            .client(cluster.client())
            .on_create("Gizmo", "create_fn", |_: Ctx| async { Ok(()) });
    let error = kactor::rbac::generate(&unknown, &rbac_args(&["-A"]))
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.starts_with("cannot resolve the resource \"Gizmo\" for RBAC: no resource \"Gizmo\" is served by the cluster"),
        "{message}"
    );
    assert!(!message.contains('\n'));

    // Without a cluster to ask, the selector is named too.
    let client = cluster.client();
    cluster.shutdown().await;
    let offline = Operator::new()
        .client(client)
        .on_create("Widget", "create_fn", |_: Ctx| async { Ok(()) });
    let message = kactor::rbac::generate(&offline, &rbac_args(&["-A"]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with(
            "cannot resolve the resource \"Widget\" for RBAC: cannot reach the Kubernetes API: "
        ),
        "{message}"
    );
    assert!(
        message.ends_with(
            "; name it by group and plural (e.g. (\"example.com\", \"v1\", \"widgets\") or \
             \"widgets.example.com\") to resolve it offline"
        ),
        "{message}"
    );
    assert!(!message.contains('\n'));
}

#[tokio::test]
async fn crds_prints_the_declared_crds_or_says_there_are_none() {
    let crd: CustomResourceDefinition = serde_json::from_value(samples::widget_crd()).unwrap();
    let operator = handlers(Operator::new()).crd(crd.clone());
    let mut output = Vec::new();
    let mut messages = Vec::new();
    command(&["crds"], &[])
        .execute(&operator, &mut std::io::empty(), &mut output, &mut messages)
        .await
        .unwrap();
    let text = String::from_utf8(output).unwrap();
    assert!(
        text.starts_with("apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"),
        "{text}"
    );
    let printed: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&text).unwrap();
    assert_eq!(printed, [crd]);
    assert!(messages.is_empty());

    let mut output = Vec::new();
    let mut messages = Vec::new();
    command(&["crds"], &[])
        .execute(
            &handlers(Operator::new()),
            &mut std::io::empty(),
            &mut output,
            &mut messages,
        )
        .await
        .unwrap();
    assert!(output.is_empty());
    assert_eq!(
        String::from_utf8(messages).unwrap(),
        "this operator declares no CRDs (declare them with Operator::crd)\n"
    );
}
