//! The registry process: binds the gRPC and HTTP listeners, reconciles
//! `mcp.d`, runs background tasks (rescans, compaction) and shuts everything
//! down through one cancellation token.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use quiver_listen::{Connections, Listener, ListenerOptions};
use quiver_proto::v1::mcp_approval_service_server::McpApprovalServiceServer;
use quiver_proto::v1::mcp_o_auth_service_server::McpOAuthServiceServer;
use quiver_proto::v1::mcp_registry_service_server::McpRegistryServiceServer;
use quiver_proto::v1::mcp_session_service_server::McpSessionServiceServer;
use quiver_proto::v1::mcp_usage_service_server::McpUsageServiceServer;
use quiver_store::Store;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{AuthConfig, AuthConfigError, Authenticator};
use crate::catalog::CatalogOptions;
use crate::error::RegistryError;
use crate::feed::{ChangeFeed, FeedOptions};
use crate::grpc::{GrpcApprovalService, GrpcOAuthService, GrpcService};
use crate::oauth::broker::OAuthBroker;
use crate::oauth::seal::Keyring;
use crate::state::{BootstrapDir, PreviewEnv, RegistryState};

/// Default of [`RegistryOptions::grpc_listen`]: loopback, the protocol's port.
pub const DEFAULT_GRPC_LISTEN: SocketAddr = SocketAddr::V4(SocketAddrV4::new(
    Ipv4Addr::LOCALHOST,
    quiver_proto::DEFAULT_GRPC_PORT,
));

/// Default of [`RegistryOptions::http_listen`]: loopback port 8080.
pub const DEFAULT_HTTP_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8080));

/// How the registry runs.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// gRPC listen address (port 0 picks a free port).
    pub grpc_listen: SocketAddr,
    /// HTTP listen address: admin API, metrics, health.
    pub http_listen: SocketAddr,
    /// Credentials.
    pub auth: AuthConfig,
    /// `mcp.d` directory reconciled at start-up and on rescans.
    pub mcp_dir: Option<BootstrapDir>,
    /// `policies.d` directory reconciled at start-up and on rescans, after
    /// `mcp.d`.
    pub policies_dir: Option<BootstrapDir>,
    /// Periodic rescan of `mcp.d` and `policies.d`; `None` disables the
    /// timer (SIGHUP and the REST action still work).
    pub rescan_interval: Option<Duration>,
    /// Watch fan-out tuning (heartbeat period, in-memory ring size).
    pub feed: FeedOptions,
    /// Change-log rows kept behind head; older ones are compacted away.
    /// `None` keeps the whole log.
    pub change_log_retention: Option<u64>,
    /// How long shutdown waits for open streams and requests.
    pub shutdown_grace: Duration,
    /// Prometheus recorder to render at `/metrics`, when installed.
    pub metrics: Option<PrometheusHandle>,
    /// The environment of tool previews (`quiver dev` adds its own binary's
    /// directory to `PATH`, as it does for its worker).
    pub preview_env: PreviewEnv,
    /// Hosts tool previews may connect to over HTTP (the workers' egress
    /// allowlist; default: all).
    pub preview_egress: quiver_mcp::egress::EgressPolicy,
    /// Bounds of the worker status board (tracked workers, expiry, report size).
    pub workers: crate::workers::WorkerBoardOptions,
    /// Serve both listeners (gRPC and HTTP) over TLS with this certificate;
    /// `None` (the default) serves plaintext.
    pub tls: Option<quiver_proto::tls::ServerTls>,
    /// Timeouts and the connection cap of both listeners (one cap for the
    /// two together).
    pub listener: ListenerOptions,
    /// Approvals: the approver token and how long approvals live.
    pub approvals: ApprovalOptions,
    /// OAuth connections: the encryption keys and the public URL.
    pub oauth: OAuthOptions,
    /// How long usage rows are kept (docs/reference.md §12.3).
    pub usage_retention: Duration,
    /// The fleet as an MCP sub-registry (`/v0.1/servers`).
    pub catalog: CatalogOptions,
}

/// OAuth settings of the registry (docs/reference.md §13.6).
#[derive(Debug, Clone, Default)]
pub struct OAuthOptions {
    /// Keys sealing secrets and tokens at rest; `None`: OAuth connections
    /// cannot be connected (reads and settings still work).
    pub keyring: Option<Keyring>,
    /// The registry's URL as browsers reach it (e.g. behind a proxy), which
    /// authorization servers redirect back to; default: the HTTP listener's
    /// address.
    pub public_url: Option<String>,
}

/// Approval settings of the registry (docs/reference.md §13.7).
#[derive(Clone)]
pub struct ApprovalOptions {
    /// Token that may only read and decide approvals (besides the admin token).
    pub approver_token: Option<String>,
    /// How long an approval waits for its decision and then its use.
    pub ttl: Duration,
    /// The most pending approvals one caller (`requested_by`) may have;
    /// beyond, requests are refused with `resource_exhausted`.
    pub max_pending_per_caller: u32,
    /// How long denied, used and expired approvals are kept after their
    /// expiry before the sweep deletes them.
    pub retention: Duration,
}

impl Default for ApprovalOptions {
    fn default() -> Self {
        ApprovalOptions {
            approver_token: None,
            ttl: crate::approvals::DEFAULT_APPROVAL_TTL,
            max_pending_per_caller: crate::approvals::DEFAULT_MAX_PENDING_PER_CALLER,
            retention: crate::approvals::DEFAULT_APPROVAL_RETENTION,
        }
    }
}

impl std::fmt::Debug for ApprovalOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalOptions")
            .field(
                "approver_token",
                &self.approver_token.as_ref().map(|_| "<set>"),
            )
            .field("ttl", &self.ttl)
            .field("max_pending_per_caller", &self.max_pending_per_caller)
            .field("retention", &self.retention)
            .finish()
    }
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            grpc_listen: DEFAULT_GRPC_LISTEN,
            http_listen: DEFAULT_HTTP_LISTEN,
            auth: AuthConfig::default(),
            mcp_dir: None,
            policies_dir: None,
            rescan_interval: Some(Duration::from_secs(30)),
            feed: FeedOptions::default(),
            change_log_retention: Some(100_000),
            shutdown_grace: Duration::from_secs(10),
            metrics: None,
            preview_env: PreviewEnv::default(),
            preview_egress: quiver_mcp::egress::EgressPolicy::default(),
            workers: crate::workers::WorkerBoardOptions::default(),
            tls: None,
            listener: ListenerOptions::default(),
            approvals: ApprovalOptions::default(),
            oauth: OAuthOptions::default(),
            usage_retention: crate::usage::DEFAULT_USAGE_RETENTION,
            catalog: CatalogOptions::default(),
        }
    }
}

/// Why the registry could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The credential configuration is refused.
    #[error(transparent)]
    Auth(#[from] AuthConfigError),
    /// The store or the initial `mcp.d` / `policies.d` reconcile failed.
    #[error("{0}")]
    Startup(#[from] RegistryError),
    /// A server failed while running.
    #[error("{0}")]
    Serve(String),
}

/// A registry whose listeners are bound; [`Registry::run`] serves it.
pub struct Registry {
    state: RegistryState,
    options: RegistryOptions,
    grpc_listener: TcpListener,
    http_listener: TcpListener,
    connections: Connections,
    shutdown: CancellationToken,
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

impl Registry {
    /// Binds the listeners, checks credentials, starts the change feed and
    /// reconciles `mcp.d` and `policies.d` once (a strict-mode error stops
    /// start-up).
    pub async fn start(
        store: Arc<dyn Store>,
        options: RegistryOptions,
        shutdown: CancellationToken,
    ) -> Result<Self, ServeError> {
        crate::catalog::Catalog::new(&options.catalog)?;
        // First: raises the descriptor limit the cap is derived from.
        let connections = Connections::new(options.listener.clone());
        let grpc_listener = bind(options.grpc_listen).await?;
        let http_listener = bind(options.http_listen).await?;
        let addrs = [local_addr(&grpc_listener)?, local_addr(&http_listener)?];
        let auth = Authenticator::new(&options.auth, &addrs)?
            .with_approver_token(options.approvals.approver_token.as_deref())?;
        let feed = ChangeFeed::start(store.clone(), options.feed, shutdown.clone()).await?;
        let public_url = options.oauth.public_url.clone().unwrap_or_else(|| {
            let scheme = if options.tls.is_some() {
                "https"
            } else {
                "http"
            };
            format!("{scheme}://{}", addrs[1])
        });
        let oauth = OAuthBroker::new(
            store.clone(),
            options.oauth.keyring.clone(),
            &public_url,
            format!(
                "registry-{}-{:08x}",
                std::process::id(),
                rand::random::<u32>()
            ),
        )
        .with_egress(options.preview_egress.clone())
        .map_err(|err| ServeError::Serve(format!("oauth broker: {err}")))?;
        let signin = crate::signin::SignIn::new(options.oauth.keyring.clone(), &public_url);
        let state = RegistryState::new(store, feed, auth, options.mcp_dir.clone())
            .with_policies_dir(options.policies_dir.clone())
            .with_oauth(oauth)
            .with_signin(signin)
            .with_preview_env(options.preview_env.clone())
            .with_preview_egress(options.preview_egress.clone())
            .with_worker_board(options.workers.clone())
            .with_approval_ttl(options.approvals.ttl)
            .with_approval_limits(
                options.approvals.max_pending_per_caller,
                options.approvals.retention,
            );
        if state.has_bootstrap_dir() {
            state.rescan().await?;
        }
        Ok(Registry {
            state,
            options,
            grpc_listener,
            http_listener,
            connections,
            shutdown,
        })
    }

    /// The bound gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_listener
            .local_addr()
            .unwrap_or(self.options.grpc_listen)
    }

    /// The bound HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_listener
            .local_addr()
            .unwrap_or(self.options.http_listen)
    }

    /// Whether both listeners serve TLS.
    pub fn is_tls(&self) -> bool {
        self.options.tls.is_some()
    }

    /// Whether requests are served without credentials.
    pub fn is_insecure(&self) -> bool {
        self.state.auth.is_insecure()
    }

    /// Serves until the shutdown token is cancelled, then drains for at most
    /// the grace period.
    pub async fn run(self) -> Result<(), ServeError> {
        let Registry {
            state,
            options,
            grpc_listener,
            http_listener,
            connections,
            shutdown,
        } = self;
        spawn_rescans(&state, options.rescan_interval, shutdown.clone());
        if let Some(retention) = options.change_log_retention {
            tokio::spawn(compact_periodically(
                state.store.clone(),
                retention,
                shutdown.clone(),
            ));
        }

        tokio::spawn(expire_approvals_periodically(
            state.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(crate::usage::sweep_periodically(
            state.clone(),
            options.usage_retention,
            shutdown.clone(),
        ));

        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<McpRegistryServiceServer<GrpcService>>()
            .await;
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(quiver_proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let reflection_error = |err| ServeError::Serve(format!("grpc reflection: {err}"));
        // Both reflection versions: grpcurl speaks v1, Python's
        // grpcio-reflection only v1alpha.
        let grpc_routes = tonic::service::Routes::new(health_service)
            .add_service(reflection().build_v1().map_err(reflection_error)?)
            .add_service(reflection().build_v1alpha().map_err(reflection_error)?)
            .add_service(McpRegistryServiceServer::new(GrpcService::new(
                state.clone(),
            )))
            .add_service(McpApprovalServiceServer::new(GrpcApprovalService::new(
                state.clone(),
            )))
            .add_service(McpOAuthServiceServer::new(GrpcOAuthService::new(
                state.clone(),
            )))
            .add_service(McpSessionServiceServer::new(
                crate::sessions::GrpcSessionService::new(state.clone()),
            ))
            .add_service(McpUsageServiceServer::new(
                crate::usage::GrpcUsageService::new(state.clone()),
            ));
        let tls = options
            .tls
            .as_ref()
            .map(quiver_proto::tls::ServerTls::acceptor);
        let grpc = Listener::new("registry_grpc", grpc_listener, &connections)
            .http2_only()
            .with_tls(tls.clone())
            .serve(
                crate::encoded::routes(state.clone()).merge(grpc_routes.into_axum_router()),
                shutdown.clone(),
            );
        let catalog = crate::catalog::router(state.clone(), &options.catalog)?
            .layer(tower_http::trace::TraceLayer::new_for_http());
        let http = Listener::new("registry_http", http_listener, &connections)
            .with_tls(tls)
            .serve(
                http_router(state, options.metrics.clone()).merge(catalog),
                shutdown.clone(),
            );

        tokio::select! {
            ((), ()) = async { tokio::join!(grpc, http) } => {}
            () = async {
                shutdown.cancelled().await;
                tokio::time::sleep(options.shutdown_grace).await;
            } => {
                tracing::warn!("shutdown grace period over; closing remaining connections");
            }
        }
        Ok(())
    }
}

fn local_addr(listener: &TcpListener) -> Result<SocketAddr, ServeError> {
    listener.local_addr().map_err(|source| ServeError::Bind {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })
}

/// The HTTP surface: admin API, metrics and health.
pub fn http_router(state: RegistryState, metrics: Option<PrometheusHandle>) -> Router {
    let workers = state.workers.clone();
    Router::new()
        .nest("/admin/api", crate::rest::router())
        .merge(crate::rest::oauth_pages())
        .merge(crate::rest::signin_pages())
        .merge(crate::web::router())
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                let workers = workers.clone();
                async move {
                    match metrics {
                        // Per-worker series come from the board, so they
                        // end when the worker expires.
                        Some(handle) => {
                            (handle.render() + &workers.render_metrics()).into_response()
                        }
                        None => (StatusCode::NOT_FOUND, "metrics recorder not installed")
                            .into_response(),
                    }
                }
            }),
        )
        .layer(tower_http::trace::TraceLayer::new_for_http())
}

async fn readyz(State(state): State<RegistryState>) -> Response {
    match state.store.head().await {
        Ok(head) => axum::Json(json!({"ready": true, "revision": head.revision})).into_response(),
        Err(err) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"ready": false, "error": err.to_string()})),
        )
            .into_response(),
    }
}

fn spawn_rescans(state: &RegistryState, interval: Option<Duration>, shutdown: CancellationToken) {
    if !state.has_bootstrap_dir() {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(signal) => Some(signal),
            Err(err) => {
                tracing::warn!(error = %err, "cannot listen for SIGHUP; rescans only on timer and request");
                None
            }
        };
        let mut timer = interval.map(tokio::time::interval);
        if let Some(timer) = &mut timer {
            timer.reset();
        }
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                Some(()) = async { match &mut hangup { Some(s) => s.recv().await, None => std::future::pending().await } } => {
                    tracing::info!("SIGHUP: rescanning mcp.d and policies.d");
                }
                _ = async { match &mut timer { Some(t) => t.tick().await, None => std::future::pending().await } } => {}
            }
            if let Err(err) = state.rescan().await {
                tracing::error!(error = %err, "rescan failed; keeping the current records");
            }
        }
    });
}

async fn compact_periodically(store: Arc<dyn Store>, retention: u64, shutdown: CancellationToken) {
    let mut timer = tokio::time::interval(Duration::from_secs(600));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        match store.head().await {
            Ok(head) if head.revision > retention => {
                let floor = head.revision - retention;
                if floor > head.compaction_floor {
                    match store.compact(floor).await {
                        Ok(head) => {
                            tracing::info!(floor = head.compaction_floor, "change log compacted")
                        }
                        Err(err) => tracing::warn!(error = %err, "change log compaction failed"),
                    }
                }
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "reading head for compaction failed"),
        }
    }
}

/// How often approvals past their expiry are marked `expired` even when
/// nobody reads them, so the audit line and metric come close to the time;
/// the same sweep purges finished approvals past their retention. A
/// retention shorter than this sweeps as often as the retention (at least
/// once a second).
const APPROVAL_SWEEP_INTERVAL: Duration = Duration::from_secs(30);

async fn expire_approvals_periodically(state: RegistryState, shutdown: CancellationToken) {
    let every = APPROVAL_SWEEP_INTERVAL
        .min(state.approval_retention())
        .max(Duration::from_secs(1));
    let mut timer = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = timer.tick() => {}
        }
        if let Err(err) = state.expire_approvals().await {
            tracing::warn!(error = %err, "marking expired approvals failed");
        }
        if let Err(err) = state.purge_approvals().await {
            tracing::warn!(error = %err, "purging finished approvals failed");
        }
    }
}
