//! `quiver registry`: the control plane.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use quiver_model::Strictness;
use quiver_registry::auth::AuthConfig;
use quiver_registry::feed::FeedOptions;
use quiver_registry::oauth::seal::Keyring;
use quiver_registry::state::BootstrapDir;
use quiver_registry::{
    ApprovalOptions, CatalogOptions, DEFAULT_GRPC_LISTEN, DEFAULT_HTTP_LISTEN, OAuthOptions,
    Registry, RegistryOptions,
};
use tokio_util::sync::CancellationToken;

use super::flags::{EgressFlags, ListenerFlags, LogFlags, TlsFlags};
use super::signals::{shutdown_on_signal, take_over_sighup};
use crate::config::{self, RegistryFile};
use crate::telemetry::{self, LogSettings};

/// Store of a registry given no `--database-url`.
const DEFAULT_DATABASE_URL: &str = "sqlite://quiver.db";

/// Flags of `quiver registry` (environment variables as in the README's table).
#[derive(Args, Debug, Default)]
pub struct RegistryArgs {
    /// TOML config file (see config/registry.toml).
    #[arg(long, env = "QUIVER_CONFIG")]
    pub config: Option<PathBuf>,
    /// Database URL: sqlite://… or postgres://user@host/db.
    #[arg(long, env = "QUIVER_DATABASE_URL",
        help = format!("Database URL: sqlite://… or postgres://user@host/db [default: {DEFAULT_DATABASE_URL}]"))]
    pub database_url: Option<String>,
    /// gRPC listen address.
    #[arg(long, env = "QUIVER_GRPC_LISTEN",
        help = format!("gRPC listen address [default: {DEFAULT_GRPC_LISTEN}]"))]
    pub grpc_listen: Option<SocketAddr>,
    /// HTTP listen address for the admin API, metrics and health.
    #[arg(long, env = "QUIVER_REGISTRY_HTTP_LISTEN",
        help = format!("HTTP listen address for the admin API, metrics and health [default: {DEFAULT_HTTP_LISTEN}]"))]
    pub http_listen: Option<SocketAddr>,
    /// Directory of mcp.d server files to load and keep in sync.
    #[arg(long, env = "QUIVER_MCP_DIR")]
    pub mcp_dir: Option<PathBuf>,
    /// Directory of policies.d files (policies and identity providers) to
    /// load and keep in sync, with mcp.d.
    #[arg(long, env = "QUIVER_POLICIES_DIR")]
    pub policies_dir: Option<PathBuf>,
    /// Admin token (read and write); prefer QUIVER_ADMIN_TOKEN or
    /// --admin-token-file (flags are visible in `ps`).
    #[arg(long, env = "QUIVER_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// File holding the admin token (trimmed).
    #[arg(long, env = "QUIVER_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// Worker token (read and status reports); prefer QUIVER_WORKER_TOKEN or
    /// --worker-token-file.
    #[arg(long, env = "QUIVER_WORKER_TOKEN", hide_env_values = true)]
    pub worker_token: Option<String>,
    /// File holding the worker token (trimmed).
    #[arg(long, env = "QUIVER_WORKER_TOKEN_FILE")]
    pub worker_token_file: Option<PathBuf>,
    /// Editor token: reads, and writes MCP server records (not OAuth
    /// connections, not approvals); prefer QUIVER_EDITOR_TOKEN or
    /// --editor-token-file.
    #[arg(long, env = "QUIVER_EDITOR_TOKEN", hide_env_values = true)]
    pub editor_token: Option<String>,
    /// File holding the editor token (trimmed).
    #[arg(long, env = "QUIVER_EDITOR_TOKEN_FILE")]
    pub editor_token_file: Option<PathBuf>,
    /// Viewer token: reads only (records masked, history, audit, workers,
    /// approvals, OAuth connection status); prefer QUIVER_VIEWER_TOKEN or
    /// --viewer-token-file.
    #[arg(long, env = "QUIVER_VIEWER_TOKEN", hide_env_values = true)]
    pub viewer_token: Option<String>,
    /// File holding the viewer token (trimmed).
    #[arg(long, env = "QUIVER_VIEWER_TOKEN_FILE")]
    pub viewer_token_file: Option<PathBuf>,
    /// Approver token: may only read and decide approvals (REST and web
    /// admin); prefer QUIVER_APPROVER_TOKEN or --approver-token-file.
    #[arg(long, env = "QUIVER_APPROVER_TOKEN", hide_env_values = true)]
    pub approver_token: Option<String>,
    /// File holding the approver token (trimmed).
    #[arg(long, env = "QUIVER_APPROVER_TOKEN_FILE")]
    pub approver_token_file: Option<PathBuf>,
    /// How long an approval waits for its decision and then for its one use.
    #[arg(long, env = "QUIVER_APPROVAL_TTL_SECS",
        value_parser = clap::value_parser!(u64).range(1..=86_400),
        help = format!("How long an approval waits for its decision and then its use, in seconds [default: {}]",
            quiver_registry::approvals::DEFAULT_APPROVAL_TTL.as_secs()))]
    pub approval_ttl_secs: Option<u64>,
    /// The most pending approvals one caller may have.
    #[arg(long, env = "QUIVER_MAX_PENDING_APPROVALS",
        value_parser = clap::value_parser!(u32).range(1..=100_000),
        help = format!("The most pending approvals one caller may have; beyond, requests are refused (resource_exhausted) [default: {}]",
            quiver_registry::approvals::DEFAULT_MAX_PENDING_PER_CALLER))]
    pub max_pending_approvals: Option<u32>,
    /// How long finished approvals are kept after their expiry.
    #[arg(long, env = "QUIVER_APPROVAL_RETENTION_SECS",
        value_parser = clap::value_parser!(u64).range(1..=31_536_000),
        help = format!("How long denied, used and expired approvals are kept after their expiry, in seconds [default: {}]",
            quiver_registry::approvals::DEFAULT_APPROVAL_RETENTION.as_secs()))]
    pub approval_retention_secs: Option<u64>,
    /// How long usage rows are kept, in days.
    #[arg(long, env = "QUIVER_USAGE_RETENTION_DAYS",
        value_parser = clap::value_parser!(u64).range(1..=3650),
        help = format!("How long usage counts of tool calls are kept, in days [default: {}]",
            quiver_registry::usage::DEFAULT_USAGE_RETENTION.as_secs() / 86_400))]
    pub usage_retention_days: Option<u64>,
    /// Keys sealing OAuth secrets and tokens at rest: `ID:BASE64` (32
    /// bytes), several separated by commas or newlines, the first sealing;
    /// prefer --oauth-key-file.
    #[arg(long, env = "QUIVER_OAUTH_KEYS", hide_env_values = true)]
    pub oauth_keys: Option<String>,
    /// File holding the OAuth keys, one `ID:BASE64` per line (first seals).
    #[arg(long, env = "QUIVER_OAUTH_KEY_FILE")]
    pub oauth_key_file: Option<PathBuf>,
    /// The registry's URL as browsers reach it, for OAuth redirects
    /// (default: the HTTP listener's address).
    #[arg(long, env = "QUIVER_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Reverse-DNS namespace of the `/v0.1/servers` entry names
    /// (`<namespace>/<server_id>`).
    #[arg(long, env = "QUIVER_CATALOG_NAMESPACE",
        help = format!("Reverse-DNS namespace of the /v0.1/servers entry names, <namespace>/<server_id> [default: {}]",
            quiver_registry::catalog::DEFAULT_NAMESPACE))]
    pub catalog_namespace: Option<String>,
    /// The workers' public URL: `/v0.1/servers` entries point at
    /// `{URL}/mcp/{server_id}` (without it the catalog answers 503).
    #[arg(long, env = "QUIVER_CATALOG_WORKER_URL")]
    pub catalog_worker_url: Option<String>,
    /// Serve `/v0.1/servers` without credentials.
    #[arg(long, env = "QUIVER_CATALOG_ANONYMOUS")]
    pub catalog_anonymous: bool,
    /// Serve without credentials; only allowed on loopback listeners.
    #[arg(long, env = "QUIVER_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// Reject unknown fields and any invalid mcp.d or policies.d file.
    #[arg(long, env = "QUIVER_STRICT")]
    pub strict: bool,
    /// Validate mcp.d and policies.d and print the changes they would make,
    /// then exit.
    #[arg(long)]
    pub dry_run: bool,
    /// Periodic mcp.d and policies.d rescan in seconds, 0 to disable.
    #[arg(long, env = "QUIVER_RESCAN_INTERVAL_SECS",
        help = format!("Periodic mcp.d and policies.d rescan in seconds, 0 to disable [default: {}]",
            RegistryOptions::default().rescan_interval.map_or(0, |every| every.as_secs())))]
    pub rescan_interval_secs: Option<u64>,
    /// Watch heartbeat period in seconds.
    #[arg(long, env = "QUIVER_HEARTBEAT_SECS",
        help = format!("Watch heartbeat period in seconds [default: {}]",
            FeedOptions::default().heartbeat.as_secs()))]
    pub heartbeat_secs: Option<u64>,
    /// TLS of the gRPC and HTTP listeners.
    #[command(flatten)]
    pub tls: TlsFlags,
    /// Timeouts and connection cap of the gRPC and HTTP listeners.
    #[command(flatten)]
    pub listener: ListenerFlags,
    /// Logging and trace export.
    #[command(flatten)]
    pub log: LogFlags,
    /// Egress allowlist of tool previews (as on workers).
    #[command(flatten)]
    pub egress: EgressFlags,
}

/// Everything `quiver registry` needs, after layering.
pub struct RegistrySettings {
    /// Store URL.
    pub database_url: String,
    /// Server options.
    pub options: RegistryOptions,
    /// Log format and trace export.
    pub log: LogSettings,
}

/// Layers defaults < config file < env < flags.
pub fn settings(args: RegistryArgs) -> anyhow::Result<RegistrySettings> {
    let file: RegistryFile = config::load(args.config.as_deref())?;
    let defaults = RegistryOptions::default();
    let strictness = if args.strict || file.mcp.strict.unwrap_or(false) {
        Strictness::Strict
    } else {
        Strictness::Lenient
    };
    // Flag or variable, else the config file's key (relative to the file).
    let bootstrap_dir = |flag: Option<PathBuf>, key: Option<PathBuf>| {
        flag.or_else(|| key.map(|dir| config::relative_to(args.config.as_deref(), dir)))
            .map(|path| BootstrapDir { path, strictness })
    };
    let mcp_dir = bootstrap_dir(args.mcp_dir, file.mcp.dir);
    let policies_dir = bootstrap_dir(args.policies_dir, file.mcp.policies_dir);
    let rescan_interval = match args.rescan_interval_secs.or(file.mcp.rescan_interval_secs) {
        Some(0) => None,
        Some(secs) => Some(Duration::from_secs(secs)),
        None => defaults.rescan_interval,
    };
    let retention = file.change_log_retention.or(defaults.change_log_retention);
    let admin_token = config::token_or_file(
        args.admin_token,
        "--admin-token",
        args.admin_token_file.as_deref(),
        "--admin-token-file",
    )?;
    let worker_token = config::token_or_file(
        args.worker_token,
        "--worker-token",
        args.worker_token_file.as_deref(),
        "--worker-token-file",
    )?;
    let editor_token = config::token_or_file(
        args.editor_token,
        "--editor-token",
        args.editor_token_file.as_deref(),
        "--editor-token-file",
    )?;
    let viewer_token = config::token_or_file(
        args.viewer_token,
        "--viewer-token",
        args.viewer_token_file.as_deref(),
        "--viewer-token-file",
    )?;
    let approver_token = config::token_or_file(
        args.approver_token,
        "--approver-token",
        args.approver_token_file.as_deref(),
        "--approver-token-file",
    )?;
    let oauth_keys = config::token_or_file(
        args.oauth_keys,
        "--oauth-keys",
        args.oauth_key_file.as_deref(),
        "--oauth-key-file",
    )?;
    let approval_ttl_secs = args.approval_ttl_secs.or(file.approval_ttl_secs);
    if approval_ttl_secs.is_some_and(|secs| !(1..=86_400).contains(&secs)) {
        anyhow::bail!("approval_ttl_secs must be 1 to 86400");
    }
    let options = RegistryOptions {
        grpc_listen: args
            .grpc_listen
            .or(file.grpc_listen)
            .unwrap_or(defaults.grpc_listen),
        http_listen: args
            .http_listen
            .or(file.http_listen)
            .unwrap_or(defaults.http_listen),
        auth: AuthConfig {
            admin_token: admin_token.or(file.admin_token),
            worker_token: worker_token.or(file.worker_token),
            editor_token: editor_token.or(file.editor_token),
            viewer_token: viewer_token.or(file.viewer_token),
            insecure_no_auth: args.insecure_no_auth || file.insecure_no_auth.unwrap_or(false),
        },
        mcp_dir,
        policies_dir,
        rescan_interval,
        feed: FeedOptions {
            heartbeat: args
                .heartbeat_secs
                .or(file.heartbeat_secs)
                .map_or(defaults.feed.heartbeat, |secs| {
                    Duration::from_secs(secs.max(1))
                }),
            ..defaults.feed
        },
        change_log_retention: retention.filter(|&n| n > 0),
        preview_egress: args.egress.policy(file.egress)?,
        tls: args.tls.server_tls(file.tls, args.config.as_deref())?,
        listener: args.listener.options(file.listener),
        approvals: ApprovalOptions {
            approver_token: approver_token.or(file.approver_token),
            ttl: approval_ttl_secs.map_or(defaults.approvals.ttl, Duration::from_secs),
            max_pending_per_caller: args
                .max_pending_approvals
                .or(file.max_pending_approvals)
                .unwrap_or(defaults.approvals.max_pending_per_caller)
                .max(1),
            retention: args
                .approval_retention_secs
                .or(file.approval_retention_secs)
                .map_or(defaults.approvals.retention, |secs| {
                    Duration::from_secs(secs.max(1))
                }),
        },
        usage_retention: args
            .usage_retention_days
            .or(file.usage_retention_days)
            .map_or(defaults.usage_retention, |days| {
                Duration::from_secs(days.max(1) * 86_400)
            }),
        oauth: OAuthOptions {
            keyring: oauth_keys
                .as_deref()
                .map(Keyring::parse)
                .transpose()
                .context("--oauth-keys / --oauth-key-file")?,
            public_url: args.public_url.or(file.public_url),
        },
        catalog: CatalogOptions {
            namespace: args
                .catalog_namespace
                .or(file.catalog.namespace)
                .unwrap_or(defaults.catalog.namespace),
            worker_url: args.catalog_worker_url.or(file.catalog.worker_url),
            anonymous: args.catalog_anonymous || file.catalog.anonymous.unwrap_or(false),
        },
        ..defaults
    };
    Ok(RegistrySettings {
        database_url: args
            .database_url
            .or(file.database_url)
            .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned()),
        options,
        log: args.log.settings(file.log)?,
    })
}

/// Runs `quiver registry`.
pub async fn run(args: RegistryArgs) -> anyhow::Result<()> {
    let dry_run = args.dry_run;
    if !dry_run {
        take_over_sighup();
    }
    let settings = settings(args)?;
    let tracing_guard = telemetry::init_tracing(&settings.log, "quiver-registry")?;
    let store = quiver_store::open(&settings.database_url)
        .await
        .with_context(|| format!("opening store {}", redact_url(&settings.database_url)))?;
    if dry_run {
        return dry_run_plans(store.as_ref(), &settings.options).await;
    }
    let mut options = settings.options;
    options.metrics = Some(telemetry::init_metrics()?);
    let served = serve(store, options, "registry").await;
    tracing_guard.shutdown();
    served
}

/// `--dry-run`: the plan of each configured directory, `mcp.d` then
/// `policies.d`, each under a heading naming it; scan warnings and invalid
/// files (lenient mode) on stderr. Writes nothing.
async fn dry_run_plans(
    store: &dyn quiver_store::Store,
    options: &RegistryOptions,
) -> anyhow::Result<()> {
    if options.mcp_dir.is_none() && options.policies_dir.is_none() {
        anyhow::bail!(
            "--dry-run needs an mcp.d or policies.d directory (--mcp-dir, --policies-dir)"
        );
    }
    if let Some(dir) = &options.mcp_dir {
        let scan = quiver_bootstrap::scan(&dir.path, dir.strictness)?;
        print_scan_notes(&dir.path, &scan);
        let plan = quiver_bootstrap::plan(store, &scan).await?;
        println!("# mcp.d {}", dir.path.display());
        print!("{}", plan.render());
    }
    if let Some(dir) = &options.policies_dir {
        let scan = quiver_bootstrap::policies::scan(&dir.path, dir.strictness)?;
        print_scan_notes(&dir.path, &scan);
        let plan = quiver_bootstrap::policies::plan(store, &scan).await?;
        println!("# policies.d {}", dir.path.display());
        print!("{}", plan.render());
    }
    Ok(())
}

fn print_scan_notes<R>(dir: &std::path::Path, scan: &quiver_bootstrap::Scan<R>) {
    for warning in &scan.warnings {
        eprintln!("warning: {warning}");
    }
    for error in &scan.errors {
        eprintln!("error: {}", error.display_in(dir));
    }
}

/// Starts a registry and serves it until Ctrl-C or SIGTERM.
pub async fn serve(
    store: std::sync::Arc<dyn quiver_store::Store>,
    options: RegistryOptions,
    banner: &str,
) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let registry = Registry::start(store, options, shutdown.clone()).await?;
    tracing::info!(
        grpc = %registry.grpc_addr(),
        http = %registry.http_addr(),
        insecure = registry.is_insecure(),
        tls = registry.is_tls(),
        "quiver {banner} listening"
    );
    if registry.is_insecure() {
        tracing::warn!(
            "running WITHOUT authentication (--insecure-no-auth): loopback only, every caller is admin"
        );
    }
    tokio::spawn(shutdown_on_signal(shutdown));
    registry.run().await?;
    tracing::info!("quiver {banner} stopped");
    Ok(())
}

/// The URL without its password, for messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{}:***{}", &url[..scheme_end + 3], user, &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_file() {
        let args = RegistryArgs {
            config: Some(PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../config/registry.toml"
            ))),
            http_listen: Some("127.0.0.1:9999".parse().unwrap()),
            ..Default::default()
        };
        let settings = settings(args).unwrap();
        assert_eq!(settings.options.http_listen.port(), 9999);
        assert_eq!(settings.options.grpc_listen, DEFAULT_GRPC_LISTEN);
        let dir = settings.options.mcp_dir.unwrap().path;
        assert!(
            dir.ends_with("config/./mcp.d") || dir.ends_with("config/mcp.d"),
            "{}",
            dir.display()
        );
        let policies = settings.options.policies_dir.unwrap();
        assert!(
            policies.path.ends_with("config/policies.d"),
            "{}",
            policies.path.display()
        );
        assert_eq!(policies.strictness, Strictness::Lenient);
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("sqlite://quiver.db"), "sqlite://quiver.db");
    }
}
