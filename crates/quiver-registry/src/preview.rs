//! Tool preview and policy evaluation for the web admin (R-UI-3).
//!
//! A preview connects to a record's MCP server from the registry itself
//! (`initialize` + `tools/list` through [`quiver_mcp::probe`], the workers'
//! connection code) and says for every tool whether workers would inject it;
//! an evaluation makes the same decisions for tool names the caller already
//! has, without connecting, so a form can re-check while patterns change.
//!
//! Both decide with [`evaluate_tools`] under an unrestricted task and no
//! session: exactly the record's own layer (`allowed_tools`/`denied_tools`,
//! raw and transformed name validity, the 64-character limit, transform
//! collisions), before any task or request narrows it further.
//!
//! A disabled record is evaluated as if it were enabled, with a `note`
//! saying so: otherwise every tool would read "server is disabled" and the
//! preview could not show what the patterns do before the record is switched
//! on.
//!
//! A preview runs with the registry's environment: a stdio command is started
//! on the registry host (with the same minimal base environment a worker
//! gives children), `${ENV:…}` references resolve against the registry
//! process's variables, and URLs are reached from the registry's network. A
//! record can therefore preview differently from how it runs on workers.
//! HTTP URLs are held to the registry's egress allowlist
//! (`--egress-allow-host` / `--egress-allow-cidr`), like workers to theirs.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use quiver_mcp::Tool;
use quiver_mcp::egress::EgressPolicy;
use quiver_mcp::launch::EnvLookup;
use quiver_mcp::probe::probe_with_egress;
use quiver_model::policy::{
    CompiledTaskPolicy, Decision, ListedTool, RejectReason, ServerToolFilter, evaluate_tools,
};
use quiver_model::{McpServerSpec, ModelError};
use serde::Serialize;
use serde_json::Value;

use crate::error::RegistryError;

/// The `note` of a preview or evaluation of a disabled record.
pub const DISABLED_NOTE: &str = "the record is disabled (enabled = false): workers inject none of its tools; the decisions show what applies once it is enabled";

/// Why a tool is not injected: [`RejectReason::code`] and its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reason {
    /// Stable snake_case code, e.g. `injected_name_too_long`.
    pub code: &'static str,
    /// Human-readable explanation.
    pub message: String,
}

impl From<&RejectReason> for Reason {
    fn from(reason: &RejectReason) -> Self {
        Reason {
            code: reason.code(),
            message: reason.to_string(),
        }
    }
}

/// The decision about one tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolVerdict {
    /// The raw MCP tool name.
    pub name: String,
    /// The name workers inject it under, when allowed.
    pub injected_name: Option<String>,
    /// Whether workers inject it.
    pub allowed: bool,
    /// Why not, when not allowed.
    pub reason: Option<Reason>,
}

/// Decisions about a list of tool names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Evaluation {
    /// One verdict per distinct name, in first-listed order.
    pub tools: Vec<ToolVerdict>,
    /// [`DISABLED_NOTE`] for a disabled record.
    pub note: Option<&'static str>,
}

/// One tool as its server lists it, with the verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreviewTool {
    /// Name and decision.
    #[serde(flatten)]
    pub verdict: ToolVerdict,
    /// The server's description.
    pub description: Option<String>,
    /// The server's JSON schema of the arguments.
    pub input_schema: Value,
}

/// What the server says about itself in `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerInfo {
    /// Implementation name.
    pub name: String,
    /// Implementation version.
    pub version: String,
}

/// The result of a tool preview.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Preview {
    /// The server's identity, when it sent one.
    pub server_info: Option<ServerInfo>,
    /// Connect + `initialize` + `tools/list`, in milliseconds.
    pub duration_ms: f64,
    /// Every tool the server lists (a repeated name once), in its order.
    pub tools: Vec<PreviewTool>,
    /// [`DISABLED_NOTE`] for a disabled record.
    pub note: Option<&'static str>,
}

/// Decides, for each name, whether workers would inject a tool of that name
/// from `spec` (see the module documentation). `spec` must be validated.
pub fn evaluate<'a>(
    spec: &McpServerSpec,
    tools: impl IntoIterator<Item = impl Into<ListedTool<'a>>>,
) -> Result<Evaluation, RegistryError> {
    let note = (!spec.enabled).then_some(DISABLED_NOTE);
    let enabled;
    let spec = if spec.enabled {
        spec
    } else {
        enabled = McpServerSpec {
            enabled: true,
            ..spec.clone()
        };
        &enabled
    };
    // Validation compiled these patterns already; failing here is a bug.
    let filter = ServerToolFilter::new(spec)
        .map_err(|err| RegistryError::Internal(format!("validated patterns fail: {err}")))?;
    let tools = evaluate_tools(
        spec,
        &filter,
        &CompiledTaskPolicy::unrestricted(),
        None,
        tools,
    )
    .into_iter()
    .map(|entry| ToolVerdict {
        injected_name: entry.decision.injected_name().map(str::to_owned),
        allowed: entry.decision.is_allowed(),
        reason: match &entry.decision {
            Decision::Allowed { .. } => None,
            Decision::Rejected(reason) => Some(reason.into()),
        },
        name: entry.tool_name,
    })
    .collect();
    Ok(Evaluation { tools, note })
}

/// Connects to `spec`'s server from the registry, lists its tools within
/// `timeout` and evaluates them. `spec` must be validated and hold no masked
/// values.
///
/// The connection runs in a task of its own, so a client that hangs up does
/// not cut the clean-up short: the stdio child's process group is always
/// ended before the task finishes.
/// Records with `http.auth_ref` carry the tokens of the registry's OAuth
/// connection (`credentials`).
pub async fn preview(
    spec: McpServerSpec,
    env: EnvLookup,
    egress: EgressPolicy,
    credentials: Option<std::sync::Arc<dyn quiver_mcp::credentials::CredentialSource>>,
    timeout: Duration,
) -> Result<Preview, RegistryError> {
    let http = quiver_mcp::egress::http_client_builder()
        .build()
        .map_err(|err| RegistryError::Internal(format!("cannot build an http client: {err}")))?;
    let probing = {
        let spec = spec.clone();
        tokio::spawn(async move {
            probe_with_egress(&spec, &env, http, &egress, credentials, timeout).await
        })
    };
    let found = probing
        .await
        .map_err(|err| RegistryError::Internal(format!("preview task failed: {err}")))??;
    let evaluation = evaluate(
        &spec,
        found.tools.iter().map(|tool| ListedTool {
            name: &tool.name,
            description: tool.description.as_deref(),
            input_schema: Some(&tool.input_schema),
        }),
    )?;
    let mut verdicts: HashMap<String, ToolVerdict> = evaluation
        .tools
        .into_iter()
        .map(|verdict| (verdict.name.clone(), verdict))
        .collect();
    let mut seen = HashSet::new();
    let tools = found
        .tools
        .iter()
        .filter(|tool| seen.insert(tool.name.as_ref()))
        .filter_map(|tool| {
            let verdict = verdicts.remove(tool.name.as_ref())?;
            Some(preview_tool(tool, verdict))
        })
        .collect();
    Ok(Preview {
        server_info: found.server_info.map(|info| ServerInfo {
            name: info.name,
            version: info.version,
        }),
        duration_ms: found.duration.as_secs_f64() * 1000.0,
        tools,
        note: evaluation.note,
    })
}

fn preview_tool(tool: &Tool, verdict: ToolVerdict) -> PreviewTool {
    PreviewTool {
        verdict,
        description: tool.description.as_deref().map(str::to_owned),
        input_schema: Value::Object(tool.input_schema.as_ref().clone()),
    }
}

/// The body of an evaluation: `{"record": <record>, "tools": ["name", …]}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvaluateRequest {
    /// The record, parsed strictly and validated.
    pub record: McpServerSpec,
    /// The tool names to decide about.
    pub tools: Vec<String>,
}

impl EvaluateRequest {
    /// Parses a JSON body; errors name the field (`record.allowed_tools[1]`,
    /// `tools[2]`, an unknown top-level key).
    pub fn parse(body: &[u8]) -> Result<Self, RegistryError> {
        let value: Value =
            serde_json::from_slice(body).map_err(|err| RegistryError::InvalidArgument {
                field: None,
                message: format!("json syntax error: {err}"),
            })?;
        let Value::Object(mut fields) = value else {
            return Err(RegistryError::InvalidArgument {
                field: None,
                message: "expected {\"record\": {...}, \"tools\": [\"name\", ...]}".into(),
            });
        };
        if let Some(unknown) = fields
            .keys()
            .find(|key| *key != "record" && *key != "tools")
        {
            return Err(RegistryError::invalid(unknown.clone(), "unknown field"));
        }
        let missing = |field: &str| RegistryError::invalid(field, "missing required field");
        let record = fields.remove("record").ok_or_else(|| missing("record"))?;
        let record = quiver_model::parse_record_value(record, quiver_model::Strictness::Strict)
            .map_err(|err| nested_in("record", err))?
            .spec;
        let Value::Array(names) = fields.remove("tools").ok_or_else(|| missing("tools"))? else {
            return Err(RegistryError::invalid(
                "tools",
                "expected an array of tool names",
            ));
        };
        let tools = names
            .into_iter()
            .enumerate()
            .map(|(i, name)| match name {
                Value::String(name) => Ok(name),
                _ => Err(RegistryError::invalid(
                    format!("tools[{i}]"),
                    "expected a string",
                )),
            })
            .collect::<Result<_, _>>()?;
        Ok(EvaluateRequest { record, tools })
    }
}

/// `err` with every field moved under `prefix`.
fn nested_in(prefix: &str, err: ModelError) -> ModelError {
    if err.field_errors().is_empty() {
        return err;
    }
    ModelError::Invalid(
        err.field_errors()
            .iter()
            .cloned()
            .map(|error| error.nested(prefix))
            .collect(),
    )
}
