//! The registry and worker the worker benchmarks run against, both served in
//! the benchmark's process over loopback, stopped by one token. Included by
//! each benchmark with `#[path = "support/stack.rs"] mod stack;`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quiver_mcp::{McpPool, PoolOptions};
use quiver_model::{McpServerSpec, Source, StoredServer};
use quiver_registry::auth::AuthConfig;
use quiver_registry::{Registry, RegistryOptions};
use quiver_store::{SqlStore, Store, UpsertRequest};
use quiver_sync::{SnapshotHandle, SyncOptions};
use quiver_upstream::UpstreamOptions;
use quiver_worker::audit::AuditOptions;
use quiver_worker::auth::{CallerToken, CallersConfig};
use quiver_worker::{DEFAULT_CATALOG_WAIT, Worker, WorkerOptions};
use tokio_util::sync::CancellationToken;

/// A benchmark's error.
pub type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The caller token of task `default`.
pub const CALLER_TOKEN: &str = "bench-caller-token";
const WORKER_TOKEN: &str = "bench-worker-token";
const ADMIN_TOKEN: &str = "bench-admin-token";
/// Bound on syncing and warming up.
const WARM_UP: Duration = Duration::from_secs(60);

/// Registry (SQLite in a temp dir) and worker, synced and warm.
pub struct Stack {
    shutdown: CancellationToken,
    /// `http://<worker address>`.
    pub worker_url: String,
    /// The worker's snapshot.
    pub snapshot: SnapshotHandle,
    /// The worker's MCP pool.
    pub pool: McpPool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _scratch: tempfile::TempDir,
}

impl Stack {
    /// Stores `specs`, starts both, and returns once every record is in the
    /// worker's snapshot and its tools are listed (cached).
    pub async fn start(
        specs: Vec<McpServerSpec>,
        upstream: Option<UpstreamOptions>,
    ) -> BenchResult<Stack> {
        let scratch = tempfile::tempdir()?;
        let url = format!("sqlite://{}", scratch.path().join("registry.db").display());
        let store: Arc<dyn Store> = Arc::new(SqlStore::open_sqlite(&url).await?);
        let ids: Vec<String> = specs.iter().map(|s| s.server_id.clone()).collect();
        for spec in specs {
            store
                .upsert(UpsertRequest {
                    spec,
                    expected_revision: None,
                    actor: "bench".into(),
                    source: Source::Api,
                })
                .await?;
        }
        let shutdown = CancellationToken::new();
        let registry = Registry::start(
            store,
            RegistryOptions {
                grpc_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                auth: AuthConfig {
                    admin_token: Some(ADMIN_TOKEN.into()),
                    worker_token: Some(WORKER_TOKEN.into()),
                    insecure_no_auth: false,
                },
                shutdown_grace: Duration::from_secs(1),
                ..RegistryOptions::default()
            },
            shutdown.clone(),
        )
        .await?;
        let worker = Worker::start(
            WorkerOptions {
                http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                sync: SyncOptions {
                    registry_url: format!("http://{}", registry.grpc_addr()),
                    token: Some(WORKER_TOKEN.into()),
                    worker_id: "bench".into(),
                    ..SyncOptions::default()
                },
                pool: PoolOptions::default(),
                callers: CallersConfig {
                    callers: vec![CallerToken {
                        token: CALLER_TOKEN.into(),
                        task: "default".into(),
                    }],
                    ..CallersConfig::default()
                },
                warm_up: ids.clone(),
                shutdown_grace: Duration::from_secs(1),
                metrics: None,
                upstream,
                audit: AuditOptions::default(),
                catalog_wait: DEFAULT_CATALOG_WAIT,
                tls: None,
            },
            shutdown.clone(),
        )
        .await?;
        let stack = Stack {
            shutdown,
            worker_url: format!("http://{}", worker.http_addr()),
            snapshot: worker.snapshot(),
            pool: worker.pool(),
            tasks: vec![
                tokio::spawn(async move {
                    if let Err(err) = registry.run().await {
                        eprintln!("registry stopped with an error: {err}");
                    }
                }),
                tokio::spawn(async move {
                    if let Err(err) = worker.run().await {
                        eprintln!("worker stopped with an error: {err}");
                    }
                }),
            ],
            _scratch: scratch,
        };
        tokio::time::timeout(WARM_UP, async {
            loop {
                let current = stack.snapshot.current();
                if ids.iter().all(|id| current.get(id).is_some()) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .map_err(|_| "the worker did not sync the benchmark records in time")?;
        for id in &ids {
            stack.pool.list_tools(&stack.server(id)?).await?;
        }
        Ok(stack)
    }

    /// The worker's current record of `id`.
    pub fn server(&self, id: &str) -> BenchResult<Arc<StoredServer>> {
        Ok(self
            .snapshot
            .current()
            .get(id)
            .ok_or_else(|| format!("{id} is not in the worker's snapshot"))?
            .clone())
    }

    /// Stops registry and worker (MCP connections closed).
    pub async fn stop(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
