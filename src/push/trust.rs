//! Which certificates a push receiver (`https://`, `grpcs://`) may present: one chaining to the
//! public web roots (compiled in, as webpki-roots ships them; the host's store is not read), or
//! to a CA the operator names with `--push-ca` (a PEM file), for receivers with private
//! certificates. Read once at start; a file that holds no certificate is refused then, not at
//! the first push.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::{Error, Result};

/// The roots push connections trust.
#[derive(Clone, Default)]
pub struct Trust {
    /// The operator's CAs, as PEM (tonic takes them so) and parsed (rustls takes them so).
    pem: Option<Arc<Vec<u8>>>,
    extra: Vec<CertificateDer<'static>>,
}

impl Trust {
    /// The web roots, and the CAs in `ca` if given.
    pub fn load(ca: Option<&Path>) -> Result<Trust> {
        let Some(path) = ca else {
            return Ok(Trust::default());
        };
        let bad =
            |why: String| Error::InvalidArgument(format!("--push-ca {}: {why}", path.display()));
        let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let extra = CertificateDer::pem_slice_iter(&pem)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| bad(format!("not PEM certificates: {e}")))?;
        if extra.is_empty() {
            return Err(bad("holds no certificate".into()));
        }
        Ok(Trust {
            pem: Some(Arc::new(pem)),
            extra,
        })
    }

    /// The operator's CAs as PEM, if any.
    pub fn pem(&self) -> Option<&[u8]> {
        self.pem.as_deref().map(Vec::as_slice)
    }

    /// A TLS client configuration trusting the web roots and the operator's CAs.
    pub fn client_config(&self) -> Result<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for cert in &self.extra {
            roots.add(cert.clone()).map_err(|e| {
                Error::InvalidArgument(format!("--push-ca: a certificate is not a CA: {e}"))
            })?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Ok(rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Internal(format!("TLS for push: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth())
    }
}
