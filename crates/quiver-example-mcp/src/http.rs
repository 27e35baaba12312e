//! The test server over MCP Streamable HTTP (feature `http`): served on a
//! listener until a token fires, or spawned on a background task.

use std::{net::SocketAddr, sync::Arc};

use axum::serve::ListenerExt;
use rmcp::transport::streamable_http_server::{
    StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::server::{ExampleServer, ServeError};

/// Sets `TCP_NODELAY` on an accepted connection: rmcp writes an SSE answer
/// in several parts, and with Nagle's algorithm the part carrying the result
/// waits for the client's delayed ACK (~40 ms per call).
pub fn no_delay(tcp: &mut tokio::net::TcpStream) {
    let _ = tcp.set_nodelay(true);
}

/// Serves MCP Streamable HTTP at `/mcp` on `listener` until `shutdown` fires.
///
/// `server_factory` is called for every new session (and for some per-request
/// checks); return clones of one [`ExampleServer`] so all sessions share its
/// state. Any `Host` header is accepted, so clients may use `127.0.0.1:<port>`
/// or any other name for the listener.
pub async fn serve_streamable_http<F>(
    server_factory: F,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), ServeError>
where
    F: Fn() -> ExampleServer + Send + Sync + 'static,
{
    // Host validation guards against DNS rebinding of servers on a developer
    // machine; a test server on a loopback port has nothing to protect.
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_cancellation_token(shutdown.child_token());
    let service: StreamableHttpService<ExampleServer, LocalSessionManager> =
        StreamableHttpService::new(
            move || Ok(server_factory()),
            Arc::new(LocalSessionManager::default()),
            config,
        );
    let router = axum::Router::new().nest_service("/mcp", service);
    axum::serve(listener.tap_io(no_delay), router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await?;
    Ok(())
}

/// A Streamable HTTP server running on a background task; stopped when
/// dropped.
#[derive(Debug)]
pub struct HttpTestServer {
    url: String,
    addr: SocketAddr,
    server: ExampleServer,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), ServeError>>,
}

impl HttpTestServer {
    /// The MCP endpoint, `http://127.0.0.1:<port>/mcp`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server whose state every session shares.
    pub fn server(&self) -> &ExampleServer {
        &self.server
    }

    /// Stops accepting requests, ends all sessions and waits for the server
    /// task to finish.
    pub async fn shutdown(mut self) -> Result<(), ServeError> {
        self.shutdown.cancel();
        (&mut self.task).await?
    }
}

impl Drop for HttpTestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Starts `server` over Streamable HTTP on `127.0.0.1:<ephemeral port>` in the
/// current Tokio runtime.
pub async fn spawn_streamable_http(server: ExampleServer) -> Result<HttpTestServer, ServeError> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let factory_server = server.clone();
    let task = tokio::spawn(serve_streamable_http(
        move || factory_server.clone(),
        listener,
        shutdown.clone(),
    ));
    Ok(HttpTestServer {
        url: format!("http://{addr}/mcp"),
        addr,
        server,
        shutdown,
        task,
    })
}
