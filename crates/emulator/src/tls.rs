//! HTTPS for the emulator ([`EmulatorBuilder::tls`](crate::EmulatorBuilder::tls)): a self-signed
//! certificate for 127.0.0.1 and `localhost`, made at start, which the emulator's clients and its
//! kubeconfig trust. kubectl (client-go) sends bearer tokens only over TLS, so the RBAC mode needs it
//! for kubectl to be anyone but `system:anonymous`.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::Error;

/// The emulator's certificate: the TLS acceptor that serves it, and the PEM clients verify it with.
#[derive(Clone)]
pub(crate) struct Tls {
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
    pub(crate) ca_pem: String,
    pub(crate) ca_der: CertificateDer<'static>,
}

impl Tls {
    /// A fresh self-signed certificate for 127.0.0.1, `localhost` and the address listened on.
    pub(crate) fn self_signed(addr: SocketAddr) -> Result<Tls, Error> {
        let tls_error = |what: &str, e: &dyn std::fmt::Display| Error::Tls(format!("{what}: {e}"));
        let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let ip = addr.ip();
        if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
            names.push(ip.to_string());
        }
        let generated = rcgen::generate_simple_self_signed(names)
            .map_err(|e| tls_error("generating the certificate", &e))?;
        let key = PrivateKeyDer::try_from(generated.signing_key.serialize_der())
            .map_err(|e| tls_error("reading the generated key", &e))?;
        let ca_der = generated.cert.der().clone();
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error("the TLS versions", &e))?
        .with_no_client_auth()
        .with_single_cert(vec![ca_der.clone()], key)
        .map_err(|e| tls_error("the certificate", &e))?;
        // The server speaks HTTP/1.1 only; clients offering h2 fall back to it.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            ca_pem: generated.cert.pem(),
            ca_der,
        })
    }
}
