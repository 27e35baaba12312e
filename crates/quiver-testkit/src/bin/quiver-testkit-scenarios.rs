//! `quiver-testkit-scenarios`: the conformance suite's scenario server
//! (`quiver_testkit::scenario_server`) as a process.
//!
//! `--listen ADDR`: streamable HTTP at `/mcp` with rmcp's default DNS-rebinding
//! protection (loopback hosts only); prints one line,
//! `{"listening":"http://ADDR/mcp"}`, once bound. Sessions that `initialize`
//! are kept; 2026-07-28 requests are served statelessly. `--stdio`: MCP on
//! stdin/stdout, opened by `initialize` or by 2026-07-28 requests
//! (`server/discover`). `--legacy`: offer only the revisions up to
//! 2025-11-25 (the last with `initialize`); `--stateless-only`: offer
//! 2026-07-28 alone (`initialize` is refused). Logs go to stderr.

use std::io::Write as _;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use quiver_testkit::scenario_server::{Revisions, ScenarioServer};
use rmcp::ServiceExt as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

#[derive(Debug, Parser)]
#[command(about = "The MCP conformance suite's scenario server")]
struct Args {
    /// Serve streamable HTTP on this address (port 0: any free port).
    #[arg(long, conflicts_with = "stdio")]
    listen: Option<std::net::SocketAddr>,
    /// Serve on stdin/stdout.
    #[arg(long)]
    stdio: bool,
    /// Offer only the protocol revisions up to 2025-11-25, the last with
    /// `initialize` (default: every revision, 2026-07-28 included).
    #[arg(long)]
    legacy: bool,
    /// Offer 2026-07-28 alone: `initialize` is refused.
    #[arg(long, conflicts_with = "legacy")]
    stateless_only: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let server = ScenarioServer::new(match (args.legacy, args.stateless_only) {
        (true, _) => Revisions::UpToInitialize,
        (_, true) => Revisions::OnlyStateless,
        _ => Revisions::AllKnown,
    });
    if args.stdio {
        let service = server
            .serve(rmcp::transport::stdio())
            .await
            .context("opening the session over stdio")?;
        service.waiting().await.context("serving stdio")?;
        return Ok(());
    }
    let listen = args.listen.context("give --listen ADDR or --stdio")?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?;
    let service: StreamableHttpService<ScenarioServer, LocalSessionManager> =
        StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default(),
        );
    let router = axum::Router::new().nest_service("/mcp", service);
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "{}",
        serde_json::json!({"listening": format!("http://{addr}/mcp")})
    )?;
    stdout.flush()?;
    drop(stdout);
    axum::serve(listener, router)
        .await
        .context("serving HTTP")?;
    Ok(())
}
