//! Retrying API requests the way Kopf does (`reference/kopf.md` §1.6): a failed request is tried again
//! after each of `settings.networking.error_backoffs` in turn, and only the failures that can pass by
//! themselves are retried.
//!
//! **Retried**: connection errors and timeouts, HTTP 5xx, 403 (API servers answer it for a while during
//! upgrades) and 429 (the server's `status.details.retryAfterSeconds` is then the shortest wait).
//!
//! **Returned at once**: every other 4xx (400, 401, 404, 409, 410, 422, ...), and errors of our own
//! making (a body that does not deserialize, a request that cannot be built, TLS or auth setup).
//!
//! **Caveats**:
//! * kube 5 turns an error response into a [`kube::core::Status`] and drops the headers, so the
//!   `Retry-After` header is not seen; the API server sends the same number in
//!   `details.retryAfterSeconds`, which is used.
//! * kube's default [`kube::Client`] retries 429, 503 and 504 by itself before the error reaches this
//!   module (`kube::Config::default_retry`); with both layers, the waits add up.
//! * Kopf re-authenticates on 401; kactor does not yet, so 401 is returned at once.

use std::future::Future;
use std::time::Duration;

/// Runs `call` until it succeeds or fails in a way that retrying cannot help.
///
/// A retriable failure (see [`is_retriable`]) is retried after the next of `backoffs`, or after the
/// server's `retryAfterSeconds` of a 429 if that is longer, so there are at most `backoffs.len() + 1`
/// attempts. Every retry is logged at warn with what failed and the wait; when the backoffs run out,
/// the last error is logged at error and returned, as in Kopf. Any other failure is returned at once.
///
/// `what` names the request in the logs (Kopf's style: `POST /api/v1/namespaces/default/events`).
///
/// ```no_run
/// # async fn example(client: kube::Client) -> Result<(), kube::Error> {
/// use std::time::Duration;
/// use kube::api::{Api, DynamicObject};
/// use kube::discovery::ApiResource;
/// use kactor_reactor::api::retrying;
///
/// let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
/// let configmaps: Api<DynamicObject> = Api::namespaced_with(client, "default", &resource);
/// let backoffs = [1, 1, 2, 3, 5, 8, 13, 21].map(Duration::from_secs);
/// let settings = retrying(&backoffs, "GET configmaps/settings", || configmaps.get("settings")).await?;
/// # Ok(())
/// # }
/// ```
pub async fn retrying<T, F, Fut>(
    backoffs: &[Duration],
    what: &str,
    mut call: F,
) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let attempts = backoffs.len() + 1;
    let mut backoffs = backoffs.iter().copied();
    let mut attempt = 1;
    loop {
        if attempt > 1 {
            tracing::debug!(
                request = what,
                "Request attempt #{attempt}/{attempts}: {what}"
            );
        }
        let error = match call().await {
            Ok(value) => {
                if attempt > 1 {
                    tracing::debug!(
                        request = what,
                        "Request attempt #{attempt}/{attempts} succeeded: {what}"
                    );
                }
                return Ok(value);
            }
            Err(error) if !is_retriable(&error) => return Err(error),
            Err(error) => error,
        };
        let Some(backoff) = backoffs.next() else {
            tracing::error!(
                request = what,
                %error,
                "Request attempt #{attempt}/{attempts} failed; escalating: {what} -> {error}"
            );
            return Err(error);
        };
        // As in Kopf (`enforce_retry_after=False`): the server's wish is the least we wait.
        let delay = match retry_after(&error) {
            Some(retry_after) if retry_after > backoff => {
                tracing::debug!(
                    request = what,
                    ?backoff,
                    ?retry_after,
                    "Overriding the backoff {backoff:?} with the retry-after {retry_after:?} from the server: {what}"
                );
                retry_after
            }
            _ => backoff,
        };
        tracing::warn!(
            request = what,
            %error,
            ?delay,
            "Request attempt #{attempt}/{attempts} failed; will retry in {delay:?}: {what} -> {error}"
        );
        tokio::time::sleep(delay).await;
        attempt += 1;
    }
}

/// Whether a failed request may succeed if tried again: connection errors, timeouts, HTTP 5xx, 403 and
/// 429 (as in Kopf).
///
/// An error status whose body named no code (a proxy's JSON that is not a `Status`) is counted as
/// retriable: kube keeps no HTTP status for it, and such answers mostly come from gateways in trouble.
pub fn is_retriable(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 0 | 403 | 429 | 500..=599),
        // hyper's errors: the connection was refused, reset or closed mid-response.
        kube::Error::HyperError(_) => true,
        // The transport stack's errors: connecting, timeouts, a broken body.
        kube::Error::Service(_) => true,
        kube::Error::ReadEvents(_) => true,
        _ => false,
    }
}

/// The server's `status.details.retryAfterSeconds` of a 429 answer, if it sent one.
pub fn retry_after(error: &kube::Error) -> Option<Duration> {
    match error {
        kube::Error::Api(status) if status.code == 429 => status
            .details
            .as_ref()
            .map(|details| details.retry_after_seconds)
            .filter(|seconds| *seconds > 0)
            .map(|seconds| Duration::from_secs(u64::from(seconds))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use kube::core::response::StatusDetails;
    use kube::core::Status;
    use tokio::time::Instant;

    use super::*;

    const BACKOFFS: [Duration; 3] = [
        Duration::from_secs(1),
        Duration::from_secs(2),
        Duration::from_secs(3),
    ];

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(
            Status::failure("injected", "Injected")
                .with_code(code)
                .boxed(),
        )
    }

    fn too_many_requests(retry_after_seconds: u32) -> kube::Error {
        let mut status = Status::failure("slow down", "TooManyRequests").with_code(429);
        status.details = Some(StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: String::new(),
            uid: String::new(),
            causes: Vec::new(),
            retry_after_seconds,
        });
        kube::Error::Api(status.boxed())
    }

    fn connection_refused() -> kube::Error {
        kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        )))
    }

    fn code_of(error: &kube::Error) -> Option<u16> {
        match error {
            kube::Error::Api(status) => Some(status.code),
            _ => None,
        }
    }

    /// Runs `retrying` over a script of failures (then success), returning the result, the number of
    /// calls made and the (paused) time it took.
    async fn run(
        backoffs: &[Duration],
        mut failures: Vec<kube::Error>,
    ) -> (Result<&'static str, kube::Error>, usize, Duration) {
        failures.reverse();
        let calls = AtomicUsize::new(0);
        let failures = std::sync::Mutex::new(failures);
        let started = Instant::now();
        let result = retrying(backoffs, "GET /test", || {
            calls.fetch_add(1, Ordering::SeqCst);
            let next = failures.lock().unwrap().pop();
            async move {
                match next {
                    Some(error) => Err(error),
                    None => Ok("done"),
                }
            }
        })
        .await;
        (result, calls.into_inner(), started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn returns_the_value_at_once_when_the_call_succeeds() {
        let (result, calls, elapsed) = run(&BACKOFFS, vec![]).await;
        assert_eq!(result.unwrap(), "done");
        assert_eq!(calls, 1);
        assert_eq!(elapsed, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_5xx_after_each_backoff_in_turn() {
        let (result, calls, elapsed) = run(&BACKOFFS, vec![status(500), status(503)]).await;
        assert_eq!(result.unwrap(), "done");
        assert_eq!(calls, 3);
        assert_eq!(elapsed, Duration::from_secs(1 + 2));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_403_as_during_upgrades() {
        let (result, calls, elapsed) = run(&BACKOFFS, vec![status(403)]).await;
        assert_eq!(result.unwrap(), "done");
        assert_eq!(calls, 2);
        assert_eq!(elapsed, Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_connection_errors() {
        let (result, calls, _) = run(&BACKOFFS, vec![connection_refused()]).await;
        assert_eq!(result.unwrap(), "done");
        assert_eq!(calls, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_429_after_the_servers_retry_after() {
        let (result, calls, elapsed) = run(&BACKOFFS, vec![too_many_requests(7)]).await;
        assert_eq!(result.unwrap(), "done");
        assert_eq!(calls, 2);
        assert_eq!(elapsed, Duration::from_secs(7));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_429_after_the_backoff_when_it_is_longer_than_retry_after() {
        let backoffs = [Duration::from_secs(10)];
        let (result, _, elapsed) = run(&backoffs, vec![too_many_requests(2)]).await;
        assert_eq!(result.unwrap(), "done");
        assert_eq!(elapsed, Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_429_without_retry_after_after_the_backoff() {
        let (result, _, elapsed) = run(&BACKOFFS, vec![status(429)]).await;
        assert_eq!(result.unwrap(), "done");
        assert_eq!(elapsed, Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn returns_404_at_once() {
        let (result, calls, elapsed) = run(&BACKOFFS, vec![status(404)]).await;
        assert_eq!(code_of(&result.unwrap_err()), Some(404));
        assert_eq!(calls, 1);
        assert_eq!(elapsed, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn returns_other_4xx_at_once() {
        for code in [400, 401, 409, 410, 422] {
            let (result, calls, _) = run(&BACKOFFS, vec![status(code)]).await;
            assert_eq!(code_of(&result.unwrap_err()), Some(code));
            assert_eq!(calls, 1, "{code} is not retried");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn returns_errors_of_our_own_making_at_once() {
        let broken = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let (result, calls, _) = run(&BACKOFFS, vec![kube::Error::SerdeError(broken)]).await;
        assert!(matches!(result, Err(kube::Error::SerdeError(_))));
        assert_eq!(calls, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_the_last_backoff() {
        let failures = vec![
            status(500),
            status(502),
            status(503),
            status(504),
            status(500),
        ];
        let (result, calls, elapsed) = run(&BACKOFFS, failures).await;
        assert_eq!(code_of(&result.unwrap_err()), Some(504), "the last error");
        assert_eq!(calls, 4);
        assert_eq!(elapsed, Duration::from_secs(1 + 2 + 3));
    }

    #[tokio::test(start_paused = true)]
    async fn tries_once_without_backoffs() {
        let (result, calls, _) = run(&[], vec![status(503)]).await;
        assert_eq!(code_of(&result.unwrap_err()), Some(503));
        assert_eq!(calls, 1);
    }

    #[test]
    fn counts_a_status_without_a_code_as_retriable() {
        assert!(is_retriable(&status(0)));
    }
}
