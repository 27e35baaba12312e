//! One round of a 2026-07-28 client's request that may need its input:
//! `tools/call`, `prompts/get`, `resources/read` (the requests MCP lets end
//! in `input_required`).
//!
//! A round opens what the client carried from the last one (its
//! `requestState`, checked by [`RequestStates`], and `inputResponses`),
//! collects what the server asks while it answers ([`Inputs`]) and, when
//! the client must answer first, ends in the `input_required` result with
//! the state of the next round. Approvals (§13.7) ask the same way: the
//! approval's id travels in the state until an approver decided.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::model::{
    ClientCapabilities, ElicitRequest, ElicitRequestParams, ElicitationSchema, ErrorData,
    InputRequest, InputRequests, InputRequiredResult, InputResponses,
};

use crate::gateway::inputs::{Inputs, RoundEnd};
use crate::gateway::request_state::{RequestBinding, RequestStates, RoundState};

/// The input key of an approval's question.
pub const APPROVAL_INPUT: &str = "quiver-approval";

/// What a round's state is bound to (see [`RequestBinding`]).
pub struct RoundKey {
    /// The caller's principal.
    pub caller: String,
    /// The endpoint.
    pub endpoint: String,
    /// The JSON-RPC method.
    pub method: &'static str,
    /// The tool or prompt name, or the resource URI.
    pub target: String,
    /// The request's arguments (`null` when none).
    pub arguments: serde_json::Value,
}

impl RoundKey {
    fn binding(&self) -> RequestBinding<'_> {
        RequestBinding {
            caller: &self.caller,
            endpoint: &self.endpoint,
            method: self.method,
            target: &self.target,
            arguments: &self.arguments,
        }
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

/// One round of a request.
pub struct Round {
    /// The client's answers and what the server asks.
    pub inputs: Arc<Inputs>,
    key: RoundKey,
    states: RequestStates,
    approval: ApprovalStep,
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
            Some(state) => states
                .open(state, &key.binding())
                .map_err(|refused| ErrorData::invalid_params(refused.to_string(), None))?,
            None => RoundState::default(),
        };
        let approval = match (prior.approval_id, prior.approval_used) {
            (Some(id), true) => ApprovalStep::Used(id),
            (Some(id), false) => ApprovalStep::Waiting(id),
            (None, _) => ApprovalStep::NotAsked,
        };
        // This round's answers win over the same key's earlier ones.
        let mut offered: BTreeMap<String, serde_json::Value> = prior.answers;
        offered.extend(carried.responses.unwrap_or_default());
        Ok(Round {
            inputs: Arc::new(Inputs::new(offered, capabilities)),
            key,
            states: states.clone(),
            approval,
        })
    }

    /// Where the call stands with its approval.
    pub fn approval(&self) -> &ApprovalStep {
        &self.approval
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
    pub fn approval_used(&mut self, id: String) {
        self.approval = ApprovalStep::Used(id);
    }

    fn state(&self, answers: BTreeMap<String, serde_json::Value>) -> String {
        let (approval_id, approval_used) = match &self.approval {
            ApprovalStep::NotAsked => (None, false),
            ApprovalStep::Waiting(id) => (Some(id.clone()), false),
            ApprovalStep::Used(id) => (Some(id.clone()), true),
        };
        self.states.seal(
            &self.key.binding(),
            RoundState {
                answers,
                approval_id,
                approval_used,
            },
        )
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

    /// Ends the round asking the person at the client to accept once an
    /// approver approved `id` (the approval travels in the state).
    pub fn ask_approval(&mut self, id: String, message: String) -> InputRequiredResult {
        let schema = serde_json::from_value::<ElicitationSchema>(
            serde_json::json!({"type": "object", "properties": {}}),
        )
        .expect("an empty object schema");
        let question = InputRequest::Elicitation(ElicitRequest::new(
            ElicitRequestParams::FormElicitationParams {
                meta: None,
                message,
                requested_schema: schema,
            },
        ));
        self.approval = ApprovalStep::Waiting(id);
        let requests = InputRequests::from([(APPROVAL_INPUT.to_owned(), question)]);
        InputRequiredResult::new(Some(requests), Some(self.state(self.inputs.used())))
    }
}
