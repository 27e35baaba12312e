//! The config file (`--config FILE`, TOML) and its layering under env and flags.
//!
//! Every field is optional; unknown fields are errors so a typo in a config
//! key is reported instead of silently ignored.

use std::net::SocketAddr;
use std::num::{NonZeroU64, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use quiver_mcp::PoolOptions;
use quiver_model::access::{ClaimRule, IdentityProviderRecord};
use serde::Deserialize;

use crate::telemetry::LogFormat;

/// `config/registry.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryFile {
    /// `sqlite://…` or `postgres://…`.
    pub database_url: Option<String>,
    /// gRPC listen address.
    pub grpc_listen: Option<SocketAddr>,
    /// HTTP listen address.
    pub http_listen: Option<SocketAddr>,
    /// Admin (read-write) token.
    pub admin_token: Option<String>,
    /// Worker (read-only) token.
    pub worker_token: Option<String>,
    /// Editor token (reads; writes MCP server records).
    pub editor_token: Option<String>,
    /// Viewer token (reads only).
    pub viewer_token: Option<String>,
    /// Approver token (reads and decides approvals only).
    pub approver_token: Option<String>,
    /// Lifetime of an approval in seconds (decision and use).
    pub approval_ttl_secs: Option<u64>,
    /// The most pending approvals one caller may have.
    pub max_pending_approvals: Option<u32>,
    /// Seconds finished approvals are kept after their expiry.
    pub approval_retention_secs: Option<u64>,
    /// Days usage rows are kept.
    pub usage_retention_days: Option<u64>,
    /// The registry's URL as browsers reach it (OAuth redirects).
    pub public_url: Option<String>,
    /// Serve without credentials (loopback only).
    pub insecure_no_auth: Option<bool>,
    /// Watch heartbeat period in seconds.
    pub heartbeat_secs: Option<u64>,
    /// Change-log rows kept behind head (0 keeps everything).
    pub change_log_retention: Option<u64>,
    /// Egress allowlist of tool previews.
    #[serde(default)]
    pub egress: EgressSection,
    /// The fleet as an MCP sub-registry (`/v0.1/servers`).
    #[serde(default)]
    pub catalog: CatalogSection,
    /// `mcp.d` and `policies.d` settings.
    #[serde(default)]
    pub mcp: McpSection,
    /// TLS of the gRPC and HTTP listeners.
    #[serde(default)]
    pub tls: TlsSection,
    /// Timeouts and connection cap of the gRPC and HTTP listeners.
    #[serde(default)]
    pub listener: ListenerSection,
    /// Logging settings.
    #[serde(default)]
    pub log: LogSection,
}

/// `[catalog]` of the registry config: the fleet as an MCP sub-registry.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogSection {
    /// Reverse-DNS namespace of the entry names.
    pub namespace: Option<String>,
    /// The workers' public URL the entries' remotes point under.
    pub worker_url: Option<String>,
    /// Serve the catalog without credentials.
    pub anonymous: Option<bool>,
}

/// `config/worker.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerFile {
    /// Registry gRPC URL.
    #[serde(default, deserialize_with = "one_or_many")]
    pub registry: Vec<String>,
    /// Worker token for the registry (prefer `QUIVER_TOKEN`).
    pub token: Option<String>,
    /// PEM CA certificates trusted for an `https://` registry.
    pub registry_ca: Option<PathBuf>,
    /// TLS of the HTTP listener.
    #[serde(default)]
    pub tls: TlsSection,
    /// Timeouts and connection cap of the HTTP listener.
    #[serde(default)]
    pub listener: ListenerSection,
    /// The MCP endpoints (gateway mode).
    #[serde(default)]
    pub gateway: GatewaySection,
    /// HTTP listen address.
    pub http_listen: Option<SocketAddr>,
    /// Identity reported to the registry.
    pub worker_id: Option<String>,
    /// Serve callers without a token (loopback only).
    pub insecure_no_auth: Option<bool>,
    /// Servers connected as soon as they appear.
    #[serde(default)]
    pub warm_up: Vec<String>,
    /// Pool limits.
    #[serde(default)]
    pub pool: PoolSection,
    /// Caller credentials and the task each selects.
    #[serde(default)]
    pub callers: Vec<CallerEntry>,
    /// Task policies by name.
    #[serde(default)]
    pub tasks: std::collections::BTreeMap<String, quiver_model::policy::TaskPolicy>,
    /// Identity providers whose JWTs are callers.
    #[serde(default)]
    pub identity_providers: Vec<IdentityProviderEntry>,
    /// The chat upstream.
    #[serde(default)]
    pub upstream: UpstreamSection,
    /// Audit log settings.
    #[serde(default)]
    pub audit: AuditSection,
    /// Egress allowlist of the HTTP transports.
    #[serde(default)]
    pub egress: EgressSection,
    /// The artifact store (images and audio of tool results).
    #[serde(default)]
    pub artifacts: ArtifactsSection,
    /// How often usage counts are reported to the registry, in ms.
    pub usage_flush_ms: Option<u64>,
    /// Logging settings.
    #[serde(default)]
    pub log: LogSection,
}

/// `[artifacts]` of the worker config: the store of images and audio of
/// tool results, and how vision requests refer to them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactsSection {
    /// Bytes of every artifact together; the oldest go first beyond.
    pub max_total_bytes: Option<NonZeroUsize>,
    /// Bytes of one caller token's artifacts together; beyond, that
    /// caller's own oldest go first. Default: a quarter of
    /// `max_total_bytes`, at least `max_item_bytes`.
    pub max_caller_bytes: Option<NonZeroUsize>,
    /// Bytes of one artifact; a bigger item becomes a note naming this.
    pub max_item_bytes: Option<NonZeroUsize>,
    /// How long an artifact is kept, in seconds.
    pub ttl_secs: Option<NonZeroU64>,
    /// `"data"` (a `data:` URL) or `"artifact"` (the artifact's signed URL).
    pub vision_url: Option<quiver_worker::artifacts::VisionUrl>,
    /// This worker's base URL as model providers reach it (for
    /// `vision_url = "artifact"`).
    pub public_url: Option<String>,
}

impl ArtifactsSection {
    /// These settings over the defaults.
    pub fn into_options(self) -> anyhow::Result<quiver_worker::artifacts::ArtifactOptions> {
        let defaults = quiver_worker::artifacts::ArtifactOptions::default();
        if let Some(url) = &self.public_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            anyhow::bail!("artifacts.public_url: must be an http:// or https:// URL, not {url:?}");
        }
        let max_total_bytes = self
            .max_total_bytes
            .map_or(defaults.max_total_bytes, NonZeroUsize::get);
        if let Some(share) = self.max_caller_bytes
            && share.get() > max_total_bytes
        {
            anyhow::bail!(
                "artifacts.max_caller_bytes: {share} is more than artifacts.max_total_bytes ({max_total_bytes})"
            );
        }
        Ok(quiver_worker::artifacts::ArtifactOptions {
            max_total_bytes,
            max_caller_bytes: self.max_caller_bytes.map(NonZeroUsize::get),
            max_item_bytes: self
                .max_item_bytes
                .map_or(defaults.max_item_bytes, NonZeroUsize::get),
            ttl: self
                .ttl_secs
                .map_or(defaults.ttl, |secs| Duration::from_secs(secs.get())),
            vision_url: self.vision_url.unwrap_or(defaults.vision_url),
            public_url: self.public_url.or(defaults.public_url),
        })
    }
}

/// `[upstream]` of the worker config.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    /// Base URL of the OpenAI-compatible API.
    pub url: Option<String>,
    /// Environment variable holding the API key.
    pub api_key_env: Option<String>,
    /// Retries of 429/5xx/network failures.
    pub max_retries: Option<u32>,
    /// Time allowed for one upstream attempt, in seconds.
    pub request_timeout_secs: Option<u64>,
    /// Time allowed to connect, in seconds.
    pub connect_timeout_secs: Option<u64>,
    /// Longest `Retry-After` honoured, in seconds.
    pub max_retry_after_secs: Option<u64>,
}

/// `[audit]` of the worker config.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    /// Log tool argument values (redacted) instead of only their keys.
    pub log_arguments: Option<bool>,
    /// Argument keys whose values are never logged.
    pub redact_keys: Option<Vec<String>>,
}

impl AuditSection {
    /// The worker's audit options: these settings over the defaults.
    pub fn into_options(self) -> quiver_worker::audit::AuditOptions {
        let defaults = quiver_worker::audit::AuditOptions::default();
        quiver_worker::audit::AuditOptions {
            log_arguments: self.log_arguments.unwrap_or(defaults.log_arguments),
            redact_keys: self.redact_keys.unwrap_or(defaults.redact_keys),
        }
    }
}

/// `[pool]` of the worker config.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    /// Calls in flight at once across all servers.
    pub max_inflight_calls: Option<usize>,
    /// Stdio child processes alive at once.
    pub max_child_processes: Option<usize>,
    /// Bound on connect + `initialize`, in ms.
    pub initialize_timeout_ms: Option<u64>,
    /// Idle connections are closed after this many seconds (0: never).
    pub idle_timeout_secs: Option<u64>,
    /// `tools/list` cache lifetime in seconds.
    pub tools_ttl_secs: Option<u64>,
    /// How long a listing of several servers waits for one server's tools
    /// before leaving it out of that request, in ms.
    pub catalog_wait_ms: Option<u64>,
    /// How long a timed-out call keeps its `max_concurrency` slot waiting
    /// for the server to answer its cancellation, in ms; unanswered by then,
    /// the connection is recycled.
    pub cancel_grace_ms: Option<NonZeroU64>,
    /// Pages one listing (`tools/list`) follows at most.
    pub max_list_pages: Option<NonZeroUsize>,
    /// Items one listing keeps at most, over all its pages.
    pub max_list_items: Option<NonZeroUsize>,
    /// Bytes (as JSON) of the items of one listing at most.
    pub max_list_bytes: Option<NonZeroUsize>,
    /// Bound on one whole listing, every page, in ms.
    pub list_timeout_ms: Option<NonZeroU64>,
    /// Longest message a stdio server may send, in bytes.
    pub max_message_bytes: Option<NonZeroUsize>,
    /// Live connections of `isolation = "per_session"` servers, worker-wide.
    pub max_session_connections: Option<NonZeroUsize>,
    /// Live connections of one `per_session` server.
    pub max_session_connections_per_server: Option<NonZeroUsize>,
    /// Live connections of `per_session` servers one caller holds,
    /// worker-wide.
    pub max_session_connections_per_caller: Option<NonZeroUsize>,
    /// A per-session connection unused this long is closed, in ms.
    pub session_idle_timeout_ms: Option<NonZeroU64>,
}

impl PoolSection {
    /// These settings over `defaults`.
    pub fn over(self, defaults: PoolOptions) -> PoolOptions {
        let millis = |ms: Option<u64>, default| ms.map_or(default, Duration::from_millis);
        let count = |n: Option<NonZeroUsize>, default| n.map_or(default, NonZeroUsize::get);
        PoolOptions {
            max_inflight_calls: self
                .max_inflight_calls
                .unwrap_or(defaults.max_inflight_calls),
            max_child_processes: self
                .max_child_processes
                .unwrap_or(defaults.max_child_processes),
            initialize_timeout: millis(self.initialize_timeout_ms, defaults.initialize_timeout),
            idle_timeout: match self.idle_timeout_secs {
                Some(0) => None,
                Some(secs) => Some(Duration::from_secs(secs)),
                None => defaults.idle_timeout,
            },
            tools_ttl: self
                .tools_ttl_secs
                .map_or(defaults.tools_ttl, Duration::from_secs),
            cancel_grace: millis(
                self.cancel_grace_ms.map(NonZeroU64::get),
                defaults.cancel_grace,
            ),
            max_list_pages: count(self.max_list_pages, defaults.max_list_pages),
            max_list_items: count(self.max_list_items, defaults.max_list_items),
            max_list_bytes: count(self.max_list_bytes, defaults.max_list_bytes),
            list_timeout: millis(
                self.list_timeout_ms.map(NonZeroU64::get),
                defaults.list_timeout,
            ),
            max_message_bytes: count(self.max_message_bytes, defaults.max_message_bytes),
            session_leases: quiver_mcp::leases::LeaseLimits {
                per_server: count(
                    self.max_session_connections_per_server,
                    defaults.session_leases.per_server,
                ),
                total: count(self.max_session_connections, defaults.session_leases.total),
                per_caller: count(
                    self.max_session_connections_per_caller,
                    defaults.session_leases.per_caller,
                ),
            },
            session_idle_timeout: millis(
                self.session_idle_timeout_ms.map(NonZeroU64::get),
                defaults.session_idle_timeout,
            ),
            ..defaults
        }
    }
}

/// `[listener]` of the registry and worker configs: bounds of the listeners
/// against slow, idle and too many peers (the `--header-read-timeout-ms`,
/// `--connection-idle-timeout-ms` and `--max-connections` flags win).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerSection {
    /// Time a new connection has to deliver its first complete request
    /// head, in ms.
    pub header_read_timeout_ms: Option<NonZeroU64>,
    /// Time a connection may stay open with no request in flight, in ms.
    pub idle_timeout_ms: Option<NonZeroU64>,
    /// Open connections of all the listeners together.
    pub max_connections: Option<NonZeroUsize>,
}

/// A string or a list of strings (`registry = "…"` or `registry = ["…", "…"]`).
fn one_or_many<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(one) => vec![one],
        OneOrMany::Many(many) => many,
    })
}

/// `[gateway]` of the worker config: the MCP endpoints `/mcp` and
/// `/mcp/{server_id}` (the `--mcp-*` flags win).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewaySection {
    /// `Host` values accepted (`host` or `host:port`).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// `Origin` values accepted (`scheme://host[:port]`).
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Name of an environment variable holding the fleet's session-signing secret.
    pub session_key_env: Option<String>,
    /// Sessions open at once on this worker.
    pub max_sessions: Option<NonZeroUsize>,
    /// A session unused this long leaves memory (its id still resumes it), in ms.
    pub session_idle_ms: Option<NonZeroU64>,
    /// Sessions one caller may hold open at once on this worker
    /// [default: max_sessions / 4, at least 1].
    pub max_sessions_per_caller: Option<NonZeroUsize>,
    /// A session id is served this long after it was issued, in ms
    /// [default: 24 h; at most 30 days].
    pub max_session_lifetime_ms: Option<NonZeroU64>,
}

/// One `[[callers]]` entry: a token (literal or from an environment
/// variable) and its task.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallerEntry {
    /// The token itself.
    pub token: Option<String>,
    /// Name of an environment variable holding the token.
    pub token_env: Option<String>,
    /// Task selected by this token.
    pub task: String,
}

/// One `[[identity_providers]]` entry: an OIDC issuer whose JWTs are
/// callers (validated with the tasks when the worker starts; errors name
/// `identity_providers[i].<field>`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityProviderEntry {
    /// `[A-Za-z0-9_.-]{1,64}`.
    pub name: String,
    /// `https://…`, or `http://` on a loopback address.
    pub issuer: String,
    /// A token's `aud` must contain one of them.
    pub audiences: Vec<String>,
    /// Allowed clock skew on `exp`/`nbf` (default 60, at most 300).
    pub clock_skew_secs: Option<u64>,
    /// The first matching rule gives the caller its task.
    #[serde(default)]
    pub rules: Vec<IdentityRuleEntry>,
}

/// One `[[identity_providers.rules]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityRuleEntry {
    /// A top-level claim name.
    pub claim: String,
    /// The claim (a string or an array of strings) contains this.
    pub contains: Option<String>,
    /// The claim (a string) equals this.
    pub equals: Option<String>,
    /// The task the caller gets (also spelled `policy`, the registry's
    /// name for it).
    #[serde(alias = "policy")]
    pub task: String,
}

impl IdentityProviderEntry {
    /// As the registry holds it: the task is the rule's policy; a worker's
    /// config gives no registry roles and no web sign-in.
    pub fn into_config(self) -> IdentityProviderRecord {
        IdentityProviderRecord {
            name: self.name,
            issuer: self.issuer,
            audiences: self.audiences,
            clock_skew_secs: self.clock_skew_secs,
            rules: self
                .rules
                .into_iter()
                .map(|rule| ClaimRule {
                    claim: rule.claim,
                    contains: rule.contains,
                    equals: rule.equals,
                    policy: Some(rule.task),
                    roles: Vec::new(),
                })
                .collect(),
            web_client_id: None,
        }
    }
}

/// `[egress]` of the worker and registry configs: the hosts HTTP MCP
/// servers may be reached on. Both lists empty (the default) allow every
/// host.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSection {
    /// Host name globs (`api.example.com`, `*.corp.example`).
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// CIDR blocks every resolved address must lie in (`10.0.0.0/8`).
    #[serde(default)]
    pub allow_cidrs: Vec<String>,
}

/// `[tls]` of the registry and worker configs: PEM certificate chain and
/// private key of the listeners (both or neither).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// Certificate chain, leaf first.
    pub cert: Option<PathBuf>,
    /// Private key of the leaf certificate.
    pub key: Option<PathBuf>,
}

/// TLS files that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// Only one of certificate and key is set.
    #[error("{present} is set without {missing}: set both or neither")]
    Half {
        /// The flag that is set.
        present: &'static str,
        /// The flag that is missing.
        missing: &'static str,
    },
    /// A file cannot be read.
    #[error("{flag} {path}: cannot read the file: {source}")]
    Unreadable {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file holds no usable PEM certificate or key.
    #[error("{flag} {path}: {source}")]
    Invalid {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: String,
        /// What is wrong.
        source: quiver_proto::tls::TlsError,
    },
}

fn read_pem(flag: &'static str, path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|source| TlsFileError::Unreadable {
        flag,
        path: path.display().to_string(),
        source,
    })
}

/// The listeners' TLS from `--tls-cert` / `--tls-key` (or the `[tls]`
/// section, under the flags); `None` when neither is set.
pub fn server_tls(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    section: TlsSection,
    config: Option<&Path>,
) -> Result<Option<quiver_proto::tls::ServerTls>, TlsFileError> {
    const CERT: &str = "--tls-cert";
    const KEY: &str = "--tls-key";
    let cert = cert.or_else(|| section.cert.map(|path| relative_to(config, path)));
    let key = key.or_else(|| section.key.map(|path| relative_to(config, path)));
    let (cert, key) = match (cert, key) {
        (None, None) => return Ok(None),
        (Some(_), None) => {
            return Err(TlsFileError::Half {
                present: CERT,
                missing: KEY,
            });
        }
        (None, Some(_)) => {
            return Err(TlsFileError::Half {
                present: KEY,
                missing: CERT,
            });
        }
        (Some(cert), Some(key)) => (cert, key),
    };
    let (cert_pem, key_pem) = (read_pem(CERT, &cert)?, read_pem(KEY, &key)?);
    quiver_proto::tls::ServerTls::from_pem(&cert_pem, &key_pem)
        .map(Some)
        .map_err(|source| {
            let (flag, path) = match source {
                quiver_proto::tls::TlsError::Key(_) => (KEY, &key),
                _ => (CERT, &cert),
            };
            TlsFileError::Invalid {
                flag,
                path: path.display().to_string(),
                source,
            }
        })
}

/// The PEM CA of `--registry-ca`, checked; `None` when unset.
pub fn registry_ca(path: Option<&Path>) -> Result<Option<Vec<u8>>, TlsFileError> {
    const FLAG: &str = "--registry-ca";
    let Some(path) = path else {
        return Ok(None);
    };
    let pem = read_pem(FLAG, path)?;
    quiver_proto::tls::client_tls(Some(&pem)).map_err(|source| TlsFileError::Invalid {
        flag: FLAG,
        path: path.display().to_string(),
        source,
    })?;
    Ok(Some(pem))
}

/// A token file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// The file cannot be read.
    #[error("{flag} {path}: cannot read the token file: {source}")]
    Unreadable {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file holds nothing but whitespace.
    #[error("{flag} {path}: the token file is empty")]
    Empty {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: String,
    },
    /// Both the token and the file naming it are set.
    #[error("set only one of {flag} and {token_flag}")]
    Both {
        /// The file flag.
        flag: &'static str,
        /// The token flag.
        token_flag: &'static str,
    },
}

/// Reads the token in `path` (surrounding whitespace trimmed), for `flag`.
pub fn read_token_file(flag: &'static str, path: &Path) -> Result<String, TokenFileError> {
    let display = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Unreadable {
        flag,
        path: display.clone(),
        source,
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(TokenFileError::Empty {
            flag,
            path: display,
        });
    }
    Ok(token.to_owned())
}

/// Reads the tokens in `path`, one per line (blank lines and lines starting
/// with `#` skipped), for `flag`.
pub fn read_token_lines(flag: &'static str, path: &Path) -> Result<Vec<String>, TokenFileError> {
    let text = read_token_file(flag, path)?;
    let tokens: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect();
    if tokens.is_empty() {
        return Err(TokenFileError::Empty {
            flag,
            path: path.display().to_string(),
        });
    }
    Ok(tokens)
}

/// The token from `token` (flag or env) or from the file `file` names;
/// setting both is an error.
pub fn token_or_file(
    token: Option<String>,
    token_flag: &'static str,
    file: Option<&Path>,
    file_flag: &'static str,
) -> Result<Option<String>, TokenFileError> {
    match (token, file) {
        (Some(_), Some(_)) => Err(TokenFileError::Both {
            flag: file_flag,
            token_flag,
        }),
        (token, None) => Ok(token),
        (None, Some(path)) => read_token_file(file_flag, path).map(Some),
    }
}

/// `[mcp]` of the registry config: the directories of record files
/// (`mcp.d`, `policies.d`) and how they are read.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpSection {
    /// Directory of `*.toml` / `*.json` server files.
    pub dir: Option<PathBuf>,
    /// Directory of `*.toml` / `*.json` policy and identity provider files.
    pub policies_dir: Option<PathBuf>,
    /// Reject unknown fields and any invalid file (both directories).
    pub strict: Option<bool>,
    /// Periodic rescan in seconds (0 disables the timer; both directories).
    pub rescan_interval_secs: Option<u64>,
}

/// `[log]` of a config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSection {
    /// `text` or `json`.
    pub format: Option<LogFormat>,
    /// `tracing` filter directives (as `--log-level`).
    pub level: Option<String>,
    /// OTLP/HTTP collector base URL for trace export (off when unset).
    pub otlp_endpoint: Option<String>,
}

/// Reads a config file; a missing `path` gives the empty config.
pub fn load<T: Default + for<'de> Deserialize<'de>>(path: Option<&Path>) -> anyhow::Result<T> {
    let Some(path) = path else {
        return Ok(T::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
}

/// Relative paths in a config file are relative to the file's directory.
pub fn relative_to(config: Option<&Path>, path: PathBuf) -> PathBuf {
    match config.and_then(Path::parent) {
        Some(base) if path.is_relative() => base.join(path),
        _ => path,
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
