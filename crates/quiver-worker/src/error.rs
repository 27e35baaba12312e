//! The one shape of every error a worker reports (docs/reference.md §10):
//! `{"error": {"code", "message", "retryable", "field"?, …}}`, whether it is
//! an HTTP answer, an SSE event or the content of a chat tool message. The
//! HTTP edge adds the status ([`crate::http`]); this type knows nothing of
//! HTTP so the domain modules can build it too. Each error type converts
//! itself (`From<&CallError>` in `call_error`, …); this module imports none of
//! them, so no module imports back.

use quiver_model::ErrorCode;
use quiver_upstream::UpstreamError;
use serde::Serialize;
use serde_json::{Map, Value, json};

/// The error object: a code from the [`ErrorCode`] table, a message for
/// people, whether retrying may help, the request field at fault, and
/// further keys a particular error carries.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorObject {
    /// The stable code.
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
    /// Whether the same request may succeed later.
    pub retryable: bool,
    /// The request field at fault, e.g. `mcp.server_ids[1]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Keys particular to this error (e.g. the id of a pending approval).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ErrorObject {
    /// An error with `code`'s default retryability and no field.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorObject {
            code,
            message: message.into(),
            retryable: code.retryable(),
            field: None,
            extra: Map::new(),
        }
    }

    /// Names the request field at fault.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// Overrides the code's default retryability.
    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// Adds a key of this error's own; the four keys of the shape are not
    /// replaced.
    pub fn with(mut self, key: &str, value: Value) -> Self {
        if !matches!(key, "code" | "message" | "retryable" | "field") {
            self.extra.insert(key.to_owned(), value);
        }
        self
    }

    /// The inner object, `{"code", "message", "retryable", …}`.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| json!({"code": self.code}))
    }

    /// The whole body, `{"error": {…}}`.
    pub fn to_body(&self) -> Value {
        json!({ "error": self.to_value() })
    }
}

impl From<&UpstreamError> for ErrorObject {
    fn from(err: &UpstreamError) -> Self {
        let code = match err {
            UpstreamError::Rejected { .. } => ErrorCode::UpstreamRejected,
            UpstreamError::Failed { .. } => ErrorCode::UpstreamFailed,
            UpstreamError::Unreachable { .. } => ErrorCode::UpstreamUnavailable,
            UpstreamError::Timeout { .. } => ErrorCode::UpstreamTimeout,
            UpstreamError::InvalidResponse(_) => ErrorCode::UpstreamInvalidResponse,
            UpstreamError::Stream(_) => ErrorCode::UpstreamStreamFailed,
        };
        ErrorObject::new(code, err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_has_field_only_when_set_and_keeps_its_own_keys() {
        let plain = ErrorObject::new(ErrorCode::McpTimeout, "slow").to_body();
        assert_eq!(
            plain,
            json!({"error": {"code": "mcp_timeout", "message": "slow", "retryable": true}})
        );
        let full = ErrorObject::new(ErrorCode::InvalidRequest, "bad")
            .with_field("mcp.server_ids[1]")
            .with("approval_id", json!("a1"))
            .with("code", json!("overwritten?"))
            .to_value();
        assert_eq!(
            full,
            json!({"code": "invalid_request", "message": "bad", "retryable": false,
                   "field": "mcp.server_ids[1]", "approval_id": "a1"})
        );
    }
}
