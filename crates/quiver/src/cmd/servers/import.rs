//! `quiver servers import`: a `server.json` file, or the matches of an MCP
//! registry's `GET /v0.1/servers`, imported through the registry's REST
//! endpoint `POST /admin/api/import/server-json` (docs/reference.md §5.4).
//! The mapping runs in the registry, so the CLI, the web admin and scripts
//! get the same records.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::Value;

/// Most entries read from a registry's listing (pages are followed until then).
pub const MAX_LISTED: usize = 1000;

/// Deadline of each HTTP request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// The `_meta` key the official registry puts its own metadata under.
const OFFICIAL_META: &str = "io.modelcontextprotocol.registry/official";

/// `quiver servers import` flags.
#[derive(Args, Debug)]
pub struct ImportArgs {
    /// The server.json file (not with --from-registry).
    #[arg(
        required_unless_present = "from_registry",
        conflicts_with = "from_registry"
    )]
    pub file: Option<PathBuf>,
    /// Base URL of an MCP registry speaking API v0.1 (its `/v0.1/servers` is read).
    #[arg(long, requires = "search")]
    pub from_registry: Option<String>,
    /// Bearer token for --from-registry (a private registry's credential;
    /// a Quiver registry takes a caller's API key).
    #[arg(
        long,
        env = "QUIVER_FROM_REGISTRY_TOKEN",
        hide_env_values = true,
        requires = "from_registry"
    )]
    pub from_registry_token: Option<String>,
    /// Text the registry's `search` matches (a substring of the server name).
    #[arg(long, requires = "from_registry")]
    pub search: Option<String>,
    /// Import the listed server of this name; repeat for several. Without
    /// --name or --all the matches are only listed.
    #[arg(long = "name", requires = "from_registry", conflicts_with = "all")]
    pub names: Vec<String>,
    /// Import every match.
    #[arg(long, requires = "from_registry")]
    pub all: bool,
    /// Show the records and inputs to fill; store nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Which remote or package becomes the record (`remotes[1]`,
    /// `packages[0]`) [default: the first remote, else the first package].
    #[arg(long)]
    pub choice: Option<String>,
    /// The records' allowed_tools, a comma list [default: none, the record's
    /// default deny].
    #[arg(long)]
    pub allowed_tools: Option<String>,
    /// The registry's HTTP (admin API) URL.
    #[arg(
        long,
        env = "QUIVER_ADMIN_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub admin_url: String,
}

/// Runs `quiver servers import` with the admin token and actor of `servers`.
pub async fn run(args: ImportArgs, token: Option<&str>, actor: Option<&str>) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .context("HTTP client")?;
    let importer = Importer {
        http: &http,
        args: &args,
        token,
        actor,
    };
    if let Some(file) = &args.file {
        let body =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        return importer.import(&file.display().to_string(), body).await;
    }
    let (Some(registry), Some(search)) = (&args.from_registry, &args.search) else {
        bail!("give a server.json FILE or --from-registry URL --search TEXT");
    };
    let listed = list(&http, registry, args.from_registry_token.as_deref(), search).await?;
    for server in &listed {
        println!(
            "{}  {}  {}",
            text(server, "name"),
            text(server, "version"),
            server["title"]
                .as_str()
                .unwrap_or_else(|| text(server, "description"))
        );
    }
    println!("{} match(es) of {search:?} at {registry}", listed.len());
    let chosen: Vec<&Value> = if args.all {
        listed.iter().collect()
    } else {
        let mut chosen = Vec::new();
        for name in &args.names {
            let server = listed
                .iter()
                .find(|server| server["name"] == name.as_str())
                .with_context(|| format!("--name {name}: not among the matches"))?;
            chosen.push(server);
        }
        chosen
    };
    if chosen.is_empty() {
        println!("nothing imported: choose with --name NAME (repeatable) or --all");
    }
    for server in chosen {
        importer
            .import(text(server, "name"), server.to_string())
            .await?;
    }
    Ok(())
}

/// `url` with `query` appended, percent-encoded.
fn with_query(url: &str, query: &[(&str, String)]) -> anyhow::Result<url::Url> {
    let mut url = url::Url::parse(url).with_context(|| format!("invalid URL {url:?}"))?;
    url.query_pairs_mut().extend_pairs(query);
    Ok(url)
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    value[key].as_str().unwrap_or_default()
}

/// The servers of `registry`'s `/v0.1/servers?search=…`, following
/// `nextCursor` up to [`MAX_LISTED`] entries; one entry per name (the one
/// the registry marks latest, else the first listed).
async fn list(
    http: &reqwest::Client,
    registry: &str,
    token: Option<&str>,
    search: &str,
) -> anyhow::Result<Vec<Value>> {
    let base = registry
        .trim_end_matches('/')
        .trim_end_matches("/v0.1/servers")
        .trim_end_matches('/');
    let url = format!("{base}/v0.1/servers");
    let mut servers: Vec<Value> = Vec::new();
    let mut seen = 0;
    let mut cursor: Option<String> = None;
    loop {
        let mut query = vec![
            ("search", search.to_owned()),
            ("version", "latest".to_owned()),
            ("limit", "100".to_owned()),
        ];
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor.clone()));
        }
        let page_url = with_query(&url, &query)?;
        let mut request = http.get(page_url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.with_context(|| format!("GET {url}"))?;
        let status = response.status();
        let page: Value = response
            .json()
            .await
            .with_context(|| format!("GET {url}: {status}, body is not JSON"))?;
        if !status.is_success() {
            bail!("GET {url}: {status} {page}");
        }
        let entries = page["servers"]
            .as_array()
            .with_context(|| format!("GET {url}: no servers array in the answer"))?;
        for entry in entries {
            seen += 1;
            let server = &entry["server"];
            if !server.is_object() {
                bail!("GET {url}: an entry without a server object: {entry}");
            }
            let latest = entry["_meta"][OFFICIAL_META]["isLatest"] == true;
            match servers.iter_mut().find(|s| s["name"] == server["name"]) {
                Some(kept) if latest => *kept = server.clone(),
                Some(_) => {}
                None => servers.push(server.clone()),
            }
        }
        let next = page["metadata"]["nextCursor"]
            .as_str()
            .filter(|next| !next.is_empty());
        match next {
            Some(next) if seen < MAX_LISTED && !entries.is_empty() => {
                if cursor.as_deref() == Some(next) {
                    bail!("GET {url}: the registry answered the same cursor {next:?} twice");
                }
                cursor = Some(next.to_owned());
            }
            Some(_) => {
                eprintln!("stopped listing after {seen} entries (at most {MAX_LISTED} are read)");
                break;
            }
            None => break,
        }
    }
    Ok(servers)
}

struct Importer<'a> {
    http: &'a reqwest::Client,
    args: &'a ImportArgs,
    token: Option<&'a str>,
    actor: Option<&'a str>,
}

impl Importer<'_> {
    /// POSTs one server.json to the import endpoint and prints the outcome.
    async fn import(&self, what: &str, body: String) -> anyhow::Result<()> {
        let url = format!(
            "{}/admin/api/import/server-json",
            self.args.admin_url.trim_end_matches('/')
        );
        let mut query = vec![("dry_run", self.args.dry_run.to_string())];
        if let Some(choice) = &self.args.choice {
            query.push(("choice", choice.clone()));
        }
        if let Some(allowed) = &self.args.allowed_tools {
            query.push(("allowed_tools", allowed.clone()));
        }
        let mut request = self
            .http
            .post(with_query(&url, &query)?)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(token) = self.token {
            request = request.bearer_auth(token);
        }
        if let Some(actor) = self.actor {
            request = request.header("x-quiver-actor", actor);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = response.status();
        let answer: Value = response
            .json()
            .await
            .with_context(|| format!("POST {url}: {status}, body is not JSON"))?;
        if !status.is_success() {
            let error = &answer["error"];
            match error["field"].as_str() {
                Some(field) => bail!("{what}: {status}: {field}: {}", text(error, "message")),
                None => bail!("{what}: {status}: {}", text(error, "message")),
            }
        }
        if self.args.dry_run {
            println!(
                "{what}: dry run, {} would be:",
                answer["choice"].as_str().unwrap_or_default()
            );
            println!("{}", serde_json::to_string_pretty(&answer["records"])?);
        }
        for (server_id, revision) in answer["revisions"].as_object().into_iter().flatten() {
            println!(
                "{what}: {server_id} {} at revision {revision} (from {})",
                text(&answer["outcomes"], server_id),
                text(&answer, "choice")
            );
        }
        for input in answer["inputs"].as_array().into_iter().flatten() {
            let via = match input["env"].as_str() {
                Some(env) => format!("set {env} on the workers or edit the record"),
                None => "edit the record".to_owned(),
            };
            println!(
                "  input to fill: {} ({}{}{}): {via}",
                text(input, "field"),
                text(input, "name"),
                if input["required"] == true {
                    ", required"
                } else {
                    ""
                },
                if input["secret"] == true {
                    ", secret"
                } else {
                    ""
                },
            );
        }
        Ok(())
    }
}
