//! The bare hop (issue #23): an HTTP proxy in the benchmark's process that
//! does nothing but pass a streamable-HTTP `POST` on to one MCP server and
//! its answer back, with the same HTTP stack as the worker (axum serving the
//! caller, reqwest calling the server). No authentication, no MCP, no
//! limits: what any route through a worker costs at least on this machine,
//! so that a route's throughput can be read against the most a hop could
//! keep. Included with `#[path = "support/bare_proxy.rs"] mod bare_proxy;`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use quiver_testkit::mcp_server::no_delay;
use tokio_util::sync::CancellationToken;

use crate::stack::BenchResult;

/// The headers passed on each way: the transport's, nothing else.
const PASSED: [HeaderName; 4] = [
    header::ACCEPT,
    header::CONTENT_TYPE,
    HeaderName::from_static("mcp-session-id"),
    HeaderName::from_static("mcp-protocol-version"),
];

/// A running bare proxy; stops when dropped.
pub struct BareProxy {
    /// `http://<address>/mcp`.
    pub url: String,
    shutdown: CancellationToken,
}

impl Drop for BareProxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Where the proxy sends what it is posted.
struct Upstream {
    http: reqwest::Client,
    url: String,
}

impl BareProxy {
    /// A proxy on a loopback port in front of the MCP endpoint `upstream`.
    pub async fn spawn(upstream: &str) -> BenchResult<BareProxy> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let url = format!("http://{}/mcp", listener.local_addr()?);
        let app = axum::Router::new()
            .route("/mcp", axum::routing::post(forward))
            .with_state(Arc::new(Upstream {
                http: reqwest::Client::new(),
                url: upstream.to_owned(),
            }));
        let shutdown = CancellationToken::new();
        let stopped = shutdown.clone();
        tokio::spawn(async move {
            let served = axum::serve(listener.tap_io(no_delay), app)
                .with_graceful_shutdown(stopped.cancelled_owned())
                .await;
            if let Err(err) = served {
                eprintln!("bare proxy stopped with an error: {err}");
            }
        });
        Ok(BareProxy { url, shutdown })
    }
}

/// One `POST` passed on, its answer read whole and passed back.
async fn forward(
    State(upstream): State<Arc<Upstream>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut request = upstream.http.post(&upstream.url).body(body);
    for name in &PASSED {
        if let Some(value) = headers.get(name) {
            request = request.header(name, value);
        }
    }
    let answered = async {
        let response = request.send().await?;
        let status = response.status();
        let mut passed = HeaderMap::new();
        // All but `Accept`, which is the request's alone.
        for name in &PASSED[1..] {
            if let Some(value) = response.headers().get(name) {
                passed.insert(name, value.clone());
            }
        }
        Ok::<_, reqwest::Error>((status, passed, response.bytes().await?))
    };
    match answered.await {
        Ok(answer) => answer.into_response(),
        Err(err) => (StatusCode::BAD_GATEWAY, err.to_string()).into_response(),
    }
}
