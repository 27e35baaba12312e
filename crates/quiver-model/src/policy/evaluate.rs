//! The decision: whether one tool of one server is injected for a request,
//! under which name, and the same for a server's whole tool list.

use std::collections::{BTreeMap, HashSet};

use crate::naming::{
    NameError, injected_name, qualified_name, quote, transformed_tool_name, validate_tool_name,
};
use crate::record::McpServerSpec;
use crate::validate::is_valid_server_id;

use super::limits::{
    MAX_TOOL_DESCRIPTION_BYTES, MAX_TOOL_SCHEMA_BYTES, MAX_TOOL_SCHEMA_DEPTH, nesting_depth,
    serialized_within,
};
use super::reject::RejectReason;
use super::server::ServerToolFilter;
use super::session::CompiledSessionFilter;
use super::task::CompiledTaskPolicy;

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
        if !serialized_within(schema, MAX_TOOL_SCHEMA_BYTES) {
            return Err(RejectReason::SchemaTooLarge);
        }
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
