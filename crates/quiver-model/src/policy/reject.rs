//! Why a tool is not injected: [`RejectReason`], its message and its stable
//! code.

use crate::naming::{MAX_INJECTED_NAME_LEN, ToolNameError};

use super::limits::{MAX_TOOL_DESCRIPTION_BYTES, MAX_TOOL_SCHEMA_BYTES, MAX_TOOL_SCHEMA_DEPTH};

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
