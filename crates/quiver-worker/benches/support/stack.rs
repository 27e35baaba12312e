//! The registry and worker the worker benchmarks run against, both served in
//! the benchmark's process over loopback (the registry is
//! `quiver_testkit::registry::InProcessRegistry`). Included by
//! each benchmark with `#[path = "support/stack.rs"] mod stack;`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quiver_mcp::McpPool;
use quiver_model::{McpServerSpec, Source, StoredServer};
use quiver_store::{Store, UpsertRequest};
use quiver_sync::{SnapshotHandle, SyncOptions};
use quiver_testkit::registry::{InProcessRegistry, WORKER_TOKEN};
use quiver_upstream::UpstreamOptions;
use quiver_worker::auth::{CallerToken, CallersConfig};
use quiver_worker::{Worker, WorkerOptions};
use tokio_util::sync::CancellationToken;

/// The allocator the `quiver` binary runs the worker with
/// (crates/quiver/src/main.rs): the worker is measured as it ships. Its
/// clients and servers in this process use it too.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// A benchmark's error.
pub type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The caller token of task `default`.
pub const CALLER_TOKEN: &str = "bench-caller-token";
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
    worker: tokio::task::JoinHandle<()>,
    /// The registry the worker follows (its admin REST creates API keys).
    pub registry: InProcessRegistry,
}

impl Stack {
    /// Stores `specs`, starts both, and returns once every record is in the
    /// worker's snapshot and its tools are listed (cached). Its one caller
    /// is [`CALLER_TOKEN`] (task `default`).
    #[allow(dead_code)] // the auth benchmark configures its callers itself
    pub async fn start(
        specs: Vec<McpServerSpec>,
        upstream: Option<UpstreamOptions>,
    ) -> BenchResult<Stack> {
        let callers = CallersConfig {
            callers: vec![CallerToken {
                token: CALLER_TOKEN.into(),
                task: "default".into(),
            }],
            ..CallersConfig::default()
        };
        Self::start_with_callers(specs, upstream, callers).await
    }

    /// [`Stack::start`] with a worker whose callers are `callers` (the auth
    /// benchmark: identity providers, `insecure_no_auth`).
    #[allow(dead_code)] // the oauth_grants benchmark starts its own registry
    pub async fn start_with_callers(
        specs: Vec<McpServerSpec>,
        upstream: Option<UpstreamOptions>,
        callers: CallersConfig,
    ) -> BenchResult<Stack> {
        let registry = InProcessRegistry::sqlite(|_| {}).await;
        Self::start_on(registry, specs, upstream, callers).await
    }

    /// [`Stack::start_with_callers`] on `registry`, started by the
    /// benchmark with options of its own (the oauth_grants benchmark: OAuth
    /// keys). Only `specs` are stored and waited for; records the benchmark
    /// stored itself are in the worker's snapshot only once it has synced.
    pub async fn start_on(
        registry: InProcessRegistry,
        specs: Vec<McpServerSpec>,
        upstream: Option<UpstreamOptions>,
        callers: CallersConfig,
    ) -> BenchResult<Stack> {
        let ids: Vec<String> = specs.iter().map(|s| s.server_id.clone()).collect();
        for spec in specs {
            registry
                .store
                .upsert(UpsertRequest {
                    spec,
                    expected_revision: None,
                    actor: "bench".into(),
                    source: Source::Api,
                })
                .await?;
        }
        let shutdown = CancellationToken::new();
        let worker = Worker::start(
            WorkerOptions {
                http_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
                sync: SyncOptions {
                    registry_urls: vec![registry.grpc.clone()],
                    token: Some(WORKER_TOKEN.into()),
                    worker_id: "bench".into(),
                    ..SyncOptions::default()
                },
                callers,
                warm_up: ids.clone(),
                shutdown_grace: Duration::from_secs(1),
                upstream,
                ..WorkerOptions::default()
            },
            shutdown.clone(),
        )
        .await?;
        let stack = Stack {
            shutdown,
            worker_url: format!("http://{}", worker.http_addr()),
            snapshot: worker.snapshot(),
            pool: worker.pool(),
            worker: tokio::spawn(async move {
                if let Err(err) = worker.run().await {
                    eprintln!("worker stopped with an error: {err}");
                }
            }),
            registry,
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

    /// Stops worker (MCP connections closed) and registry.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.worker.await;
        self.registry.stop().await;
    }
}
