//! Errors of MCP calls, each with its code of the [`ErrorCode`] table.

use quiver_model::ErrorCode;

/// Why an MCP operation failed. Every variant maps to one [`ErrorCode`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum McpError {
    /// The server cannot be reached, failed to start, crashed, or the
    /// worker-wide limits leave no room.
    #[error("{0}")]
    Unavailable(String),
    /// The call exceeded `tool_timeout_ms`; the server was sent a cancellation.
    #[error("tool call timed out after {0} ms")]
    Timeout(u64),
    /// The arguments were rejected (not a JSON object, or refused by the server as invalid params).
    #[error("{0}")]
    InvalidArguments(String),
    /// The record's URL is refused by the egress allowlist (nothing was
    /// connected); the message names the host and how to allow it.
    #[error("{0}")]
    EgressDenied(String),
    /// The server answered with a JSON-RPC error other than invalid params,
    /// or with a message that cannot be parsed.
    #[error("{0}")]
    Protocol(String),
    /// A per-session server was called without a session; the message says
    /// which header to send.
    #[error("{0}")]
    SessionRequired(String),
    /// The server's answer is over `max_message_bytes`: it was dropped
    /// unread, and the request failed at once.
    #[error("{0}")]
    OutputTooLarge(String),
    /// A 2026-07-28 server answered a call with `input_required`: the call
    /// runs once it is repeated with the answers to the server's input
    /// requests and its `requestState` (see [`crate::UpstreamInput`]).
    #[error("{}", input_required_message(.0))]
    InputRequired(Box<rmcp::model::InputRequiredResult>),
    /// A 2026-07-28 server refused the call for a capability its caller
    /// did not declare (JSON-RPC -32021, `data.requiredCapabilities`): the
    /// caller cannot give the input the server needs.
    #[error("the server needs the caller to declare a capability it lacks: {}", .0.message)]
    CapabilityRequired(Box<rmcp::ErrorData>),
    /// The server acts as each caller (its OAuth connection is per user)
    /// and this caller has no grant yet: a person must consent through the
    /// link. The message never holds the link (it is a credential).
    #[error("{0}")]
    AuthorizationRequired(AuthorizationRequired),
}

/// A caller must connect its own account before the server can act as it.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "oauth connection {connection:?} acts as each caller, and {principal} has not connected its account yet: open error.authorization_url in a browser, consent, then call again"
)]
pub struct AuthorizationRequired {
    /// The OAuth connection (`http.auth_ref`).
    pub connection: String,
    /// The caller.
    pub principal: String,
    /// Where the caller's person consents: absolute, single-use, bound to
    /// the caller and the connection, expiring.
    pub url: String,
}

impl std::fmt::Debug for AuthorizationRequired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorizationRequired")
            .field("connection", &self.connection)
            .field("principal", &self.principal)
            .finish_non_exhaustive()
    }
}

/// Names what the server asks for, by key and kind.
fn input_required_message(result: &rmcp::model::InputRequiredResult) -> String {
    use rmcp::model::InputRequest;
    let asked: Vec<String> = result
        .input_requests
        .iter()
        .flatten()
        .map(|(key, request)| {
            let kind = match request {
                InputRequest::Elicitation(_) => "elicitation",
                InputRequest::CreateMessage(_) => "sampling",
                InputRequest::ListRoots(_) => "roots",
                _ => "input",
            };
            format!("{key:?} ({kind})")
        })
        .collect();
    let state = if result.request_state.is_some() {
        " and its requestState"
    } else {
        ""
    };
    if asked.is_empty() {
        "the server needs the call repeated with its requestState before it runs".to_owned()
    } else {
        format!(
            "the server needs input before the call runs: {}; repeat the call with inputResponses for these keys{state}",
            asked.join(", ")
        )
    }
}

impl McpError {
    /// The error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            McpError::Unavailable(_) | McpError::Protocol(_) => ErrorCode::McpUnavailable,
            McpError::Timeout(_) => ErrorCode::McpTimeout,
            McpError::InvalidArguments(_) => ErrorCode::McpInvalidArguments,
            McpError::EgressDenied(_) => ErrorCode::McpPolicyDenied,
            McpError::OutputTooLarge(_) => ErrorCode::McpOutputTooLarge,
            McpError::SessionRequired(_) => ErrorCode::InvalidRequest,
            McpError::InputRequired(_) | McpError::CapabilityRequired(_) => {
                ErrorCode::McpInputRequired
            }
            McpError::AuthorizationRequired(_) => ErrorCode::McpAuthorizationRequired,
        }
    }

    /// Whether retrying the same call later may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, McpError::Unavailable(_) | McpError::Timeout(_))
    }
}
