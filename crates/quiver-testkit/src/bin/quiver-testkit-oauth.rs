//! `quiver-testkit-oauth`: an OAuth 2.1 authorization server and the MCP
//! server it protects (`quiver_testkit::oauth_server`) as a process.
//!
//! Serves both on `--listen ADDR` and prints one line once bound,
//! `{"listening":"http://ADDR","mcp":"http://ADDR/mcp"}`: the issuer and the
//! protected MCP endpoint. Logs go to stderr. The issuer is also a test
//! OpenID Connect provider (`quiver_testkit::oidc_issuer`: discovery, JWKS,
//! `POST /admin/oidc/mint` and `/admin/oidc/rotate`), and signs people in:
//! a code granted for scope `openid` also yields an `id_token` with the
//! claims of `POST /admin/oidc/person`, for clients such as the registry's
//! web admin pre-registered as public clients by `POST /admin/clients`.
//! Each token belongs to a user: `/authorize` approves for the auto user
//! (`POST /admin/auto-user`), or with `--consent-page` asks for one on an
//! HTML form; the MCP tool `whoami_user` reports it.

use std::io::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use quiver_testkit::oauth_server::{Fault, OAuthServer, OAuthServerOptions, PreregisteredClient};

#[derive(Debug, Parser)]
#[command(about = "An OAuth 2.1 authorization server and an OAuth-protected MCP server, for tests")]
struct Args {
    /// Serve on this address (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: std::net::SocketAddr,
    /// A pre-registered confidential client, `ID:SECRET` (repeatable); it may
    /// redirect to any loopback URI.
    #[arg(long = "client", value_name = "ID:SECRET")]
    clients: Vec<PreregisteredClient>,
    /// Lifetime of access tokens, in seconds (`POST /admin/config` changes it).
    #[arg(long, default_value_t = 3600)]
    access_ttl_secs: u64,
    /// Misbehave at one step: bad-metadata, wrong-issuer, no-pkce,
    /// token-error or state-mismatch.
    #[arg(long, value_name = "NAME")]
    fault: Option<Fault>,
    /// Answer `/authorize` with a consent page asking for the user, instead
    /// of approving at once for the auto user.
    #[arg(long)]
    consent_page: bool,
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
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    let base = format!("http://{addr}");
    let server = OAuthServer::new(
        &base,
        OAuthServerOptions {
            clients: args.clients,
            access_ttl: Duration::from_secs(args.access_ttl_secs),
            fault: args.fault,
            consent_page: args.consent_page,
        },
    );
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "{}",
        serde_json::json!({"listening": base, "mcp": server.resource_url()})
    )?;
    stdout.flush()?;
    drop(stdout);
    server.serve(listener).await
}
