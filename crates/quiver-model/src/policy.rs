//! Which tools a request may use (R-FILTER-1/2, R-CHAT-1).
//!
//! Three layers, all of which must pass:
//!
//! 1. the record's `allowed_tools` / `denied_tools` (admin), matched against
//!    the raw MCP tool name; an empty `allowed_tools` allows nothing;
//! 2. the task policy (operator, per caller credential or task), whose
//!    patterns match `<server_id>.<tool_name>`;
//! 3. the session filter (caller, per request), same subject as the task.
//!
//! At the task and session layers an empty allowlist means "no further
//! narrowing"; a deny match always removes. The session can only narrow: it
//! selects servers among those the task allows, and its lists are applied in
//! addition to the task's.
//!
//! [`evaluate`] is the one decision used for the registry's tool preview, the
//! worker's tool listing and the worker's call routing, so the three never
//! disagree.
//!
//! Resources and prompts (served by the planned MCP gateway, docs/reference.md
//! §13.5) have only the record layer so far: [`ServerContentFilter`] compiles
//! `allowed_resources` / `allowed_prompts`, again default deny. Task policies
//! and session filters do not narrow them.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

use crate::budget::{BudgetError, BudgetLimits, SessionBudgets};
use crate::naming::{
    MAX_INJECTED_NAME_LEN, NameError, ToolNameError, injected_name, qualified_name, quote,
    transformed_tool_name, validate_tool_name,
};
use crate::pattern::{PatternError, PatternSet};
use crate::rate_limit::{
    CompiledRateLimit, RateLimit, RateLimitError, check_max_concurrent, compile_rate_limits,
};
use crate::record::McpServerSpec;
use crate::resource_uri::{ResourcePatterns, UriRefusal};
use crate::tool_search::{ToolSearchError, ToolSearchSetting};
use crate::validate::is_valid_server_id;

/// Patterns together with their text, so a rejection can quote the pattern.
#[derive(Debug, Clone)]
struct NamedPatterns {
    patterns: Vec<String>,
    set: PatternSet,
}

impl NamedPatterns {
    fn new(patterns: &[String]) -> Result<Self, PatternError> {
        Ok(NamedPatterns {
            patterns: patterns.to_vec(),
            set: PatternSet::new(patterns)?,
        })
    }

    /// Compiles one pattern at a time so the error names its index.
    fn for_field(field: &str, patterns: &[String]) -> Result<Self, PolicyError> {
        for (i, pattern) in patterns.iter().enumerate() {
            if let Err(error) = PatternSet::new(std::slice::from_ref(pattern)) {
                return Err(PolicyError::InvalidPattern {
                    field: format!("{field}[{i}]"),
                    error,
                });
            }
        }
        NamedPatterns::new(patterns).map_err(|error| PolicyError::InvalidPattern {
            field: field.to_owned(),
            error,
        })
    }

    fn empty() -> Self {
        NamedPatterns {
            patterns: Vec::new(),
            set: PatternSet::empty(),
        }
    }

    fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    fn matches(&self, name: &str) -> bool {
        self.set.matches(name)
    }

    /// The first matching pattern as written.
    fn first_match(&self, name: &str) -> Option<String> {
        if !self.set.matches(name) {
            return None;
        }
        let index = self.set.first_match(name)?;
        self.patterns.get(index).map(|p| quote(p))
    }
}

/// A record's `allowed_tools` / `denied_tools`, compiled (layer 1).
#[derive(Debug, Clone)]
pub struct ServerToolFilter {
    allowed: NamedPatterns,
    denied: NamedPatterns,
}

impl ServerToolFilter {
    /// Compiles the record's lists. Stored records were validated, so this
    /// only fails for a record that skipped validation.
    pub fn new(spec: &McpServerSpec) -> Result<Self, PatternError> {
        Ok(ServerToolFilter {
            allowed: NamedPatterns::new(&spec.allowed_tools)?,
            denied: NamedPatterns::new(&spec.denied_tools)?,
        })
    }

    /// Whether the raw tool name passes this layer; deny wins over allow.
    pub fn check(&self, tool_name: &str) -> Result<(), RejectReason> {
        if let Some(pattern) = self.denied.first_match(tool_name) {
            return Err(RejectReason::DeniedByServer { pattern });
        }
        if !self.allowed.matches(tool_name) {
            return Err(RejectReason::NotInAllowedTools);
        }
        Ok(())
    }
}

/// A record's `allowed_resources` and `allowed_prompts`, compiled: which of
/// the server's resources and prompts callers may use besides its tools.
///
/// Resource patterns match the whole URI as the server lists it and prompt
/// patterns the prompt name, both case-sensitively, with the syntax of
/// [`crate::pattern`] (`*` matches any substring, `/` included). A URI with
/// a dot segment, control character, backslash or malformed encoding is
/// refused before matching ([`crate::resource_uri`]). An empty list allows
/// nothing. This is the only layer for resources and prompts; whether the
/// server itself may be used is [`server_selected`]'s decision.
#[derive(Debug, Clone)]
pub struct ServerContentFilter {
    resources: ResourcePatterns,
    prompts: PatternSet,
}

impl ServerContentFilter {
    /// Compiles the record's lists. Stored records were validated, so this
    /// only fails for a record that skipped validation.
    pub fn new(spec: &McpServerSpec) -> Result<Self, PatternError> {
        Ok(ServerContentFilter {
            resources: ResourcePatterns::new(&spec.allowed_resources)?,
            prompts: PatternSet::new(&spec.allowed_prompts)?,
        })
    }

    /// Whether the resource at `uri` may be listed and read.
    pub fn allows_resource(&self, uri: &str) -> bool {
        self.resources.matches(uri)
    }

    /// Why `uri` is refused whatever `allowed_resources` says
    /// ([`crate::resource_uri::check`]), or whether a pattern allows it.
    pub fn judge_resource(&self, uri: &str) -> Result<bool, UriRefusal> {
        self.resources.judge(uri)
    }

    /// Whether the prompt `name` may be listed and got.
    pub fn allows_prompt(&self, name: &str) -> bool {
        self.prompts.matches(name)
    }
}

/// The operator's policy for one caller or task (layer 2), as configured.
///
/// The default allows every enabled server and narrows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskPolicy {
    /// Servers this task may use; `None` means every enabled server, an
    /// empty list means none.
    pub allowed_server_ids: Option<Vec<String>>,
    /// Servers used when the request names none; `None` means all the task
    /// allows. Must be a subset of `allowed_server_ids`.
    pub default_server_ids: Option<Vec<String>>,
    /// Patterns over `<server_id>.<tool_name>`; empty: no further narrowing.
    #[serde(alias = "task_tool_allowlist")]
    pub tool_allowlist: Vec<String>,
    /// Patterns over `<server_id>.<tool_name>` that always remove.
    #[serde(alias = "task_tool_denylist")]
    pub tool_denylist: Vec<String>,
    /// Session budgets of the chat tool loop (`[tasks.<name>.budgets]`).
    pub budgets: BudgetLimits,
    /// Upstream model for every chat request of this task, whatever the
    /// request names.
    pub model: Option<String>,
    /// Requested model → upstream model, used when `model` is unset.
    pub models: BTreeMap<String, String>,
    /// Whether chat requests offer tool search instead of every tool,
    /// unless the request says otherwise (`mcp.tool_search`).
    pub tool_search: ToolSearchSetting,
    /// Whether chat requests show tool images to the model, unless the
    /// request says otherwise (`mcp.vision`).
    pub vision: bool,
    /// Tool calls allowed per window, counted across the fleet
    /// ([`crate::rate_limit`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rate_limits: Vec<RateLimit>,
    /// Calls one caller may have running at once on one worker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_calls: Option<u32>,
}

impl TaskPolicy {
    /// Checks and compiles the policy; errors name the offending field.
    pub fn compile(&self) -> Result<CompiledTaskPolicy, PolicyError> {
        let allowed_server_ids = server_id_set("allowed_server_ids", &self.allowed_server_ids)?;
        let default_server_ids = server_id_set("default_server_ids", &self.default_server_ids)?;
        if let (Some(allowed), Some(defaults)) = (&allowed_server_ids, &self.default_server_ids) {
            for (i, id) in defaults.iter().enumerate() {
                if !allowed.contains(id) {
                    return Err(PolicyError::DefaultNotAllowed {
                        field: format!("default_server_ids[{i}]"),
                        server_id: quote(id),
                    });
                }
            }
        }
        if self.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
            return Err(PolicyError::EmptyModel {
                field: "model".into(),
            });
        }
        if let Some((from, _)) = self.models.iter().find(|(_, to)| to.trim().is_empty()) {
            return Err(PolicyError::EmptyModel {
                field: format!("models.{from}"),
            });
        }
        Ok(CompiledTaskPolicy {
            allowed_server_ids,
            default_server_ids,
            allowlist: NamedPatterns::for_field("tool_allowlist", &self.tool_allowlist)?,
            denylist: NamedPatterns::for_field("tool_denylist", &self.tool_denylist)?,
            budgets: SessionBudgets::for_task(&self.budgets)?,
            model: self.model.clone(),
            models: self.models.clone(),
            tool_search: self.tool_search.max_tools()?,
            vision: self.vision,
            rate_limits: compile_rate_limits(&self.rate_limits)?,
            max_concurrent_calls: check_max_concurrent(self.max_concurrent_calls)?,
        })
    }
}

/// A checked [`TaskPolicy`].
#[derive(Debug, Clone)]
pub struct CompiledTaskPolicy {
    allowed_server_ids: Option<BTreeSet<String>>,
    default_server_ids: Option<BTreeSet<String>>,
    allowlist: NamedPatterns,
    denylist: NamedPatterns,
    budgets: SessionBudgets,
    model: Option<String>,
    models: BTreeMap<String, String>,
    tool_search: Option<u32>,
    vision: bool,
    rate_limits: Vec<CompiledRateLimit>,
    max_concurrent_calls: Option<u32>,
}

impl CompiledTaskPolicy {
    /// A policy that allows every enabled server and narrows nothing, e.g.
    /// for the registry's preview of what a record exposes.
    pub fn unrestricted() -> Self {
        CompiledTaskPolicy {
            allowed_server_ids: None,
            default_server_ids: None,
            allowlist: NamedPatterns::empty(),
            denylist: NamedPatterns::empty(),
            budgets: SessionBudgets::default(),
            model: None,
            models: BTreeMap::new(),
            tool_search: None,
            vision: false,
            rate_limits: Vec::new(),
            max_concurrent_calls: None,
        }
    }

    /// The task's rate limits, in the order configured.
    pub fn rate_limits(&self) -> &[CompiledRateLimit] {
        &self.rate_limits
    }

    /// Calls one caller may have running at once on one worker.
    pub fn max_concurrent_calls(&self) -> Option<u32> {
        self.max_concurrent_calls
    }

    /// Whether chat requests show tool images to the model by default.
    pub fn vision(&self) -> bool {
        self.vision
    }

    /// Tools offered with tool search by default (`None`: search is off).
    pub fn tool_search(&self) -> Option<u32> {
        self.tool_search
    }

    /// The task's session budgets.
    pub fn budgets(&self) -> &SessionBudgets {
        &self.budgets
    }

    /// The model to ask the upstream for when a request names `requested`:
    /// the task's override, else its mapping; `None` keeps the request's.
    pub fn upstream_model(&self, requested: Option<&str>) -> Option<&str> {
        self.model
            .as_deref()
            .or_else(|| requested.and_then(|name| self.models.get(name).map(String::as_str)))
    }

    /// Whether the task may use `server_id` at all.
    pub fn allows_server(&self, server_id: &str) -> bool {
        self.allowed_server_ids
            .as_ref()
            .is_none_or(|ids| ids.contains(server_id))
    }

    fn check_tool(&self, qualified: &str) -> Result<(), RejectReason> {
        if let Some(pattern) = self.denylist.first_match(qualified) {
            return Err(RejectReason::DeniedByTask { pattern });
        }
        if !self.allowlist.is_empty() && !self.allowlist.matches(qualified) {
            return Err(RejectReason::NotInTaskAllowlist);
        }
        Ok(())
    }
}

/// The caller's per-request choices (layer 3): the `mcp` extension of a chat
/// request without its `enabled` flag.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionFilter {
    /// Servers to use; `None` means the task's defaults, an empty list means
    /// none. Naming a server the task does not allow is an error, see
    /// [`check_session_within_task`].
    pub server_ids: Option<Vec<String>>,
    /// Patterns over `<server_id>.<tool_name>`; empty: no further narrowing.
    pub tool_allowlist: Vec<String>,
    /// Patterns over `<server_id>.<tool_name>` that always remove.
    pub tool_denylist: Vec<String>,
}

impl SessionFilter {
    /// Checks and compiles the filter; errors name the offending field.
    pub fn compile(&self) -> Result<CompiledSessionFilter, PolicyError> {
        Ok(CompiledSessionFilter {
            server_ids: server_id_set("server_ids", &self.server_ids)?,
            allowlist: NamedPatterns::for_field("tool_allowlist", &self.tool_allowlist)?,
            denylist: NamedPatterns::for_field("tool_denylist", &self.tool_denylist)?,
        })
    }
}

/// A checked [`SessionFilter`].
#[derive(Debug, Clone)]
pub struct CompiledSessionFilter {
    server_ids: Option<BTreeSet<String>>,
    allowlist: NamedPatterns,
    denylist: NamedPatterns,
}

impl CompiledSessionFilter {
    /// The session's tool patterns as written: (allowlist, denylist). Two
    /// filters with the same patterns decide every tool alike.
    pub fn tool_patterns(&self) -> (&[String], &[String]) {
        (&self.allowlist.patterns, &self.denylist.patterns)
    }

    fn check_tool(&self, qualified: &str) -> Result<(), RejectReason> {
        if let Some(pattern) = self.denylist.first_match(qualified) {
            return Err(RejectReason::DeniedBySession { pattern });
        }
        if !self.allowlist.is_empty() && !self.allowlist.matches(qualified) {
            return Err(RejectReason::NotInSessionAllowlist);
        }
        Ok(())
    }
}

fn server_id_set(
    field: &str,
    ids: &Option<Vec<String>>,
) -> Result<Option<BTreeSet<String>>, PolicyError> {
    let Some(ids) = ids else {
        return Ok(None);
    };
    for (i, id) in ids.iter().enumerate() {
        if !is_valid_server_id(id) {
            return Err(PolicyError::InvalidServerId {
                field: format!("{field}[{i}]"),
                server_id: quote(id),
            });
        }
    }
    Ok(Some(ids.iter().cloned().collect()))
}

/// A task policy or session filter that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A pattern does not compile.
    #[error("{field}: {error}")]
    InvalidPattern {
        /// The offending entry, e.g. `tool_allowlist[2]`.
        field: String,
        /// What is wrong with the pattern.
        error: PatternError,
    },
    /// A listed server id is not a valid server id.
    #[error("{field}: {server_id:?} is not a valid server id (^[A-Za-z0-9][A-Za-z0-9_-]{{0,63}}$)")]
    InvalidServerId {
        /// The offending entry, e.g. `server_ids[0]`.
        field: String,
        /// The id as given, shortened when very long.
        server_id: String,
    },
    /// A default server is outside the task's allowed servers.
    #[error("{field}: server {server_id:?} is not in allowed_server_ids")]
    DefaultNotAllowed {
        /// The offending entry, e.g. `default_server_ids[1]`.
        field: String,
        /// The server id.
        server_id: String,
    },
    /// A model name is empty.
    #[error("{field}: must not be empty")]
    EmptyModel {
        /// `model` or `models.<requested>`.
        field: String,
    },
    /// A session budget is invalid or above the task's.
    #[error("budgets.{0}")]
    Budget(#[from] BudgetError),
    /// `tool_search.max_tools` is out of range.
    #[error("tool_search.max_tools: {0}")]
    ToolSearch(#[from] ToolSearchError),
    /// A rate limit or `max_concurrent_calls` is invalid.
    #[error(transparent)]
    RateLimit(#[from] RateLimitError),
    /// The request names servers the task does not allow; a request cannot
    /// widen the task policy.
    #[error(
        "server_ids: {} not allowed for this caller; the request cannot widen the task policy",
        list_ids(.server_ids)
    )]
    ServersNotAllowed {
        /// The servers named by the request but not allowed, sorted.
        server_ids: Vec<String>,
    },
}

impl PolicyError {
    /// The field this error is about.
    pub fn field(&self) -> &str {
        match self {
            PolicyError::InvalidPattern { field, .. }
            | PolicyError::InvalidServerId { field, .. }
            | PolicyError::DefaultNotAllowed { field, .. }
            | PolicyError::EmptyModel { field } => field,
            PolicyError::ServersNotAllowed { .. } => "server_ids",
            PolicyError::Budget(error) => error.field(),
            PolicyError::ToolSearch(_) => "tool_search.max_tools",
            PolicyError::RateLimit(error) => &error.field,
        }
    }
}

fn list_ids(ids: &[String]) -> String {
    let quoted: Vec<String> = ids.iter().map(|id| format!("{id:?}")).collect();
    match quoted.len() {
        1 => format!("server {} is", quoted[0]),
        _ => format!("servers {} are", quoted.join(", ")),
    }
}

/// Refuses a session that names servers the task does not allow.
///
/// [`server_selected`] already keeps such servers out; this makes the attempt
/// visible so the chat layer can refuse the request (403) instead of quietly
/// using fewer servers than asked for.
pub fn check_session_within_task(
    task: &CompiledTaskPolicy,
    session: &CompiledSessionFilter,
) -> Result<(), PolicyError> {
    let Some(requested) = &session.server_ids else {
        return Ok(());
    };
    let refused: Vec<String> = requested
        .iter()
        .filter(|id| !task.allows_server(id))
        .cloned()
        .collect();
    if refused.is_empty() {
        Ok(())
    } else {
        Err(PolicyError::ServersNotAllowed {
            server_ids: refused,
        })
    }
}

/// Why a tool is not injected. The `Display` text answers "why is this tool
/// rejected" in the registry's tool preview and worker diagnostics.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RejectReason {
    /// The record is disabled.
    #[error("server is disabled")]
    ServerDisabled,
    /// The record's server id is invalid (only possible for unvalidated records).
    #[error("server id is invalid, so no injected name can be built")]
    InvalidServerId,
    /// The task policy does not allow this server.
    #[error("server is not allowed by the task policy")]
    ServerNotAllowedForTask,
    /// The request (or, when it names none, the task's defaults) did not select this server.
    #[error(
        "server is not selected for this request (server_ids, or the task's default_server_ids)"
    )]
    ServerNotSelected,
    /// The raw MCP tool name is invalid.
    #[error("raw tool name is invalid: {0}")]
    InvalidToolName(ToolNameError),
    /// The name after the record's `transform` steps is invalid.
    #[error("transformed tool name {name:?} is invalid: {error}")]
    InvalidTransformedName {
        /// The transformed name, shortened when very long.
        name: String,
        /// What is wrong with it.
        error: ToolNameError,
    },
    /// The injected name would exceed the function-name limit.
    #[error(
        "injected name would be {len} characters long, at most {MAX_INJECTED_NAME_LEN} are allowed; shorten the server id or the tool name (transform)"
    )]
    InjectedNameTooLong {
        /// Length the injected name would have.
        len: usize,
    },
    /// No `allowed_tools` pattern of the record matches (empty allows nothing).
    #[error(
        "tool does not match the server's allowed_tools (an empty allowed_tools allows no tool)"
    )]
    NotInAllowedTools,
    /// A `denied_tools` pattern of the record matches.
    #[error("tool is denied by the server's denied_tools pattern {pattern:?}")]
    DeniedByServer {
        /// The first matching pattern.
        pattern: String,
    },
    /// A task denylist pattern matches `<server_id>.<tool_name>`.
    #[error("tool is denied by the task's tool_denylist pattern {pattern:?}")]
    DeniedByTask {
        /// The first matching pattern.
        pattern: String,
    },
    /// The task allowlist is not empty and does not match.
    #[error("tool does not match the task's tool_allowlist")]
    NotInTaskAllowlist,
    /// A session denylist pattern matches `<server_id>.<tool_name>`.
    #[error("tool is denied by the request's tool_denylist pattern {pattern:?}")]
    DeniedBySession {
        /// The first matching pattern.
        pattern: String,
    },
    /// The session allowlist is not empty and does not match.
    #[error("tool does not match the request's tool_allowlist")]
    NotInSessionAllowlist,
    /// The tool's description is longer than [`MAX_TOOL_DESCRIPTION_BYTES`].
    #[error(
        "tool description is {len} bytes long, more than the {MAX_TOOL_DESCRIPTION_BYTES}-byte limit on descriptions"
    )]
    DescriptionTooLong {
        /// Length of the description in bytes.
        len: usize,
    },
    /// The tool's input schema, serialized, is larger than [`MAX_TOOL_SCHEMA_BYTES`].
    #[error(
        "tool input schema is more than the {MAX_TOOL_SCHEMA_BYTES}-byte limit on schemas (serialized as JSON)"
    )]
    SchemaTooLarge,
    /// The tool's input schema nests arrays and objects deeper than
    /// [`MAX_TOOL_SCHEMA_DEPTH`].
    #[error(
        "tool input schema nests more than {MAX_TOOL_SCHEMA_DEPTH} levels deep, the limit on schemas"
    )]
    SchemaTooDeep,
    /// Several raw tools of the server have the same name after the record's
    /// transforms; none of them is injected, whichever order the server lists them in.
    #[error(
        "tools {tools:?} all become {exposed_name:?} after the transform steps; none of them is injected"
    )]
    NameCollision {
        /// The shared transformed name.
        exposed_name: String,
        /// The raw names involved, sorted.
        tools: Vec<String>,
    },
}

impl RejectReason {
    /// A stable snake_case code for APIs, metrics and logs.
    pub fn code(&self) -> &'static str {
        match self {
            RejectReason::ServerDisabled => "server_disabled",
            RejectReason::InvalidServerId => "invalid_server_id",
            RejectReason::ServerNotAllowedForTask => "server_not_allowed_for_task",
            RejectReason::ServerNotSelected => "server_not_selected",
            RejectReason::InvalidToolName(ToolNameError::InvisibleCharacter { .. })
            | RejectReason::InvalidTransformedName {
                error: ToolNameError::InvisibleCharacter { .. },
                ..
            } => "invisible_characters",
            RejectReason::InvalidToolName(_) => "invalid_tool_name",
            RejectReason::InvalidTransformedName { .. } => "invalid_transformed_name",
            RejectReason::DescriptionTooLong { .. } => "description_too_long",
            RejectReason::SchemaTooLarge => "schema_too_large",
            RejectReason::SchemaTooDeep => "schema_too_deep",
            RejectReason::InjectedNameTooLong { .. } => "injected_name_too_long",
            RejectReason::NotInAllowedTools => "not_in_allowed_tools",
            RejectReason::DeniedByServer { .. } => "denied_by_server",
            RejectReason::DeniedByTask { .. } => "denied_by_task",
            RejectReason::NotInTaskAllowlist => "not_in_task_allowlist",
            RejectReason::DeniedBySession { .. } => "denied_by_session",
            RejectReason::NotInSessionAllowlist => "not_in_session_allowlist",
            RejectReason::NameCollision { .. } => "name_collision",
        }
    }
}

/// The outcome for one tool of one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The tool is injected.
    Allowed {
        /// `mcp__<b64(server_id)>__<b64(exposed_name)>`.
        injected_name: String,
        /// The tool name after the record's transforms (the raw name without any).
        exposed_name: String,
    },
    /// The tool is not injected.
    Rejected(RejectReason),
}

impl Decision {
    /// Whether the tool is injected.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed { .. })
    }

    /// The injected name, when allowed.
    pub fn injected_name(&self) -> Option<&str> {
        match self {
            Decision::Allowed { injected_name, .. } => Some(injected_name),
            Decision::Rejected(_) => None,
        }
    }

    /// The reason, when rejected.
    pub fn reject_reason(&self) -> Option<&RejectReason> {
        match self {
            Decision::Allowed { .. } => None,
            Decision::Rejected(reason) => Some(reason),
        }
    }
}

/// The server-level part of [`evaluate`], so callers can skip a server before
/// listing its tools.
///
/// The request's `server_ids` select servers when given; otherwise the task's
/// `default_server_ids`; otherwise every server the task allows. A selected
/// server still needs the task's permission.
pub fn server_selected(
    spec: &McpServerSpec,
    task: &CompiledTaskPolicy,
    session: Option<&CompiledSessionFilter>,
) -> Result<(), RejectReason> {
    if !spec.enabled {
        return Err(RejectReason::ServerDisabled);
    }
    if !is_valid_server_id(&spec.server_id) {
        return Err(RejectReason::InvalidServerId);
    }
    if !task.allows_server(&spec.server_id) {
        return Err(RejectReason::ServerNotAllowedForTask);
    }
    let selection = session
        .and_then(|session| session.server_ids.as_ref())
        .or(task.default_server_ids.as_ref());
    if let Some(selected) = selection
        && !selected.contains(&spec.server_id)
    {
        return Err(RejectReason::ServerNotSelected);
    }
    Ok(())
}

/// Whether raw tool `tool_name` of `spec` is injected for a request, and under
/// which name.
///
/// `server_filter` must be compiled from `spec`. `session` is `None` when the
/// decision is not about one request (registry preview). Checks run in this
/// order, the first failure being the reason: server selection, raw-name
/// validity, registry deny then allow, task deny then allowlist, session deny
/// then allowlist, transformed-name validity, injected-name length. Filters
/// see the raw name; the injected name encodes the transformed name
/// (docs/reference.md §13.3). Name collisions need the whole tool list: see [`evaluate_tools`].
pub fn evaluate(
    spec: &McpServerSpec,
    server_filter: &ServerToolFilter,
    task: &CompiledTaskPolicy,
    session: Option<&CompiledSessionFilter>,
    tool_name: &str,
) -> Decision {
    match decide(spec, server_filter, task, session, tool_name) {
        Ok((injected_name, exposed_name)) => Decision::Allowed {
            injected_name,
            exposed_name,
        },
        Err(reason) => Decision::Rejected(reason),
    }
}

fn decide(
    spec: &McpServerSpec,
    server_filter: &ServerToolFilter,
    task: &CompiledTaskPolicy,
    session: Option<&CompiledSessionFilter>,
    tool_name: &str,
) -> Result<(String, String), RejectReason> {
    server_selected(spec, task, session)?;
    validate_tool_name(tool_name).map_err(RejectReason::InvalidToolName)?;
    server_filter.check(tool_name)?;
    let qualified = qualified_name(&spec.server_id, tool_name);
    task.check_tool(&qualified)?;
    if let Some(session) = session {
        session.check_tool(&qualified)?;
    }
    let exposed = exposed_name(spec, tool_name)?;
    match injected_name(&spec.server_id, &exposed) {
        Ok(injected) => Ok((injected, exposed)),
        Err(NameError::TooLong { len }) => Err(RejectReason::InjectedNameTooLong { len }),
        Err(NameError::InvalidServerId { .. }) => Err(RejectReason::InvalidServerId),
        Err(NameError::InvalidToolName(error)) => Err(RejectReason::InvalidTransformedName {
            name: quote(&exposed),
            error,
        }),
    }
}

fn exposed_name(spec: &McpServerSpec, tool_name: &str) -> Result<String, RejectReason> {
    let exposed = transformed_tool_name(&spec.transform, tool_name);
    validate_tool_name(&exposed).map_err(|error| RejectReason::InvalidTransformedName {
        name: quote(&exposed),
        error,
    })?;
    Ok(exposed)
}

/// Longest tool description injected, in bytes: descriptions go into every
/// request's prompt, so one server must not fill the model's context.
pub const MAX_TOOL_DESCRIPTION_BYTES: usize = 8 * 1024;

/// Largest tool input schema injected, in bytes of compact JSON.
pub const MAX_TOOL_SCHEMA_BYTES: usize = 64 * 1024;

/// Deepest nesting of arrays and objects in an injected input schema (the
/// schema object itself is level 1).
pub const MAX_TOOL_SCHEMA_DEPTH: usize = 32;

/// One tool as its server lists it: what [`evaluate_tools`] judges. The
/// registry's evaluation of bare names has no description or schema.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListedTool<'a> {
    /// The raw MCP tool name.
    pub name: &'a str,
    /// The server's description.
    pub description: Option<&'a str>,
    /// The server's input schema.
    pub input_schema: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

impl<'a> From<&'a str> for ListedTool<'a> {
    fn from(name: &'a str) -> Self {
        ListedTool {
            name,
            ..ListedTool::default()
        }
    }
}

impl ListedTool<'_> {
    /// Checks the description and input schema against
    /// [`MAX_TOOL_DESCRIPTION_BYTES`], [`MAX_TOOL_SCHEMA_BYTES`] and
    /// [`MAX_TOOL_SCHEMA_DEPTH`].
    pub fn check_size(&self) -> Result<(), RejectReason> {
        if let Some(description) = self.description
            && description.len() > MAX_TOOL_DESCRIPTION_BYTES
        {
            return Err(RejectReason::DescriptionTooLong {
                len: description.len(),
            });
        }
        let Some(schema) = self.input_schema else {
            return Ok(());
        };
        if nesting_depth(schema) > MAX_TOOL_SCHEMA_DEPTH {
            return Err(RejectReason::SchemaTooDeep);
        }
        // Counting stops at the limit: a huge schema is not serialized whole.
        let mut counter = ByteCounter {
            remaining: MAX_TOOL_SCHEMA_BYTES,
        };
        serde_json::to_writer(&mut counter, schema).map_err(|_| RejectReason::SchemaTooLarge)
    }
}

/// Nesting depth of arrays and objects under `schema` (itself level 1),
/// walked without recursion.
fn nesting_depth(schema: &serde_json::Map<String, serde_json::Value>) -> usize {
    use serde_json::Value;
    let mut deepest = 1;
    let mut stack: Vec<(&Value, usize)> = schema.values().map(|v| (v, 2)).collect();
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Object(map) => Box::new(map.values()),
            Value::Array(items) => Box::new(items.iter()),
            _ => continue,
        };
        deepest = deepest.max(depth);
        if deepest > MAX_TOOL_SCHEMA_DEPTH {
            break;
        }
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    deepest
}

/// A writer that fails once more than `remaining` bytes are written.
struct ByteCounter {
    remaining: usize,
}

impl std::io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.remaining = self
            .remaining
            .checked_sub(buf.len())
            .ok_or_else(|| std::io::Error::other("limit exceeded"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One tool's outcome in [`evaluate_tools`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolDecision {
    /// The raw MCP tool name.
    pub tool_name: String,
    /// What happens to it.
    pub decision: Decision,
}

/// [`evaluate`] for every tool a server lists, plus size limits and
/// collision detection.
///
/// Returns one entry per distinct raw name, in first-listed order (a server
/// listing a name twice lists one tool). A tool the name and patterns allow
/// is still rejected when its description or schema breaks a size limit
/// ([`ListedTool::check_size`]). Distinct raw names always encode to
/// distinct injected names, but `transform` steps can map two raw names to one
/// exposed name; every allowed tool whose exposed name is shared with another
/// listed tool — allowed or not, so the outcome does not depend on the
/// request's filters or the listing order — is rejected with
/// [`RejectReason::NameCollision`] (docs/reference.md §13.3: reported, not silently dropped).
pub fn evaluate_tools<'a>(
    spec: &McpServerSpec,
    server_filter: &ServerToolFilter,
    task: &CompiledTaskPolicy,
    session: Option<&CompiledSessionFilter>,
    tools: impl IntoIterator<Item = impl Into<ListedTool<'a>>>,
) -> Vec<ToolDecision> {
    let mut seen = HashSet::new();
    let mut decisions: Vec<ToolDecision> = tools
        .into_iter()
        .map(Into::into)
        .filter(|tool| seen.insert(tool.name))
        .map(|tool| {
            let mut decision = evaluate(spec, server_filter, task, session, tool.name);
            if decision.is_allowed()
                && let Err(reason) = tool.check_size()
            {
                decision = Decision::Rejected(reason);
            }
            ToolDecision {
                tool_name: tool.name.to_owned(),
                decision,
            }
        })
        .collect();
    if spec.transform.is_empty() {
        return decisions;
    }
    let mut by_exposed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in &decisions {
        if validate_tool_name(&entry.tool_name).is_ok() {
            let exposed = transformed_tool_name(&spec.transform, &entry.tool_name);
            by_exposed
                .entry(exposed)
                .or_default()
                .push(entry.tool_name.clone());
        }
    }
    for entry in &mut decisions {
        let Decision::Allowed { exposed_name, .. } = &entry.decision else {
            continue;
        };
        if let Some(tools) = by_exposed.get(exposed_name)
            && tools.len() > 1
        {
            let mut tools = tools.clone();
            tools.sort();
            entry.decision = Decision::Rejected(RejectReason::NameCollision {
                exposed_name: quote(exposed_name),
                tools,
            });
        }
    }
    decisions
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
