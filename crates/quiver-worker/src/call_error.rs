//! Why a tool call did not run or did not finish (docs/reference.md §10).
//! Below both `call`, which runs a call, and `approval`, which refuses one
//! without the approval it needs, so neither imports the other back.

use std::time::Duration;

use quiver_mcp::McpError;
use quiver_model::ErrorCode;
use rmcp::model::InputRequiredResult;
use serde_json::Value;

use crate::error::ErrorObject;

/// Why a call did not run or did not finish (docs/reference.md §10).
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The name does not resolve to a tool injected for this caller.
    #[error("{0}")]
    PolicyDenied(String),
    /// The tool needs an approval first; `approval_id` names the one
    /// requested for this call, when the tool API asked for it.
    #[error("{message}")]
    ApprovalRequired {
        /// What to do.
        message: String,
        /// The approval to ask an approver for, then to repeat the call with.
        approval_id: Option<String>,
    },
    /// The approval given was denied.
    #[error("{0}")]
    ApprovalDenied(String),
    /// The approval given cannot be used for this call.
    #[error("{0}")]
    ApprovalInvalid(String),
    /// The arguments are not a JSON object.
    #[error("{0}")]
    InvalidArguments(String),
    /// The caller is asked before the call runs (MCP 2026-07-28
    /// `input_required`: an approval's question).
    #[error("the client is asked for input before the call runs")]
    Asking(Box<InputRequiredResult>),
    /// A per-caller limit of the fleet refuses the call (the message names
    /// it), e.g. the caller's pending approvals at the registry's cap.
    #[error("{0}")]
    LimitReached(String),
    /// The caller's policy's `rate_limits` or `max_concurrent_calls` refuse
    /// the call for now (the message names the rule).
    #[error("{message}")]
    RateLimited {
        /// Which rule refused.
        message: String,
        /// When trying again may succeed.
        retry_after: Duration,
    },
    /// The MCP call failed.
    #[error(transparent)]
    Mcp(#[from] McpError),
}

impl CallError {
    /// The refusal for a name that is not one of the caller's tools.
    pub fn not_available(name: &str) -> Self {
        CallError::PolicyDenied(format!("{name:?} is not a tool available to this caller"))
    }

    /// The error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            CallError::PolicyDenied(_) => ErrorCode::McpPolicyDenied,
            CallError::ApprovalRequired { .. } => ErrorCode::McpApprovalRequired,
            CallError::ApprovalDenied(_) => ErrorCode::McpApprovalDenied,
            CallError::ApprovalInvalid(_) => ErrorCode::McpApprovalInvalid,
            CallError::InvalidArguments(_) => ErrorCode::McpInvalidArguments,
            CallError::Asking(_) => ErrorCode::McpInputRequired,
            CallError::LimitReached(_) => ErrorCode::ResourceExhausted,
            CallError::RateLimited { .. } => ErrorCode::McpRateLimited,
            CallError::Mcp(err) => err.code(),
        }
    }

    /// Whether retrying later may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            CallError::LimitReached(_) | CallError::RateLimited { .. } => true,
            CallError::Mcp(err) => err.retryable(),
            _ => false,
        }
    }

    /// The error body, `{"error": {…}}`.
    pub fn to_json(&self) -> Value {
        ErrorObject::from(self).to_body()
    }
}

impl From<&CallError> for ErrorObject {
    fn from(err: &CallError) -> Self {
        let object = ErrorObject::new(err.code(), err.to_string()).with_retryable(err.retryable());
        match err {
            CallError::ApprovalRequired {
                approval_id: Some(id),
                ..
            } => object.with("approval_id", Value::String(id.clone())),
            CallError::RateLimited { retry_after, .. } => {
                // Whole milliseconds, at least 1: "now" is never the answer.
                let ms = retry_after.as_millis().max(1);
                object.with(
                    "retry_after_ms",
                    Value::from(u64::try_from(ms).unwrap_or(u64::MAX)),
                )
            }
            // The link goes to the caller only: it is in no message, so in
            // no log line.
            CallError::Mcp(McpError::AuthorizationRequired(required)) => object
                .with("authorization_url", Value::String(required.url.clone()))
                .with(
                    "oauth_connection",
                    Value::String(required.connection.clone()),
                ),
            _ => object,
        }
    }
}
