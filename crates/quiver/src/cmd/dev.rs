//! `quiver dev`: the whole system on one machine, offline, with no set-up:
//! the registry on the embedded SQLite store, `config/mcp.d` loaded, and no
//! credentials (loopback only, announced in the start-up banner).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use quiver_model::Strictness;
use quiver_registry::RegistryOptions;
use quiver_registry::auth::AuthConfig;
use quiver_registry::state::McpDir;

use crate::telemetry::{self, LogFormat};

/// Flags of `quiver dev`.
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
    /// gRPC listen address (must be loopback).
    #[arg(long, env = "QUIVER_GRPC_LISTEN", default_value = "127.0.0.1:50051")]
    pub grpc_listen: SocketAddr,
    /// HTTP listen address (must be loopback).
    #[arg(long, env = "QUIVER_HTTP_LISTEN", default_value = "127.0.0.1:8080")]
    pub http_listen: SocketAddr,
    /// Log format.
    #[arg(long, env = "QUIVER_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// Runs `quiver dev`.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    super::registry::take_over_sighup();
    telemetry::init_logging(args.log_format);
    let store = quiver_store::open(&args.database_url)
        .await
        .with_context(|| format!("opening {}", args.database_url))?;
    let options = RegistryOptions {
        grpc_listen: args.grpc_listen,
        http_listen: args.http_listen,
        auth: AuthConfig {
            insecure_no_auth: true,
            ..Default::default()
        },
        mcp_dir: Some(McpDir {
            path: args.mcp_dir.clone(),
            strictness: Strictness::Lenient,
        }),
        rescan_interval: Some(Duration::from_secs(5)),
        metrics: Some(telemetry::init_metrics()?),
        ..Default::default()
    };
    eprintln!(
        "quiver dev: registry on {} with {} loaded\n  gRPC  http://{}   (quiver servers list)\n  HTTP  http://{}/admin/api/mcp/servers\n  AUTHENTICATION DISABLED (--insecure-no-auth): loopback only, every caller is admin",
        args.database_url,
        args.mcp_dir.display(),
        args.grpc_listen,
        args.http_listen,
    );
    super::registry::serve(store, options, "dev").await
}
