//! `kactor new`, end to end, as a new user takes it: the generated crate's own `cargo test` passes
//! with no edit, and the generated program run with `--emulator` handles an object created with
//! kubectl. Both variants (closure handlers, `--actor`).
//!
//! It runs cargo on the generated crates, sharing this checkout's target directory so that the
//! dependencies they share with kactor are built once.

// The generated crates' own tests use the embedded emulator, by design: running them again in the
// real kube-apiserver's pass would test nothing new.
mod emulator_only {
    use std::path::{Path, PathBuf};
    use std::process::Stdio;
    use std::time::Duration;

    use tokio::io::{AsyncBufReadExt, BufReader};

    /// The longest anything is waited for once the program is built.
    const WAIT: Duration = Duration::from_secs(60);

    /// A fresh directory for generated crates.
    fn scratch(name: &str) -> PathBuf {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("kactor-new-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// `kactor new ARGS` into `dir`, which must succeed.
    fn kactor_new(dir: &Path, args: &[&str]) -> String {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_kactor"))
            .arg("new")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "kactor new {args:?}: {said}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        said
    }

    /// The target directory of this checkout, shared with the generated crates.
    fn target_dir() -> PathBuf {
        std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
    }

    /// `cargo ARGS` in the generated crate, which must succeed; its output.
    fn cargo(crate_dir: &Path, args: &[&str]) -> String {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let output = std::process::Command::new(cargo)
            .args(args)
            .current_dir(crate_dir)
            .env("CARGO_TARGET_DIR", target_dir())
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success(),
            "cargo {args:?} in {}:\n{said}",
            crate_dir.display()
        );
        said
    }

    #[test]
    fn a_new_operator_builds_and_its_test_passes_as_generated() {
        let dir = scratch("handlers");
        let said = kactor_new(&dir, &["shop-operator"]);
        assert!(said.contains("a Shop (example.com/v1)"), "{said}");
        let crate_dir = dir.join("shop-operator");
        for file in [
            "Cargo.toml",
            "Cargo.lock",
            "README.md",
            "Dockerfile",
            ".gitignore",
            "src/main.rs",
            "src/lib.rs",
            "tests/operator.rs",
        ] {
            assert!(crate_dir.join(file).is_file(), "{file}");
        }
        let readme = std::fs::read_to_string(crate_dir.join("README.md")).unwrap();
        assert!(readme.contains("cargo run -- --emulator") && readme.contains("cargo test"));
        let tested = cargo(&crate_dir, &["test"]);
        assert!(
            tested.contains(
                "test a_shop_is_greeted_when_created_and_changed_and_let_go_when_deleted ... ok"
            ),
            "{tested}"
        );
        // A second one in the same place is refused, and nothing is overwritten.
        let again = std::process::Command::new(env!("CARGO_BIN_EXE_kactor"))
            .args(["new", "shop-operator"])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(!again.status.success());
        assert!(String::from_utf8_lossy(&again.stderr).contains("exists and is not empty"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_new_actor_operator_builds_and_its_test_passes_as_generated() {
        let dir = scratch("actor");
        kactor_new(
            &dir,
            &[
                "cache",
                "--actor",
                "--kind",
                "Cache",
                "--group",
                "caching.example.org",
            ],
        );
        let crate_dir = dir.join("cache");
        let lib = std::fs::read_to_string(crate_dir.join("src/lib.rs")).unwrap();
        assert!(lib.contains("impl ObjectActor for CacheActor"), "{lib}");
        let tested = cargo(&crate_dir, &["test"]);
        assert!(tested.contains("test result: ok. 1 passed"), "{tested}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Names, kinds and groups that cannot be used are refused with a clear message, and nothing is
    /// written.
    #[test]
    fn what_cannot_name_an_operator_is_refused() {
        let dir = scratch("refused");
        for (args, says) in [
            (&["My_Operator"][..], "cannot name an operator"),
            (&["1st"], "cannot name an operator"),
            (&["op", "--kind", "widget"], "is not a Kubernetes kind"),
            (&["op", "--group", "example"], "is not an API group"),
            (&["op", "--kactor-path", "/nowhere"], "no kactor checkout"),
        ] {
            let output = std::process::Command::new(env!("CARGO_BIN_EXE_kactor"))
                .arg("new")
                .args(args)
                .current_dir(&dir)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                !output.status.success() && stderr.contains(says),
                "{args:?}: {stderr}"
            );
        }
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "nothing written"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The generated program with `--emulator`: an object created with kubectl through the
    /// kubeconfig it prints gets its greeting.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_new_operator_on_the_emulator_handles_an_object_made_with_kubectl() {
        let dir = scratch("emulator");
        kactor_new(&dir, &["greeter"]);
        let crate_dir = dir.join("greeter");
        cargo(&crate_dir, &["build"]);
        let program = target_dir().join("debug/greeter");
        let mut child = tokio::process::Command::new(&program)
            .arg("--emulator")
            .env("TMPDIR", &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let kubeconfig = tokio::time::timeout(WAIT, async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if let Some(path) = line.trim().strip_prefix("kubectl     export KUBECONFIG=") {
                    return path.to_string();
                }
            }
            panic!("no kubeconfig printed");
        })
        .await
        .expect("it prints its kubeconfig");
        let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
        let object = dir.join("greeter.yaml");
        std::fs::write(
            &object,
            "apiVersion: example.com/v1\nkind: Greeter\nmetadata: {name: first}\nspec: {message: kubectl}\n",
        )
        .unwrap();
        let applied = std::process::Command::new(&kubectl)
            .args(["apply", "-f"])
            .arg(&object)
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .unwrap();
        assert!(applied.status.success(), "{applied:?}");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let got = std::process::Command::new(&kubectl)
                .args([
                    "get",
                    "greeter",
                    "first",
                    "-o",
                    "jsonpath={.status.create.greeting}",
                ])
                .env("KUBECONFIG", &kubeconfig)
                .output()
                .unwrap();
            if String::from_utf8_lossy(&got.stdout) == "hello, kubectl" {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no greeting: {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let pid = child.id().unwrap().to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        let status = tokio::time::timeout(WAIT, child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "{status}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
