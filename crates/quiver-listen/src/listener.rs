//! Accepting connections and driving each one under the table's bounds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tokio_util::sync::CancellationToken;

use crate::connections::{Admitted, Connections};
use crate::options::ListenerOptions;
use crate::tracked::Tracked;

/// How long accepting pauses after a failure such as running out of
/// descriptors (the pending connection stays in the kernel's backlog).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// How often at most a failing accept is reported in the log.
const ACCEPT_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// A bound TCP listener served under a process's [`Connections`] bounds.
pub struct Listener {
    name: &'static str,
    tcp: TcpListener,
    connections: Connections,
    tls: Option<TlsAcceptor>,
    http2_only: bool,
}

impl Listener {
    /// Serves `tcp` as `name` (the `listener` label of the
    /// `http_connections_*` metrics), plaintext, HTTP/1.1 and HTTP/2.
    pub fn new(name: &'static str, tcp: TcpListener, connections: &Connections) -> Self {
        Listener {
            name,
            tcp,
            connections: connections.clone(),
            tls: None,
            http2_only: false,
        }
    }

    /// Handshakes TLS with `acceptor` first (when given); the handshake
    /// counts against the header-read timeout and the cap.
    pub fn with_tls(mut self, acceptor: Option<TlsAcceptor>) -> Self {
        self.tls = acceptor;
        self
    }

    /// Speaks HTTP/2 only (gRPC): anything else is closed at once.
    pub fn http2_only(mut self) -> Self {
        self.http2_only = true;
        self
    }

    /// Serves `router` until `shutdown` is cancelled, then stops accepting,
    /// asks every connection to finish (HTTP/2 GOAWAY, HTTP/1 closes once
    /// its response is sent) and returns when all have closed. The caller
    /// bounds that drain (dropping this future closes what is left).
    pub async fn serve(self, router: Router, shutdown: CancellationToken) {
        let builder = Arc::new(builder(self.connections.options(), self.http2_only));
        let mut tasks = JoinSet::new();
        let mut last_accept_warning: Option<Instant> = None;
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                // A finished task keeps its memory until joined: join it
                // now, not at the next accept (which may be long after a
                // flood).
                Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
                accepted = self.tcp.accept() => accepted,
            };
            let tcp = match accepted {
                Ok((tcp, _peer)) => tcp,
                Err(err) => {
                    if last_accept_warning.is_none_or(|at| at.elapsed() >= ACCEPT_WARNING_INTERVAL)
                    {
                        tracing::warn!(listener = self.name, error = %err, "accept failed; retrying");
                        last_accept_warning = Some(Instant::now());
                    }
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            };
            // Refused at the cap: dropping the stream closes it.
            let Some(admitted) = self.connections.admit(self.name) else {
                continue;
            };
            // Small answers and gRPC messages: never wait for delayed ACKs.
            let _ = tcp.set_nodelay(true);
            tasks.spawn(drive(
                self.name,
                tcp,
                self.tls.clone(),
                builder.clone(),
                router.clone(),
                admitted,
                shutdown.clone(),
            ));
        }
        drop(self.tcp);
        while tasks.join_next().await.is_some() {}
    }
}

/// The protocol driver of every connection of a listener.
fn builder(options: &ListenerOptions, http2_only: bool) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    // hyper's own HTTP/1 header-read timer is left off: it would also close
    // idle keep-alive connections at the header deadline, and it covers
    // neither TLS nor HTTP/2. `Connection::closed` bounds both phases for
    // every protocol instead.
    builder.http1().header_read_timeout(None);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(options.http2_keepalive_interval)
        .keep_alive_timeout(options.http2_keepalive_timeout);
    if http2_only {
        builder = builder.http2_only();
    }
    builder
}

/// Serves one connection until it ends, the listener closes it (evicted,
/// timed out) or, after shutdown, its last request is answered.
async fn drive(
    listener: &'static str,
    tcp: TcpStream,
    tls: Option<TlsAcceptor>,
    builder: Arc<Builder<TokioExecutor>>,
    router: Router,
    admitted: Admitted,
    shutdown: CancellationToken,
) {
    let connection = admitted.connection().clone();
    let closed = connection.closed(admitted.options());
    tokio::pin!(closed);
    let io = match tls {
        None => Either::Left(tcp),
        Some(acceptor) => tokio::select! {
            handshake = acceptor.accept(tcp) => match handshake {
                Ok(stream) => Either::Right(stream),
                Err(err) => {
                    tracing::debug!(listener, error = %err, "tls handshake failed");
                    return;
                }
            },
            reason = &mut closed => {
                reason.count(listener);
                return;
            }
            () = shutdown.cancelled() => return,
        },
    };
    let serving = builder
        .serve_connection_with_upgrades(TokioIo::new(io), Tracked::new(router, connection.clone()));
    tokio::pin!(serving);
    let mut draining = false;
    loop {
        tokio::select! {
            served = serving.as_mut() => {
                if let Err(err) = served {
                    tracing::debug!(listener, error = %err, "connection ended with an error");
                }
                return;
            }
            reason = &mut closed => {
                reason.count(listener);
                return;
            }
            () = shutdown.cancelled(), if !draining => {
                serving.as_mut().graceful_shutdown();
                draining = true;
            }
        }
    }
}
