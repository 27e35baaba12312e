//! `quiver mcp probe URL`: connects to a streamable-HTTP MCP server as a
//! worker would, authorizing with OAuth when the server asks for it
//! (`quiver_mcp::oauth`), runs `initialize` and `tools/list` (and the tools
//! named with `--call`, in order), prints what it got as JSON and exits
//! non-zero on failure, naming the step that failed.
//!
//! A 401 from the server starts the authorization from its challenge; a 403
//! `insufficient_scope` on a later request authorizes again with the scopes
//! granted before and those the new challenge names (step-up), at most
//! [`MAX_AUTHORIZATIONS`] times.
//!
//! The probe asks nobody, so it answers what a server asks of the client
//! itself ([`ProbeSide`]): the `input_required` rounds of MCP 2026-07-28 (the
//! call is sent again with the answers and the server's `requestState`, at
//! most [`MAX_INPUT_ROUNDS`] times), or the requests of older revisions.

use std::collections::HashSet;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use quiver_mcp::connection::ClientSide;
use quiver_mcp::lifecycle::Handshake;
use quiver_mcp::oauth::{Consent, OAuthClient, authorize, reauthorize};
use quiver_mcp::server_log::ServerLog;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationCapability, FormElicitationCapability, JsonObject,
    RootsCapabilities,
};
use rmcp::service::ClientServiceExt;
use rmcp::service::{ClientInitializeError, RequestContext, RunningService, ServiceError};
use rmcp::transport::AuthClient;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClient, StreamableHttpClientTransportConfig,
};
use rmcp::{ClientHandler, RoleClient};
use serde_json::{Value, json};

/// Authorizations one probe runs at most (the first and the step-ups).
const MAX_AUTHORIZATIONS: usize = 3;

/// `input_required` results one call is answered at most (as rmcp's own
/// helpers), so a server that keeps asking cannot hold the probe forever.
const MAX_INPUT_ROUNDS: usize = 10;

/// `quiver mcp …`.
#[derive(Args, Debug)]
pub struct McpArgs {
    #[command(subcommand)]
    command: McpCommand,
}

#[derive(Subcommand, Debug)]
enum McpCommand {
    /// Connect to an MCP server (OAuth if it asks), list its tools, optionally call some.
    Probe(ProbeArgs),
}

/// Flags of `quiver mcp probe`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// The server's streamable-HTTP endpoint.
    url: String,
    /// Call this tool after listing (repeatable: the calls run in order, and
    /// a tool the server does not list is not called).
    #[arg(long = "call", value_name = "NAME")]
    calls: Vec<String>,
    /// Arguments of a call, a JSON object: once per `--call`, in the same
    /// order, or never (no call has arguments).
    #[arg(long = "args", value_name = "JSON", requires = "calls")]
    args: Vec<String>,
    /// Accept the server's form elicitations with this JSON object as the
    /// content [default: decline them].
    #[arg(long, value_name = "JSON")]
    elicitation_content: Option<String>,
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

type Client = RunningService<RoleClient, ProbeSide>;

/// The probe's side of a connection: the worker's identity and protocol
/// version, and answers to what a server asks of the client, given without
/// a person: form elicitations are declined (or accepted with
/// `--elicitation-content`), URL elicitations declined, roots are none;
/// sampling is not offered (the probe has no model), so a server asking for
/// it anyway is answered "method not found" (rmcp's default).
struct ProbeSide {
    info: ClientConfig,
    elicitation_content: Option<JsonObject>,
}

impl ProbeSide {
    fn new(elicitation_content: Option<JsonObject>) -> Self {
        let mut info = ClientSide::standalone(ServerLog::new("probe")).get_info();
        let mut capabilities = ClientCapabilities::default();
        capabilities.elicitation =
            Some(ElicitationCapability::new().with_form(FormElicitationCapability::new()));
        capabilities.roots = Some(RootsCapabilities::default());
        info.capabilities = capabilities;
        ProbeSide {
            info,
            elicitation_content,
        }
    }
}

impl ClientHandler for ProbeSide {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, rmcp::ErrorData> {
        Ok(match (&request, &self.elicitation_content) {
            (ElicitRequestParams::FormElicitationParams { .. }, Some(content)) => {
                ElicitResult::new(ElicitationAction::Accept)
                    .with_content(Value::Object(content.clone()))
            }
            _ => ElicitResult::new(ElicitationAction::Decline),
        })
    }
}

/// How the probe opens: the newest revision the server offers
/// (`server/discover`, MCP 2026-07-28), else the `initialize` handshake.
const NEWEST: Handshake = Handshake::newest(quiver_model::Transport::StreamableHttp);

/// The probe's way to the server: its flags, and the grant it holds.
struct Session<'a> {
    args: &'a ProbeArgs,
    http: reqwest::Client,
    elicitation_content: Option<JsonObject>,
    /// The newest grant; a re-authorization builds on its scopes.
    grant: Option<AuthClient<reqwest::Client>>,
    authorizations: usize,
}

impl Session<'_> {
    /// A new connection, with the newest grant's token when there is one.
    async fn connect(&self) -> Result<Client, ClientInitializeError> {
        match &self.grant {
            None => self.serve(self.http.clone()).await,
            Some(grant) => self.serve(grant.clone()).await,
        }
    }

    async fn serve<C>(&self, http: C) -> Result<Client, ClientInitializeError>
    where
        C: StreamableHttpClient + Send + Sync + 'static,
    {
        let config = StreamableHttpClientTransportConfig::with_uri(self.args.url.clone());
        let transport = StreamableHttpClientTransport::with_client(http, config);
        ProbeSide::new(self.elicitation_content.clone())
            .serve_with_lifecycle(NEWEST.probe(transport), NEWEST.mode())
            .await
    }

    /// Authorizes from `challenge`: the first time, or again on top of the
    /// newest grant (step-up).
    async fn authorize(&mut self, challenge: &str) -> anyhow::Result<()> {
        let args = self.args;
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
        let http = self.http.clone();
        let grant = match &self.grant {
            None => authorize(&args.url, Some(challenge), &client, consent, http).await?,
            Some(previous) => {
                reauthorize(&args.url, challenge, previous, &client, consent, http).await?
            }
        };
        self.grant = Some(grant);
        self.authorizations += 1;
        Ok(())
    }

    /// Runs `request` on `client`, authorizing again (step-up) and
    /// reconnecting when the server answers with a challenge; gives up after
    /// [`MAX_AUTHORIZATIONS`]. The outer error is the authorization's, the
    /// inner the request's own.
    async fn request<T>(
        &mut self,
        client: &mut Client,
        what: &str,
        request: impl AsyncFn(&Client) -> Result<T, ServiceError>,
    ) -> anyhow::Result<Result<T, ServiceError>> {
        loop {
            let err = match request(client).await {
                Ok(value) => return Ok(Ok(value)),
                Err(err) => err,
            };
            let Some(challenge) = err.auth_challenge().map(str::to_owned) else {
                return Ok(Err(err));
            };
            if self.authorizations >= MAX_AUTHORIZATIONS {
                bail!(
                    "{what}: still refused after {MAX_AUTHORIZATIONS} authorizations: {challenge}"
                );
            }
            self.authorize(&challenge).await?;
            *client = self.connect().await.context("initialize (authorized)")?;
        }
    }
}

/// The `--call`s with their `--args`.
fn planned_calls(args: &ProbeArgs) -> anyhow::Result<Vec<CallToolRequestParams>> {
    if !args.args.is_empty() && args.args.len() != args.calls.len() {
        bail!(
            "--args must be given once per --call, in the same order, or never ({} --call, {} --args)",
            args.calls.len(),
            args.args.len()
        );
    }
    args.calls
        .iter()
        .enumerate()
        .map(|(index, name)| {
            let mut params = CallToolRequestParams::new(name.clone());
            if let Some(text) = args.args.get(index) {
                params.arguments =
                    Some(serde_json::from_str(text).with_context(|| {
                        format!("--args of --call {name} must be a JSON object")
                    })?);
            }
            Ok(params)
        })
        .collect()
}

/// Why a call failed, for the report.
fn call_error(err: &ServiceError) -> String {
    match err {
        ServiceError::InputRequiredRoundsExceeded { max_rounds } => format!(
            "the server still answered input_required after {max_rounds} rounds of answers (the probe's limit)"
        ),
        other => other.to_string(),
    }
}

async fn probe(args: ProbeArgs) -> anyhow::Result<()> {
    let calls = planned_calls(&args)?;
    let elicitation_content: Option<JsonObject> = match &args.elicitation_content {
        Some(text) => Some(
            serde_json::from_str(text).context("--elicitation-content must be a JSON object")?,
        ),
        None => None,
    };
    let http = quiver_mcp::egress::http_client_builder()
        .build()
        .context("building the HTTP client")?;
    let mut session = Session {
        args: &args,
        http,
        elicitation_content,
        grant: None,
        authorizations: 0,
    };
    let mut client = match session.connect().await {
        Ok(client) => client,
        Err(err) => {
            let Some(challenge) = err.auth_challenge().map(str::to_owned) else {
                return Err(anyhow::Error::new(err).context(format!("initialize {}", args.url)));
            };
            session.authorize(&challenge).await?;
            session.connect().await.context("initialize (authorized)")?
        }
    };
    let info = client.peer().peer_info();
    let tools = session
        .request(&mut client, "tools/list", async |client| {
            client.list_all_tools().await
        })
        .await?
        .context("tools/list")?;
    // rmcp leaves out of the listing the tools the client must not call
    // (invalid `x-mcp-header` annotations); nothing unlisted is called.
    let listed: HashSet<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    let mut reports = Vec::new();
    let mut failed = Vec::new();
    for params in calls {
        let name = params.name.to_string();
        let outcome = if listed.contains(name.as_str()) {
            let call = async |client: &Client| {
                client
                    .call_tool_with_mrtr_max_rounds(params.clone(), MAX_INPUT_ROUNDS)
                    .await
            };
            session
                .request(&mut client, "tools/call", call)
                .await?
                .map_err(|err| call_error(&err))
        } else {
            Err("not called: not in the server's tool list".to_owned())
        };
        match outcome {
            Ok(result) => {
                if result.is_error == Some(true) {
                    failed.push(format!("{name} (isError)"));
                }
                reports.push(json!({"name": name, "result": result}));
            }
            Err(error) => {
                failed.push(format!("{name} ({error})"));
                reports.push(json!({"name": name, "error": error}));
            }
        }
    }
    let mut report = json!({
        "server": info.as_ref().and_then(|i| i.server_info.as_ref()).map(|i| &i.name),
        "protocol_version": info.as_ref().map(|i| i.protocol_version.to_string()),
        "tools": tools.iter().map(|t| t.name.to_string()).collect::<Vec<_>>(),
        "authorizations": session.authorizations,
    });
    if !reports.is_empty() {
        report["calls"] = Value::Array(reports);
    }
    let _ = client.cancel().await;
    println!("{report}");
    if !failed.is_empty() {
        bail!("tools/call failed: {}", failed.join(", "));
    }
    Ok(())
}
