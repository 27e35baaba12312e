//! The registry served in this process on loopback ports, for crate tests
//! and benchmarks that need a real registry without spawning `quiver`.
//!
//! [`InProcessRegistry`] owns what the registry needs to outlive the test:
//! the store, the SQLite file's temporary directory or the PostgreSQL test
//! database, and the shutdown token. Dropping it cancels the registry;
//! [`InProcessRegistry::stop`] also waits until its listeners are closed (a
//! test that restarts a registry on the same port needs that).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quiver_proto::credentials::{Credentials, RegistryClient};
use quiver_registry::auth::AuthConfig;
use quiver_registry::{Registry, RegistryOptions, ServeError};
use quiver_store::SqlStore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::postgres::TestDatabase;

/// The admin token of every in-process registry (unless options say
/// otherwise).
pub const ADMIN_TOKEN: &str = "admin-secret";
/// The worker token of every in-process registry (unless options say
/// otherwise).
pub const WORKER_TOKEN: &str = "worker-secret";

/// How long [`InProcessRegistry::stop`] waits for the listeners to close.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Options of a test registry: ephemeral loopback ports, both tokens, no
/// `mcp.d` rescans and no change-log compaction (a test asks for those when
/// it tests them), a short shutdown grace. Everything else (heartbeats,
/// fan-out sizes) as deployed.
pub fn test_options() -> RegistryOptions {
    RegistryOptions {
        grpc_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        auth: AuthConfig {
            admin_token: Some(ADMIN_TOKEN.into()),
            worker_token: Some(WORKER_TOKEN.into()),
            ..AuthConfig::default()
        },
        mcp_dir: None,
        rescan_interval: None,
        change_log_retention: None,
        shutdown_grace: Duration::from_secs(1),
        ..RegistryOptions::default()
    }
}

/// A registry served in this process; cancelled when dropped.
pub struct InProcessRegistry {
    /// The store it serves (write through it as an admin would).
    pub store: Arc<SqlStore>,
    /// `http://` URL of the gRPC listener.
    pub grpc: String,
    /// `http://` URL of the HTTP listener (admin API, metrics, health).
    pub http: String,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), ServeError>>>,
    /// Where the store's data lives, when this registry made the store.
    _dir: Option<tempfile::TempDir>,
    _db: Option<TestDatabase>,
}

impl InProcessRegistry {
    /// Serves `store` with `options` (see [`test_options`]).
    ///
    /// # Panics
    /// When the registry cannot start (a listener cannot be bound, the store
    /// fails): test support fails loudly.
    pub async fn start(store: Arc<SqlStore>, options: RegistryOptions) -> InProcessRegistry {
        InProcessRegistry::serve(store, options, None, None).await
    }

    /// A registry on a fresh SQLite file in a temporary directory, with
    /// [`test_options`] changed by `tweak`.
    pub async fn sqlite(tweak: impl FnOnce(&mut RegistryOptions)) -> InProcessRegistry {
        let dir = tempfile::tempdir().expect("temporary directory for the registry");
        let url = format!("sqlite://{}", dir.path().join("registry.db").display());
        let store = SqlStore::open_sqlite(&url)
            .await
            .unwrap_or_else(|err| panic!("cannot open {url}: {err}"));
        let mut options = test_options();
        tweak(&mut options);
        InProcessRegistry::serve(Arc::new(store), options, Some(dir), None).await
    }

    /// A registry on a fresh database of the PostgreSQL test server (see
    /// [`TestDatabase`]), with [`test_options`] changed by `tweak`.
    pub async fn postgres(tweak: impl FnOnce(&mut RegistryOptions)) -> InProcessRegistry {
        let db = TestDatabase::create().await;
        let store = SqlStore::open_postgres(db.url())
            .await
            .unwrap_or_else(|err| panic!("cannot open {}: {err}", db.url()));
        let mut options = test_options();
        tweak(&mut options);
        InProcessRegistry::serve(Arc::new(store), options, None, Some(db)).await
    }

    async fn serve(
        store: Arc<SqlStore>,
        options: RegistryOptions,
        dir: Option<tempfile::TempDir>,
        db: Option<TestDatabase>,
    ) -> InProcessRegistry {
        let shutdown = CancellationToken::new();
        let registry = Registry::start(store.clone(), options, shutdown.clone())
            .await
            .unwrap_or_else(|err| panic!("the test registry did not start: {err}"));
        let (grpc_addr, http_addr) = (registry.grpc_addr(), registry.http_addr());
        InProcessRegistry {
            store,
            grpc: format!("http://{grpc_addr}"),
            http: format!("http://{http_addr}"),
            grpc_addr,
            http_addr,
            shutdown,
            task: Some(tokio::spawn(registry.run())),
            _dir: dir,
            _db: db,
        }
    }

    /// The bound gRPC address (to restart a registry on the same port).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The URL of `path` on the HTTP listener.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.http)
    }

    /// A gRPC client presenting `token` (none: unauthenticated).
    pub async fn client(&self, token: Option<&str>) -> RegistryClient {
        let channel = Channel::from_shared(self.grpc.clone())
            .expect("the gRPC URL is valid")
            .connect()
            .await
            .unwrap_or_else(|err| panic!("cannot connect to {}: {err}", self.grpc));
        Credentials::new(token, None)
            .expect("the token is header text")
            .client(channel)
    }

    /// Stops serving and waits (at most 5 s) until the listeners are closed.
    ///
    /// # Panics
    /// When the registry does not stop in time or stopped with an error.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(STOP_TIMEOUT, task)
                .await
                .unwrap_or_else(|_| panic!("registry did not stop within {STOP_TIMEOUT:?}"))
                .expect("registry task")
                .unwrap_or_else(|err| panic!("registry stopped with an error: {err}"));
        }
    }
}

impl Drop for InProcessRegistry {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
