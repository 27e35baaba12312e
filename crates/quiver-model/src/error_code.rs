//! The one table of the error codes Quiver answers with (docs/reference.md
//! §10): MCP call failures, refusals of a request, and upstream failures of
//! chat. Every code string is written here and nowhere else. The table lives
//! at the bottom of the workspace so that every surface borrows the same
//! names: the worker answers with every code, the registry's tool preview
//! names its `mcp_*` failures with them. Each surface maps a code to its
//! protocol once (the worker's HTTP statuses: `quiver_worker::http::error`;
//! the registry's gRPC codes and statuses: `quiver_registry::error`).

/// A stable, machine-readable error code of Quiver's APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The MCP server cannot be reached, failed to start, crashed, or the
    /// worker-wide limits leave no room.
    McpUnavailable,
    /// The call exceeded `tool_timeout_ms`.
    McpTimeout,
    /// The arguments are not a JSON object or do not match the tool's schema.
    McpInvalidArguments,
    /// The caller's policy (or the egress allowlist) refuses the tool, server
    /// or URL.
    McpPolicyDenied,
    /// The output was truncated to the budget (and marked so).
    McpOutputTooLarge,
    /// The tool needs an approval before it runs.
    McpApprovalRequired,
    /// The server acts as each caller (a per-user OAuth connection) and
    /// this caller has not connected its account: `authorization_url` says
    /// where to.
    McpAuthorizationRequired,
    /// The approval given for the call was denied by an approver.
    McpApprovalDenied,
    /// The approval given cannot be used for this call (unknown, pending,
    /// used, expired, or approved for another call).
    McpApprovalInvalid,
    /// The server's own `isError` result, its text kept.
    McpToolError,
    /// A 2026-07-28 server answered the call with `input_required`: it runs
    /// once the caller repeats it with the answers to the server's input
    /// requests (`inputResponses`) and its `requestState`.
    McpInputRequired,
    /// A call not run because a session budget of the chat request is used up.
    McpBudgetExceeded,
    /// A call not run because the caller's policy's `rate_limits` or
    /// `max_concurrent_calls` refuse it for now; `retry_after_ms` (and the
    /// `Retry-After` header) say when to try again.
    McpRateLimited,
    /// A per-caller limit of the fleet is reached (e.g. the caller's pending
    /// approvals); the message names the limit. Other callers are unaffected.
    ResourceExhausted,
    /// The request is malformed; the error names the field when it can.
    InvalidRequest,
    /// No or unknown bearer token, or a JWT that does not verify (the
    /// message says why).
    Unauthenticated,
    /// A JWT of a configured identity provider verified, but none of the
    /// provider's rules gives its caller a task.
    IdentityNoMatchingRule,
    /// The `Host` or `Origin` header is not allowed on the MCP endpoints
    /// (DNS-rebinding protection).
    ForbiddenOrigin,
    /// No such route.
    NotFound,
    /// The route exists but not with this method.
    MethodNotAllowed,
    /// The request body is over the listener's limit.
    PayloadTooLarge,
    /// Chat was asked of a worker without an upstream.
    UpstreamNotConfigured,
    /// The chat upstream refused the request (its own status and body are
    /// forwarded when it sent one).
    UpstreamRejected,
    /// The chat upstream kept failing (429/5xx) until the retries ran out.
    UpstreamFailed,
    /// The chat upstream could not be reached.
    UpstreamUnavailable,
    /// The chat upstream did not answer in time.
    UpstreamTimeout,
    /// The chat upstream's answer is not a chat completion.
    UpstreamInvalidResponse,
    /// The chat upstream's stream broke off or carried an invalid chunk.
    UpstreamStreamFailed,
    /// A bug in the worker.
    Internal,
}

impl ErrorCode {
    /// The code as it appears in error objects and metric labels.
    pub const fn as_str(self) -> &'static str {
        self.mapping().0
    }

    /// Whether the same request may succeed if retried later (a default: an
    /// error may know better, e.g. a JSON-RPC error reported as
    /// `mcp_unavailable` is not retryable).
    pub const fn retryable(self) -> bool {
        self.mapping().1
    }

    /// The table itself: code, retryable.
    const fn mapping(self) -> (&'static str, bool) {
        match self {
            ErrorCode::McpUnavailable => ("mcp_unavailable", true),
            ErrorCode::McpTimeout => ("mcp_timeout", true),
            ErrorCode::McpInvalidArguments => ("mcp_invalid_arguments", false),
            ErrorCode::McpPolicyDenied => ("mcp_policy_denied", false),
            ErrorCode::McpOutputTooLarge => ("mcp_output_too_large", false),
            ErrorCode::McpApprovalRequired => ("mcp_approval_required", false),
            ErrorCode::McpApprovalDenied => ("mcp_approval_denied", false),
            ErrorCode::McpAuthorizationRequired => ("mcp_authorization_required", false),
            ErrorCode::McpApprovalInvalid => ("mcp_approval_invalid", false),
            ErrorCode::McpToolError => ("mcp_tool_error", false),
            ErrorCode::McpInputRequired => ("mcp_input_required", false),
            ErrorCode::McpBudgetExceeded => ("mcp_budget_exceeded", false),
            ErrorCode::McpRateLimited => ("mcp_rate_limited", true),
            ErrorCode::ResourceExhausted => ("resource_exhausted", true),
            ErrorCode::InvalidRequest => ("invalid_request", false),
            ErrorCode::Unauthenticated => ("unauthenticated", false),
            ErrorCode::IdentityNoMatchingRule => ("identity_no_matching_rule", false),
            ErrorCode::ForbiddenOrigin => ("forbidden_origin", false),
            ErrorCode::NotFound => ("not_found", false),
            ErrorCode::MethodNotAllowed => ("method_not_allowed", false),
            ErrorCode::PayloadTooLarge => ("payload_too_large", false),
            ErrorCode::UpstreamNotConfigured => ("upstream_not_configured", false),
            ErrorCode::UpstreamRejected => ("upstream_rejected", false),
            ErrorCode::UpstreamFailed => ("upstream_failed", true),
            ErrorCode::UpstreamUnavailable => ("upstream_unavailable", true),
            ErrorCode::UpstreamTimeout => ("upstream_timeout", true),
            ErrorCode::UpstreamInvalidResponse => ("upstream_invalid_response", false),
            ErrorCode::UpstreamStreamFailed => ("upstream_stream_failed", true),
            ErrorCode::Internal => ("internal", true),
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [ErrorCode; 28] = [
        ErrorCode::McpAuthorizationRequired,
        ErrorCode::McpRateLimited,
        ErrorCode::McpUnavailable,
        ErrorCode::McpTimeout,
        ErrorCode::McpInvalidArguments,
        ErrorCode::McpPolicyDenied,
        ErrorCode::McpOutputTooLarge,
        ErrorCode::McpApprovalRequired,
        ErrorCode::McpApprovalDenied,
        ErrorCode::McpApprovalInvalid,
        ErrorCode::McpToolError,
        ErrorCode::McpInputRequired,
        ErrorCode::McpBudgetExceeded,
        ErrorCode::InvalidRequest,
        ErrorCode::Unauthenticated,
        ErrorCode::IdentityNoMatchingRule,
        ErrorCode::ForbiddenOrigin,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UpstreamNotConfigured,
        ErrorCode::UpstreamRejected,
        ErrorCode::UpstreamFailed,
        ErrorCode::UpstreamUnavailable,
        ErrorCode::UpstreamTimeout,
        ErrorCode::UpstreamInvalidResponse,
        ErrorCode::UpstreamStreamFailed,
        ErrorCode::Internal,
    ];

    #[test]
    fn codes_are_distinct_snake_case_strings() {
        let mut seen = std::collections::HashSet::new();
        for code in ALL {
            let text = code.as_str();
            assert!(seen.insert(text), "{text} twice");
            assert!(
                text.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{text}"
            );
            assert_eq!(serde_json::to_value(code).unwrap(), text);
        }
    }
}
