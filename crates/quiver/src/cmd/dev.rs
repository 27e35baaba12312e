//! `quiver dev`: the whole system in one process, offline, with no set-up:
//! the registry on the embedded SQLite store with `config/mcp.d` loaded
//! (including the bundled example MCP server, `quiver mcp-example`) and
//! `config/policies.d` (example policies), and a worker following it. No credentials: loopback only, said in the banner.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use quiver_mcp::PoolOptions;
use quiver_model::Strictness;
use quiver_registry::auth::AuthConfig;
use quiver_registry::state::{BootstrapDir, PreviewEnv};
use quiver_registry::{
    CatalogOptions, DEFAULT_GRPC_LISTEN, DEFAULT_HTTP_LISTEN, Registry, RegistryOptions,
};
use quiver_sync::SyncOptions;
use quiver_worker::auth::CallersConfig;
use quiver_worker::{DEFAULT_HTTP_LISTEN as DEFAULT_WORKER_HTTP_LISTEN, Worker, WorkerOptions};
use tokio_util::sync::CancellationToken;

use super::flags::{LogFlags, UpstreamFlags};
use super::signals::{shutdown_on_signal, take_over_sighup};
use crate::config::{LogSection, UpstreamSection};
use crate::telemetry;

/// `mcp.d` and `policies.d` rescan period of `quiver dev`: edits show up
/// within seconds.
const DEV_RESCAN_INTERVAL: Duration = Duration::from_secs(5);

/// How long `quiver dev`'s worker waits for requests in flight at shutdown.
const DEV_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Flags of `quiver dev` (environment variables as in the README's table).
#[derive(Args, Debug)]
pub struct DevArgs {
    /// SQLite database of the dev registry.
    #[arg(
        long,
        env = "QUIVER_DATABASE_URL",
        default_value = "sqlite://quiver-dev.db"
    )]
    pub database_url: String,
    /// Directory of mcp.d server files.
    #[arg(long, env = "QUIVER_MCP_DIR", default_value = "config/mcp.d")]
    pub mcp_dir: PathBuf,
    /// Directory of policies.d files (policies and identity providers).
    #[arg(long, env = "QUIVER_POLICIES_DIR", default_value = "config/policies.d")]
    pub policies_dir: PathBuf,
    /// Registry gRPC listen address (must be loopback).
    #[arg(long, env = "QUIVER_GRPC_LISTEN", default_value_t = DEFAULT_GRPC_LISTEN)]
    pub grpc_listen: SocketAddr,
    /// Registry HTTP listen address (must be loopback).
    #[arg(long, env = "QUIVER_REGISTRY_HTTP_LISTEN", default_value_t = DEFAULT_HTTP_LISTEN)]
    pub http_listen: SocketAddr,
    /// Worker HTTP listen address (must be loopback).
    #[arg(
        long,
        env = "QUIVER_WORKER_HTTP_LISTEN",
        default_value_t = DEFAULT_WORKER_HTTP_LISTEN
    )]
    pub worker_http_listen: SocketAddr,
    /// Logging and trace export.
    #[command(flatten)]
    pub log: LogFlags,
    /// Chat upstream (none by default: dev stays offline).
    #[command(flatten)]
    pub upstream: UpstreamFlags,
}

/// The worker's environment, with the directory of this binary first on
/// `PATH`, so records whose command is `quiver` (the bundled example server)
/// run this very build.
fn env_with_own_dir_on_path() -> quiver_mcp::launch::EnvLookup {
    let own_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.display().to_string()));
    Arc::new(move |name| {
        let value = std::env::var(name).ok();
        match (name, &own_dir) {
            ("PATH", Some(dir)) => Some(match value {
                Some(path) if !path.is_empty() => format!("{dir}:{path}"),
                _ => dir.clone(),
            }),
            _ => value,
        }
    })
}

/// Runs `quiver dev`.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    take_over_sighup();
    let log = args.log.settings(LogSection::default())?;
    let tracing_guard = telemetry::init_tracing(&log, "quiver-dev")?;
    let metrics = telemetry::init_metrics()?;
    let store = quiver_store::open(&args.database_url)
        .await
        .with_context(|| format!("opening {}", args.database_url))?;
    let shutdown = CancellationToken::new();
    let registry = Registry::start(
        store,
        RegistryOptions {
            grpc_listen: args.grpc_listen,
            http_listen: args.http_listen,
            auth: AuthConfig {
                insecure_no_auth: true,
                ..Default::default()
            },
            mcp_dir: Some(BootstrapDir {
                path: args.mcp_dir.clone(),
                strictness: Strictness::Lenient,
            }),
            policies_dir: Some(BootstrapDir {
                path: args.policies_dir.clone(),
                strictness: Strictness::Lenient,
            }),
            rescan_interval: Some(DEV_RESCAN_INTERVAL),
            metrics: Some(metrics.clone()),
            preview_env: PreviewEnv(env_with_own_dir_on_path()),
            oauth: dev_oauth()?,
            catalog: CatalogOptions {
                worker_url: dev_worker_url(args.worker_http_listen),
                ..CatalogOptions::default()
            },
            ..Default::default()
        },
        shutdown.clone(),
    )
    .await?;
    let upstream = args.upstream.options(UpstreamSection::default())?;
    let upstream_note = upstream.as_ref().map_or_else(
        || "no upstream: pass --upstream-url".to_owned(),
        |u| format!("upstream {}", u.base_url),
    );
    let worker = Worker::start(
        WorkerOptions {
            http_listen: args.worker_http_listen,
            sync: SyncOptions {
                registry_urls: vec![format!("http://{}", registry.grpc_addr())],
                worker_id: "dev".to_owned(),
                ..SyncOptions::default()
            },
            pool: PoolOptions {
                env: env_with_own_dir_on_path(),
                ..PoolOptions::default()
            },
            callers: CallersConfig {
                insecure_no_auth: true,
                ..Default::default()
            },
            shutdown_grace: DEV_SHUTDOWN_GRACE,
            metrics: Some(metrics),
            upstream,
            ..WorkerOptions::default()
        },
        shutdown.clone(),
    )
    .await?;
    eprintln!(
        "quiver dev: registry on {db} with {dir} and {policies} loaded, and a worker\n  \
         registry gRPC  http://{grpc}   (quiver servers list)\n  \
         registry HTTP  http://{http}/admin/api/mcp/servers\n  \
         worker   HTTP  http://{worker}/v1/mcp/tools   /v1/chat/completions ({chat})\n  \
         worker   MCP   http://{worker}/mcp   /mcp/example   (streamable HTTP; quiver mcp-stdio --worker http://{worker})\n  \
         AUTHENTICATION DISABLED (--insecure-no-auth): loopback only, every caller is admin",
        db = args.database_url,
        dir = args.mcp_dir.display(),
        policies = args.policies_dir.display(),
        grpc = registry.grpc_addr(),
        http = registry.http_addr(),
        worker = worker.http_addr(),
        chat = upstream_note,
    );
    tokio::spawn(shutdown_on_signal(shutdown));
    let (registry, worker) = tokio::join!(registry.run(), worker.run());
    tracing_guard.shutdown();
    registry?;
    worker?;
    tracing::info!("quiver dev stopped");
    Ok(())
}

/// Where the catalog's entries point (`/v0.1/servers`): this process's
/// worker. The registry starts first, so a port picked by the system (0) is
/// not known yet: then the catalog has no worker URL (it answers 503).
fn dev_worker_url(listen: std::net::SocketAddr) -> Option<String> {
    if listen.port() == 0 {
        return None;
    }
    let mut reachable = listen;
    if listen.ip().is_unspecified() {
        reachable.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    Some(format!("http://{reachable}"))
}

/// The dev registry's OAuth keys: `QUIVER_OAUTH_KEYS` when set, else a key
/// made for this process (tokens it seals do not open after a restart: the
/// connection then asks to be connected again).
fn dev_oauth() -> anyhow::Result<quiver_registry::OAuthOptions> {
    use quiver_registry::oauth::seal::Keyring;
    let keyring = match std::env::var("QUIVER_OAUTH_KEYS") {
        Ok(keys) => Keyring::parse(&keys).context("QUIVER_OAUTH_KEYS")?,
        Err(_) => Keyring::ephemeral("dev"),
    };
    Ok(quiver_registry::OAuthOptions {
        keyring: Some(keyring),
        public_url: None,
    })
}
