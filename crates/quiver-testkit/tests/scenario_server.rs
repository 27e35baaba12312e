//! The scenario server over an in-memory pipe with rmcp's client: each
//! revision opens its way (`initialize`, `server/discover`), and the tools
//! that need the client's input give the same text whether they ask by
//! `InputRequiredResult` (2026-07-28) or by requests during the call, each
//! tagged with `_meta["io.quiver/inputKey"]`.

// The flows ask for sampling and roots, which SEP-2577 deprecates.
#![expect(deprecated)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use quiver_testkit::scenario_server::{Revisions, ScenarioServer};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientInfo,
    CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams, ElicitResult,
    ElicitationAction, ErrorCode, ErrorData, GetPromptRequestParams, Implementation,
    InputResponses, ListRootsResult, ProtocolVersion, Root, SamplingMessage,
};
use rmcp::service::{RequestContext, RunningService, ServiceError};
use rmcp::{
    ClientHandler, ClientLifecycleMode, ClientServiceExt as _, RoleClient, ServiceExt as _,
};
use serde_json::{Value, json};

/// A client that answers every question and notes the input keys the
/// requests it gets carry.
#[derive(Clone)]
struct Answering {
    capabilities: ClientCapabilities,
    keys: Arc<Mutex<Vec<String>>>,
}

impl Answering {
    fn new(capabilities: ClientCapabilities) -> Self {
        Self {
            capabilities,
            keys: Arc::default(),
        }
    }

    fn every_capability() -> Self {
        Self::new(
            ClientCapabilities::builder()
                .enable_elicitation()
                .enable_sampling()
                .enable_roots()
                .build(),
        )
    }

    fn note(&self, context: &RequestContext<RoleClient>) {
        if let Some(key) = context
            .meta
            .get("io.quiver/inputKey")
            .and_then(Value::as_str)
        {
            self.keys.lock().unwrap().push(key.to_owned());
        }
    }

    /// The keys noted since the last call, sorted.
    fn take_keys(&self) -> Vec<String> {
        let mut keys = std::mem::take(&mut *self.keys.lock().unwrap());
        keys.sort();
        keys
    }
}

impl ClientHandler for Answering {
    fn get_info(&self) -> ClientInfo {
        ClientInfo::new(
            self.capabilities.clone(),
            Implementation::new("scenario-test-client", "1.0.0"),
        )
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.note(&context);
        let ElicitRequestParams::FormElicitationParams {
            requested_schema, ..
        } = request
        else {
            return Err(ErrorData::invalid_params("a form was expected", None));
        };
        let content: serde_json::Map<String, Value> = requested_schema
            .properties
            .keys()
            .map(|field| {
                let value = match field.as_str() {
                    "name" => json!("Alice"),
                    "color" => json!("blue"),
                    "ok" => json!(true),
                    _ => json!("tests"),
                };
                (field.clone(), value)
            })
            .collect();
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(Value::Object(content)))
    }

    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.note(&context);
        let prompt = params.messages[0]
            .content
            .first()
            .and_then(|c| c.as_text())
            .map(|t| t.text.clone());
        let answer = match prompt.as_deref() {
            Some("What is the capital of France?") => "Paris",
            _ => "Hello there!",
        };
        Ok(CreateMessageResult::new(
            SamplingMessage::assistant_text(answer),
            "test-model".into(),
        ))
    }

    async fn list_roots(
        &self,
        context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        self.note(&context);
        Ok(ListRootsResult::new(vec![Root::new("file:///test/root")]))
    }
}

/// A client of a new server offering `revisions`, opened by `lifecycle`.
async fn connect(
    revisions: Revisions,
    client: Answering,
    lifecycle: ClientLifecycleMode,
) -> RunningService<RoleClient, Answering> {
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(service) = ScenarioServer::new(revisions).serve(server_end).await {
            let _ = service.waiting().await;
        }
    });
    client
        .serve_with_lifecycle(client_end, lifecycle)
        .await
        .expect("the client opens its session")
}

fn discover() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    }
}

async fn tool_text(client: &RunningService<RoleClient, Answering>, name: &str) -> String {
    let result = client
        .call_tool(CallToolRequestParams::new(name.to_owned()))
        .await
        .unwrap_or_else(|err| panic!("{name}: {err}"));
    assert_ne!(result.is_error, Some(true), "{name}: {result:?}");
    result.content[0].as_text().expect("a text").text.clone()
}

async fn prompt_text(client: &RunningService<RoleClient, Answering>) -> String {
    let result = client
        .get_prompt(GetPromptRequestParams::new(
            "test_input_required_result_prompt",
        ))
        .await
        .expect("the prompt");
    result.messages[0]
        .content
        .as_text()
        .expect("a text")
        .text
        .clone()
}

/// Per tool: its text and the input keys it asks by.
const TOOLS: [(&str, &str, &[&str]); 10] = [
    (
        "test_input_required_result_elicitation",
        "Hello, Alice!",
        &["user_name"],
    ),
    (
        "test_input_required_result_sampling",
        "Paris",
        &["capital_question"],
    ),
    (
        "test_input_required_result_list_roots",
        "Client roots: file:///test/root",
        &["client_roots"],
    ),
    (
        "test_input_required_result_request_state",
        "state-ok",
        &["confirm"],
    ),
    (
        "test_input_required_result_multiple_inputs",
        "Hello, Alice! Hello there! Client roots: file:///test/root",
        &["client_roots", "greeting", "user_name"],
    ),
    (
        "test_input_required_result_multi_round",
        "Hello, Alice! Your favorite color is blue.",
        &["step1", "step2"],
    ),
    (
        "test_input_required_result_tampered_state",
        "state-ok",
        &["confirm"],
    ),
    (
        "test_input_required_result_capabilities",
        "user_name: Alice; greeting: Hello there!; client_roots: file:///test/root",
        &["client_roots", "greeting", "user_name"],
    ),
    (
        "test_streaming_elicitation",
        "Confirmed: true",
        &["confirm"],
    ),
    ("test_missing_capability", "Paris", &["capital_question"]),
];

#[tokio::test]
async fn the_flows_ask_inline_on_2026_07_28() {
    let answering = Answering::every_capability();
    let client = connect(Revisions::AllKnown, answering.clone(), discover()).await;
    assert_eq!(
        client.peer_info().expect("discovered").protocol_version,
        ProtocolVersion::V_2026_07_28
    );
    for (name, text, _) in TOOLS {
        assert_eq!(tool_text(&client, name).await, text, "{name}");
    }
    assert_eq!(prompt_text(&client).await, "Use this context: tests");
    assert_eq!(answering.take_keys(), Vec::<String>::new());
}

#[tokio::test]
async fn the_flows_ask_by_tagged_requests_on_an_initialized_session() {
    for revisions in [Revisions::AllKnown, Revisions::UpToInitialize] {
        let answering = Answering::every_capability();
        let client = connect(
            revisions,
            answering.clone(),
            ClientLifecycleMode::Initialize,
        )
        .await;
        assert_eq!(
            client.peer_info().expect("initialized").protocol_version,
            ProtocolVersion::V_2025_11_25
        );
        for (name, text, keys) in TOOLS {
            assert_eq!(tool_text(&client, name).await, text, "{name}");
            assert_eq!(answering.take_keys(), keys, "{name}");
        }
        assert_eq!(prompt_text(&client).await, "Use this context: tests");
        assert_eq!(answering.take_keys(), ["user_context"]);
    }
}

#[tokio::test]
async fn the_legacy_server_does_not_discover() {
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(service) = ScenarioServer::new(Revisions::UpToInitialize)
            .serve(server_end)
            .await
        {
            let _ = service.waiting().await;
        }
    });
    let opened = Answering::every_capability()
        .serve_with_lifecycle(client_end, discover())
        .await;
    assert!(
        opened.is_err(),
        "a 2026-07-28 session opened on the legacy server"
    );
}

fn error_code(result: Result<impl std::fmt::Debug, ServiceError>) -> (ErrorCode, Option<Value>) {
    match result {
        Err(ServiceError::McpError(error)) => (error.code, error.data),
        other => panic!("an error was expected: {other:?}"),
    }
}

#[tokio::test]
async fn a_tool_needing_sampling_refuses_a_client_without_it() {
    let elicitation_only = ClientCapabilities::builder().enable_elicitation().build();
    for lifecycle in [discover(), ClientLifecycleMode::Initialize] {
        let client = connect(
            Revisions::AllKnown,
            Answering::new(elicitation_only.clone()),
            lifecycle,
        )
        .await;
        let (code, data) = error_code(
            client
                .call_tool_once(CallToolRequestParams::new("test_missing_capability"))
                .await,
        );
        assert_eq!(code, ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY);
        assert_eq!(
            data,
            Some(json!({"requiredCapabilities": {"sampling": {}}}))
        );
    }
}

#[tokio::test]
async fn a_tampered_request_state_is_refused() {
    let client = connect(
        Revisions::AllKnown,
        Answering::every_capability(),
        discover(),
    )
    .await;
    let name = "test_input_required_result_tampered_state";
    let CallToolResponse::InputRequired(asked) = client
        .call_tool_once(CallToolRequestParams::new(name))
        .await
        .expect("the first round")
    else {
        panic!("input was expected");
    };
    let state = asked.request_state.expect("a request state");
    let answers: InputResponses = BTreeMap::from([(
        "confirm".into(),
        json!({"action": "accept", "content": {"ok": true}}),
    )]);
    let retry = |state: String| {
        let mut params = CallToolRequestParams::new(name);
        params.input_responses = Some(answers.clone());
        params.request_state = Some(state);
        client.call_tool_once(params)
    };
    let (code, _) = error_code(retry(format!("{state}-TAMPERED")).await);
    assert_eq!(code, ErrorCode::INVALID_PARAMS);
    let CallToolResponse::Complete(done) = retry(state).await.expect("the second round") else {
        panic!("a result was expected");
    };
    assert_eq!(done.content[0].as_text().expect("a text").text, "state-ok");
}
