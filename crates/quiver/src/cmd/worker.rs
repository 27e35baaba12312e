//! `quiver worker`: the data plane.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use quiver_mcp::PoolOptions;
use quiver_sync::SyncOptions;
use quiver_upstream::UpstreamOptions;
use quiver_worker::auth::{CallerToken, CallersConfig, DEFAULT_TASK};
use quiver_worker::{DEFAULT_CATALOG_WAIT, Worker, WorkerOptions};
use tokio_util::sync::CancellationToken;

use crate::config::{self, EgressSection, UpstreamSection, WorkerFile};
use crate::telemetry::{self, LogFormat, LogSettings};

/// Flags of `quiver worker` (each also `QUIVER_<FLAG>`).
#[derive(Args, Debug, Default)]
pub struct WorkerArgs {
    /// TOML config file (see config/worker.toml).
    #[arg(long, env = "QUIVER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Registry gRPC URL [default: http://127.0.0.1:50051].
    #[arg(long, env = "QUIVER_REGISTRY")]
    pub registry: Option<String>,
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
    /// PEM certificate chain: serve HTTP over TLS (with --tls-key).
    #[arg(long, env = "QUIVER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "QUIVER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// A caller token of task "default" (repeatable; comma-separated in the env).
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
    /// HTTP listen address for the tool API, chat, health and metrics [default: 127.0.0.1:8090].
    #[arg(long, env = "QUIVER_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// Identity reported to the registry [default: <hostname>-<pid>].
    #[arg(long, env = "QUIVER_WORKER_ID")]
    pub worker_id: Option<String>,
    /// Serve callers without a token as task "default"; loopback listeners only.
    #[arg(long, env = "QUIVER_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// Connect this server as soon as it appears (repeatable).
    #[arg(long = "warm-up", env = "QUIVER_WARM_UP", value_delimiter = ',')]
    pub warm_up: Vec<String>,
    /// Log format.
    #[arg(long, env = "QUIVER_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
    /// OTLP/HTTP collector base URL (e.g. http://127.0.0.1:4318): export
    /// trace spans there as protobuf (off by default).
    #[arg(long, env = "QUIVER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Chat upstream.
    #[command(flatten)]
    pub upstream: UpstreamArgs,
    /// Egress allowlist of the HTTP transports.
    #[command(flatten)]
    pub egress: EgressArgs,
}

/// Flags of the egress allowlist (shared by `quiver worker` and `quiver
/// registry`, whose tool previews obey it). No entry anywhere allows every
/// host; flags replace the config file's list of the same kind.
#[derive(Args, Debug, Default)]
pub struct EgressArgs {
    /// Host name (glob, `*` spans dots) HTTP MCP servers may be reached on
    /// (repeatable; comma-separated in the env) [default: every host, unless
    /// an allowlist is set].
    #[arg(
        long = "egress-allow-host",
        env = "QUIVER_EGRESS_ALLOW_HOST",
        value_delimiter = ','
    )]
    pub allow_hosts: Vec<String>,
    /// CIDR block every resolved address of an HTTP MCP server's host must
    /// lie in, unless the host name is allowed (repeatable; comma-separated
    /// in the env).
    #[arg(
        long = "egress-allow-cidr",
        env = "QUIVER_EGRESS_ALLOW_CIDR",
        value_delimiter = ','
    )]
    pub allow_cidrs: Vec<String>,
}

/// The egress allowlist from flags over the config file.
pub fn egress_policy(
    args: EgressArgs,
    file: EgressSection,
) -> anyhow::Result<quiver_mcp::egress::EgressPolicy> {
    let pick = |flags: Vec<String>, file: Vec<String>| if flags.is_empty() { file } else { flags };
    let hosts = pick(args.allow_hosts, file.allow_hosts);
    let cidrs = pick(args.allow_cidrs, file.allow_cidrs);
    Ok(quiver_mcp::egress::EgressPolicy::new(&hosts, &cidrs)?)
}

/// Flags naming the OpenAI-compatible upstream of `/v1/chat/completions`
/// (shared by `quiver worker` and `quiver dev`).
#[derive(Args, Debug, Default)]
pub struct UpstreamArgs {
    /// Base URL of the OpenAI-compatible chat API, e.g. https://api.openai.com/v1.
    #[arg(long, env = "QUIVER_UPSTREAM_URL")]
    pub upstream_url: Option<String>,
    /// Environment variable holding the upstream API key [default: OPENAI_API_KEY].
    #[arg(long, env = "QUIVER_UPSTREAM_API_KEY_ENV")]
    pub upstream_api_key_env: Option<String>,
}

/// Upstream options from flags over the config file; `None` when no URL is
/// configured (chat requests are then refused with 503).
pub fn upstream_options(
    args: UpstreamArgs,
    file: UpstreamSection,
) -> anyhow::Result<Option<UpstreamOptions>> {
    let Some(url) = args.upstream_url.or(file.url) else {
        return Ok(None);
    };
    let base_url = url::Url::parse(&url).with_context(|| format!("upstream url {url:?}"))?;
    let key_env = args
        .upstream_api_key_env
        .or(file.api_key_env)
        .unwrap_or_else(|| "OPENAI_API_KEY".to_owned());
    let mut options = UpstreamOptions::new(base_url);
    // Local providers need no key: an unset variable sends none.
    options.api_key = std::env::var(&key_env).ok().filter(|key| !key.is_empty());
    if let Some(retries) = file.max_retries {
        options.max_retries = retries;
    }
    if let Some(secs) = file.request_timeout_secs {
        options.request_timeout = Duration::from_secs(secs);
    }
    if let Some(secs) = file.connect_timeout_secs {
        options.connect_timeout = Duration::from_secs(secs);
    }
    if let Some(secs) = file.max_retry_after_secs {
        options.max_retry_after = Duration::from_secs(secs);
    }
    Ok(Some(options))
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
    let catalog_wait = file
        .pool
        .catalog_wait_ms
        .map_or(DEFAULT_CATALOG_WAIT, Duration::from_millis);
    let pool_defaults = PoolOptions::default();
    let pool = PoolOptions {
        max_inflight_calls: file
            .pool
            .max_inflight_calls
            .unwrap_or(pool_defaults.max_inflight_calls),
        max_child_processes: file
            .pool
            .max_child_processes
            .unwrap_or(pool_defaults.max_child_processes),
        initialize_timeout: file
            .pool
            .initialize_timeout_ms
            .map_or(pool_defaults.initialize_timeout, Duration::from_millis),
        idle_timeout: match file.pool.idle_timeout_secs {
            Some(0) => None,
            Some(secs) => Some(Duration::from_secs(secs)),
            None => pool_defaults.idle_timeout,
        },
        tools_ttl: file
            .pool
            .tools_ttl_secs
            .map_or(pool_defaults.tools_ttl, Duration::from_secs),
        egress: egress_policy(args.egress, file.egress)?,
        ..pool_defaults
    };
    let warm_up = if args.warm_up.is_empty() {
        file.warm_up
    } else {
        args.warm_up
    };
    let registry_url = args
        .registry
        .or(file.registry)
        .unwrap_or_else(|| "http://127.0.0.1:50051".to_owned());
    let registry_ca = config::registry_ca(
        args.registry_ca
            .or_else(|| {
                file.registry_ca
                    .map(|path| config::relative_to(args.config.as_deref(), path))
            })
            .as_deref(),
    )?;
    if registry_ca.is_some() && !registry_url.starts_with("https://") {
        bail!("--registry-ca needs an https:// --registry (got {registry_url})");
    }
    let options = WorkerOptions {
        http_listen: args
            .http_listen
            .or(file.http_listen)
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8090))),
        sync: SyncOptions {
            registry_url,
            token: token.or(file.token),
            registry_ca,
            worker_id: args
                .worker_id
                .or(file.worker_id)
                .unwrap_or_else(default_worker_id),
            ..SyncOptions::default()
        },
        pool,
        callers: CallersConfig {
            callers,
            tasks: file.tasks,
            insecure_no_auth: args.insecure_no_auth || file.insecure_no_auth.unwrap_or(false),
        },
        warm_up,
        shutdown_grace: Duration::from_secs(10),
        metrics: None,
        upstream: upstream_options(args.upstream, file.upstream)?,
        audit: file.audit.into_options(),
        catalog_wait,
        tls: config::server_tls(
            args.tls_cert,
            args.tls_key,
            file.tls,
            args.config.as_deref(),
        )?,
    };
    let log = LogSettings::layered(args.log_format, args.otlp_endpoint, file.log)?;
    Ok((options, log))
}

/// Runs `quiver worker`.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let (mut options, log) = options(args)?;
    let tracing_guard = telemetry::init_tracing(&log, "quiver-worker")?;
    options.metrics = Some(telemetry::init_metrics()?);
    let shutdown = CancellationToken::new();
    tokio::spawn(super::registry::shutdown_on_signal(shutdown.clone()));
    let served = serve(options, shutdown).await;
    tracing_guard.shutdown();
    served
}

/// Starts a worker and serves it until `shutdown`.
pub async fn serve(options: WorkerOptions, shutdown: CancellationToken) -> anyhow::Result<()> {
    let registry = options.sync.registry_url.clone();
    let tls = options.tls.is_some();
    let worker = Worker::start(options, shutdown)
        .await
        .context("starting the worker")?;
    tracing::info!(http = %worker.http_addr(), registry = %registry, tls, "quiver worker listening");
    worker.run().await?;
    tracing::info!("quiver worker stopped");
    Ok(())
}
