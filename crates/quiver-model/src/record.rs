//! The MCP server record (docs/reference.md §1): the admin-editable content of one `mcp.d` file.
//!
//! Field names are the snake_case names of the TOML files; JSON (REST) and the
//! protobuf contract use the same names. Defaults live here, once.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How a worker reaches an MCP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// A child process speaking MCP over stdin/stdout.
    Stdio,
    /// The current MCP HTTP transport (single endpoint, optional SSE responses).
    StreamableHttp,
    /// The 2024-11-05 HTTP+SSE transport (GET an event stream, POST to its endpoint).
    HttpSseLegacy,
}

impl Transport {
    /// The name used in files and APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Stdio => "stdio",
            Transport::StreamableHttp => "streamable_http",
            Transport::HttpSseLegacy => "http_sse_legacy",
        }
    }

    /// Whether this transport is configured by the `http` table.
    pub fn is_http(self) -> bool {
        matches!(self, Transport::StreamableHttp | Transport::HttpSseLegacy)
    }
}

/// Whether tool calls need an approval before they run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    /// Calls run without approval.
    #[default]
    Never,
    /// Every call of this server needs an approval.
    Always,
    /// Per-tool decision from `approval_tools`.
    Policy,
}

/// Per-tool approval decision used by [`ApprovalPolicy::Policy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalMode {
    /// The tool runs without approval.
    Never,
    /// The tool needs an approval.
    Always,
}

/// How MCP clients for this server are shared on a worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// One pooled client serves every session.
    #[default]
    Shared,
    /// A dedicated client per chat session (stateful servers).
    PerSession,
}

/// Which MCP protocol era a worker speaks to the server, negotiated per
/// connection. The two eras open a connection differently: 2026-07-28 asks
/// `server/discover` and carries the protocol version in every request's
/// `_meta`, 2025-11-25 and older open with the `initialize` handshake.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Protocol {
    /// A session (`initialize`, 2025-11-25 or the older revision the
    /// server answers) when the server offers one, else 2026-07-28
    /// (`server/discover`): what the worker relays between a server and its
    /// callers needs a session (docs/reference.md §7 R-MCP-8).
    #[default]
    #[serde(rename = "auto")]
    Auto,
    /// Only 2026-07-28: a server without it fails to connect.
    #[serde(rename = "2026-07-28")]
    V2026_07_28,
    /// Only the `initialize` handshake, offering 2025-11-25.
    #[serde(rename = "2025-11-25")]
    V2025_11_25,
}

impl Protocol {
    /// The name used in files and APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Auto => "auto",
            Protocol::V2026_07_28 => "2026-07-28",
            Protocol::V2025_11_25 => "2025-11-25",
        }
    }

    /// Every value, in the order of the documentation.
    pub const ALL: [Protocol; 3] = [Protocol::Auto, Protocol::V2026_07_28, Protocol::V2025_11_25];

    fn is_auto(&self) -> bool {
        *self == Protocol::Auto
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Protocol::ALL
            .into_iter()
            .find(|protocol| protocol.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "unknown protocol {text:?}: expected \"auto\", \"2026-07-28\" or \"2025-11-25\""
                )
            })
    }
}

/// The `stdio` table: how to start the server process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StdioConfig {
    /// Program to execute (looked up on the worker's `PATH` when not absolute).
    pub command: String,
    /// Arguments passed to `command`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment of the child; values may hold `${ENV:VAR}` references.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Sugar: `env_from = ["X"]` is `env.X = "${ENV:X}"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<String>,
    /// Working directory of the child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Opt in to inheriting the worker's whole environment (off: a minimal base
    /// environment plus `env`, so the worker's own secrets do not leak).
    #[serde(default, skip_serializing_if = "is_false")]
    pub inherit_env: bool,
}

/// The `http` table of the HTTP transports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HttpConfig {
    /// Endpoint URL (`http` or `https`).
    pub url: String,
    /// Extra request headers; values may hold `${ENV:VAR}` references.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Name of a credential held outside the registry (docs/reference.md §12).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_ref: Option<String>,
}

/// Per-server limits enforced by workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Budgets {
    /// Timeout of every `tools/call`, in milliseconds.
    pub tool_timeout_ms: u64,
    /// Calls in flight at once on one worker.
    pub max_concurrency: u32,
    /// Output kept from one call; longer output is truncated and marked.
    pub max_tool_output_bytes: u64,
    /// An `isolation = "per_session"` server's session connection unused
    /// this long is closed, in milliseconds; `None`: the worker's
    /// `session_idle_timeout_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_idle_ms: Option<u64>,
}

impl Budgets {
    /// Default `tool_timeout_ms`.
    pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 30_000;
    /// Default `max_concurrency`.
    pub const DEFAULT_MAX_CONCURRENCY: u32 = 8;
    /// Default `max_tool_output_bytes`.
    pub const DEFAULT_MAX_TOOL_OUTPUT_BYTES: u64 = 65_536;
}

impl Default for Budgets {
    fn default() -> Self {
        Budgets {
            tool_timeout_ms: Self::DEFAULT_TOOL_TIMEOUT_MS,
            max_concurrency: Self::DEFAULT_MAX_CONCURRENCY,
            max_tool_output_bytes: Self::DEFAULT_MAX_TOOL_OUTPUT_BYTES,
            session_idle_ms: None,
        }
    }
}

/// `{ remove, add }`: replace a leading `remove` with `add`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixReplace {
    /// Prefix removed from the raw name when present.
    pub remove: String,
    /// Prefix added afterwards.
    pub add: String,
}

/// Argument of a `prefix` step: a prefix to add, or a replacement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PrefixOp {
    /// Add this prefix.
    Add(String),
    /// Replace one prefix with another.
    Replace(PrefixReplace),
}

/// One tool-name transform step (docs/reference.md §13.3), applied in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TransformStep {
    /// `{ prefix = "x_" }` or `{ prefix = { remove = "a_", add = "b_" } }`.
    Prefix(PrefixOp),
    /// `{ suffix = "_v2" }`.
    Suffix(String),
}

/// The admin-editable content of one MCP server record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpServerSpec {
    /// Unique, stable key: `^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`.
    pub server_id: String,
    /// Free text shown to admins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// How workers reach the server.
    pub transport: Transport,
    /// Required iff `transport = "stdio"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdio: Option<StdioConfig>,
    /// Required iff the transport is an HTTP one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpConfig>,
    /// Audit grouping; [`McpServerSpec::effective_tool_namespace`] gives the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_namespace: Option<String>,
    /// Patterns of raw tool names that may be injected. Empty: none (default deny).
    #[serde(default)]
    pub allowed_tools: Vec<String>,
    /// Patterns that are never injected; deny wins over allow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied_tools: Vec<String>,
    /// Patterns of resource URIs callers may read through the MCP gateway,
    /// matched against the whole URI (`file:///data/*.md`, `ui://*`).
    /// Empty: none (default deny). Unlike `allowed_tools`, an empty list is
    /// left out of the record's JSON and TOML forms, so records that do not
    /// use it read exactly as before the field existed (likewise below).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_resources: Vec<String>,
    /// Patterns of prompt names callers may get through the MCP gateway.
    /// Empty: none (default deny).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_prompts: Vec<String>,
    /// Whether calls need an approval.
    #[serde(default)]
    pub approval_policy: ApprovalPolicy,
    /// Per-tool-pattern approval, used with `approval_policy = "policy"`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub approval_tools: BTreeMap<String, ApprovalMode>,
    /// Worker-enforced limits.
    #[serde(default)]
    pub budgets: Budgets,
    /// Client sharing on workers.
    #[serde(default)]
    pub isolation: Isolation,
    /// The MCP protocol era workers speak to the server; left out of the
    /// record's forms while `auto`.
    #[serde(default, skip_serializing_if = "Protocol::is_auto")]
    pub protocol: Protocol,
    /// Disabled records stay stored but are never injected.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Ordered tool-name transforms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transform: Vec<TransformStep>,
    /// Free-form metadata.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl McpServerSpec {
    /// A record with every optional field at its default.
    pub fn new(server_id: impl Into<String>, transport: Transport) -> Self {
        McpServerSpec {
            server_id: server_id.into(),
            display_name: None,
            transport,
            stdio: None,
            http: None,
            tool_namespace: None,
            allowed_tools: Vec::new(),
            denied_tools: Vec::new(),
            allowed_resources: Vec::new(),
            allowed_prompts: Vec::new(),
            approval_policy: ApprovalPolicy::default(),
            approval_tools: BTreeMap::new(),
            budgets: Budgets::default(),
            isolation: Isolation::default(),
            protocol: Protocol::default(),
            enabled: true,
            transform: Vec::new(),
            labels: BTreeMap::new(),
        }
    }

    /// `tool_namespace`, or its default `mcp.<server_id>`.
    pub fn effective_tool_namespace(&self) -> String {
        self.tool_namespace
            .clone()
            .unwrap_or_else(|| format!("mcp.{}", self.server_id))
    }

    /// The record as a pretty TOML document (the `mcp.d` file form).
    pub fn to_toml(&self) -> String {
        // Serialising a plain struct of strings, numbers and maps cannot fail.
        toml::to_string_pretty(self).unwrap_or_else(|err| format!("# unrenderable record: {err}\n"))
    }
}

fn default_true() -> bool {
    true
}

fn is_false(value: &bool) -> bool {
    !*value
}
