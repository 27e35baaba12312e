//! Optional TLS (rustls on aws-lc-rs) of the listeners and of the workers'
//! registry client.
//!
//! A [`ServerTls`] holds a PEM certificate chain and private key, checked
//! once at start-up; it configures the registry's gRPC listener
//! ([`ServerTls::grpc_config`]) and the HTTP listeners of registry and worker
//! ([`TlsListener`], served by `axum::serve`). [`client_tls`] configures the
//! worker's gRPC client for an `https://` registry.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::server::TlsStream;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// How long a client may take to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the HTTP server to accept them.
const ACCEPT_QUEUE: usize = 64;

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
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
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
            cert_pem: cert_pem.to_vec(),
            key_pem: key_pem.to_vec(),
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// The TLS configuration of a tonic server.
    pub fn grpc_config(&self) -> ServerTlsConfig {
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .timeout(HANDSHAKE_TIMEOUT)
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

/// A TCP listener whose connections are TLS handshaken before `axum::serve`
/// sees them. Handshakes run concurrently (a slow client does not hold up
/// the others) and are bounded by a timeout; failed ones are logged at debug
/// level and dropped.
pub struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: io::Result<SocketAddr>,
}

impl TlsListener {
    /// Starts accepting on `listener` (from the current tokio runtime); the
    /// accept task ends when the returned listener is dropped.
    pub fn new(listener: TcpListener, tls: &ServerTls) -> Self {
        let local_addr = listener.local_addr();
        let (sender, accepted) = mpsc::channel(ACCEPT_QUEUE);
        tokio::spawn(accept_loop(listener, tls.acceptor.clone(), sender));
        TlsListener {
            accepted,
            local_addr,
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    sender: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let accepted = tokio::select! {
            () = sender.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Typically out of file descriptors: back off instead of spinning.
                tracing::warn!(error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Small JSON answers: never wait for delayed ACKs.
        let _ = tcp.set_nodelay(true);
        let (acceptor, sender) = (acceptor.clone(), sender.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = sender.send((stream, peer)).await;
                }
                Ok(Err(err)) => tracing::debug!(%peer, error = %err, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accept task only ends once this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        match &self.local_addr {
            Ok(addr) => Ok(*addr),
            Err(err) => Err(io::Error::new(err.kind(), err.to_string())),
        }
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
