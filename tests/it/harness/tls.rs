//! Throwaway TLS material: a CA and a server certificate for 127.0.0.1/localhost, plus a
//! rustls client config that trusts only that CA.
//!
//! A separate CA (rather than one self-signed leaf) makes `ca_cert_path()` a real root,
//! which is what `sslrootcert`/`sslmode=verify-full` style configs expect.

use std::path::Path;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use tokio_postgres_rustls::MakeRustlsConnect;

/// PEM texts of a freshly generated CA and a server certificate/key signed by it.
pub struct ServerTls {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

pub fn generate_server_tls() -> ServerTls {
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "outbox-relay test CA");
    let ca = ca_params.self_signed(&ca_key).expect("self-sign ca");

    let key = KeyPair::generate().expect("server key");
    // rcgen turns the IP string into an IP SAN, which rustls checks for 127.0.0.1.
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).expect("server params");
    params.distinguished_name.push(DnType::CommonName, "127.0.0.1");
    let cert = params.signed_by(&key, &ca, &ca_key).expect("sign server cert");

    ServerTls {
        ca_pem: ca.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// A rustls client config trusting only the CA in `ca_pem_path`. Uses the ring provider
/// explicitly so no process-wide default provider has to be installed.
pub fn client_config(ca_pem_path: &Path) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_pem_path).expect("read CA pem") {
        roots.add(cert.expect("parse CA pem")).expect("add CA root");
    }
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

/// A tokio-postgres TLS connector trusting only the CA in `ca_pem_path`.
pub fn pg_connector(ca_pem_path: &Path) -> MakeRustlsConnect {
    MakeRustlsConnect::new(client_config(ca_pem_path))
}
