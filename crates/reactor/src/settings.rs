//! The operator's settings, grouped and defaulted as Kopf's `OperatorSettings` (`reference/kopf.md`
//! §1.19), with kactor's additions marked as such. Groups and fields arrive with the features that use
//! them (throttling, persistence, posting and peering come with their issues).

use std::time::Duration;

/// All settings. `Settings::default()` is Kopf's defaults.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    /// How watch streams are run.
    pub watching: Watching,
    /// Per-object workers.
    pub queueing: Queueing,
    /// API requests.
    pub networking: Networking,
    /// Handler execution.
    pub execution: Execution,
    /// The process as a whole.
    pub process: Process,
}

/// `settings.watching`.
#[derive(Debug, Clone, PartialEq)]
pub struct Watching {
    /// `timeoutSeconds` asked of the server for each watch request; None: the server's choice
    /// (as in Kopf). The stream is then simply reopened from the last resourceVersion.
    pub server_timeout: Option<Duration>,
    /// The pause between two watch requests of one stream (Kopf: 0.1 s).
    pub reconnect_backoff: Duration,
    /// A stream with no event and no bookmark for this long is considered dead and reopened
    /// (Kopf: 70 s; the API server sends bookmarks about every minute).
    pub inactivity_timeout: Duration,
    /// Objects per page of the initial listing (kactor; 0: no pagination). 500 as in client-go's
    /// reflector.
    pub list_page_size: u32,
}

impl Default for Watching {
    fn default() -> Self {
        Watching {
            server_timeout: None,
            reconnect_backoff: Duration::from_millis(100),
            inactivity_timeout: Duration::from_secs(70),
            list_page_size: 500,
        }
    }
}

/// `settings.queueing`.
#[derive(Debug, Clone, PartialEq)]
pub struct Queueing {
    /// An object's worker stops after this long without events (Kopf: 5 s); the object's memory stays.
    pub idle_timeout: Duration,
    /// At exit, how long running handlers may take to finish before they are cancelled (Kopf: 2 s).
    pub exit_timeout: Duration,
}

impl Default for Queueing {
    fn default() -> Self {
        Queueing {
            idle_timeout: Duration::from_secs(5),
            exit_timeout: Duration::from_secs(2),
        }
    }
}

/// `settings.networking`.
#[derive(Debug, Clone, PartialEq)]
pub struct Networking {
    /// The delays between retries of a failing API request (5xx, 429, 403 during upgrades); when
    /// they run out, the failure is reported (Kopf: 1, 1, 2, 3, 5, 8, 13, 21 s).
    pub error_backoffs: Vec<Duration>,
}

impl Default for Networking {
    fn default() -> Self {
        Networking {
            error_backoffs: [1, 1, 2, 3, 5, 8, 13, 21]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
        }
    }
}

/// `settings.execution`.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    /// At most this many handlers run at once in the whole operator (kactor; Kopf has no limit). It
    /// protects the process and the API server when thousands of objects are listed at startup.
    pub max_concurrent_handlers: usize,
}

impl Default for Execution {
    fn default() -> Self {
        Execution {
            max_concurrent_handlers: 256,
        }
    }
}

/// `settings.process`.
#[derive(Debug, Clone, PartialEq)]
pub struct Process {
    /// After a stop signal, the longest the operator takes to exit before it gives up waiting (Kopf: 600 s).
    pub ultimate_exiting_timeout: Duration,
}

impl Default for Process {
    fn default() -> Self {
        Process {
            ultimate_exiting_timeout: Duration::from_secs(600),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kopfs() {
        let settings = Settings::default();
        assert_eq!(
            settings.watching.inactivity_timeout,
            Duration::from_secs(70)
        );
        assert_eq!(
            settings.watching.reconnect_backoff,
            Duration::from_millis(100)
        );
        assert_eq!(settings.queueing.idle_timeout, Duration::from_secs(5));
        assert_eq!(settings.queueing.exit_timeout, Duration::from_secs(2));
        assert_eq!(settings.networking.error_backoffs.len(), 8);
        assert_eq!(
            settings.process.ultimate_exiting_timeout,
            Duration::from_secs(600)
        );
    }
}
