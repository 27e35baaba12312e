//! OpenTelemetry export (issue 6): a registry and a worker started with
//! `--otlp-endpoint` post their trace spans as OTLP/HTTP protobuf to a local
//! collector, at the latest when they shut down.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;

use crate::harness::{RegistryProcess, WorkerProcess};
use crate::worker::{ADMIN, CALLER, WORKER};

/// Bodies of the `POST /v1/traces` requests a collector received.
type Exports = Arc<Mutex<Vec<Bytes>>>;

/// Starts a collector on an ephemeral loopback port; returns its base URL.
async fn collector(exports: Exports) -> String {
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| async move {
            exports
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(body);
            // An empty ExportTraceServiceResponse.
            ([("content-type", "application/x-protobuf")], Bytes::new())
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("collector bind");
    let addr = listener.local_addr().expect("collector addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// Whether some non-empty export mentions `service` (protobuf strings are
/// stored as plain UTF-8, so no decoding is needed).
fn exported_by(exports: &Exports, service: &str) -> bool {
    exports
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .any(|body| {
            !body.is_empty()
                && body
                    .windows(service.len())
                    .any(|window| window == service.as_bytes())
        })
}

#[tokio::test]
async fn registry_and_worker_export_spans_to_an_otlp_collector() {
    let exports = Exports::default();
    let collector = collector(exports.clone()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let db_url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    let mut registry = RegistryProcess::start(&[
        "--database-url",
        &db_url,
        "--admin-token",
        ADMIN,
        "--worker-token",
        WORKER,
        "--otlp-endpoint",
        &collector,
    ])
    .await;
    let mut worker = WorkerProcess::start(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &["--otlp-endpoint", &collector],
    )
    .await;

    let http = reqwest::Client::new();
    let status = http
        .get(format!("{}/healthz", registry.http_url()))
        .send()
        .await
        .expect("registry /healthz")
        .status();
    assert!(status.is_success(), "registry /healthz: {status}");
    let (status, _) = worker.get("/v1/mcp/tools").await;
    assert!(status.is_success(), "worker tools: {status}");

    let (status, _) = worker.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "worker exit: {status}");
    let (status, _) = registry.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "registry exit: {status}");

    let count = exports
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .len();
    assert!(count >= 1, "the collector received no export");
    assert!(
        exported_by(&exports, "quiver-worker"),
        "no span of service quiver-worker in {count} exports; worker log:\n{}",
        worker.log_tail()
    );
    assert!(
        exported_by(&exports, "quiver-registry"),
        "no span of service quiver-registry in {count} exports; registry log:\n{}",
        registry.log_tail()
    );
}
