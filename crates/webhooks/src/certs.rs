//! The webhook server's certificate: made (self-signed) when none is given, or read from files and
//! read again whenever they change on disk, without a restart (what cert-manager's rotation or a
//! mounted Secret's update needs).
//!
//! **Guarantees**: a handshake always gets the newest certificate that was read whole and valid; a
//! half-written or broken file is logged and the previous certificate stays. The CA bundle (what
//! the webhook configurations' `caBundle` carries) changes with it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// Why a certificate cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM of the kind expected.
    #[error("{path} holds no {what} in PEM")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was looked for.
        what: &'static str,
    },
    /// The key does not fit rustls (an unsupported algorithm).
    #[error("the private key cannot be used: {0}")]
    Key(String),
    /// Making a self-signed certificate failed.
    #[error("cannot make a self-signed certificate: {0}")]
    Generate(String),
}

/// A certificate with its key, and the CA bundle (PEM) that verifies it.
pub struct Loaded {
    key: Arc<CertifiedKey>,
    ca_pem: Vec<u8>,
}

/// A self-signed certificate valid for `names` (DNS names; addresses become IP SANs): its own CA.
pub fn self_signed(names: &[String]) -> Result<Loaded, CertError> {
    let generated = rcgen::generate_simple_self_signed(names.to_vec())
        .map_err(|e| CertError::Generate(e.to_string()))?;
    let cert_pem = generated.cert.pem();
    let key_der = PrivateKeyDer::try_from(generated.signing_key.serialize_der())
        .map_err(|e| CertError::Key(e.to_string()))?;
    let chain = vec![generated.cert.der().clone()];
    Ok(Loaded {
        key: certified(chain, &key_der)?,
        ca_pem: cert_pem.into_bytes(),
    })
}

/// The certificate chain and key in these PEM files; the CA bundle from `cafile`, else the chain's
/// last certificate.
pub fn from_files(
    certfile: &Path,
    pkeyfile: &Path,
    cafile: Option<&Path>,
) -> Result<Loaded, CertError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| CertError::Read {
            path: path.to_path_buf(),
            source,
        })
    };
    let cert_pem = read(certfile)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .filter_map(Result::ok)
        .collect();
    if chain.is_empty() {
        return Err(CertError::Pem {
            path: certfile.to_path_buf(),
            what: "certificate",
        });
    }
    let key_pem = read(pkeyfile)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| CertError::Pem {
        path: pkeyfile.to_path_buf(),
        what: "private key",
    })?;
    let ca_pem = match cafile {
        Some(cafile) => read(cafile)?,
        None => {
            let last = chain
                .last()
                .map(|c| c.as_ref().to_vec())
                .unwrap_or_default();
            pem_of("CERTIFICATE", &last).into_bytes()
        }
    };
    Ok(Loaded {
        key: certified(chain, &key)?,
        ca_pem,
    })
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: &PrivateKeyDer<'_>,
) -> Result<Arc<CertifiedKey>, CertError> {
    let signing = rustls::crypto::ring::sign::any_supported_type(key)
        .map_err(|e| CertError::Key(e.to_string()))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

fn pem_of(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = format!("-----BEGIN {label}-----\n");
    for line in text.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str(&format!("-----END {label}-----\n"));
    pem
}

/// The certificate handshakes get, replaced when the files change.
#[derive(Clone)]
pub struct Certs {
    current: Arc<RwLock<Arc<Loaded>>>,
}

impl std::fmt::Debug for Certs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Certs")
    }
}

impl Certs {
    /// Serves `loaded`.
    pub fn new(loaded: Loaded) -> Self {
        Certs {
            current: Arc::new(RwLock::new(Arc::new(loaded))),
        }
    }

    /// The CA bundle (PEM) that verifies the certificate served now.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.get().ca_pem.clone()
    }

    fn get(&self) -> Arc<Loaded> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set(&self, loaded: Loaded) {
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(loaded);
    }

    /// Checks the files every `interval` and serves what they hold once they changed (their
    /// modification times or sizes) and read whole; `changed` is told of each new CA bundle.
    /// Runs until the task is aborted.
    pub async fn follow(
        self,
        certfile: PathBuf,
        pkeyfile: PathBuf,
        cafile: Option<PathBuf>,
        interval: Duration,
        changed: impl Fn(Vec<u8>) + Send + 'static,
    ) {
        let stamp = |paths: &[Option<&Path>]| -> Vec<Option<(SystemTime, u64)>> {
            paths
                .iter()
                .map(|path| {
                    let meta = std::fs::metadata((*path)?).ok()?;
                    Some((meta.modified().ok()?, meta.len()))
                })
                .collect()
        };
        let paths = [
            Some(certfile.as_path()),
            Some(pkeyfile.as_path()),
            cafile.as_deref(),
        ];
        let mut seen = stamp(&paths);
        let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(10)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let now = stamp(&paths);
            if now == seen {
                continue;
            }
            match from_files(&certfile, &pkeyfile, cafile.as_deref()) {
                Ok(loaded) => {
                    seen = now;
                    let ca = loaded.ca_pem.clone();
                    let ca_changed = ca != self.ca_pem();
                    self.set(loaded);
                    tracing::info!(cert = %certfile.display(), "The webhook server's certificate changed on disk; serving the new one.");
                    if ca_changed {
                        changed(ca);
                    }
                }
                // Maybe half-written: tried again at the next check (the stamp is not taken).
                Err(error) => {
                    tracing::warn!(%error, "The webhook server's certificate files changed but cannot be used (yet); serving the previous one.");
                }
            }
        }
    }
}

impl ResolvesServerCert for Certs {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get().key.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_is_its_own_ca_bundle() {
        let loaded = self_signed(&["localhost".into(), "127.0.0.1".into()]).unwrap();
        let text = String::from_utf8(loaded.ca_pem.clone()).unwrap();
        assert!(text.starts_with("-----BEGIN CERTIFICATE-----"), "{text}");
        let served = loaded.key.cert[0].as_ref().to_vec();
        let bundled = CertificateDer::from_pem_slice(&loaded.ca_pem).unwrap();
        assert_eq!(bundled.as_ref(), served.as_slice());
    }

    #[test]
    fn files_are_read_and_garbage_is_refused_with_the_file_named() {
        let dir = std::env::temp_dir().join(format!("kactor-certs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, generated.cert.pem()).unwrap();
        std::fs::write(&key, generated.signing_key.serialize_pem()).unwrap();
        let loaded = from_files(&cert, &key, None).unwrap();
        assert_eq!(loaded.ca_pem, generated.cert.pem().into_bytes());
        std::fs::write(&key, "not a key").unwrap();
        let error = from_files(&cert, &key, None).err().unwrap().to_string();
        assert!(
            error.contains("tls.key") && error.contains("private key"),
            "{error}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
