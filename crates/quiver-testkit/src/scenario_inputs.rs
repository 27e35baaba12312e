//! The scenario server's tools and prompt that need the client's input: the
//! conformance suite's multi round-trip scenarios (SEP-2322) and the
//! stateless diagnostics that ask for input (SEP-2575).
//!
//! Each is one [`Flow`]: given the answers so far it asks the next questions
//! or finishes. A flow is served two ways, with the same questions and the
//! same final text:
//!
//! - to a request of a revision without `initialize` (2026-07-28 on), as an
//!   `InputRequiredResult` whose `requestState` carries the answers so far,
//!   sealed (HMAC-SHA256 under a key of this process) and bound to the flow;
//! - to a session of an older revision, as server-to-client requests during
//!   the call, one round after the other, the requests of a round at once.
//!   Each carries `_meta["io.quiver/inputKey"]`: the key the 2026 form names
//!   the input by, so that a gateway turning these requests into an
//!   `InputRequiredResult` can name its inputs as the suite expects.

// The flows ask for sampling and roots, which SEP-2577 deprecates.
#![expect(deprecated)]

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use rmcp::model::{
    ClientCapabilities, ClientResult, CreateMessageRequest, CreateMessageRequestParams,
    CreateMessageResult, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction,
    ElicitationSchema, ErrorData, InputRequest, InputRequests, InputRequiredResult, InputResponses,
    ListRootsRequest, ListRootsResult, RequestMetaObject, RequestStateCodec, SamplingMessage,
    SealOptions, ServerRequest,
};
use rmcp::service::{PeerRequestOptions, RequestContext};
use rmcp::{Peer, RoleServer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The `_meta` key naming the input a server-to-client request asks for.
pub(crate) const INPUT_KEY_META: &str = "io.quiver/inputKey";

/// How long a person may take to answer: the life of a `requestState`, and
/// the wait for a server-to-client request's answer.
const ANSWER_WINDOW: Duration = Duration::from_secs(600);

/// Whether the request is of a revision without `initialize` (2026-07-28 on):
/// it carries its own metadata and takes input by `InputRequiredResult`, as
/// the server may send it no requests.
pub(crate) fn is_stateless(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|version| !version.has_initialize())
}

/// What the client is asked for, and which of its capabilities answers it.
enum Ask {
    /// A form with one required field.
    Elicit {
        message: &'static str,
        field: Field,
    },
    /// One user message to the client's model.
    Sample {
        prompt: &'static str,
        max_tokens: u32,
    },
    ListRoots,
}

/// The one field of an elicitation form.
enum Field {
    Text(&'static str),
    Flag(&'static str),
}

impl Field {
    fn name(&self) -> &'static str {
        match self {
            Field::Text(name) | Field::Flag(name) => name,
        }
    }
}

/// One request for input, under the key its answer comes back by.
struct Question {
    key: &'static str,
    ask: Ask,
}

const NAME: Question = Question {
    key: "user_name",
    ask: Ask::Elicit {
        message: "What is your name?",
        field: Field::Text("name"),
    },
};
const CAPITAL: Question = Question {
    key: "capital_question",
    ask: Ask::Sample {
        prompt: "What is the capital of France?",
        max_tokens: 100,
    },
};
const ROOTS: Question = Question {
    key: "client_roots",
    ask: Ask::ListRoots,
};
const CONFIRM: Question = Question {
    key: "confirm",
    ask: Ask::Elicit {
        message: "Please confirm",
        field: Field::Flag("ok"),
    },
};
const GREETING: Question = Question {
    key: "greeting",
    ask: Ask::Sample {
        prompt: "Generate a greeting",
        max_tokens: 50,
    },
};
const STEP1: Question = Question {
    key: "step1",
    ask: Ask::Elicit {
        message: "Step 1: What is your name?",
        field: Field::Text("name"),
    },
};
const STEP2: Question = Question {
    key: "step2",
    ask: Ask::Elicit {
        message: "Step 2: What is your favorite color?",
        field: Field::Text("color"),
    },
};
const CONTEXT: Question = Question {
    key: "user_context",
    ask: Ask::Elicit {
        message: "What context should the prompt use?",
        field: Field::Text("context"),
    },
};

impl Ask {
    fn declared_by(&self, capabilities: &ClientCapabilities) -> bool {
        match self {
            Ask::Elicit { .. } => capabilities.elicitation.is_some(),
            Ask::Sample { .. } => capabilities.sampling.is_some(),
            Ask::ListRoots => capabilities.roots.is_some(),
        }
    }

    /// Adds the capability that answers this to `capabilities`.
    fn require(&self, capabilities: &mut ClientCapabilities) {
        match self {
            Ask::Elicit { .. } => capabilities.elicitation = Some(Default::default()),
            Ask::Sample { .. } => capabilities.sampling = Some(Default::default()),
            Ask::ListRoots => capabilities.roots = Some(Default::default()),
        }
    }

    fn elicit_request(message: &str, field: &Field) -> ElicitRequest {
        let schema = ElicitationSchema::builder();
        let requested_schema = match field {
            Field::Text(name) => schema.required_string(*name),
            Field::Flag(name) => schema.required_bool(*name),
        }
        .build_unchecked();
        ElicitRequest::new(ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: message.to_owned(),
            requested_schema,
        })
    }

    fn sample_request(prompt: &str, max_tokens: u32) -> CreateMessageRequest {
        CreateMessageRequest::new(CreateMessageRequestParams::new(
            vec![SamplingMessage::user_text(prompt)],
            max_tokens,
        ))
    }

    /// The request as an entry of an `InputRequiredResult`.
    fn input_request(&self) -> InputRequest {
        match self {
            Ask::Elicit { message, field } => {
                InputRequest::Elicitation(Self::elicit_request(message, field))
            }
            Ask::Sample { prompt, max_tokens } => {
                InputRequest::CreateMessage(Self::sample_request(prompt, *max_tokens))
            }
            Ask::ListRoots => InputRequest::ListRoots(ListRootsRequest::default()),
        }
    }

    /// The request as a server-to-client request.
    fn server_request(&self) -> ServerRequest {
        match self {
            Ask::Elicit { message, field } => {
                ServerRequest::ElicitRequest(Self::elicit_request(message, field))
            }
            Ask::Sample { prompt, max_tokens } => {
                ServerRequest::CreateMessageRequest(Self::sample_request(prompt, *max_tokens))
            }
            Ask::ListRoots => ServerRequest::ListRootsRequest(ListRootsRequest::default()),
        }
    }

    /// Reads a client's answer (an entry of `inputResponses`).
    fn parse(&self, answer: Value) -> Result<Answer, serde_json::Error> {
        Ok(match self {
            Ask::Elicit { .. } => Answer::Elicited(serde_json::from_value(answer)?),
            Ask::Sample { .. } => Answer::Sampled(serde_json::from_value(answer)?),
            Ask::ListRoots => Answer::Roots(serde_json::from_value(answer)?),
        })
    }

    /// Takes the answer to a server-to-client request.
    fn answer(&self, result: ClientResult) -> Answer {
        match (self, result) {
            (Ask::Elicit { .. }, ClientResult::ElicitResult(result)) => Answer::Elicited(result),
            (Ask::Sample { .. }, ClientResult::CreateMessageResult(result)) => {
                Answer::Sampled(*result)
            }
            (Ask::ListRoots, ClientResult::ListRootsResult(result)) => Answer::Roots(result),
            _ => Answer::Refused("the client answered with another result".into()),
        }
    }
}

/// The client's answer to one question.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "method", content = "result")]
enum Answer {
    #[serde(rename = "elicitation/create")]
    Elicited(ElicitResult),
    #[serde(rename = "sampling/createMessage")]
    Sampled(CreateMessageResult),
    #[serde(rename = "roots/list")]
    Roots(ListRootsResult),
    /// A server-to-client request the client answered with an error.
    #[serde(rename = "refused")]
    Refused(String),
}

/// The answers so far, by question key.
type Answers = BTreeMap<String, Answer>;

/// The text the answer to `question` gives, or why there is none.
fn answer_text(answers: &Answers, question: &Question) -> Result<String, String> {
    let key = question.key;
    match (answers.get(key), &question.ask) {
        (None, _) => Err(format!("no answer to {key}")),
        (Some(Answer::Refused(reason)), _) => Err(format!("{key} was refused: {reason}")),
        (Some(Answer::Elicited(result)), Ask::Elicit { field, .. }) => {
            if !matches!(result.action, ElicitationAction::Accept) {
                return Err(format!("{key} was not accepted ({:?})", result.action));
            }
            let content = result.content.as_ref();
            let value = |name: &str| content.and_then(|content| content.get(name));
            match field {
                Field::Text(name) => value(name).and_then(Value::as_str).map(str::to_owned),
                Field::Flag(name) => value(name).and_then(Value::as_bool).map(|b| b.to_string()),
            }
            .ok_or_else(|| format!("{key} has no {} field of its type", field.name()))
        }
        (Some(Answer::Sampled(result)), Ask::Sample { .. }) => result
            .message
            .content
            .first()
            .and_then(|content| content.as_text())
            .map(|text| text.text.clone())
            .ok_or_else(|| format!("{key} has no text")),
        (Some(Answer::Roots(result)), Ask::ListRoots) => Ok(if result.roots.is_empty() {
            "no roots".to_owned()
        } else {
            result
                .roots
                .iter()
                .map(|root| root.uri.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        }),
        (Some(_), _) => Err(format!("{key} has an answer of another kind")),
    }
}

/// A tool or prompt that asks the client for input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Elicitation,
    Sampling,
    ListRoots,
    RequestState,
    MultipleInputs,
    MultiRound,
    TamperedState,
    Capabilities,
    StreamingElicitation,
    MissingCapability,
    Prompt,
}

/// What a flow does next.
enum Step {
    Ask(Vec<&'static Question>),
    /// The final text, or why there is none.
    Done(Result<String, String>),
}

/// Where a flow ended up on one request.
pub(crate) enum Outcome {
    Done(Result<String, String>),
    InputRequired(InputRequiredResult),
}

impl Flow {
    /// The flows served as tools, with their descriptions.
    pub(crate) const TOOLS: [(Flow, &'static str); 10] = [
        (Flow::Elicitation, "Asks the client's user for a name"),
        (Flow::Sampling, "Asks the client's model a question"),
        (Flow::ListRoots, "Asks the client for its roots"),
        (Flow::RequestState, "Asks for a confirmation, keeping state"),
        (
            Flow::MultipleInputs,
            "Asks for a name, a greeting and roots at once",
        ),
        (Flow::MultiRound, "Asks for a name, then a color"),
        (
            Flow::TamperedState,
            "Asks for a confirmation under sealed state",
        ),
        (
            Flow::Capabilities,
            "Asks only what the client's capabilities allow",
        ),
        (
            Flow::StreamingElicitation,
            "Asks the client's user while it runs (needs elicitation)",
        ),
        (
            Flow::MissingCapability,
            "Asks the client's model (needs sampling)",
        ),
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Flow::Elicitation => "test_input_required_result_elicitation",
            Flow::Sampling => "test_input_required_result_sampling",
            Flow::ListRoots => "test_input_required_result_list_roots",
            Flow::RequestState => "test_input_required_result_request_state",
            Flow::MultipleInputs => "test_input_required_result_multiple_inputs",
            Flow::MultiRound => "test_input_required_result_multi_round",
            Flow::TamperedState => "test_input_required_result_tampered_state",
            Flow::Capabilities => "test_input_required_result_capabilities",
            Flow::StreamingElicitation => "test_streaming_elicitation",
            Flow::MissingCapability => "test_missing_capability",
            Flow::Prompt => "test_input_required_result_prompt",
        }
    }

    /// The tool flow named `name`.
    pub(crate) fn tool(name: &str) -> Option<Flow> {
        Self::TOOLS
            .iter()
            .map(|(flow, _)| *flow)
            .find(|flow| flow.name() == name)
    }

    /// The capabilities the flow needs and the client did not declare, when
    /// it refuses to run without them (the other flows ask what they can).
    fn missing_capabilities(
        self,
        declared: Option<&ClientCapabilities>,
    ) -> Option<ClientCapabilities> {
        if !matches!(self, Flow::StreamingElicitation | Flow::MissingCapability) {
            return None;
        }
        let mut missing: Option<ClientCapabilities> = None;
        for question in self.rounds().iter().copied().flatten() {
            if !declared.is_some_and(|declared| question.ask.declared_by(declared)) {
                question.ask.require(missing.get_or_insert_default());
            }
        }
        missing
    }

    /// Its rounds of questions, in order.
    fn rounds(self) -> &'static [&'static [Question]] {
        match self {
            Flow::Elicitation => &[&[NAME]],
            Flow::Sampling | Flow::MissingCapability => &[&[CAPITAL]],
            Flow::ListRoots => &[&[ROOTS]],
            Flow::RequestState | Flow::TamperedState | Flow::StreamingElicitation => &[&[CONFIRM]],
            Flow::MultipleInputs | Flow::Capabilities => &[&[NAME, GREETING, ROOTS]],
            Flow::MultiRound => &[&[STEP1], &[STEP2]],
            Flow::Prompt => &[&[CONTEXT]],
        }
    }

    /// The next step given `answers`. `capabilities`: what the client
    /// declared, `None` when unknown (the capabilities flow then asks
    /// everything and does without what is refused).
    fn step(self, answers: &Answers, capabilities: Option<&ClientCapabilities>) -> Step {
        let asked = |question: &Question| {
            self != Flow::Capabilities
                || capabilities.is_none_or(|declared| question.ask.declared_by(declared))
        };
        for round in self.rounds() {
            let open: Vec<&'static Question> = round
                .iter()
                .filter(|question| asked(question) && !answers.contains_key(question.key))
                .collect();
            if !open.is_empty() {
                return Step::Ask(open);
            }
        }
        let text = |question: &Question| answer_text(answers, question);
        Step::Done(match self {
            Flow::Elicitation => text(&NAME).map(|name| format!("Hello, {name}!")),
            Flow::Sampling | Flow::MissingCapability => text(&CAPITAL),
            Flow::ListRoots => text(&ROOTS).map(|roots| format!("Client roots: {roots}")),
            Flow::RequestState | Flow::TamperedState => text(&CONFIRM).map(|_| "state-ok".into()),
            Flow::StreamingElicitation => text(&CONFIRM).map(|ok| format!("Confirmed: {ok}")),
            Flow::MultipleInputs => text(&NAME).and_then(|name| {
                Ok(format!(
                    "Hello, {name}! {} Client roots: {}",
                    text(&GREETING)?,
                    text(&ROOTS)?
                ))
            }),
            Flow::MultiRound => text(&STEP1).and_then(|name| {
                Ok(format!(
                    "Hello, {name}! Your favorite color is {}.",
                    text(&STEP2)?
                ))
            }),
            Flow::Capabilities => {
                let given: Vec<String> = self.rounds()[0]
                    .iter()
                    .filter_map(|question| {
                        text(question)
                            .ok()
                            .map(|value| format!("{}: {value}", question.key))
                    })
                    .collect();
                Ok(if given.is_empty() {
                    "No input: the client can answer none of elicitation, sampling, roots".into()
                } else {
                    given.join("; ")
                })
            }
            Flow::Prompt => text(&CONTEXT).map(|context| format!("Use this context: {context}")),
        })
    }
}

/// Runs flows; its key seals the `requestState` of every flow of the process.
pub(crate) struct Flows {
    state: RequestStateCodec,
}

impl Default for Flows {
    fn default() -> Self {
        // 32 random bytes: the codec's minimum key length.
        Self {
            state: RequestStateCodec::new_unchecked(rand::random::<[u8; 32]>().to_vec()),
        }
    }
}

impl Flows {
    /// Runs `flow` for one request, with the `inputResponses` and
    /// `requestState` the request carries.
    pub(crate) async fn run(
        &self,
        flow: Flow,
        responses: Option<InputResponses>,
        request_state: Option<String>,
        context: &RequestContext<RoleServer>,
    ) -> Result<Outcome, ErrorData> {
        let capabilities = context.client_capabilities();
        if let Some(missing) = flow.missing_capabilities(capabilities.as_ref()) {
            return Err(ErrorData::missing_required_client_capability(missing));
        }
        if is_stateless(context) {
            self.run_inline(flow, responses, request_state, capabilities.as_ref())
        } else {
            Ok(Outcome::Done(ask_peer(flow, &context.peer).await))
        }
    }

    /// One round of `flow` on a stateless request: the answers so far come
    /// from `request_state`, the new ones from `responses` (only those to the
    /// open questions count); unanswered questions are asked (again).
    fn run_inline(
        &self,
        flow: Flow,
        responses: Option<InputResponses>,
        request_state: Option<String>,
        capabilities: Option<&ClientCapabilities>,
    ) -> Result<Outcome, ErrorData> {
        let binding = flow.name().as_bytes();
        let mut answers: Answers = match request_state {
            Some(sealed) => self
                .state
                .open_json_with(&sealed, binding)
                .map_err(|_| ErrorData::invalid_params("requestState is not valid", None))?,
            None => Answers::new(),
        };
        let mut responses = responses.unwrap_or_default();
        if let Step::Ask(open) = flow.step(&answers, capabilities) {
            for question in open {
                if let Some(response) = responses.remove(question.key) {
                    let answer = question.ask.parse(response).map_err(|err| {
                        ErrorData::invalid_params(
                            format!("inputResponses.{}: {err}", question.key),
                            None,
                        )
                    })?;
                    answers.insert(question.key.to_owned(), answer);
                }
            }
        }
        match flow.step(&answers, capabilities) {
            Step::Done(text) => Ok(Outcome::Done(text)),
            Step::Ask(open) => {
                let requests: InputRequests = open
                    .iter()
                    .map(|question| (question.key.to_owned(), question.ask.input_request()))
                    .collect();
                let sealed = self
                    .state
                    .seal_json_with(
                        &answers,
                        &SealOptions::new()
                            .associated_data(binding)
                            .ttl(ANSWER_WINDOW),
                    )
                    .map_err(|err| ErrorData::internal_error(err.to_string(), None))?;
                Ok(Outcome::InputRequired(InputRequiredResult::new(
                    Some(requests),
                    Some(sealed),
                )))
            }
        }
    }
}

/// Runs `flow` to its end by asking the client during the call.
async fn ask_peer(flow: Flow, peer: &Peer<RoleServer>) -> Result<String, String> {
    let mut answers = Answers::new();
    loop {
        match flow.step(&answers, None) {
            Step::Done(text) => return text,
            Step::Ask(open) => {
                let asked = join_all(open.iter().map(|question| ask_one(peer, question))).await;
                for (question, answer) in open.into_iter().zip(asked) {
                    answers.insert(question.key.to_owned(), answer);
                }
            }
        }
    }
}

/// Sends one question as a server-to-client request tagged with its key.
async fn ask_one(peer: &Peer<RoleServer>, question: &Question) -> Answer {
    let mut meta = RequestMetaObject::new();
    meta.insert(INPUT_KEY_META.to_owned(), question.key.into());
    let options = PeerRequestOptions::with_timeout(ANSWER_WINDOW).with_meta(meta);
    let answered = match peer
        .send_request_with_option(question.ask.server_request(), options)
        .await
    {
        Ok(handle) => handle.await_response().await,
        Err(err) => Err(err),
    };
    match answered {
        Ok(result) => question.ask.answer(result),
        Err(err) => Answer::Refused(err.to_string()),
    }
}
