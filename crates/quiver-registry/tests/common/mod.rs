//! The registry served in-process on loopback ports, shared by the API test
//! files (each file is its own crate and uses part of this).
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use quiver_model::{McpServerSpec, StdioConfig, Transport};
use quiver_registry::auth::AuthConfig;
use quiver_registry::{Registry, RegistryOptions};
use quiver_store::SqlStore;
use quiver_testkit::postgres::TestDatabase;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// The admin token of every test registry.
pub const ADMIN: &str = "admin-secret";
/// The worker token of every test registry.
pub const WORKER: &str = "worker-secret";

/// A registry served in-process; stops when dropped.
pub struct TestRegistry {
    /// The store behind it.
    pub store: Arc<SqlStore>,
    /// `http://` address of the gRPC listener.
    pub grpc: String,
    /// `http://` address of the HTTP listener.
    pub http: String,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
    _db: Option<TestDatabase>,
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Starts a registry over `store` with both tokens, no rescans and no
/// compaction; `tweak` changes the options first.
pub async fn start_with(
    store: Arc<SqlStore>,
    dir: tempfile::TempDir,
    db: Option<TestDatabase>,
    tweak: impl FnOnce(&mut RegistryOptions),
) -> TestRegistry {
    let mut options = RegistryOptions {
        grpc_listen: "127.0.0.1:0".parse().unwrap(),
        http_listen: "127.0.0.1:0".parse().unwrap(),
        auth: AuthConfig {
            admin_token: Some(ADMIN.into()),
            worker_token: Some(WORKER.into()),
            insecure_no_auth: false,
        },
        rescan_interval: None,
        change_log_retention: None,
        shutdown_grace: Duration::from_secs(2),
        ..Default::default()
    };
    tweak(&mut options);
    let shutdown = CancellationToken::new();
    let registry = Registry::start(store.clone(), options, shutdown.clone())
        .await
        .unwrap();
    let grpc = format!("http://{}", registry.grpc_addr());
    let http = format!("http://{}", registry.http_addr());
    tokio::spawn(registry.run());
    TestRegistry {
        store,
        grpc,
        http,
        shutdown,
        _dir: dir,
        _db: db,
    }
}

/// A registry on a fresh SQLite file.
pub async fn sqlite_registry(tweak: impl FnOnce(&mut RegistryOptions)) -> TestRegistry {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("registry.db").display());
    let store = Arc::new(SqlStore::open_sqlite(&url).await.unwrap());
    start_with(store, dir, None, tweak).await
}

/// A registry on a fresh PostgreSQL database.
pub async fn postgres_registry() -> TestRegistry {
    let db = TestDatabase::create().await;
    let store = Arc::new(SqlStore::open_postgres(db.url()).await.unwrap());
    start_with(store, tempfile::tempdir().unwrap(), Some(db), |_| {}).await
}

/// The gRPC client with credentials.
pub type Client = quiver_proto::credentials::RegistryClient;

impl TestRegistry {
    /// A gRPC client presenting `token`.
    pub async fn client(&self, token: Option<&'static str>) -> Client {
        let channel = Channel::from_shared(self.grpc.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        quiver_proto::credentials::Credentials::new(token, None)
            .unwrap()
            .client(channel)
    }

    /// The URL of `path` on the HTTP listener.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.http)
    }
}

/// A stdio record with one literal env value (`API_KEY`) and one reference
/// (`TOKEN`), allowing every tool.
pub fn spec(id: &str, command: &str) -> McpServerSpec {
    let mut spec = McpServerSpec::new(id, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: command.into(),
        env: [
            ("API_KEY".to_owned(), "sk-literal".to_owned()),
            ("TOKEN".to_owned(), "${ENV:TOKEN}".to_owned()),
        ]
        .into(),
        ..Default::default()
    });
    spec.allowed_tools = vec!["*".into()];
    spec
}

/// One REST request: status and JSON body (a string when not JSON).
pub async fn rest(
    registry: &TestRegistry,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    rest_at(&registry.http, method, path, token, body).await
}

/// [`rest`] against any registry HTTP address (`http://host:port`).
pub async fn rest_at(
    base: &str,
    method: reqwest::Method,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new().request(method, format!("{base}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}
