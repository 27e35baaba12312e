//! `quiver worker`: the data plane.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use quiver_mcp::PoolOptions;
use quiver_sync::{SyncOptions, default_registry_url};
use quiver_worker::auth::{CallerToken, CallersConfig, DEFAULT_TASK};
use quiver_worker::{DEFAULT_HTTP_LISTEN, Worker, WorkerOptions};
use tokio_util::sync::CancellationToken;

use super::flags::{EgressFlags, GatewayFlags, ListenerFlags, LogFlags, TlsFlags, UpstreamFlags};
use super::signals::shutdown_on_signal;
use crate::config::{self, WorkerFile};
use crate::telemetry::{self, LogSettings};

/// Flags of `quiver worker` (environment variables as in the README's table).
#[derive(Args, Debug, Default)]
pub struct WorkerArgs {
    /// TOML config file (see config/worker.toml).
    #[arg(long, env = "QUIVER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Registry gRPC URL; repeat it (or give a comma list in the
    /// environment) for replicas: the worker follows one and fails over to
    /// the next.
    #[arg(long, env = "QUIVER_REGISTRY", value_delimiter = ',',
        help = format!("Registry gRPC URL; repeat it (comma list in QUIVER_REGISTRY) for replicas the worker fails over between [default: {}]", default_registry_url()))]
    pub registry: Vec<String>,
    /// Worker token for the registry (prefer QUIVER_TOKEN or --token-file:
    /// flags are visible in `ps`).
    #[arg(long, env = "QUIVER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the worker token for the registry (trimmed).
    #[arg(long, env = "QUIVER_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM CA certificates trusted for an https:// --registry [default: the
    /// system roots].
    #[arg(long, env = "QUIVER_REGISTRY_CA")]
    pub registry_ca: Option<PathBuf>,
    /// A caller token of task "default" (repeatable; comma-separated in the
    /// env). Optional: without one the worker serves the registry's callers
    /// (API keys, identity providers) only.
    #[arg(
        long = "caller-token",
        env = "QUIVER_CALLER_TOKEN",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub caller_tokens: Vec<String>,
    /// File of caller tokens of task "default", one per line (blank lines
    /// and `#` comments skipped).
    #[arg(long, env = "QUIVER_CALLER_TOKEN_FILE")]
    pub caller_token_file: Option<PathBuf>,
    /// HTTP listen address for the tool API, chat, health and metrics.
    #[arg(long, env = "QUIVER_WORKER_HTTP_LISTEN",
        help = format!("HTTP listen address for the tool API, chat, health and metrics [default: {DEFAULT_HTTP_LISTEN}]"))]
    pub http_listen: Option<SocketAddr>,
    /// Identity reported to the registry; by default the host name and the
    /// process id.
    #[arg(
        long,
        env = "QUIVER_WORKER_ID",
        help = "Identity reported to the registry [default: <hostname>-<pid>]"
    )]
    pub worker_id: Option<String>,
    /// Serve callers without a token as task "default"; loopback listeners only.
    #[arg(long, env = "QUIVER_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// How often usage counts are reported to the registry, in ms.
    #[arg(long, env = "QUIVER_USAGE_FLUSH_MS",
        value_parser = clap::value_parser!(u64).range(50..=3_600_000),
        help = format!("How often usage counts of tool calls are reported to the registry, in ms [default: {}]",
            quiver_worker::usage::DEFAULT_FLUSH.as_millis()))]
    pub usage_flush_ms: Option<u64>,
    /// Connect this server as soon as it appears (repeatable).
    #[arg(long = "warm-up", env = "QUIVER_WARM_UP", value_delimiter = ',')]
    pub warm_up: Vec<String>,
    /// TLS of the HTTP listener.
    #[command(flatten)]
    pub tls: TlsFlags,
    /// Timeouts and connection cap of the HTTP listener.
    #[command(flatten)]
    pub listener: ListenerFlags,
    /// Logging and trace export.
    #[command(flatten)]
    pub log: LogFlags,
    /// Chat upstream.
    #[command(flatten)]
    pub upstream: UpstreamFlags,
    /// Egress allowlist of the HTTP transports.
    #[command(flatten)]
    pub egress: EgressFlags,
    /// The MCP endpoints (gateway mode).
    #[command(flatten)]
    pub gateway: GatewayFlags,
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "worker".to_owned());
    format!("{host}-{}", std::process::id())
}

/// Layers defaults < config file < env < flags into worker options.
pub fn options(args: WorkerArgs) -> anyhow::Result<(WorkerOptions, LogSettings)> {
    let file: WorkerFile = config::load(args.config.as_deref())?;
    let token = config::token_or_file(
        args.token,
        "--token",
        args.token_file.as_deref(),
        "--token-file",
    )?;
    let mut caller_tokens = args.caller_tokens;
    if let Some(path) = &args.caller_token_file {
        caller_tokens.extend(config::read_token_lines("--caller-token-file", path)?);
    }
    let mut callers: Vec<CallerToken> = caller_tokens
        .into_iter()
        .map(|token| CallerToken {
            token,
            task: DEFAULT_TASK.to_owned(),
        })
        .collect();
    for (i, entry) in file.callers.into_iter().enumerate() {
        let token = match (entry.token, entry.token_env) {
            (Some(token), None) => token,
            (None, Some(var)) => match std::env::var(&var) {
                Ok(token) => token,
                Err(_) => {
                    eprintln!(
                        "warning: callers[{i}]: environment variable {var} is not set; caller of task {:?} disabled",
                        entry.task
                    );
                    continue;
                }
            },
            _ => bail!("callers[{i}]: set exactly one of token and token_env"),
        };
        callers.push(CallerToken {
            token,
            task: entry.task,
        });
    }
    let defaults = WorkerOptions::default();
    let catalog_wait = file
        .pool
        .catalog_wait_ms
        .map_or(defaults.catalog_wait, Duration::from_millis);
    let pool = PoolOptions {
        egress: args.egress.policy(file.egress)?,
        ..file.pool.over(defaults.pool)
    };
    let warm_up = if args.warm_up.is_empty() {
        file.warm_up
    } else {
        args.warm_up
    };
    let registry_urls = if !args.registry.is_empty() {
        args.registry
    } else if !file.registry.is_empty() {
        file.registry
    } else {
        defaults.sync.registry_urls.clone()
    };
    let registry_ca = config::registry_ca(
        args.registry_ca
            .or_else(|| {
                file.registry_ca
                    .map(|path| config::relative_to(args.config.as_deref(), path))
            })
            .as_deref(),
    )?;
    if registry_ca.is_some()
        && let Some(plain) = registry_urls
            .iter()
            .find(|url| !url.starts_with("https://"))
    {
        bail!("--registry-ca needs https:// registries (got {plain})");
    }
    let token = token.or(file.token);
    let gateway = args.gateway.options(file.gateway, token.as_deref())?;
    let options = WorkerOptions {
        http_listen: args
            .http_listen
            .or(file.http_listen)
            .unwrap_or(defaults.http_listen),
        sync: SyncOptions {
            registry_urls,
            token,
            registry_ca,
            worker_id: args
                .worker_id
                .or(file.worker_id)
                .unwrap_or_else(default_worker_id),
            ..defaults.sync
        },
        pool,
        callers: CallersConfig {
            callers,
            tasks: file.tasks,
            insecure_no_auth: args.insecure_no_auth || file.insecure_no_auth.unwrap_or(false),
            identity_providers: file
                .identity_providers
                .into_iter()
                .map(config::IdentityProviderEntry::into_config)
                .collect(),
        },
        warm_up,
        upstream: args.upstream.options(file.upstream)?,
        audit: file.audit.into_options(),
        catalog_wait,
        tls: args.tls.server_tls(file.tls, args.config.as_deref())?,
        listener: args.listener.options(file.listener),
        gateway,
        artifacts: file.artifacts.into_options()?,
        usage_flush: args
            .usage_flush_ms
            .or(file.usage_flush_ms)
            .map_or(defaults.usage_flush, |ms| Duration::from_millis(ms.max(50))),
        ..defaults
    };
    let log = args.log.settings(file.log)?;
    Ok((options, log))
}

/// Runs `quiver worker`.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let (mut options, log) = options(args)?;
    let tracing_guard = telemetry::init_tracing(&log, "quiver-worker")?;
    options.metrics = Some(telemetry::init_metrics()?);
    let shutdown = CancellationToken::new();
    tokio::spawn(shutdown_on_signal(shutdown.clone()));
    let served = serve(options, shutdown).await;
    tracing_guard.shutdown();
    served
}

/// Starts a worker and serves it until `shutdown`.
pub async fn serve(options: WorkerOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    let registry = options.sync.registry_urls.join(",");
    let tls = options.tls.is_some();
    let worker = Worker::start(options, shutdown)
        .await
        .context("starting the worker")?;
    tracing::info!(http = %worker.http_addr(), registry = %registry, tls, "quiver worker listening");
    worker.run().await?;
    tracing::info!("quiver worker stopped");
    Ok(())
}
