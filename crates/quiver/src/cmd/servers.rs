//! `quiver servers …`: the admin CLI over gRPC.

use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use quiver_model::{Format, HistoryEntry, McpServerSpec, StoredServer, Strictness, parse_document};
use quiver_proto::credentials::{Credentials, RegistryClient};
use quiver_proto::v1 as pb;
use tonic::transport::Channel;

mod import;

/// Connection flags shared by every `servers` subcommand.
#[derive(Args, Debug)]
pub struct ServersArgs {
    /// Registry gRPC URL; repeat it (comma list in QUIVER_REGISTRY) for
    /// replicas: the first that accepts a connection is used.
    #[arg(
        long,
        env = "QUIVER_REGISTRY",
        value_delimiter = ',',
        default_values_t = [quiver_sync::default_registry_url()],
        global = true
    )]
    pub registry: Vec<String>,
    /// PEM CA certificates trusted for an https:// --registry [default: the
    /// system roots].
    #[arg(long, env = "QUIVER_REGISTRY_CA", global = true)]
    pub registry_ca: Option<PathBuf>,
    /// Bearer token (admin token for writes).
    #[arg(long, env = "QUIVER_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Name recorded as the actor of writes.
    #[arg(long, env = "QUIVER_ACTOR", global = true)]
    pub actor: Option<String>,
    #[command(subcommand)]
    pub command: ServersCommand,
}

/// Output format of reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Human-readable (TOML for single records).
    Text,
    /// JSON.
    Json,
}

/// `quiver servers` subcommands.
#[derive(Subcommand, Debug)]
pub enum ServersCommand {
    /// List every record.
    List {
        /// Output format.
        #[arg(long, short, value_enum, default_value = "text")]
        output: Output,
    },
    /// Show one record.
    Get {
        /// The server id.
        server_id: String,
        /// Output format.
        #[arg(long, short, value_enum, default_value = "text")]
        output: Output,
    },
    /// Create or replace the records of a TOML or JSON file, or of every
    /// `*.toml`/`*.json` file of a directory in one batch (one transaction:
    /// all or nothing).
    Apply {
        /// File with one record or a `[[servers]]` list, or a directory of such
        /// files.
        #[arg(long, short = 'f')]
        file: PathBuf,
        /// Fail unless the record is at this revision (0: must not exist).
        #[arg(long)]
        expected_revision: Option<u64>,
        /// Reject unknown fields.
        #[arg(long)]
        strict: bool,
    },
    /// Delete a record.
    Delete {
        /// The server id.
        server_id: String,
        /// Fail unless the record is at this revision.
        #[arg(long)]
        expected_revision: Option<u64>,
    },
    /// Show every revision of a record.
    History {
        /// The server id.
        server_id: String,
        /// Output format.
        #[arg(long, short, value_enum, default_value = "text")]
        output: Output,
    },
    /// Import a server.json of the official MCP Registry format, or the
    /// matches of an MCP registry's `/v0.1/servers`, through the registry's
    /// REST API (`--admin-url`).
    Import(import::ImportArgs),
    /// Print change events as they happen.
    Watch {
        /// Replay changes after this revision first (default: start at head).
        #[arg(long)]
        since: Option<u64>,
    },
}

/// A client of the first replica of `--registry` that accepts a connection.
async fn connect(args: &ServersArgs) -> anyhow::Result<RegistryClient> {
    let ca = crate::config::registry_ca(args.registry_ca.as_deref())?;
    let credentials = Credentials::new(args.token.as_deref(), args.actor.as_deref())
        .context("invalid --token or --actor")?;
    let mut failures = Vec::new();
    for url in &args.registry {
        let mut endpoint = Channel::from_shared(url.clone())
            .with_context(|| format!("invalid --registry URL {url:?}"))?
            .connect_timeout(std::time::Duration::from_secs(5));
        if endpoint.uri().scheme_str() == Some("https") {
            let tls = quiver_proto::tls::client_tls(ca.as_deref()).context("--registry-ca")?;
            endpoint = endpoint.tls_config(tls).context("--registry TLS")?;
        } else if ca.is_some() {
            bail!("--registry-ca needs an https:// --registry (got {url})");
        }
        match endpoint.connect().await {
            Ok(channel) => return Ok(credentials.client(channel)),
            Err(err) => failures.push(format!("{url}: {err}")),
        }
    }
    bail!("cannot connect to the registry ({})", failures.join("; "))
}

/// Turns a gRPC status into an error message naming its code.
fn status(err: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", err.code(), err.message())
}

/// Runs `quiver servers …`.
pub async fn run(args: ServersArgs) -> anyhow::Result<()> {
    if let ServersCommand::Import(import) = args.command {
        // Over REST (the mapping lives in the registry's HTTP API), no gRPC.
        return import::run(import, args.token.as_deref(), args.actor.as_deref()).await;
    }
    let mut client = connect(&args).await?;
    match args.command {
        ServersCommand::Import(_) => unreachable!("handled above"),
        ServersCommand::List { output } => {
            let response = client
                .list_mcp_servers(pb::ListMcpServersRequest {})
                .await
                .map_err(status)?
                .into_inner();
            let servers = response
                .servers
                .into_iter()
                .map(StoredServer::try_from)
                .collect::<Result<Vec<_>, _>>()?;
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"revision": response.revision, "servers": servers})
                    )?
                ),
                Output::Text => print_table(response.revision, &servers),
            }
        }
        ServersCommand::Get { server_id, output } => {
            let server = client
                .get_mcp_server(pb::GetMcpServerRequest { server_id })
                .await
                .map_err(status)?
                .into_inner()
                .server
                .context("registry returned no record")?;
            let server = StoredServer::try_from(server)?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&server)?),
                Output::Text => {
                    println!(
                        "# revision {} · updated {} by {} · source {}",
                        server.revision, server.updated_at, server.updated_by, server.source
                    );
                    print!("{}", server.spec.to_toml());
                }
            }
        }
        ServersCommand::Apply {
            file,
            expected_revision,
            strict,
        } => {
            if file.is_dir() {
                if expected_revision.is_some() {
                    bail!(
                        "--expected-revision applies to a single record, not to directory {}",
                        file.display()
                    );
                }
                return apply_directory(&mut client, &file, strict).await;
            }
            let specs = read_records(&file, strict)?;
            if expected_revision.is_some() && specs.len() > 1 {
                bail!(
                    "--expected-revision applies to a single record, but {} holds {}",
                    file.display(),
                    specs.len()
                );
            }
            for spec in specs {
                let server_id = spec.server_id.clone();
                let response = client
                    .upsert_mcp_server(pb::UpsertMcpServerRequest {
                        server: Some((&spec).into()),
                        expected_revision,
                    })
                    .await
                    .map_err(|err| status(err).context(format!("applying {server_id}")))?
                    .into_inner();
                let revision = response.server.map_or(0, |s| s.revision);
                let what = if response.unchanged {
                    "unchanged"
                } else {
                    "applied"
                };
                println!("{server_id}: {what} at revision {revision}");
            }
        }
        ServersCommand::Delete {
            server_id,
            expected_revision,
        } => {
            let response = client
                .delete_mcp_server(pb::DeleteMcpServerRequest {
                    server_id: server_id.clone(),
                    expected_revision,
                })
                .await
                .map_err(status)?
                .into_inner();
            println!("{server_id}: deleted at revision {}", response.revision);
        }
        ServersCommand::History { server_id, output } => {
            let entries = client
                .get_mcp_server_history(pb::GetMcpServerHistoryRequest { server_id })
                .await
                .map_err(status)?
                .into_inner()
                .entries
                .into_iter()
                .map(HistoryEntry::try_from)
                .collect::<Result<Vec<_>, _>>()?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&entries)?),
                Output::Text => {
                    for entry in entries {
                        println!(
                            "{:>8}  {:<6}  {}  {}  {}",
                            entry.revision,
                            entry.kind.as_str(),
                            entry.at.format("%Y-%m-%d %H:%M:%S"),
                            entry.actor,
                            entry.source
                        );
                    }
                }
            }
        }
        ServersCommand::Watch { since } => {
            let since = match since {
                Some(since) => since,
                None => {
                    client
                        .list_mcp_servers(pb::ListMcpServersRequest {})
                        .await
                        .map_err(status)?
                        .into_inner()
                        .revision
                }
            };
            let mut stream = client
                .watch_mcp_servers(pb::WatchMcpServersRequest {
                    since_revision: since,
                })
                .await
                .map_err(status)?
                .into_inner();
            while let Some(event) = stream.message().await.map_err(status)? {
                if event.heartbeat {
                    continue;
                }
                for id in &event.upserts {
                    println!("{} upsert {id}", event.revision);
                }
                for id in &event.deletes {
                    println!("{} delete {id}", event.revision);
                }
            }
        }
    }
    Ok(())
}

/// `quiver servers apply -f DIR`: the records of every `*.toml`/`*.json`
/// file of `dir` (sorted by name, not recursive) in one `ApplyMcpServers`.
async fn apply_directory(
    client: &mut RegistryClient,
    dir: &std::path::Path,
    strict: bool,
) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        let is_record_file = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e == "toml" || e == "json");
        if is_record_file && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    if files.is_empty() {
        bail!("{} holds no *.toml or *.json record file", dir.display());
    }
    // Which file each record of the batch comes from, to name it in errors.
    let mut origins = Vec::new();
    let mut servers = Vec::new();
    for file in &files {
        for spec in read_records(file, strict)? {
            origins.push(file.clone());
            servers.push(pb::UpsertMcpServerRequest {
                server: Some((&spec).into()),
                expected_revision: None,
            });
        }
    }
    let count = servers.len();
    let response = client
        .apply_mcp_servers(pb::ApplyMcpServersRequest { servers })
        .await
        .map_err(|err| {
            let origin = batch_index(err.message())
                .and_then(|i| origins.get(i))
                .map(|file| format!(" (in {})", file.display()))
                .unwrap_or_default();
            status(err).context(format!(
                "applying {count} records of {}{origin}; nothing was written",
                dir.display()
            ))
        })?
        .into_inner();
    for result in &response.results {
        let (server_id, revision) = result.server.as_ref().map_or(("?", 0), |s| {
            (
                s.spec.as_ref().map_or("?", |s| s.server_id.as_str()),
                s.revision,
            )
        });
        let what = if result.unchanged {
            "unchanged"
        } else {
            "applied"
        };
        println!("{server_id}: {what} at revision {revision}");
    }
    let changed = response.results.iter().filter(|r| !r.unchanged).count();
    if changed == 0 {
        println!(
            "{count} records from {} files: nothing changed",
            files.len()
        );
    } else {
        println!(
            "{count} records from {} files: {changed} applied at revisions {}..={}",
            files.len(),
            response.first_revision,
            response.last_revision
        );
    }
    Ok(())
}

/// The record index of a batch error message (`servers[3]…`).
fn batch_index(message: &str) -> Option<usize> {
    let rest = message.strip_prefix("servers[")?;
    rest[..rest.find(']')?].parse().ok()
}

fn read_records(file: &PathBuf, strict: bool) -> anyhow::Result<Vec<McpServerSpec>> {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let format = Format::from_file_name(name).unwrap_or(Format::Toml);
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let strictness = if strict {
        Strictness::Strict
    } else {
        Strictness::Lenient
    };
    let records = parse_document(&text, format, strictness)
        .with_context(|| format!("invalid {}", file.display()))?;
    for record in &records {
        for field in &record.ignored_fields {
            eprintln!("warning: {}: unknown field {field} ignored", file.display());
        }
    }
    Ok(records.into_iter().map(|r| r.spec).collect())
}

fn print_table(revision: u64, servers: &[StoredServer]) {
    println!(
        "{:<24} {:<16} {:<8} {:>8}  {:<20}  DISPLAY NAME",
        "SERVER_ID", "TRANSPORT", "ENABLED", "REVISION", "SOURCE"
    );
    for server in servers {
        println!(
            "{:<24} {:<16} {:<8} {:>8}  {:<20}  {}",
            server.spec.server_id,
            server.spec.transport.as_str(),
            server.spec.enabled,
            server.revision,
            server.source.to_string(),
            server.spec.display_name.as_deref().unwrap_or("")
        );
    }
    println!("({} servers at revision {revision})", servers.len());
}
