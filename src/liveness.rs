//! Where health and metrics are served: the `--liveness` URL, as Kopf reads it.

use std::net::{SocketAddr, ToSocketAddrs};

use crate::error::{Error, Result};

/// A parsed `--liveness` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// Where to listen.
    pub addr: SocketAddr,
    /// The path that answers the liveness probe (besides `/healthz`).
    pub path: String,
}

/// Parses `http://HOST[:PORT][/PATH]` as Kopf does: http only, the host defaults to `localhost`
/// (`http://:8080/healthz`), the port to 80, the path to `/`.
pub(crate) fn endpoint(url: &str) -> Result<Endpoint> {
    let invalid = |reason: &str| Error::Liveness {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(invalid("no scheme"));
    };
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(invalid("only http is served (as in Kopf)"));
    }
    if rest.contains(['?', '#']) {
        return Err(invalid("a query or fragment cannot be served"));
    }
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.strip_prefix('[') {
        // [::1]:8080
        Some(bracketed) => {
            let Some((host, after)) = bracketed.split_once(']') else {
                return Err(invalid("an unclosed [ in the host"));
            };
            (host, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port = match port {
        Some(port) => port
            .parse::<u16>()
            .map_err(|_| invalid("the port is not a number from 0 to 65535"))?,
        None => 80,
    };
    let host = if host.is_empty() { "localhost" } else { host };
    let addr = (host, port)
        .to_socket_addrs()
        .map_err(|e| invalid(&format!("the host cannot be resolved ({e})")))?
        .next()
        .ok_or_else(|| invalid("the host resolves to no address"))?;
    Ok(Endpoint {
        addr,
        path: path.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kopfs_forms_are_understood() {
        let e = endpoint("http://0.0.0.0:8080/healthz").unwrap();
        assert_eq!(e.addr, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(e.path, "/healthz");
        let e = endpoint("http://127.0.0.1").unwrap();
        assert_eq!(e.addr, "127.0.0.1:80".parse().unwrap());
        assert_eq!(e.path, "/");
        let e = endpoint("http://[::1]:9000/live").unwrap();
        assert_eq!(e.addr, "[::1]:9000".parse().unwrap());
        assert_eq!(e.path, "/live");
        let e = endpoint("HTTP://localhost:8081/healthz").unwrap();
        assert!(e.addr.ip().is_loopback() && e.addr.port() == 8081);
    }

    #[test]
    fn what_cannot_be_served_is_refused_with_the_reason() {
        for (url, reason) in [
            ("https://0.0.0.0:8443/healthz", "only http"),
            ("0.0.0.0:8080/healthz", "no scheme"),
            ("http://0.0.0.0:99999/healthz", "the port"),
            ("http://0.0.0.0:8080/healthz?x=1", "a query"),
        ] {
            let error = endpoint(url).unwrap_err().to_string();
            assert!(error.contains(reason), "{url}: {error}");
            assert!(error.contains("http://0.0.0.0:8080/healthz"), "{error}");
        }
    }
}
