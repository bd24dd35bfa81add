//! A tour of kactor's handlers, on the embedded Kubernetes API emulator: every kind of handler
//! fires, with filters and errors, and says what happens and why.
//!
//! ```sh
//! cargo run --example tour        # about ten seconds, then it exits
//! ```
//!
//! Lines starting with `  [kind]` come from the handlers; `Step N.` lines are the tour doing what a
//! user would do with kubectl. kactor's own warnings (stderr) come in between: `Handler 'flaky'
//! failed temporarily: ...`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kactor::emulator::Emulator;
use kactor::logging::{LogFormat, LogSettings};
use kactor::prelude::*;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::oneshot;

/// A widget of some size.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "tour.example.com",
    version = "v1",
    kind = "Widget",
    doc = "A widget, for the tour of kactor's handlers.",
    namespaced,
    status = "WidgetStatus"
)]
pub struct WidgetSpec {
    /// How big the widget is.
    pub size: i32,
}

/// Where the operator keeps each handler's result, under the handler's id.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct WidgetStatus {}

/// Only widgets with this label get the `audit` event handler, the daemon and the timer.
const WATCHED: &str = "tour.example.com/watched";
/// Only widgets with this annotation get the `strict` create handler, which always fails.
const STRICT: &str = "tour.example.com/strict";

/// What the tour says: printed as it happens, and kept for the test.
#[derive(Clone, Default)]
pub struct Narrator(Arc<Mutex<Vec<String>>>);

impl Narrator {
    /// Prints a line and keeps it.
    pub fn say(&self, line: impl Into<String>) {
        let line = line.into();
        println!("{line}");
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(line);
    }

    /// Everything said so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many lines contain `text`.
    pub fn count(&self, text: &str) -> usize {
        self.lines().iter().filter(|l| l.contains(text)).count()
    }

    /// Waits until `n` lines contain `text`: the handlers run in their own tasks, the tour goes
    /// on once they have said their piece.
    pub async fn until(&self, text: &str, n: usize) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while self.count(text) < n {
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("waited 60 s for {n} lines with {text:?}, in vain");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

/// Counts MODIFIED events per widget, in its memo (state that lives as long as the object).
#[derive(Default)]
struct Modifications(u32);

/// Counts timer calls per widget, in its memo.
#[derive(Default)]
struct Ticks(u32);

/// The tour's operator: one handler of every kind for `Widget`s, each saying what it sees.
#[allow(
    clippy::too_many_lines,
    reason = "the tour: one handler of every kind, in one list for the reader"
)]
pub fn operator(narrator: &Narrator) -> Operator {
    let widgets = Selector::of::<Widget>();
    let say = narrator.clone();
    let created = Arc::new(AtomicUsize::new(0));
    Operator::new()
        // Activities: around the operator's life, not about an object.
        .on_startup("connect", {
            let say = say.clone();
            move |_ctx: ActivityCtx| {
                say.say("  [startup] connect: runs before anything is watched; an error would stop the operator.");
                async { Ok(()) }
            }
        })
        .on_cleanup("disconnect", {
            let say = say.clone();
            move |_ctx: ActivityCtx| {
                say.say("  [cleanup] disconnect: runs at exit, after the handlers have finished.");
                async { Ok(()) }
            }
        })
        // Every watch event of the watched widgets, the initial listing included. Nothing is
        // retried or stored: for auditing, metrics, caches.
        .on_event(
            widgets.clone(),
            On::id("audit").label(WATCHED, MetaFilter::Present),
            {
                let say = say.clone();
                move |ctx: Ctx| {
                    let modified = ctx.memo.with(|m: &mut Modifications| {
                        if ctx.event_type == EventType::Modified {
                            m.0 += 1;
                        }
                        m.0
                    });
                    match ctx.event_type {
                        // kactor's own patches (progress, status) come back as MODIFIED too.
                        EventType::Modified => {}
                        EventType::Listed => say.say(format!(
                            "  [event] audit: {} found in the initial listing (Kopf's event type None).",
                            ctx.name()
                        )),
                        other => say.say(format!(
                            "  [event] audit: {other:?} {}, after {modified} MODIFIED events (counted in its memo).",
                            ctx.name()
                        )),
                    }
                    async { Ok(()) }
                }
            },
        )
        // Changing handlers: run for a cause, retried until they succeed, their progress kept
        // on the object, their results in status.<id>.
        .on_create(widgets.clone(), "create_fn", {
            let (say, created) = (say.clone(), created.clone());
            move |ctx: Ctx| {
                created.fetch_add(1, Ordering::SeqCst);
                say.say(format!(
                    "  [create] create_fn: {} is new (no diff-base stored yet); its result goes to status.create_fn.",
                    ctx.name()
                ));
                async { Ok(json!({"message": "hello"})) }
            }
        })
        .on_create(widgets.clone(), On::id("flaky").retries(3), {
            let say = say.clone();
            move |ctx: Ctx| {
                let result = if ctx.retry() == 0 {
                    say.say(format!(
                        "  [create] flaky: {}, attempt 1 fails with a temporary error: retried in 1 s.",
                        ctx.name()
                    ));
                    Err(HandlerError::temporary(
                        "the database is not ready yet",
                        Duration::from_secs(1),
                    ))
                } else {
                    say.say(format!(
                        "  [create] flaky: {}, attempt {} succeeds.",
                        ctx.name(),
                        ctx.retry() + 1
                    ));
                    Ok(())
                };
                async move { result }
            }
        })
        .on_create(
            widgets.clone(),
            On::id("strict").annotation(STRICT, MetaFilter::Present),
            {
                let say = say.clone();
                move |ctx: Ctx| {
                    say.say(format!(
                        "  [create] strict: {} is annotated {STRICT}; fails permanently, never retried; the other handlers go on.",
                        ctx.name()
                    ));
                    async { Err::<(), _>(HandlerError::permanent("strict widgets are not allowed")) }
                }
            },
        )
        .on_update(widgets.clone(), "update_fn", {
            let say = say.clone();
            move |ctx: Ctx| {
                let changes: Vec<String> = ctx
                    .diff()
                    .iter()
                    .map(|item| {
                        format!(
                            "{} {}: {} -> {}",
                            item.op.as_str(),
                            item.field.join("."),
                            show(item.old.as_ref()),
                            show(item.new.as_ref())
                        )
                    })
                    .collect();
                say.say(format!(
                    "  [update] update_fn: {}'s spec, labels or annotations changed: {}.",
                    ctx.name(),
                    changes.join("; ")
                ));
                async { Ok(()) }
            }
        })
        // A value filter: only when the new size is 10 or more.
        .on_update(
            widgets.clone(),
            On::id("grow").field("spec.size").new(ValueFilter::check(|size| {
                size.and_then(Value::as_i64).is_some_and(|size| size >= 10)
            })),
            {
                let say = say.clone();
                move |ctx: Ctx| {
                    say.say(format!(
                        "  [update] grow: {} grew to {} (its filter wants a new size of 10 or more).",
                        ctx.name(),
                        show(ctx.new_value())
                    ));
                    async { Ok(()) }
                }
            },
        )
        .on_field(widgets.clone(), "spec.size", "size_fn", {
            let say = say.clone();
            move |ctx: Ctx| {
                let why = if ctx.old().is_none() {
                    " (field handlers run for the creation too)"
                } else {
                    ""
                };
                say.say(format!(
                    "  [field] size_fn/spec.size: {}'s size {} -> {}{why}.",
                    ctx.name(),
                    show(ctx.old()),
                    show(ctx.new_value())
                ));
                async { Ok(()) }
            }
        })
        .on_resume(widgets.clone(), "resume_fn", {
            let say = say.clone();
            move |ctx: Ctx| {
                say.say(format!(
                    "  [resume] resume_fn: {} was found at startup, handled by an earlier run.",
                    ctx.name()
                ));
                async { Ok(()) }
            }
        })
        .on_delete(widgets.clone(), "delete_fn", {
            let say = say.clone();
            move |ctx: Ctx| {
                say.say(format!(
                    "  [delete] delete_fn: {} is being deleted; kactor's finalizer holds it until this succeeds.",
                    ctx.name()
                ));
                async { Ok(()) }
            }
        })
        // Indexes: each widget's result, kept in memory by key across the widgets, read by any
        // handler (`ctx.index`); no resource handler runs before they are populated.
        .index(widgets.clone(), "by_size", {
            let say = say.clone();
            move |ctx: Ctx| {
                let size = ctx.spec()["size"].as_i64().unwrap_or(0);
                let bucket = if size >= 10 { "big" } else { "small" };
                // It runs on every event of the widget: say only what changes.
                let moved = ctx.memo.with(|last: &mut Option<&'static str>| {
                    last.replace(bucket) != Some(bucket)
                });
                if moved {
                    say.say(format!(
                        "  [index] by_size: {} is {bucket} (size {size}); handlers read ctx.index(\"by_size\").",
                        ctx.name()
                    ));
                }
                let name = ctx.name().to_string();
                async move { Ok(json!({ bucket: name })) }
            }
        })
        // Daemons and timers: tasks per object, for as long as it exists (and matches).
        .daemon(
            widgets.clone(),
            On::id("monitor").label(WATCHED, MetaFilter::Present),
            Daemon::new(),
            {
                let say = say.clone();
                move |ctx: Ctx| {
                    let say = say.clone();
                    async move {
                        say.say(format!(
                            "  [daemon] monitor: started for {}; it runs until asked to stop.",
                            ctx.name()
                        ));
                        let reasons = ctx.stopped().wait().await;
                        say.say(format!(
                            "  [daemon] monitor: stopping for {}, because {reasons}.",
                            ctx.name()
                        ));
                        Ok(())
                    }
                }
            },
        )
        .timer(
            widgets.clone(),
            On::id("tick").label(WATCHED, MetaFilter::Present),
            Timer::every(Duration::from_secs(1)),
            {
                let say = say.clone();
                move |ctx: Ctx| {
                    let ticks = ctx.memo.with(|t: &mut Ticks| {
                        t.0 += 1;
                        t.0
                    });
                    let big = ctx.index("by_size").map_or(0, |index| index.get(Some("big")).len());
                    say.say(format!(
                        "  [timer] tick: {} has size {} (call {ticks}, every second; result in status.tick; {big} big widget(s) in the index by_size).",
                        ctx.name(),
                        show(ctx.spec().get("size"))
                    ));
                    async move { Ok(json!({"ticks": ticks})) }
                }
            },
        )
        // Probes: their results are what /healthz answers.
        .on_probe("widgets", {
            let say = say.clone();
            move |_ctx: ActivityCtx| {
                let created = created.load(Ordering::SeqCst);
                say.say(format!(
                    "  [probe] widgets: asked by /healthz; {created} widgets created so far."
                ));
                async move { Ok(json!({"created": created})) }
            }
        })
}

/// A JSON value for a line of text; `-` when absent.
fn show(value: Option<&Value>) -> String {
    value.map_or_else(|| "-".to_string(), Value::to_string)
}

/// An operator running in a task, until told to stop.
struct Running {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<kactor::Result<()>>,
}

fn start(emulator: &Emulator, narrator: &Narrator, health_port: u16) -> Running {
    let operator = operator(narrator)
        .kube_config(emulator.config())
        .standalone()
        .liveness(&format!("http://127.0.0.1:{health_port}/healthz"))
        .settings(|s| s.queueing.exit_timeout = Duration::from_secs(1));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(operator.run_until(async {
        let _ = stopped.await;
    }));
    Running { stop, task }
}

impl Running {
    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await??;
        Ok(())
    }
}

/// The tour: an emulator, the operator, and what a user would do with kubectl.
pub async fn play(say: &Narrator) -> anyhow::Result<()> {
    let emulator = Emulator::start().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(emulator.client());
    crds.create(&PostParams::default(), &Widget::crd()).await?;
    let widgets: Api<Widget> = Api::namespaced(emulator.client(), "default");
    let health_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();

    say.say("Step 1. Start the operator.");
    let running = start(&emulator, say, health_port);
    // Ready once the startup activities succeeded and the widgets are listed: what is created
    // from now on comes as ADDED, not in the initial listing.
    until_ready(health_port).await?;

    say.say(format!(
        "Step 2. Create the widget demo, size 1, labelled {WATCHED}=yes."
    ));
    let mut demo = Widget::new("demo", WidgetSpec { size: 1 });
    demo.metadata.labels = Some([(WATCHED.to_string(), "yes".to_string())].into());
    widgets.create(&PostParams::default(), &demo).await?;
    for line in [
        "[event] audit: Added demo",
        "[create] create_fn: demo",
        "[field] size_fn/spec.size: demo",
        "flaky: demo, attempt 2 succeeds",
        "[daemon] monitor: started for demo",
    ] {
        say.until(line, 1).await?;
    }

    say.say(format!(
        "Step 3. Create the widget strict, size 1, annotated {STRICT}: no daemon, no timer."
    ));
    let mut strict = Widget::new("strict", WidgetSpec { size: 1 });
    strict.metadata.annotations = Some([(STRICT.to_string(), "yes".to_string())].into());
    widgets.create(&PostParams::default(), &strict).await?;
    say.until("[create] strict: strict", 1).await?;
    // The creation is done once its temporary failure was retried (1 s later).
    say.until("flaky: strict, attempt 2 succeeds", 1).await?;

    say.say("Step 4. Resize demo: 1 -> 3.");
    resize(&widgets, "demo", 3).await?;
    say.until("[field] size_fn/spec.size: demo's size 1 -> 3", 1)
        .await?;
    say.until("[update] update_fn: demo", 1).await?;

    say.say("Step 5. Resize demo: 3 -> 12.");
    resize(&widgets, "demo", 12).await?;
    say.until("[update] grow: demo grew to 12", 1).await?;
    say.until("[index] by_size: demo is big (size 12)", 1)
        .await?;
    say.until("[timer] tick: demo has size 12", 1).await?;
    // The timer runs beside the cycle that updates the index: a tick may come just before.
    say.until("1 big widget(s) in the index by_size", 1).await?;

    say.say(format!(
        "Step 6. Ask http://127.0.0.1:{health_port}/healthz, as a liveness probe would."
    ));
    let (code, body) = get(health_port, "/healthz").await?;
    say.say(format!("  /healthz answers {code}: {body}"));

    say.say("Step 7. Restart the operator.");
    running.stop().await?;
    say.until("[cleanup]", 1).await?;
    let running = start(&emulator, say, health_port);
    say.until("[resume] resume_fn: demo", 1).await?;
    say.until("[resume] resume_fn: strict", 1).await?;
    say.until("[daemon] monitor: started for demo", 2).await?;

    say.say("Step 8. Delete both widgets.");
    for name in ["demo", "strict"] {
        widgets.delete(name, &DeleteParams::default()).await?;
    }
    say.until("[delete] delete_fn: demo", 1).await?;
    say.until("[delete] delete_fn: strict", 1).await?;
    say.until("monitor: stopping for demo, because RESOURCE_DELETED", 1)
        .await?;
    say.until("[event] audit: Deleted demo", 1).await?;

    say.say("Step 9. Stop the operator.");
    running.stop().await?;
    say.say("The tour is over.");
    Ok(())
}

async fn resize(widgets: &Api<Widget>, name: &str, size: i32) -> kube::Result<Widget> {
    let patch = json!({"spec": {"size": size}});
    widgets
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// Waits until `/readyz` answers 200.
async fn until_ready(port: u16) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !matches!(get(port, "/readyz").await, Ok((200, _))) {
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("the operator was not ready within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// `GET path` on the health server: the status code and the body.
async fn get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("not an HTTP response: {response:?}"))?;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status code in {head:?}"))?;
    Ok((code, body.to_string()))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // kactor's warnings and errors only (a handler failing, ...): the tour says the rest.
    let logging = LogSettings {
        format: LogFormat::Plain,
        level: tracing::Level::WARN,
        ..LogSettings::default()
    };
    if let Err(error) = kactor::logging::init(&logging) {
        eprintln!("tour: error: {error}");
        return std::process::ExitCode::FAILURE;
    }
    match play(&Narrator::default()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tour: error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
