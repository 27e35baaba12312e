//! How what a server answers reaches a gateway client: a forwarded
//! request's failure, a resource the record's patterns leave out, and a
//! server's own `input_required` (2026-07-28) carried across a round.

use quiver_mcp::ForwardError;
use quiver_model::policy::ServerContentFilter;
use quiver_model::resource_uri;
use rmcp::model::{
    ErrorCode as RpcCode, ErrorData, InputRequiredResult, InputResponses, ServerResult,
};

use crate::error::ErrorObject;
use crate::gateway::round::Round;

/// A resource that does not exist for this caller (-32002).
pub fn not_found(what: &str) -> ErrorData {
    ErrorData::new(RpcCode::RESOURCE_NOT_FOUND, what.to_owned(), None)
}

/// Refuses `uri` unless `filter` allows it (docs/reference.md §13.5): a
/// URI refused as such (dot segment, control character, …) is -32602
/// naming why, one the patterns leave out -32002 as if it did not exist.
/// Nothing refused reaches the server.
pub fn resource_allowed(filter: &ServerContentFilter, uri: &str) -> Result<(), ErrorData> {
    match filter.judge_resource(uri) {
        Ok(true) => Ok(()),
        Ok(false) => Err(not_found(&format!(
            "resource {uri:?} is not available to this caller"
        ))),
        Err(refusal) => Err(uri_refused(uri, refusal)),
    }
}

/// A resource URI refused as such (-32602, naming why).
pub fn uri_refused(uri: &str, refusal: resource_uri::UriRefusal) -> ErrorData {
    ErrorData::invalid_params(
        format!(
            "resource URI {uri:?} refused: {refusal} (allowed_resources, docs/reference.md §13.5)"
        ),
        None,
    )
}

/// A forwarded request's failure as the client sees it: the server's own
/// JSON-RPC error unchanged, or the §10 object as the error's data.
pub fn forward_error(err: ForwardError) -> ErrorData {
    match err {
        ForwardError::Server(error) => error,
        ForwardError::Failed(err) => {
            let object =
                ErrorObject::new(err.code(), err.to_string()).with_retryable(err.retryable());
            ErrorData::internal_error(err.to_string(), Some(object.to_body()))
        }
    }
}

/// The `inputResponses` and `requestState` a request carries to a server
/// that asked itself last round.
pub fn upstream_params(round: Option<&Round>) -> (Option<InputResponses>, Option<String>) {
    match round.and_then(Round::upstream_input) {
        Some(input) => (
            (!input.responses.is_empty()).then_some(input.responses),
            input.request_state,
        ),
        None => (None, None),
    }
}

/// A server's answer to `prompts/get` or `resources/read` other than its
/// result: its own `input_required` (2026-07-28), passed on to a client
/// without a session; a session's client is asked only during calls.
pub fn passed_on(
    round: Option<&Round>,
    answer: ServerResult,
) -> Result<InputRequiredResult, ErrorData> {
    match (round, answer) {
        (Some(round), ServerResult::InputRequiredResult(asked)) => Ok(round.pass_on(asked)),
        (None, ServerResult::InputRequiredResult(_)) => Err(ErrorData::invalid_request(
            "the server asks for input before it answers (MCP 2026-07-28 input_required); use MCP 2026-07-28 to answer it",
            None,
        )),
        _ => Err(ErrorData::internal_error(
            "the server answered with another result",
            None,
        )),
    }
}
