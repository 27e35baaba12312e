//! `tools/call` over streamable HTTP posted by the calling task
//! (`crate::direct_call`, issue #23), against the testkit's scenario server
//! (rmcp, both protocol eras) served over HTTP in this process behind a
//! layer that records every `POST` it is sent (method, id, whether it
//! answers a request of the server) and can close a session, as a
//! restarted server has forgotten it. The server checks what a 2026-07-28 request must
//! carry (its `_meta`, `Mcp-Method`, `Mcp-Name`), so a call it answers was
//! sent right.

#![allow(deprecated)] // sampling, roots and logging (SEP-2577) are still relayed

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use quiver_mcp::relay::{CallAttachment, CallPeer};
use quiver_mcp::{CallOptions, McpPool, PoolOptions};
use quiver_model::{HttpConfig, McpServerSpec, Protocol, StoredServer, Transport};
use quiver_testkit::scenario_server::{Revisions, ScenarioServer};
use rmcp::ErrorData;
use rmcp::model::{
    CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams, ElicitResult,
    ElicitationAction, ListRootsResult, LoggingMessageNotificationParam, NumberOrString,
    ProgressNotificationParam, ProgressToken, RequestMetaObject,
};
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The first id `crate::direct_call` gives a request.
const DIRECT_IDS: i64 = 1 << 40;

/// What the server was sent: `(method or "answer", id)` per `POST`.
#[derive(Default)]
struct Seen {
    posts: Mutex<Vec<(String, Option<i64>)>>,
    /// Close the session of the next `tools/call` before the server reads
    /// it, as a restarted server has forgotten it: the server answers 404.
    forget_session: AtomicBool,
    sessions: Arc<LocalSessionManager>,
}

impl Seen {
    fn calls(&self) -> Vec<Option<i64>> {
        self.posts
            .lock()
            .unwrap()
            .iter()
            .filter(|(method, _)| method == "tools/call")
            .map(|(_, id)| *id)
            .collect()
    }

    fn methods(&self) -> Vec<String> {
        self.posts
            .lock()
            .unwrap()
            .iter()
            .map(|(method, _)| method.clone())
            .collect()
    }
}

async fn record(State(seen): State<Arc<Seen>>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = to_bytes(body, 1 << 20).await.expect("a body");
    if let Ok(message) = serde_json::from_slice::<Value>(&bytes) {
        let method = message["method"].as_str().unwrap_or("answer").to_owned();
        let session = parts
            .headers
            .get("mcp-session-id")
            .and_then(|id| id.to_str().ok());
        if let Some(session) = session
            && method == "tools/call"
            && seen.forget_session.swap(false, Ordering::SeqCst)
        {
            seen.sessions
                .close_session(&session.into())
                .await
                .expect("close the session");
        }
        seen.posts
            .lock()
            .unwrap()
            .push((method, message["id"].as_i64()));
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The scenario server over streamable HTTP behind the recording layer.
async fn serve(seen: Arc<Seen>, shutdown: CancellationToken) -> String {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let server = ScenarioServer::new(Revisions::AllKnown);
    let service: StreamableHttpService<ScenarioServer, LocalSessionManager> =
        StreamableHttpService::new(
            move || Ok(server.clone()),
            seen.sessions.clone(),
            StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token()),
        );
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn_with_state(seen, record));
    tokio::spawn(
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .into_future(),
    );
    format!("http://{addr}/mcp")
}

fn server(url: &str, protocol: Protocol) -> Arc<StoredServer> {
    let mut spec = McpServerSpec::new("scenarios", Transport::StreamableHttp);
    spec.http = Some(HttpConfig {
        url: url.into(),
        ..Default::default()
    });
    spec.protocol = protocol;
    Arc::new(StoredServer::created(spec, 1, "test"))
}

fn text(outcome: &quiver_mcp::CallOutcome) -> String {
    outcome.result.content[0]
        .as_text()
        .map(|text| text.text.clone())
        .unwrap_or_default()
}

/// A caller that accepts every elicitation with fixed values and records
/// the progress it is sent.
#[derive(Default)]
struct Caller {
    progress: Mutex<Vec<String>>,
}

impl CallPeer for Caller {
    fn progress(&self, params: ProgressNotificationParam) {
        self.progress
            .lock()
            .unwrap()
            .push(params.message.unwrap_or_default());
    }
    fn log(&self, _params: LoggingMessageNotificationParam) {}
    fn create_message(
        &self,
        _params: CreateMessageRequestParams,
    ) -> BoxFuture<'static, Result<CreateMessageResult, ErrorData>> {
        async { Err(ErrorData::internal_error("no model here", None)) }.boxed()
    }
    fn create_elicitation(
        &self,
        _params: ElicitRequestParams,
    ) -> BoxFuture<'static, Result<ElicitResult, ErrorData>> {
        async {
            let mut answer = ElicitResult::new(ElicitationAction::Accept);
            answer.content = Some(json!({"username": "ada", "email": "ada@example.org"}));
            Ok(answer)
        }
        .boxed()
    }
    fn list_roots(
        &self,
        _meta: Option<RequestMetaObject>,
    ) -> BoxFuture<'static, Result<ListRootsResult, ErrorData>> {
        async { Ok(ListRootsResult::default()) }.boxed()
    }
}

fn attached(caller: &Arc<Caller>) -> CallOptions {
    CallOptions {
        attachment: Some(CallAttachment {
            peer: caller.clone(),
            progress_token: Some(ProgressToken(NumberOrString::String("mine".into()))),
        }),
        ..CallOptions::default()
    }
}

/// The scenario server's plain tool, its answer checked.
async fn simple(pool: &McpPool, server: &Arc<StoredServer>) {
    let outcome = call(
        pool,
        server,
        "test_simple_text",
        json!({}),
        CallOptions::default(),
    )
    .await;
    assert_eq!(
        text(&outcome),
        "This is a simple text response for testing."
    );
}

/// The scenario server's progress tool called for `caller`: its answer,
/// and its three progress messages relayed to `caller`.
async fn progress_reaches(pool: &McpPool, server: &Arc<StoredServer>, caller: &Arc<Caller>) {
    let outcome = call(
        pool,
        server,
        "test_tool_with_progress",
        json!({}),
        attached(caller),
    )
    .await;
    assert_eq!(text(&outcome), "Progress test completed");
    assert_eq!(
        *caller.progress.lock().unwrap(),
        ["Starting", "Halfway", "Complete"]
    );
}

async fn call(
    pool: &McpPool,
    server: &Arc<StoredServer>,
    tool: &str,
    arguments: Value,
    options: CallOptions,
) -> quiver_mcp::CallOutcome {
    pool.call_tool_with(
        server,
        tool,
        arguments.as_object().cloned(),
        std::time::Instant::now(),
        options,
    )
    .await
    .unwrap_or_else(|err| panic!("{tool}: {err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_of_both_eras_are_posted_by_their_callers() {
    for protocol in [Protocol::V2025_11_25, Protocol::V2026_07_28] {
        let (seen, shutdown) = (Arc::new(Seen::default()), CancellationToken::new());
        let url = serve(seen.clone(), shutdown.clone()).await;
        let pool = McpPool::new(PoolOptions::default());
        let server = server(&url, protocol);
        pool.list_tools(&server).await.expect("tools");
        for _ in 0..3 {
            simple(&pool, &server).await;
        }
        let calls = seen.calls();
        assert_eq!(calls.len(), 3, "{protocol:?}: {calls:?}");
        assert!(
            calls.iter().all(|id| id.is_some_and(|id| id >= DIRECT_IDS)),
            "{protocol:?}: every call posted by its caller: {calls:?}"
        );
        pool.shutdown().await;
        shutdown.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_server_sends_before_the_answer_reaches_the_caller() {
    let (seen, shutdown) = (Arc::new(Seen::default()), CancellationToken::new());
    let url = serve(seen.clone(), shutdown.clone()).await;
    let pool = McpPool::new(PoolOptions::default());
    let server = server(&url, Protocol::V2025_11_25);
    pool.list_tools(&server).await.expect("tools");

    // A request of the server on the call's stream: relayed to the caller,
    // its answer posted back, the call answered after it.
    let caller = Arc::new(Caller::default());
    let outcome = call(
        &pool,
        &server,
        "test_elicitation",
        json!({"message": "who are you?"}),
        attached(&caller),
    )
    .await;
    assert_eq!(
        text(&outcome),
        r#"Elicitation answered: action=accept, content={"email":"ada@example.org","username":"ada"}"#
    );
    // Progress on the call's stream, under the caller's own token.
    progress_reaches(&pool, &server, &caller).await;
    let calls = seen.calls();
    assert!(
        calls.iter().all(|id| id.is_some_and(|id| id >= DIRECT_IDS)),
        "{calls:?}"
    );
    assert!(
        seen.methods().iter().any(|method| method == "answer"),
        "the elicitation's answer was posted: {:?}",
        seen.methods()
    );
    pool.shutdown().await;
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forgotten_session_sends_the_call_through_a_new_one() {
    let (seen, shutdown) = (Arc::new(Seen::default()), CancellationToken::new());
    let url = serve(seen.clone(), shutdown.clone()).await;
    let pool = McpPool::new(PoolOptions::default());
    let server = server(&url, Protocol::V2025_11_25);
    pool.list_tools(&server).await.expect("tools");
    seen.forget_session.store(true, Ordering::SeqCst);
    // rmcp sends the call again under a progress token of its own: its
    // progress still reaches the caller.
    progress_reaches(&pool, &server, &Arc::new(Caller::default())).await;
    let methods = seen.methods();
    let calls = seen.calls();
    // Posted directly and refused; then rmcp's: refused too, a new
    // session, the call again there.
    assert_eq!(calls.len(), 3, "{methods:?}");
    assert!(calls[0].is_some_and(|id| id >= DIRECT_IDS), "{calls:?}");
    assert!(
        calls[1..]
            .iter()
            .all(|id| id.is_some_and(|id| id < DIRECT_IDS)),
        "{calls:?}"
    );
    let refused = methods.iter().position(|m| m == "tools/call").unwrap();
    assert!(
        methods[refused..].iter().any(|m| m == "initialize"),
        "a new session: {methods:?}"
    );
    // The new session's calls are posted directly again.
    simple(&pool, &server).await;
    assert!(seen.calls()[3].is_some_and(|id| id >= DIRECT_IDS));
    pool.shutdown().await;
    shutdown.cancel();
}
