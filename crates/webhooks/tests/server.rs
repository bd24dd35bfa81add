//! The webhook server over real HTTPS, on both test clusters: AdmissionReviews answered as Kopf
//! answers them, the managed webhook configurations written and withdrawn, and a certificate
//! rotated on disk served without a restart. (That the API server itself calls the webhooks is
//! `tests/admission.rs`, on the real kube-apiserver.)

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kactor_reactor::admission::{
    admission_fn, Admission, AdmissionError, AdmissionHandler, AdmissionKind, Operation,
};
use kactor_reactor::resources::{Resource, Selector};
use kactor_reactor::settings::WebhookServer;
use kactor_testenv::TestCluster;
use kactor_webhooks::{Served, Webhooks};
use kube::api::Api;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};

fn widgets() -> Arc<Resource> {
    Arc::new(Resource::namespaced(
        "example.com",
        "v1",
        "Widget",
        "widgets",
    ))
}

fn served(
    kind: AdmissionKind,
    admission: Admission,
    func: kactor_reactor::admission::AdmissionFn,
) -> Served {
    Served {
        handler: AdmissionHandler {
            kind,
            selector: Selector::parse("widgets.example.com"),
            admission,
            func,
        },
        resource: widgets(),
    }
}

/// The handlers of these tests: a size check (deny above 10 with 400, warn above 5), defaults (a
/// missing size becomes 1, a label is added), and one that panics.
fn handlers() -> Vec<Served> {
    vec![
        served(
            AdmissionKind::Validating,
            Admission::id("check-size").operations([Operation::Create, Operation::Update]),
            admission_fn(|ctx| async move {
                let size = ctx.spec()["size"].as_i64().unwrap_or_default();
                if size > 5 {
                    ctx.warn(format!("size {size} is large"));
                }
                if size > 10 {
                    return Err(AdmissionError::deny(format!("size {size} is over 10")).code(400));
                }
                Ok(())
            }),
        ),
        served(
            AdmissionKind::Mutating,
            Admission::id("defaults").persistent(),
            admission_fn(|ctx| async move {
                if ctx.spec().get("size").is_none() {
                    ctx.patch().set(&["spec", "size"], json!(1));
                }
                ctx.patch().label("defaulted", Some("yes"));
                Ok(())
            }),
        ),
        served(
            AdmissionKind::Validating,
            Admission::id("broken"),
            admission_fn(|_| async move {
                if true {
                    panic!("the handler's bug");
                }
                Ok(())
            }),
        ),
    ]
}

fn settings() -> WebhookServer {
    WebhookServer {
        addr: "127.0.0.1".parse().unwrap(),
        host: "127.0.0.1".into(),
        ..WebhookServer::default()
    }
}

/// POSTs `body` to `path` of the server over HTTPS, trusting only `ca_pem`: the status and body.
async fn post(webhooks: &Webhooks, ca_pem: &[u8], path: &str, body: &str) -> (u16, String) {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(webhooks.local_addr())
        .await
        .unwrap();
    let tls = connector
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .expect("the TLS handshake with the served certificate");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::post(path)
        .header("content-type", "application/json")
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn review(operation: &str, object: Value) -> String {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "req-1",
            "operation": operation,
            "object": object,
            "userInfo": {"username": "tester"},
            "dryRun": false,
        },
    })
    .to_string()
}

fn widget(size: Option<i64>) -> Value {
    let mut widget = json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1", "namespace": "default", "labels": {"app": "demo"}},
        "spec": {},
    });
    if let Some(size) = size {
        widget["spec"]["size"] = json!(size);
    }
    widget
}

async fn answer(webhooks: &Webhooks, path: &str, body: String) -> Value {
    let (status, text) = post(webhooks, &webhooks.ca_pem(), path, &body).await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_reviews_are_answered_as_kopf_answers_them() {
    let cluster = TestCluster::start().await.unwrap();
    let webhooks = Webhooks::start(&settings(), handlers(), vec![], cluster.client())
        .await
        .unwrap();

    // Allowed, with a warning.
    let allowed = answer(&webhooks, "/check-size", review("CREATE", widget(Some(7)))).await;
    assert_eq!(
        allowed,
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": "req-1", "allowed": true, "warnings": ["size 7 is large"]},
        })
    );
    // Denied, with the handler's message and code.
    let denied = answer(&webhooks, "/check-size", review("UPDATE", widget(Some(11)))).await;
    assert_eq!(denied["response"]["allowed"], false);
    assert_eq!(
        denied["response"]["status"],
        json!({"message": "size 11 is over 10", "code": 400})
    );
    // A deletion is not its operation: allowed without a call.
    let deleted = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "req-2", "operation": "DELETE", "oldObject": widget(Some(50))},
    });
    let answered = answer(&webhooks, "/check-size", deleted.to_string()).await;
    assert_eq!(
        answered["response"],
        json!({"uid": "req-2", "allowed": true})
    );

    // The mutation, as a base64 JSON patch.
    let mutated = answer(&webhooks, "/defaults", review("CREATE", widget(None))).await;
    let response = &mutated["response"];
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().unwrap())
        .unwrap();
    let mut object = widget(None);
    let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
    json_patch::patch(&mut object, &patch).unwrap();
    assert_eq!(object["spec"]["size"], 1);
    assert_eq!(
        object["metadata"]["labels"],
        json!({"app": "demo", "defaulted": "yes"})
    );

    // A panic denies with code 500 and its message.
    let broken = answer(&webhooks, "/broken", review("CREATE", widget(Some(1)))).await;
    assert_eq!(broken["response"]["allowed"], false);
    assert_eq!(broken["response"]["status"]["code"], 500);
    assert!(
        broken["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("the handler's bug"),
        "{broken}"
    );

    // What is not an AdmissionReview, or not a webhook.
    let ca = webhooks.ca_pem();
    let (status, text) = post(&webhooks, &ca, "/check-size", "{not json").await;
    assert_eq!(status, 400, "{text}");
    let (status, text) = post(
        &webhooks,
        &ca,
        "/check-size",
        r#"{"kind": "AdmissionReview"}"#,
    )
    .await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("no request"), "{text}");
    let (status, _) = post(&webhooks, &ca, "/nothing", "{}").await;
    assert_eq!(status, 404);
    webhooks.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_configurations_point_at_the_server_and_only_persistent_webhooks_outlive_it() {
    let cluster = TestCluster::start().await.unwrap();
    let client = cluster.client();
    let webhooks = Webhooks::start(&settings(), handlers(), vec![], client.clone())
        .await
        .unwrap();
    webhooks.configure("auto.kactor.test").await.unwrap();
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let stored = serde_json::to_value(validating.get("auto.kactor.test").await.unwrap()).unwrap();
    let hooks = stored["webhooks"].as_array().unwrap();
    let names: Vec<&str> = hooks.iter().map(|h| h["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["check-size.auto.kactor.test", "broken.auto.kactor.test"]
    );
    let port = webhooks.local_addr().port();
    assert_eq!(
        hooks[0]["clientConfig"]["url"],
        format!("https://127.0.0.1:{port}/check-size")
    );
    let ca = base64::engine::general_purpose::STANDARD
        .decode(hooks[0]["clientConfig"]["caBundle"].as_str().unwrap())
        .unwrap();
    assert_eq!(ca, webhooks.ca_pem());
    // The bundle verifies the server: a request trusting only it goes through.
    let (status, _) = post(
        &webhooks,
        &ca,
        "/check-size",
        &review("CREATE", widget(Some(1))),
    )
    .await;
    assert_eq!(status, 200);
    let stored = serde_json::to_value(mutating.get("auto.kactor.test").await.unwrap()).unwrap();
    assert_eq!(stored["webhooks"][0]["name"], "defaults.auto.kactor.test");

    webhooks.stop().await;
    assert!(
        validating
            .get_opt("auto.kactor.test")
            .await
            .unwrap()
            .is_none(),
        "no persistent validating webhook: the configuration is deleted"
    );
    let kept = serde_json::to_value(mutating.get("auto.kactor.test").await.unwrap()).unwrap();
    assert_eq!(
        kept["webhooks"][0]["name"], "defaults.auto.kactor.test",
        "persistent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_rotated_on_disk_is_served_without_a_restart() {
    let cluster = TestCluster::start().await.unwrap();
    let dir = std::env::temp_dir().join(format!("kactor-webhook-certs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let write = |names: Vec<String>| {
        let made = rcgen::generate_simple_self_signed(names).unwrap();
        // The key first: the certificate's change is what completes the pair.
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        std::fs::write(&cert, made.cert.pem()).unwrap();
        made.cert.pem().into_bytes()
    };
    let first = write(vec!["127.0.0.1".into()]);
    let settings = WebhookServer {
        certfile: Some(cert.clone()),
        pkeyfile: Some(key.clone()),
        file_check_interval: Duration::from_millis(50),
        ..settings()
    };
    let webhooks = Webhooks::start(&settings, handlers(), vec![], cluster.client())
        .await
        .unwrap();
    webhooks.configure("rotating.kactor.test").await.unwrap();
    assert_eq!(webhooks.ca_pem(), first);
    let (status, _) = post(
        &webhooks,
        &first,
        "/check-size",
        &review("CREATE", widget(Some(1))),
    )
    .await;
    assert_eq!(status, 200);

    // Rotated: a new key and certificate (another CA) replace the files.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = write(vec!["127.0.0.1".into(), "webhooks.example".into()]);
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(cluster.client());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let stored =
            serde_json::to_value(validating.get("rotating.kactor.test").await.unwrap()).unwrap();
        let bundle = base64::engine::general_purpose::STANDARD
            .decode(
                stored["webhooks"][0]["clientConfig"]["caBundle"]
                    .as_str()
                    .unwrap(),
            )
            .unwrap();
        if bundle == second && webhooks.ca_pem() == second {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new CA is not in the configuration"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = post(
        &webhooks,
        &second,
        "/check-size",
        &review("CREATE", widget(Some(1))),
    )
    .await;
    assert_eq!(status, 200, "the new certificate is served");
    webhooks.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversion_reviews_are_answered_at_convert_and_the_crd_pointed_at_the_server() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kactor_reactor::admission::{convert_fn, ConversionHandler};
    use kactor_webhooks::Converter;
    let cluster = TestCluster::start().await.unwrap();
    kactor_emulator::samples::install_widgets(&cluster.client())
        .await
        .unwrap();
    let converter = Converter {
        handler: ConversionHandler {
            selector: Selector::parse("widgets.example.com"),
            from: "v1".into(),
            to: "v2".into(),
            func: convert_fn(|mut widget: Value| {
                let size = widget["spec"]["size"].take();
                widget["spec"] = json!({"dimensions": {"size": size}});
                Ok::<_, kactor_reactor::handlers::HandlerError>(widget)
            }),
        },
        resource: widgets(),
    };
    let webhooks = Webhooks::start(&settings(), vec![], vec![converter], cluster.client())
        .await
        .unwrap();
    let review = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "c1", "desiredAPIVersion": "example.com/v2", "objects": [widget(Some(4))]},
    });
    let answer = answer(&webhooks, "/convert", review.to_string()).await;
    assert_eq!(answer["kind"], "ConversionReview");
    let response = &answer["response"];
    assert_eq!(response["uid"], "c1");
    assert_eq!(response["result"]["status"], "Success");
    assert_eq!(
        response["convertedObjects"][0]["apiVersion"],
        "example.com/v2"
    );
    assert_eq!(
        response["convertedObjects"][0]["spec"],
        json!({"dimensions": {"size": 4}})
    );

    // Managed: the CRD's conversion points at the server.
    webhooks.configure("auto.kactor.test").await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(cluster.client());
    let crd = serde_json::to_value(crds.get("widgets.example.com").await.unwrap()).unwrap();
    let conversion = &crd["spec"]["conversion"];
    assert_eq!(conversion["strategy"], "Webhook");
    let port = webhooks.local_addr().port();
    assert_eq!(
        conversion["webhook"]["clientConfig"]["url"],
        format!("https://127.0.0.1:{port}/convert")
    );
    webhooks.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_dropped_without_stopping_stops_listening() {
    let cluster = TestCluster::start().await.unwrap();
    let webhooks = Webhooks::start(&settings(), handlers(), vec![], cluster.client())
        .await
        .unwrap();
    let addr = webhooks.local_addr();
    assert!(tokio::net::TcpStream::connect(addr).await.is_ok());
    drop(webhooks);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still listening on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
