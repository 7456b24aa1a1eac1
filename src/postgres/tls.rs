//! TLS for both PostgreSQL connections (control plane and replication).
//!
//! libpq semantics, which operators already know: the URL's `sslmode` decides whether TLS is
//! used (`disable`, `prefer` — the default — or `require`). Without `postgres.sslrootcert` the
//! channel is encrypted but the server is not authenticated (libpq's `require`); with it, the
//! certificate chain and host name are verified against that CA (libpq's `verify-full`).

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read CA certificates from {path}: {source}. Point postgres.sslrootcert at a PEM file")]
    CaFile {
        path: String,
        #[source]
        source: CaFileError,
    },
    #[error("TLS setup failed: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("invalid TLS server name {host:?}: {source}")]
    ServerName {
        host: String,
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
}

/// Why the CA file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CaFileError {
    #[error(transparent)]
    Pem(#[from] rustls::pki_types::pem::Error),
    #[error(transparent)]
    Certificate(#[from] rustls::Error),
    #[error("no certificate found in the file")]
    Empty,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the client TLS configuration (see module docs for the verification rules).
pub(crate) fn client_config(sslrootcert: Option<&Path>) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let config = match sslrootcert {
        Some(path) => {
            let ca_err = |source: CaFileError| TlsError::CaFile {
                path: path.display().to_string(),
                source,
            };
            let mut roots = RootCertStore::empty();
            let certs = CertificateDer::pem_file_iter(path).map_err(|e| ca_err(e.into()))?;
            for cert in certs {
                roots
                    .add(cert.map_err(|e| ca_err(e.into()))?)
                    .map_err(|e| ca_err(e.into()))?;
            }
            if roots.is_empty() {
                return Err(ca_err(CaFileError::Empty));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider())))
            .with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The server name to present (SNI) and verify, from a host string.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(host.to_owned()).map_err(|source| TlsError::ServerName {
        host: host.to_owned(),
        source,
    })
}

/// Accepts any certificate but still checks the handshake signatures, i.e. `sslmode=require`.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn ca_file_errors_keep_their_typed_cause() {
        let err = client_config(Some(Path::new("/nonexistent/ca.pem"))).unwrap_err();
        assert!(
            matches!(
                &err,
                TlsError::CaFile {
                    source: CaFileError::Pem(_),
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.source().is_some_and(|s| s.is::<CaFileError>()), "{err:?}");
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");

        let err = server_name("not a host name").unwrap_err();
        assert!(matches!(&err, TlsError::ServerName { .. }), "{err:?}");
        assert!(err.source().is_some(), "{err:?}");
    }
}
