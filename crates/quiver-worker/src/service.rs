//! The worker process: registry sync, the MCP pool fed by its snapshots, and
//! the HTTP API, stopped through one cancellation token.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use quiver_listen::{Connections, Listener, ListenerOptions};
use quiver_mcp::{McpPool, PoolOptions};
use quiver_sync::{SnapshotHandle, SyncOptions, SyncService};
use quiver_upstream::{Upstream, UpstreamConfigError, UpstreamOptions};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::artifacts::{ArtifactOptions, ArtifactStore};
use crate::audit::AuditOptions;
use crate::auth::{Callers, CallersConfig, CallersError};
use crate::call::ToolRunner;
use crate::gateway::rebinding::RebindingGuard;
use crate::gateway::{Gateway, GatewayOptions};
use crate::health::PoolHealth;
use crate::http::{ApiState, router};
use crate::oauth_tokens::TokenCache;
use crate::quota::Quotas;
use crate::registry_callers::RegistryCallers;
use crate::usage::UsageRecorder;

/// How the worker runs.
#[derive(Clone)]
pub struct WorkerOptions {
    /// HTTP listen address (port 0 picks a free one).
    pub http_listen: SocketAddr,
    /// Registry connection.
    pub sync: SyncOptions,
    /// MCP pool limits and timeouts.
    pub pool: PoolOptions,
    /// Caller tokens and task policies.
    pub callers: CallersConfig,
    /// Servers connected (and their tools listed) as soon as they appear.
    pub warm_up: Vec<String>,
    /// How long shutdown waits for requests in flight.
    pub shutdown_grace: Duration,
    /// Prometheus recorder to render at `/metrics`.
    pub metrics: Option<PrometheusHandle>,
    /// The OpenAI-compatible upstream of `/v1/chat/completions`; without
    /// one, chat requests are refused (503).
    pub upstream: Option<UpstreamOptions>,
    /// What the audit log records of tool arguments.
    pub audit: AuditOptions,
    /// How long a listing of several servers (`GET /v1/mcp/tools`, chat)
    /// waits for any one server's tools before leaving it out.
    pub catalog_wait: Duration,
    /// Serve the HTTP listener over TLS with this certificate; `None`
    /// serves plaintext.
    pub tls: Option<quiver_proto::tls::ServerTls>,
    /// Timeouts and the connection cap of the HTTP listener.
    pub listener: ListenerOptions,
    /// The MCP endpoints (gateway mode).
    pub gateway: GatewayOptions,
    /// The artifact store of images and audio in results.
    pub artifacts: ArtifactOptions,
    /// How often usage counts go to the registry.
    pub usage_flush: Duration,
}

/// Default of [`WorkerOptions::catalog_wait`]: long enough for a warm or
/// quickly starting server, short enough that a server stuck in its
/// handshake does not stall every chat request for its connect timeout.
pub const DEFAULT_CATALOG_WAIT: Duration = Duration::from_secs(3);

/// Default of [`WorkerOptions::http_listen`]: loopback port 8090.
pub const DEFAULT_HTTP_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8090));

/// A worker on [`DEFAULT_HTTP_LISTEN`] following a registry at
/// [`quiver_sync::default_registry_url`], with no callers, no upstream and
/// plaintext HTTP. `sync.worker_id` is empty and must be set.
impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            http_listen: DEFAULT_HTTP_LISTEN,
            sync: SyncOptions::default(),
            pool: PoolOptions::default(),
            callers: CallersConfig::default(),
            warm_up: Vec::new(),
            shutdown_grace: Duration::from_secs(10),
            metrics: None,
            upstream: None,
            audit: AuditOptions::default(),
            catalog_wait: DEFAULT_CATALOG_WAIT,
            tls: None,
            listener: ListenerOptions::default(),
            gateway: GatewayOptions::default(),
            artifacts: ArtifactOptions::default(),
            usage_flush: crate::usage::DEFAULT_FLUSH,
        }
    }
}

/// Why the worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// Caller configuration refused.
    #[error(transparent)]
    Callers(#[from] CallersError),
    /// Upstream configuration refused.
    #[error(transparent)]
    Upstream(#[from] UpstreamConfigError),
    /// Registry sync configuration refused.
    #[error(transparent)]
    Sync(#[from] quiver_sync::SyncError),
    /// Serving failed.
    #[error("http server: {0}")]
    Serve(std::io::Error),
}

/// A worker whose listener is bound; [`Worker::run`] serves it.
pub struct Worker {
    listener: TcpListener,
    connections: Connections,
    sync: SyncService,
    state: ApiState,
    options: WorkerOptions,
    shutdown: CancellationToken,
}

impl Worker {
    /// Binds the listener and assembles sync, pool and API.
    pub async fn start(
        options: WorkerOptions,
        shutdown: CancellationToken,
    ) -> Result<Self, WorkerError> {
        // First: raises the descriptor limit the cap is derived from.
        let connections = Connections::new(options.listener.clone());
        let listener = TcpListener::bind(options.http_listen)
            .await
            .map_err(|source| WorkerError::Bind {
                addr: options.http_listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(WorkerError::Serve)?;
        let sync = SyncService::new(options.sync.clone())?;
        let registry_callers =
            Arc::new(RegistryCallers::new(sync.key_uses()).following(sync.handle()));
        let callers =
            Arc::new(Callers::new(&options.callers, addr)?.with_registry(registry_callers));
        let tokens = TokenCache::new(sync.tokens());
        let pool = McpPool::new(PoolOptions {
            credentials: Some(Arc::new(tokens.clone())),
            ..options.pool.clone()
        });
        let sync = sync.with_health_source(Arc::new(PoolHealth(pool.clone())));
        let upstream = options.upstream.clone().map(Upstream::new).transpose()?;
        let mut artifacts = options.artifacts.clone();
        if artifacts.public_url.is_none() {
            let scheme = if options.tls.is_some() {
                "https"
            } else {
                "http"
            };
            artifacts.public_url = Some(format!("{scheme}://{addr}"));
        }
        let runner = ToolRunner::new(pool, options.audit.clone(), options.catalog_wait)
            .with_approvals(sync.approvals())
            .with_quotas(Arc::new(Quotas::new(Some(sync.usage()))))
            .with_usage(Arc::new(UsageRecorder::new(
                sync.usage(),
                &options.sync.worker_id,
            )))
            .with_artifacts(Arc::new(ArtifactStore::new(artifacts)));
        let gateway = Gateway::new(
            runner.clone(),
            sync.handle(),
            GatewayOptions {
                registry: Some(sync.sessions()),
                ..options.gateway.clone()
            },
            &shutdown,
        );
        let rebinding = Arc::new(RebindingGuard::new(
            addr.ip().is_loopback(),
            options.gateway.allowed_hosts.clone(),
            options.gateway.allowed_origins.clone(),
        ));
        let state = ApiState {
            snapshot: sync.handle(),
            runner,
            callers,
            upstream,
            gateway,
            rebinding,
            metrics: options.metrics.clone(),
            tokens: Some(tokens),
        };
        Ok(Worker {
            listener,
            connections,
            sync,
            state,
            options,
            shutdown,
        })
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or(self.options.http_listen)
    }

    /// The worker's view of the registry.
    pub fn snapshot(&self) -> SnapshotHandle {
        self.state.snapshot.clone()
    }

    /// The worker's MCP pool.
    pub fn pool(&self) -> McpPool {
        self.state.runner.pool().clone()
    }

    /// Serves until the shutdown token is cancelled; then drains requests for
    /// at most the grace period and closes every MCP connection (child
    /// process groups are killed and reaped).
    pub async fn run(self) -> Result<(), WorkerError> {
        let Worker {
            listener,
            connections,
            sync,
            state,
            options,
            shutdown,
        } = self;
        let syncing = tokio::spawn(sync.run(shutdown.clone()));
        tokio::spawn(follow_snapshots(
            state.snapshot.clone(),
            state.runner.pool().clone(),
            state.callers.registry().cloned(),
            options.warm_up.clone(),
            shutdown.clone(),
        ));
        let quotas = tokio::spawn(state.runner.quotas().clone().run(shutdown.clone()));
        let usage = state
            .runner
            .usage()
            .cloned()
            .map(|usage| tokio::spawn(usage.run(options.usage_flush, shutdown.clone())));
        let gateway = state.gateway.clone();
        let notifying = shutdown.clone();
        tokio::spawn(async move { gateway.follow_changes(notifying).await });
        let pool = state.runner.pool().clone();
        let app = router(state);
        let served = Listener::new("worker_http", listener, &connections)
            .with_tls(
                options
                    .tls
                    .as_ref()
                    .map(quiver_proto::tls::ServerTls::acceptor),
            )
            .serve(app, shutdown.clone());
        tokio::select! {
            () = served => {}
            () = async {
                shutdown.cancelled().await;
                tokio::time::sleep(options.shutdown_grace).await;
            } => {}
        }
        pool.shutdown().await;
        // Unused shares go back and the last counts out, each bounded by
        // its own request timeout.
        let _ = quotas.await;
        if let Some(usage) = usage {
            let _ = usage.await;
        }
        let _ = syncing.await;
        Ok(())
    }
}

/// Applies every new snapshot to the registry's callers and the pool, and
/// warms up configured servers.
async fn follow_snapshots(
    snapshot: SnapshotHandle,
    pool: McpPool,
    callers: Option<Arc<RegistryCallers>>,
    warm_up: Vec<String>,
    shutdown: CancellationToken,
) {
    let mut updates = snapshot.subscribe();
    loop {
        let update = updates.borrow_and_update().clone();
        // Rebuilt here rather than by the first request after a change
        // (each request also brings them to the current snapshot).
        if let Some(callers) = &callers {
            callers.refresh();
        }
        pool.apply_snapshot(&update.snapshot.servers);
        for id in &warm_up {
            if let Some(server) = update.snapshot.get(id).filter(|s| s.spec.enabled) {
                let (pool, server) = (pool.clone(), server.clone());
                tokio::spawn(async move {
                    if let Err(err) = pool.warm_up(&server).await {
                        tracing::warn!(server_id = %server.spec.server_id, error = %err, "warm-up failed");
                    }
                });
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            changed = updates.changed() => if changed.is_err() { return },
        }
    }
}
