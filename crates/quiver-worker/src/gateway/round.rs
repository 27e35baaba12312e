//! One round of a 2026-07-28 client's request that may need its input:
//! `tools/call`, `prompts/get`, `resources/read` (the requests MCP lets end
//! in `input_required`).
//!
//! A round opens what the client carried from the last one (its
//! `requestState`, checked by [`RequestStates`], and `inputResponses`),
//! collects what the server asks while it answers ([`Inputs`]) and, when
//! the client must answer first, ends in the `input_required` result with
//! the state of the next round. Approvals (§13.7) ask the same way: the
//! approval's id travels in the state until an approver decided. A server
//! of 2026-07-28 asks by `input_required` itself: its requests are passed on
//! as they are and its own state travels inside the gateway's
//! ([`Round::pass_on`]), the client's answers back to it
//! ([`Round::upstream_input`]).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    ClientCapabilities, ElicitRequest, ElicitRequestParams, ElicitationSchema, ErrorData,
    InputRequest, InputRequests, InputRequiredResult, InputResponses,
};

use quiver_mcp::UpstreamInput;

use crate::auth::CallerId;
use crate::gateway::consent::CONSENT_INPUT;
use crate::gateway::inputs::{Inputs, RoundEnd};
use crate::gateway::request_state::{RequestBinding, RequestStates, RoundState};
use crate::gateway::scope::Scope;

/// The input key of an approval's question.
pub const APPROVAL_INPUT: &str = "quiver-approval";

/// What a round's state is bound to (see [`RequestBinding`]).
pub struct RoundKey {
    /// The caller.
    pub caller: CallerId,
    /// The endpoint.
    pub scope: Scope,
    /// The JSON-RPC method.
    pub method: &'static str,
    /// The tool or prompt name, or the resource URI.
    pub target: String,
    /// The request's arguments (`null` when none).
    pub arguments: serde_json::Value,
}

impl RoundKey {
    /// Uses the key's binding. The caller's principal and the endpoint are
    /// spelled out only here: most rounds neither open a state nor seal one.
    fn bound<R>(&self, use_binding: impl FnOnce(&RequestBinding<'_>) -> R) -> R {
        let caller = self.caller.principal();
        let endpoint = self.scope.endpoint();
        use_binding(&RequestBinding {
            caller: &caller,
            endpoint: &endpoint,
            method: self.method,
            target: &self.target,
            arguments: &self.arguments,
        })
    }
}

/// Where a call stands with its approval in this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalStep {
    /// None asked yet.
    NotAsked,
    /// Approval `id` was requested; the client was asked to wait for it.
    Waiting(String),
    /// Approval `id` was used for this call in an earlier round: the call
    /// runs again with the client's answers, under the same approval.
    Used(String),
}

/// An elicitation form with nothing to fill in: the answer is the action
/// (an approval's question).
pub fn empty_form() -> ElicitationSchema {
    serde_json::from_value(serde_json::json!({"type": "object", "properties": {}}))
        .expect("an empty object schema")
}

/// One round of a request.
pub struct Round {
    /// The client's answers and what the server asks.
    pub inputs: Arc<Inputs>,
    key: RoundKey,
    states: RequestStates,
    /// Changes while the call settles its approval, which runs beside the
    /// round's watch for the server's questions.
    approval: Mutex<ApprovalStep>,
    /// This round's `inputResponses`, for a server that asked itself.
    responses: InputResponses,
    /// Whether the server asked itself last round, and its state.
    upstream: Option<Option<String>>,
}

/// The request's `inputResponses` and `requestState`, as the client sent them.
pub struct Carried {
    /// `inputResponses`.
    pub responses: Option<InputResponses>,
    /// `requestState`.
    pub state: Option<String>,
}

impl Round {
    /// Opens a round of `key`: a state the gateway did not issue for this
    /// very request is refused (-32602 naming why).
    pub fn open(
        states: &RequestStates,
        key: RoundKey,
        carried: Carried,
        capabilities: ClientCapabilities,
    ) -> Result<Round, ErrorData> {
        let prior = match carried.state.as_deref() {
            Some(state) => key
                .bound(|binding| states.open(state, binding))
                .map_err(|refused| ErrorData::invalid_params(refused.to_string(), None))?,
            None => RoundState::default(),
        };
        let approval = match (prior.approval_id, prior.approval_used) {
            (Some(id), true) => ApprovalStep::Used(id),
            (Some(id), false) => ApprovalStep::Waiting(id),
            (None, _) => ApprovalStep::NotAsked,
        };
        // This round's answers win over the same key's earlier ones.
        let responses = carried.responses.unwrap_or_default();
        let mut offered: BTreeMap<String, serde_json::Value> = prior.answers;
        offered.extend(responses.clone());
        Ok(Round {
            inputs: Arc::new(Inputs::new(offered, capabilities)),
            key,
            states: states.clone(),
            approval: Mutex::new(approval),
            responses,
            upstream: prior.upstream_asked.then_some(prior.upstream_state),
        })
    }

    /// Where the call stands with its approval.
    pub fn approval(&self) -> ApprovalStep {
        self.step().clone()
    }

    fn step(&self) -> std::sync::MutexGuard<'_, ApprovalStep> {
        self.approval.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the client declared it can be asked (elicitation).
    pub fn can_ask(&self) -> bool {
        self.inputs.can_elicit()
    }

    /// The client's answer to the approval's question: `Some(true)` when it
    /// accepted, `Some(false)` when it declined or cancelled.
    pub fn approval_answer(&self) -> Option<bool> {
        let answer = self.inputs.offered(APPROVAL_INPUT)?;
        let action = answer.get("action").and_then(|a| a.as_str())?;
        Some(action == "accept")
    }

    /// Notes that approval `id` was used for this call: later rounds run it
    /// again without asking.
    pub fn approval_used(&self, id: String) {
        *self.step() = ApprovalStep::Used(id);
    }

    /// What goes back to a server that asked itself last round: the
    /// client's answers (the approval's excepted) and the server's state.
    pub fn upstream_input(&self) -> Option<UpstreamInput> {
        let request_state = self.upstream.clone()?;
        let mut responses = self.responses.clone();
        responses.remove(APPROVAL_INPUT);
        responses.remove(CONSENT_INPUT);
        Some(UpstreamInput {
            responses,
            request_state,
        })
    }

    /// What the client can be asked, as it declared.
    pub fn capabilities(&self) -> ClientCapabilities {
        self.inputs.capabilities().clone()
    }

    /// The server's own `input_required`, passed on: its requests as they
    /// are, its state inside the gateway's.
    pub fn pass_on(&self, asked: InputRequiredResult) -> InputRequiredResult {
        let state = self.seal(self.inputs.used(), Some(asked.request_state));
        InputRequiredResult::new(asked.input_requests, Some(state))
    }

    fn state(&self, answers: BTreeMap<String, serde_json::Value>) -> String {
        self.seal(answers, None)
    }

    /// The state of the next round: `upstream` is the server's own
    /// `input_required` state when it asked itself.
    fn seal(
        &self,
        answers: BTreeMap<String, serde_json::Value>,
        upstream: Option<Option<String>>,
    ) -> String {
        let (approval_id, approval_used) = match self.approval() {
            ApprovalStep::NotAsked => (None, false),
            ApprovalStep::Waiting(id) => (Some(id), false),
            ApprovalStep::Used(id) => (Some(id), true),
        };
        let state = RoundState {
            answers,
            approval_id,
            approval_used,
            upstream_asked: upstream.is_some(),
            upstream_state: upstream.flatten(),
        };
        self.key.bound(|binding| self.states.seal(binding, state))
    }

    /// The round's end when the server asked what the client must answer
    /// first, or an answer did not fit (pending until then).
    pub async fn ended(&self) -> Result<InputRequiredResult, ErrorData> {
        match self.inputs.ended().await {
            RoundEnd::InputRequired { requests, used } => Ok(InputRequiredResult::new(
                Some(requests),
                Some(self.state(used)),
            )),
            RoundEnd::Invalid(error) => Err(error),
        }
    }

    /// Whether the client can be sent to a consent link (it declared URL
    /// elicitation) and was not yet: the retry of a round that sent it
    /// reports what stands instead of asking again.
    pub fn may_send_to_link(&self) -> bool {
        crate::gateway::consent::opens_links(self.inputs.capabilities())
            && self.inputs.offered(CONSENT_INPUT).is_none()
    }

    /// Ends the round sending the person at the client to `url`, where it
    /// connects the caller's account (a URL elicitation); the retry runs
    /// with the grant.
    pub fn ask_consent(&self, message: String, url: String) -> InputRequiredResult {
        let question = InputRequest::Elicitation(ElicitRequest::new(
            ElicitRequestParams::UrlElicitationParams {
                meta: None,
                message,
                url,
                // 2026-07-28 has no elicitation ids: the key names it.
                elicitation_id: String::new(),
            },
        ));
        let requests = InputRequests::from([(CONSENT_INPUT.to_owned(), question)]);
        InputRequiredResult::new(Some(requests), Some(self.state(self.inputs.used())))
    }

    /// Ends the round asking the person at the client to accept once an
    /// approver approved `id` (the approval travels in the state).
    pub fn ask_approval(&self, id: String, message: String) -> InputRequiredResult {
        let question = InputRequest::Elicitation(ElicitRequest::new(
            ElicitRequestParams::FormElicitationParams {
                meta: None,
                message,
                requested_schema: empty_form(),
            },
        ));
        *self.step() = ApprovalStep::Waiting(id);
        let requests = InputRequests::from([(APPROVAL_INPUT.to_owned(), question)]);
        InputRequiredResult::new(Some(requests), Some(self.state(self.inputs.used())))
    }
}

/// How a request of a round settled.
pub enum Settled<T> {
    /// The server answered.
    Done(T),
    /// The client must answer first.
    InputRequired(InputRequiredResult),
}

/// Runs `answer` within `round` (if any): the round may end first, asking
/// the client. `answer` is pinned where the caller keeps it: a future
/// taken by value is stored again in this one's state, and a tool call's
/// is tens of kilobytes, copied at every level that takes it so.
pub async fn in_round<T, F>(
    round: Option<&Round>,
    mut answer: Pin<&mut F>,
) -> Result<Settled<T>, ErrorData>
where
    F: Future<Output = Result<T, ErrorData>>,
{
    let Some(round) = round else {
        return answer.await.map(Settled::Done);
    };
    tokio::select! {
        answer = answer.as_mut() => match answer {
            Ok(answer) => Ok(Settled::Done(answer)),
            Err(error) => Err(round.inputs.missing_capability().unwrap_or(error)),
        },
        asked = round.ended() => {
            // The server's waiting requests are refused now: it gets a
            // moment to end the request by itself rather than be cancelled
            // (a server that honours a cancellation never answers, and an
            // unanswered call holds its slot until `cancel_grace` recycles
            // the connection).
            let _ = tokio::time::timeout(ROUND_SETTLE, answer).await;
            asked.map(Settled::InputRequired)
        }
    }
}

/// How long a request whose round ended waits for its server to end it.
const ROUND_SETTLE: std::time::Duration = std::time::Duration::from_secs(1);
