//! Execution: one attempt of one handler, and what it came to (`reference/kopf.md` §1.6; Kopf's
//! `execute_handler_once`).
//!
//! **Expected flow**: before the attempt, an exceeded `timeout` or `retries` fails the handler for
//! good without calling it; the handler runs (a panic is its error; an attempt still running when the
//! `timeout` is up is cancelled); then its result or error becomes an [`Outcome`]:
//! * `Ok(value)`: succeeded, the value is its result;
//! * [`HandlerError::Temporary`]: retried after its delay, unless the next attempt would exceed the
//!   timeout or the retries (a look-ahead), which makes it final;
//! * [`HandlerError::Permanent`]: failed for good (until the next change);
//! * any other error or a panic, per the handler's [`ErrorsMode`]: retried after the backoff (with the
//!   same look-ahead), failed for good, or ignored (done, no result).
//!
//! Log lines use Kopf's wording (`Handler 'create_fn' succeeded.`); changing handlers also post them
//! as Kubernetes Events about the object.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;

use crate::clients::observe::{ActiveHandler, HandlerRun, Observer};
use crate::intents::context::{Ctx, ErrorsMode, HandlerError, HandlerFn};
use crate::intents::subhandlers::{self, CHILDREN_RETRY_MESSAGE};
use crate::storage::progression::Outcome;
pub use crate::structs::names::Verdict;

/// What to run, and how to treat what comes out.
pub struct Invocation<'a> {
    /// The handler's id.
    pub id: &'a str,
    /// The function.
    pub func: &'a HandlerFn,
    /// How arbitrary errors are treated.
    pub errors: ErrorsMode,
    /// The delay before retrying after an arbitrary error.
    pub backoff: Duration,
    /// Give up once this long has passed since the first attempt.
    pub timeout: Option<Duration>,
    /// Give up after this many attempts in all.
    pub retries: Option<u32>,
    /// Post the outcome as a Kubernetes Event (changing handlers; never `on_event`).
    pub post_events: bool,
    /// The resource, as metrics label it (kubectl's form).
    pub resource: &'a str,
    /// Where the attempt is counted (metrics).
    pub observer: &'a dyn Observer,
    /// Whether it counts as an active handler while it runs (not daemons: they have their own
    /// gauge, and would fill this one forever).
    pub active: bool,
}

/// Runs one attempt: `attempts` came before it, `runtime` passed since the first one. The attempt is
/// counted by the invocation's observer (active while it runs, then its verdict and duration).
pub async fn execute_once(
    handler: &Invocation<'_>,
    ctx: Ctx,
    attempts: u32,
    runtime: Duration,
) -> (Outcome, Verdict) {
    let active = handler
        .active
        .then(|| ActiveHandler::start(handler.observer));
    let started = Instant::now();
    let (outcome, verdict) = attempt(handler, ctx, attempts, runtime).await;
    let run = HandlerRun {
        resource: handler.resource,
        handler: handler.id,
        verdict,
        attempt: attempts,
        duration: started.elapsed(),
        active: handler.active,
    };
    match active {
        Some(active) => active.finish(&run),
        None => handler.observer.handler_finished(&run),
    }
    (outcome, verdict)
}

async fn attempt(
    handler: &Invocation<'_>,
    ctx: Ctx,
    attempts: u32,
    runtime: Duration,
) -> (Outcome, Verdict) {
    let title = format!("Handler '{}'", handler.id);
    // Logged, and for changing handlers posted as a Kubernetes Event about the object when
    // `posting.loggers` is on (Kopf's object logger with its `K8sPoster`).
    let report = |error: bool, message: &str| {
        if handler.post_events {
            let logger = ctx.logger();
            if error {
                logger.error(message);
            } else {
                logger.info(message);
            }
        } else if error {
            tracing::error!(handler = handler.id, "{message}");
        } else {
            tracing::info!(handler = handler.id, "{message}");
        }
    };
    if let Some(message) = exhausted(handler, &title, attempts, runtime) {
        report(true, &message);
        return (failed_for_good(message), Verdict::Timeout);
    }
    tracing::debug!(handler = handler.id, "{title} is invoked.");
    let result = match invoke(handler, &title, ctx.clone(), runtime).await {
        Ok(result) => result,
        Err(message) => {
            report(true, &message);
            return (failed_for_good(message), Verdict::Timeout);
        }
    };
    let judged = judge(handler, &title, result, attempts, runtime);
    match judged.verdict {
        // Not a failure: the handler runs again when its earliest sub-handler is due.
        Verdict::Unfinished => tracing::debug!(handler = handler.id, "{}", judged.text),
        verdict => report(verdict != Verdict::Success, &judged.text),
    }
    (judged.outcome, judged.verdict)
}

/// Whether the handler is out of time or attempts before this attempt: the message saying so.
fn exhausted(
    handler: &Invocation<'_>,
    title: &str,
    attempts: u32,
    runtime: Duration,
) -> Option<String> {
    if handler.timeout.is_some_and(|timeout| runtime >= timeout) {
        return Some(format!("{title} has timed out after {}.", seconds(runtime)));
    }
    if handler.retries.is_some_and(|retries| attempts >= retries) {
        return Some(format!("{title} has exceeded {attempts} retries."));
    }
    None
}

/// Calls the handler, for what is left of its timeout; a panic is its error. Err: it ran out of
/// time and was cancelled (the message saying so).
async fn invoke(
    handler: &Invocation<'_>,
    title: &str,
    ctx: Ctx,
    runtime: Duration,
) -> Result<Result<serde_json::Value, HandlerError>, String> {
    // Sub-handlers registered and not executed by the handler are executed once it returns
    // (Kopf's implicit `kopf.execute()`), within its attempt: its timeout and panic catching.
    let parent = subhandlers::current().map(|sub| (sub, ctx.clone()));
    let call = (handler.func)(ctx);
    let call = async move {
        let value = call.await?;
        match parent {
            Some((sub, parent)) if !sub.executed() => parent.execute().await.map(|()| value),
            _ => Ok(value),
        }
    };
    let call = AssertUnwindSafe(call).catch_unwind();
    let result = match handler.timeout {
        Some(timeout) => tokio::time::timeout(timeout - runtime, call)
            .await
            .map_err(|_| {
                format!(
                    "{title} has timed out after {} (cancelled while running).",
                    seconds(timeout)
                )
            })?,
        None => call.await,
    };
    Ok(result.unwrap_or_else(|panic| Err(HandlerError::Panicked(panic_message(&panic)))))
}

/// What an attempt came to, and the line that says so.
struct Judged {
    outcome: Outcome,
    verdict: Verdict,
    text: String,
}

/// Kopf's reading of a handler's result: success, a temporary failure (retried after its delay
/// unless the next attempt would be one too many), a permanent one, or any other error per the
/// handler's [`ErrorsMode`].
fn judge(
    handler: &Invocation<'_>,
    title: &str,
    result: Result<serde_json::Value, HandlerError>,
    attempts: u32,
    runtime: Duration,
) -> Judged {
    // Would the next attempt, after `delay`, be one too many?
    let lookahead = |delay: Duration| -> Option<String> {
        if let Some(timeout) = handler.timeout.filter(|t| runtime + delay >= *t) {
            Some(format!("will time out after {} seconds", seconds(timeout)))
        } else {
            handler
                .retries
                .filter(|r| attempts + 1 >= *r)
                .map(|r| format!("will exceed {r} retries"))
        }
    };
    let judged = |outcome, verdict, text| Judged {
        outcome,
        verdict,
        text,
    };
    let retry = |message: String, delay: Duration| Outcome {
        final_: false,
        error: Some(message),
        delay: Some(delay),
        ..Outcome::default()
    };
    match result {
        Ok(value) => {
            let outcome = Outcome {
                final_: true,
                result: (!value.is_null()).then_some(value),
                ..Outcome::default()
            };
            judged(outcome, Verdict::Success, format!("{title} succeeded."))
        }
        Err(HandlerError::Temporary { message, delay }) => match lookahead(delay) {
            Some(limit) => {
                let text = format!("{title} failed temporarily but {limit}: {message}");
                judged(failed_for_good(text.clone()), Verdict::Timeout, text)
            }
            None => {
                let text = format!("{title} failed temporarily: {message}");
                judged(retry(message, delay), Verdict::Temporary, text)
            }
        },
        Err(HandlerError::ChildrenRetry { delay }) => {
            // Kopf's `HandlerChildrenRetry`: no look-ahead; the record's message is its text.
            let outcome = Outcome {
                final_: false,
                error: Some(CHILDREN_RETRY_MESSAGE.to_string()),
                delay: Some(delay),
                ..Outcome::default()
            };
            let text = format!("{title} has unfinished sub-handlers. Will retry soon.");
            judged(outcome, Verdict::Unfinished, text)
        }
        Err(HandlerError::Permanent(message)) => {
            let text = format!("{title} failed permanently: {message}");
            judged(failed_for_good(message), Verdict::Permanent, text)
        }
        Err(error) => {
            let message = error.to_string();
            let exception = format!("{title} failed with an exception and will");
            match handler.errors {
                ErrorsMode::Ignored => {
                    let outcome = Outcome {
                        final_: true,
                        ..Outcome::default()
                    };
                    let text = format!("{exception} ignore it: {message}");
                    judged(outcome, Verdict::Ignored, text)
                }
                ErrorsMode::Permanent => {
                    let text = format!("{exception} stop now: {message}");
                    judged(failed_for_good(message), Verdict::Permanent, text)
                }
                ErrorsMode::Temporary => match lookahead(handler.backoff) {
                    Some(limit) => {
                        let text = format!(
                            "{exception} stop now (it {limit} on the next attempt): {message}"
                        );
                        judged(failed_for_good(text.clone()), Verdict::Timeout, text)
                    }
                    None => {
                        let text = format!(
                            "{exception} try again in {} seconds: {message}",
                            seconds(handler.backoff)
                        );
                        judged(retry(message, handler.backoff), Verdict::Temporary, text)
                    }
                },
            }
        }
    }
}

fn failed_for_good(message: String) -> Outcome {
    Outcome {
        final_: true,
        error: Some(message),
        ..Outcome::default()
    }
}

/// Seconds as Kopf prints them (`60`, `1.5`).
fn seconds(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{secs:.0}")
    } else {
        format!("{secs}")
    }
}

/// The message of a caught panic.
pub fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intents::handlers::{handler_fn, Memo};
    use crate::structs::names::EventType;
    use crate::structs::resources::Resource;
    use serde_json::json;
    use std::sync::Arc;

    fn ctx() -> Ctx {
        // A client that is never used: the handlers below do not call the API.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        Ctx::new(
            EventType::Added,
            Arc::new(serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap()),
            Memo::default(),
            Arc::new(Resource::namespaced(
                "example.com",
                "v1",
                "Widget",
                "widgets",
            )),
            Arc::new(client),
            std::time::Instant::now(),
        )
    }

    fn invocation(func: &HandlerFn) -> Invocation<'_> {
        Invocation {
            id: "fn",
            func,
            errors: ErrorsMode::Temporary,
            backoff: Duration::from_secs(60),
            timeout: None,
            retries: None,
            post_events: false,
            resource: "widgets.v1.example.com",
            observer: &crate::clients::observe::NoObserver,
            active: true,
        }
    }

    #[tokio::test]
    async fn a_returned_value_is_the_result_and_null_is_none() {
        let func = handler_fn(|_| async { Ok(json!({"x": 1})) });
        let (outcome, verdict) = execute_once(&invocation(&func), ctx(), 0, Duration::ZERO).await;
        assert_eq!(verdict, Verdict::Success);
        assert_eq!(outcome.result, Some(json!({"x": 1})));
        let func = handler_fn(|_| async { Ok(()) });
        let (outcome, _) = execute_once(&invocation(&func), ctx(), 0, Duration::ZERO).await;
        assert!(outcome.final_ && outcome.result.is_none() && outcome.error.is_none());
    }

    #[tokio::test]
    async fn an_arbitrary_error_is_retried_after_the_backoff() {
        let func = handler_fn(|_| async { Err::<(), _>(HandlerError::msg("boom")) });
        let (outcome, verdict) = execute_once(&invocation(&func), ctx(), 0, Duration::ZERO).await;
        assert_eq!(verdict, Verdict::Temporary);
        assert_eq!(outcome.delay, Some(Duration::from_secs(60)));
        assert!(!outcome.final_);
    }

    #[tokio::test]
    async fn a_panic_is_an_error_of_the_handler() {
        let func = handler_fn(|_| async {
            if true {
                panic!("kaboom");
            }
            Ok(())
        });
        let mut inv = invocation(&func);
        inv.errors = ErrorsMode::Permanent;
        let (outcome, verdict) = execute_once(&inv, ctx(), 0, Duration::ZERO).await;
        assert_eq!(verdict, Verdict::Permanent);
        assert!(outcome.error.unwrap().contains("kaboom"));
    }

    #[tokio::test]
    async fn ignored_errors_finish_with_no_result() {
        let func = handler_fn(|_| async { Err::<(), _>(HandlerError::msg("boom")) });
        let mut inv = invocation(&func);
        inv.errors = ErrorsMode::Ignored;
        let (outcome, verdict) = execute_once(&inv, ctx(), 0, Duration::ZERO).await;
        assert_eq!(verdict, Verdict::Ignored);
        assert!(outcome.final_ && outcome.error.is_none());
    }

    #[tokio::test]
    async fn the_lookahead_makes_the_last_allowed_retry_final() {
        let func = handler_fn(|_| async {
            Err::<(), _>(HandlerError::temporary("later", Duration::from_secs(5)))
        });
        let mut inv = invocation(&func);
        inv.retries = Some(2);
        let (outcome, verdict) = execute_once(&inv, ctx(), 0, Duration::ZERO).await;
        assert_eq!(verdict, Verdict::Temporary);
        assert_eq!(outcome.delay, Some(Duration::from_secs(5)));
        let (outcome, verdict) = execute_once(&inv, ctx(), 1, Duration::ZERO).await;
        assert_eq!(verdict, Verdict::Timeout);
        assert!(outcome.final_);
        assert!(outcome.error.unwrap().contains("will exceed 2 retries"));
    }

    #[tokio::test]
    async fn exceeded_retries_fail_without_calling_the_handler() {
        let func = handler_fn(|_| async {
            if true {
                panic!("must not be called");
            }
            Ok(())
        });
        let mut inv = invocation(&func);
        inv.retries = Some(1);
        let (outcome, verdict) = execute_once(&inv, ctx(), 1, Duration::ZERO).await;
        assert_eq!(verdict, Verdict::Timeout);
        assert!(outcome.error.unwrap().contains("has exceeded 1 retries"));
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_running_past_the_timeout_is_cancelled() {
        let func = handler_fn(|_| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        });
        let mut inv = invocation(&func);
        inv.timeout = Some(Duration::from_secs(10));
        let (outcome, verdict) = execute_once(&inv, ctx(), 0, Duration::from_secs(4)).await;
        assert_eq!(verdict, Verdict::Timeout);
        assert!(outcome.final_);
        assert!(outcome.error.unwrap().contains("timed out"));
    }
    #[tokio::test]
    async fn unfinished_sub_handlers_are_neither_final_nor_a_failure() {
        let func = handler_fn(|_| async {
            Err::<(), _>(HandlerError::ChildrenRetry {
                delay: Duration::from_secs(5),
            })
        });
        let mut inv = invocation(&func);
        // No look-ahead: the parent's next attempt would be one too many, yet it is not final.
        inv.retries = Some(1);
        let (outcome, verdict) = execute_once(&inv, ctx(), 0, Duration::ZERO).await;
        assert_eq!(verdict, Verdict::Unfinished);
        assert!(!outcome.final_);
        assert_eq!(outcome.delay, Some(Duration::from_secs(5)));
        assert_eq!(
            outcome.error.as_deref(),
            Some("None"),
            "Kopf's stored message"
        );
    }

    #[tokio::test]
    async fn sub_handlers_outside_a_changing_handler_are_refused() {
        let ctx = ctx();
        ctx.subhandler("a", |_| async {
            if true {
                panic!("must not be called");
            }
            Ok(())
        });
        let error = ctx.execute().await.unwrap_err();
        assert!(
            error.to_string().contains("only inside changing handlers"),
            "{error}"
        );
    }
}
