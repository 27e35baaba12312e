//! `quiver mcp probe URL`: connects to a streamable-HTTP MCP server as a
//! worker would, authorizing with OAuth when the server asks for it
//! (`quiver_mcp::oauth`), runs `initialize` and `tools/list` (and one call
//! with `--call`), prints what it got as JSON and exits non-zero on failure,
//! naming the step that failed.
//!
//! A 401 from the server starts the authorization from its challenge; a 403
//! `insufficient_scope` on a later request authorizes again with the scopes
//! the new challenge names (step-up), at most [`MAX_AUTHORIZATIONS`] times.

use std::future::Future;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use quiver_mcp::connection::ClientSide;
use quiver_mcp::lifecycle::Handshake;
use quiver_mcp::oauth::{Consent, OAuthClient, authorize};
use quiver_mcp::server_log::ServerLog;
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::ClientServiceExt;
use rmcp::service::{Peer, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

/// Authorizations one probe runs at most (the first and the step-ups).
const MAX_AUTHORIZATIONS: usize = 3;

/// `quiver mcp …`.
#[derive(Args, Debug)]
pub struct McpArgs {
    #[command(subcommand)]
    command: McpCommand,
}

#[derive(Subcommand, Debug)]
enum McpCommand {
    /// Connect to an MCP server (OAuth if it asks), list its tools, optionally call one.
    Probe(ProbeArgs),
}

/// Flags of `quiver mcp probe`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// The server's streamable-HTTP endpoint.
    url: String,
    /// Call this tool after listing.
    #[arg(long)]
    call: Option<String>,
    /// Arguments of the call, a JSON object.
    #[arg(long, requires = "call")]
    args: Option<String>,
    /// A pre-registered OAuth client id (else a metadata document or
    /// dynamic registration).
    #[arg(long)]
    oauth_client_id: Option<String>,
    /// The pre-registered client's secret.
    #[arg(
        long,
        requires = "oauth_client_id",
        env = "QUIVER_OAUTH_CLIENT_SECRET",
        hide_env_values = true
    )]
    oauth_client_secret: Option<String>,
    /// An HTTPS URL of a client ID metadata document (used when the
    /// authorization server supports them).
    #[arg(long)]
    oauth_client_metadata_url: Option<String>,
    /// Scopes to ask for (repeatable) [default: what the server suggests].
    #[arg(long = "oauth-scope")]
    oauth_scopes: Vec<String>,
    /// Where the authorization server redirects with the code.
    #[arg(long, default_value = "http://127.0.0.1:8976/callback")]
    oauth_redirect_uri: String,
    /// Follow the authorization redirect without a browser (for servers
    /// that approve at once), instead of printing the URL and reading back
    /// where the browser landed.
    #[arg(long)]
    oauth_auto_authorize: bool,
}

/// Runs `quiver mcp …`.
pub async fn run(args: McpArgs) -> anyhow::Result<()> {
    match args.command {
        McpCommand::Probe(args) => probe(args).await,
    }
}

type Client = RunningService<RoleClient, ClientSide>;

/// How the probe opens: the newest revision the server offers
/// (`server/discover`, MCP 2026-07-28), else the `initialize` handshake.
const NEWEST: Handshake = Handshake::newest(quiver_model::Transport::StreamableHttp);

/// A connection, authorized with `challenge` when there is one.
async fn connect(
    args: &ProbeArgs,
    challenge: Option<&str>,
    http: &reqwest::Client,
) -> anyhow::Result<Client> {
    let side = ClientSide::standalone(ServerLog::new("probe"));
    let config = StreamableHttpClientTransportConfig::with_uri(args.url.clone());
    let Some(challenge) = challenge else {
        let transport = StreamableHttpClientTransport::with_client(http.clone(), config);
        return Ok(side
            .serve_with_lifecycle(NEWEST.probe(transport), NEWEST.mode())
            .await?);
    };
    let client = OAuthClient {
        client_id: args.oauth_client_id.clone(),
        client_secret: args.oauth_client_secret.clone(),
        client_metadata_url: args.oauth_client_metadata_url.clone(),
        scopes: args.oauth_scopes.clone(),
        redirect_uri: args.oauth_redirect_uri.clone(),
    };
    let consent = if args.oauth_auto_authorize {
        Consent::Automatic
    } else {
        Consent::Interactive
    };
    let authorized = authorize(&args.url, Some(challenge), &client, consent, http.clone()).await?;
    let transport = StreamableHttpClientTransport::with_client(authorized, config);
    side.serve_with_lifecycle(NEWEST.probe(transport), NEWEST.mode())
        .await
        .context("initialize (authorized)")
}

/// Runs `request` on the connection, authorizing again (step-up) when the
/// server answers with a challenge; gives up after [`MAX_AUTHORIZATIONS`].
async fn with_authorization<T, F, Fut>(
    args: &ProbeArgs,
    http: &reqwest::Client,
    client: &mut Client,
    authorizations: &mut usize,
    what: &str,
    request: F,
) -> anyhow::Result<T>
where
    F: Fn(Peer<RoleClient>) -> Fut,
    Fut: Future<Output = Result<T, ServiceError>>,
{
    loop {
        let err = match request(client.peer().clone()).await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        let Some(challenge) = err.auth_challenge().map(str::to_owned) else {
            return Err(anyhow::Error::new(err).context(what.to_owned()));
        };
        if *authorizations >= MAX_AUTHORIZATIONS {
            bail!("{what}: still refused after {MAX_AUTHORIZATIONS} authorizations: {challenge}");
        }
        *authorizations += 1;
        *client = connect(args, Some(&challenge), http).await?;
    }
}

async fn probe(args: ProbeArgs) -> anyhow::Result<()> {
    let arguments: Option<JsonObject> = match &args.args {
        Some(text) => Some(serde_json::from_str(text).context("--args must be a JSON object")?),
        None => None,
    };
    let http = quiver_mcp::egress::http_client_builder()
        .build()
        .context("building the HTTP client")?;
    let mut authorizations = 0;
    let mut client = match connect(&args, None, &http).await {
        Ok(client) => client,
        Err(err) => {
            let challenge = err
                .downcast_ref::<rmcp::service::ClientInitializeError>()
                .and_then(|err| err.auth_challenge())
                .map(str::to_owned);
            let Some(challenge) = challenge else {
                return Err(err.context(format!("initialize {}", args.url)));
            };
            authorizations += 1;
            connect(&args, Some(&challenge), &http).await?
        }
    };
    let info = client.peer().peer_info();
    let tools = with_authorization(
        &args,
        &http,
        &mut client,
        &mut authorizations,
        "tools/list",
        |peer| async move { peer.list_all_tools().await },
    )
    .await?;
    let mut report = json!({
        "server": info.as_ref().and_then(|i| i.server_info.as_ref()).map(|i| &i.name),
        "protocol_version": info.as_ref().map(|i| i.protocol_version.to_string()),
        "tools": tools.iter().map(|t| t.name.to_string()).collect::<Vec<_>>(),
        "authorizations": authorizations,
    });
    if let Some(name) = &args.call {
        let call = |peer: Peer<RoleClient>| {
            let mut params = CallToolRequestParams::new(name.clone());
            params.arguments = arguments.clone();
            async move { peer.call_tool(params).await }
        };
        let result = with_authorization(
            &args,
            &http,
            &mut client,
            &mut authorizations,
            "tools/call",
            call,
        )
        .await?;
        report["call"] = serde_json::to_value(&result).unwrap_or(Value::Null);
        report["authorizations"] = json!(authorizations);
        let _ = client.cancel().await;
        println!("{report}");
        if result.is_error == Some(true) {
            bail!("tools/call {name}: the tool answered isError");
        }
        return Ok(());
    }
    let _ = client.cancel().await;
    println!("{report}");
    Ok(())
}
