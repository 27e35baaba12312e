//! Optional TLS (rustls on aws-lc-rs) of the listeners and of the workers'
//! registry client.
//!
//! A [`ServerTls`] holds a PEM certificate chain and private key, checked
//! once at start-up; its [`ServerTls::acceptor`] handshakes the connections
//! of the registry's and the worker's listeners (`quiver-listen`, which
//! bounds handshakes like any other connection). [`client_tls`] configures
//! the worker's gRPC client for an `https://` registry.

use std::sync::Arc;

use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig};

/// A certificate or key that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate PEM holds no usable certificate.
    #[error("no PEM certificate found")]
    NoCertificate,
    /// The certificate PEM is malformed.
    #[error("invalid PEM certificate: {0}")]
    Certificate(String),
    /// The key PEM holds no usable private key.
    #[error("invalid PEM private key: {0}")]
    Key(String),
    /// The key does not belong to the certificate, or rustls refuses the pair.
    #[error("certificate and key cannot be used together: {0}")]
    Pair(String),
    /// A CA PEM holds no usable certificate.
    #[error("no PEM CA certificate found")]
    NoCa,
}

/// A server certificate chain and key, validated.
#[derive(Clone)]
pub struct ServerTls {
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    // The key must not end up in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Parses and checks a PEM certificate chain (leaf first) and its PEM
    /// private key (PKCS#8, PKCS#1 or SEC1).
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        let chain = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| TlsError::Certificate(err.to_string()))?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate);
        }
        let key =
            PrivateKeyDer::from_pem_slice(key_pem).map_err(|err| TlsError::Key(err.to_string()))?;
        let mut config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|err| TlsError::Pair(err.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// The acceptor of server connections (ALPN: `h2`, `http/1.1`).
    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }
}

/// The TLS configuration of a gRPC client: trusts `ca_pem` (PEM CA
/// certificates) when given, the system roots otherwise.
pub fn client_tls(ca_pem: Option<&[u8]>) -> Result<ClientTlsConfig, TlsError> {
    let config = ClientTlsConfig::new();
    match ca_pem {
        Some(pem) => {
            let count = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|err| TlsError::Certificate(err.to_string()))?
                .len();
            if count == 0 {
                return Err(TlsError::NoCa);
            }
            Ok(config.ca_certificate(Certificate::from_pem(pem)))
        }
        None => Ok(config.with_native_roots()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_garbage() {
        assert!(matches!(
            ServerTls::from_pem(b"", b""),
            Err(TlsError::NoCertificate)
        ));
        assert!(matches!(client_tls(Some(b"nothing")), Err(TlsError::NoCa)));
    }
}
