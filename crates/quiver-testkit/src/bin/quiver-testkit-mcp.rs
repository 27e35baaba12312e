//! `quiver-testkit-mcp`: the test MCP server of `quiver_example_mcp` (every
//! tool, every transport) as a standalone process, for tests that need a real child process or a
//! real HTTP peer.
//!
//! Stdout contract: with `--transport stdio` stdout carries only MCP
//! messages; with an HTTP transport the process prints exactly one line,
//! `{"listening":"http://HOST:PORT/PATH"}`, once the listener is bound, and
//! nothing else. Logs always go to stderr (`RUST_LOG`, default `warn`).

use std::{
    io::{IsTerminal as _, Write as _},
    time::Duration,
};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use quiver_example_mcp::http::serve_streamable_http;
use quiver_example_mcp::legacy_sse;
use quiver_example_mcp::server::{ExampleServer, Profile, serve_stdio};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Status the process exits with when `--exit-after-ms` elapses.
const EXIT_AFTER_STATUS: i32 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TransportArg {
    /// MCP over stdin/stdout.
    Stdio,
    /// MCP Streamable HTTP at `/mcp`.
    StreamableHttp,
    /// The legacy HTTP+SSE transport (2024-11-05): `GET /sse`, `POST /message`.
    Sse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ProfileArg {
    /// Every tool.
    Full,
    /// The friendly subset used by `quiver dev`.
    Example,
}

impl From<ProfileArg> for Profile {
    fn from(profile: ProfileArg) -> Self {
        match profile {
            ProfileArg::Full => Profile::Full,
            ProfileArg::Example => Profile::Example,
        }
    }
}

/// A real MCP server with test tools (echo, add, sleep, fail, crash, …).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// How to talk to the client.
    #[arg(long, value_enum, default_value_t = TransportArg::Stdio)]
    transport: TransportArg,
    /// Address to listen on for HTTP transports.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Which tools to offer.
    #[arg(long, value_enum, default_value_t = ProfileArg::Full)]
    profile: ProfileArg,
    /// Also offer N generated tools, `generated_000` … (for large catalogs).
    #[arg(long, value_name = "N", default_value_t = 0)]
    generated_tools: usize,
    /// Return `tools/list` in pages of at most N tools.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    page_size: Option<u64>,
    /// Delay every `initialize` answer by N ms (a slow-starting server).
    #[arg(long, value_name = "N")]
    slow_start_ms: Option<u64>,
    /// Exit the process (status 0) N ms after start, whatever it is doing.
    #[arg(long, value_name = "N")]
    exit_after_ms: Option<u64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| {
            // rmcp warns about the deliberately non-conforming tool names on
            // every start; that is the point of them, not news.
            EnvFilter::new("warn,rmcp::handler::server::tool_name_validation=error")
        }))
        .init();

    if let Some(ms) = args.exit_after_ms {
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            tracing::warn!("--exit-after-ms elapsed: exiting");
            std::process::exit(EXIT_AFTER_STATUS);
        });
    }

    let page_size = args
        .page_size
        .map(usize::try_from)
        .transpose()
        .context("--page-size is too large")?;
    let server = ExampleServer::new(args.profile.into())
        .with_generated_tools(args.generated_tools)
        .with_page_size(page_size)
        .with_slow_start(args.slow_start_ms.map(Duration::from_millis));

    match args.transport {
        TransportArg::Stdio => serve_stdio(server).await?,
        TransportArg::StreamableHttp => {
            let listener = bind_and_announce(&args.listen, "/mcp").await?;
            serve_streamable_http(move || server.clone(), listener, shutdown_on_signal()).await?;
        }
        TransportArg::Sse => {
            let listener = bind_and_announce(&args.listen, legacy_sse::SSE_PATH).await?;
            legacy_sse::serve(listener, move || server.clone(), shutdown_on_signal()).await?;
        }
    }
    Ok(())
}

/// Binds `listen` and prints the one stdout line HTTP transports promise.
async fn bind_and_announce(listen: &str, path: &str) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    let line = serde_json::json!({ "listening": format!("http://{addr}{path}") });
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}")?;
    stdout.flush()?;
    Ok(listener)
}

/// A token cancelled on Ctrl-C or SIGTERM, so HTTP sessions end cleanly.
fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let fire = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(err) => {
                    tracing::warn!("cannot watch SIGTERM: {err}");
                    let _ = ctrl_c.await;
                    fire.cancel();
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
        fire.cancel();
    });
    token
}
