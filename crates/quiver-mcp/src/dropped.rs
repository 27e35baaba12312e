//! The marker of an answer the stdio transport could not take (over
//! `max_message_bytes`, or not parsable): the transport puts a JSON-RPC
//! error with this code in its place ([`DropReason::error`]), and the pool
//! and the output cap recognise it ([`dropped_answer`]) to report it as the
//! failure it stands for instead of as the server's own error. Both ends
//! live here so the encoding has one home.

use rmcp::model::{ErrorCode, ErrorData};

use crate::error::McpError;

/// JSON-RPC error code of the marker (in the implementation-defined range).
const DROPPED_ANSWER_CODE: i32 = -32099;

/// Why an answer was dropped, carried in the marker's `data.reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Over `max_message_bytes`.
    TooLarge,
    /// Not a JSON-RPC message.
    Unparsable,
}

impl DropReason {
    /// The reason as written in `data.reason` and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::TooLarge => "too_large",
            DropReason::Unparsable => "unparsable",
        }
    }

    /// The marker put in place of the dropped answer.
    pub fn error(self, message: String) -> ErrorData {
        let data = serde_json::json!({ "reason": self.as_str() });
        ErrorData::new(ErrorCode(DROPPED_ANSWER_CODE), message, Some(data))
    }
}

/// The error a request gets when the transport dropped its answer, or
/// `None` for an error the server sent itself.
pub fn dropped_answer(error: &ErrorData) -> Option<McpError> {
    if error.code.0 != DROPPED_ANSWER_CODE {
        return None;
    }
    let message = error.message.to_string();
    let reason = error.data.as_ref()?.get("reason")?.as_str()?;
    if reason == DropReason::TooLarge.as_str() {
        Some(McpError::OutputTooLarge(message))
    } else if reason == DropReason::Unparsable.as_str() {
        Some(McpError::Protocol(message))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_decode_to_the_failure_they_stand_for_and_server_errors_do_not() {
        let large = DropReason::TooLarge.error("big".into());
        assert!(matches!(dropped_answer(&large), Some(McpError::OutputTooLarge(m)) if m == "big"));
        let garbled = DropReason::Unparsable.error("bad".into());
        assert!(matches!(dropped_answer(&garbled), Some(McpError::Protocol(m)) if m == "bad"));
        let own = ErrorData::new(ErrorCode(DROPPED_ANSWER_CODE), "server's", None);
        assert!(
            dropped_answer(&own).is_none(),
            "no reason: the server's own"
        );
        let other = ErrorData::new(
            ErrorCode(-32000),
            "x",
            Some(serde_json::json!({"reason": "too_large"})),
        );
        assert!(dropped_answer(&other).is_none());
    }
}
