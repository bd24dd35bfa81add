//! The `kactor` command line, run as a process.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, ListParams};

/// Kills the child when the test ends, even on a failed assertion.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn kactor_emulator_serves_a_sample_widget_and_writes_a_kubeconfig_any_client_can_use() {
    let dir = std::env::temp_dir().join(format!("kactor-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_kactor"))
            .args(["emulator", "--port", "0", "--kubeconfig"])
            .arg(&kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("kactor runs"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut banner = Vec::new();
    while let Some(Ok(line)) = lines.next() {
        banner.push(line.clone());
        if line.starts_with("Serving until Ctrl-C") || Instant::now() > deadline {
            break;
        }
    }
    assert!(
        banner.iter().any(|l| l.contains("kubectl get widgets")),
        "instructions printed: {banner:?}"
    );
    let config =
        kube::config::Kubeconfig::read_from(&kubeconfig).expect("the kubeconfig is written");
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let resource = kactor::emulator::samples::widget_api_resource();
    let widgets: Api<DynamicObject> = Api::namespaced_with(client, "default", &resource);
    let names: Vec<_> = widgets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|w| w.metadata.name)
        .collect();
    assert_eq!(names, ["demo"]);
    let _ = std::fs::remove_dir_all(&dir);
}
