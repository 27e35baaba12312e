//! The legacy HTTP+SSE client transport over real loopback HTTP: against the testkit's
//! legacy SSE server running the real `ExampleServer`, and against scripted servers that
//! send exactly the bytes a misbehaving server would.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Router,
    body::{Body, Bytes},
    http::{HeaderMap, Method, StatusCode, header},
    response::Response,
    routing::get,
};
use futures::{StreamExt, future::join_all, stream};
use quiver_mcp::legacy_sse::{LegacySseClientTransport, LegacySseError};
use quiver_testkit::{legacy_sse, mcp_server::ExampleServer};
use rmcp::{
    ServiceExt,
    model::{CallToolRequestParams, CallToolResult, ClientJsonRpcMessage, ServerJsonRpcMessage},
    service::ServiceError,
    transport::Transport,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use url::Url;

const WAIT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// Against the testkit server

struct TestkitServer {
    sse_url: Url,
    shutdown: CancellationToken,
}

impl Drop for TestkitServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start_testkit() -> TestkitServer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sse_url = format!("http://{}/sse", listener.local_addr().unwrap())
        .parse()
        .unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(legacy_sse::serve(
        listener,
        ExampleServer::example,
        shutdown.clone(),
    ));
    TestkitServer { sse_url, shutdown }
}

async fn connect(sse_url: &Url) -> Result<LegacySseClientTransport, LegacySseError> {
    LegacySseClientTransport::connect(
        reqwest::Client::new(),
        sse_url.clone(),
        HeaderMap::new(),
        WAIT,
    )
    .await
}

fn call(name: &'static str, arguments: serde_json::Value) -> CallToolRequestParams {
    let serde_json::Value::Object(arguments) = arguments else {
        panic!("arguments must be an object");
    };
    CallToolRequestParams::new(name).with_arguments(arguments)
}

fn text(result: &CallToolResult) -> &str {
    &result.content[0].as_text().expect("text content").text
}

#[tokio::test]
async fn initializes_lists_and_calls_tools() {
    let server = start_testkit().await;
    let transport = connect(&server.sse_url).await.unwrap();
    assert_eq!(transport.endpoint().path(), "/message");
    let client = ().serve(transport).await.unwrap();

    let info = client.peer_info().expect("server info after initialize");
    assert!(info.capabilities.tools.is_some());

    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    for expected in ["add", "echo", "sleep"] {
        assert!(names.contains(&expected), "{names:?}");
    }

    let result = client
        .call_tool(call("echo", json!({"text": "hello over sse"})))
        .await
        .unwrap();
    assert_eq!(text(&result), "hello over sse");
    let result = client
        .call_tool(call("add", json!({"a": 2, "b": 3})))
        .await
        .unwrap();
    assert_eq!(text(&result), "5");

    client.cancel().await.unwrap();
}

#[tokio::test]
async fn concurrent_calls_are_routed_by_id() {
    let server = start_testkit().await;
    let client = ().serve(connect(&server.sse_url).await.unwrap()).await.unwrap();

    // Later calls sleep less, so responses arrive in a different order than requests.
    let started = Instant::now();
    let calls = (0..10u64).map(|i| {
        let client = client.clone();
        async move {
            let ms = (10 - i) * 50;
            let slept = client
                .call_tool(call("sleep", json!({"ms": ms})))
                .await
                .unwrap();
            let echoed = client
                .call_tool(call("echo", json!({"text": format!("call {i}")})))
                .await
                .unwrap();
            (i, ms, text(&slept).to_owned(), text(&echoed).to_owned())
        }
    });
    for (i, ms, slept, echoed) in join_all(calls).await {
        assert_eq!(slept, format!("slept {ms}ms"));
        assert_eq!(echoed, format!("call {i}"));
    }
    // One connection carries all ten at once: the slowest (500 ms) bounds the total,
    // where one at a time would take 2750 ms.
    assert!(
        started.elapsed() < Duration::from_millis(2000),
        "{:?}",
        started.elapsed()
    );

    client.cancel().await.unwrap();
}

#[tokio::test]
async fn server_shutdown_closes_the_transport() {
    let server = start_testkit().await;
    let client = ().serve(connect(&server.sse_url).await.unwrap()).await.unwrap();
    client
        .call_tool(call("echo", json!({"text": "x"})))
        .await
        .unwrap();
    let peer = client.peer().clone();

    server.shutdown.cancel();
    let reason = tokio::time::timeout(WAIT, client.waiting())
        .await
        .expect("client notices the closed stream")
        .unwrap();
    assert!(
        matches!(reason, rmcp::service::QuitReason::Closed),
        "{reason:?}"
    );
    assert!(peer.is_transport_closed());
    let error = peer
        .call_tool(call("echo", json!({"text": "x"})))
        .await
        .unwrap_err();
    assert!(matches!(error, ServiceError::TransportClosed), "{error:?}");
}

#[tokio::test]
async fn closing_the_client_ends_the_server_session() {
    let server = start_testkit().await;
    let transport = connect(&server.sse_url).await.unwrap();
    let endpoint = transport.endpoint().clone();
    let client = ().serve(transport).await.unwrap();
    client.cancel().await.unwrap();

    let http = reqwest::Client::new();
    let notification = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let deadline = Instant::now() + WAIT;
    loop {
        let status = http
            .post(endpoint.clone())
            .json(&notification)
            .send()
            .await
            .unwrap()
            .status();
        if status == StatusCode::NOT_FOUND {
            break;
        }
        assert!(Instant::now() < deadline, "session still open: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Against scripted servers

/// How the scripted SSE body ends after its chunks.
#[derive(Clone, Copy)]
enum Tail {
    HoldOpen,
    End,
    Abort,
}

#[derive(Clone)]
struct Script {
    status: StatusCode,
    content_type: Option<&'static str>,
    chunks: Vec<String>,
    tail: Tail,
    post_status: StatusCode,
    post_body: &'static str,
    /// Method and headers of every request received.
    seen: Arc<Mutex<Vec<(Method, HeaderMap)>>>,
}

impl Script {
    fn sse(chunks: &[&str]) -> Self {
        Script {
            status: StatusCode::OK,
            content_type: Some("text/event-stream"),
            chunks: chunks.iter().map(|chunk| (*chunk).to_owned()).collect(),
            tail: Tail::HoldOpen,
            post_status: StatusCode::ACCEPTED,
            post_body: "Accepted",
            seen: Arc::default(),
        }
    }

    fn tail(mut self, tail: Tail) -> Self {
        self.tail = tail;
        self
    }
}

const ENDPOINT: &str = "event: endpoint\ndata: /message?sessionId=s1\n\n";

/// Serves `script` on a fresh loopback port and returns the SSE URL.
async fn scripted(script: Script) -> Url {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sse_url = format!("http://{}/sse", listener.local_addr().unwrap())
        .parse()
        .unwrap();
    let on_get = script.clone();
    let on_post = script;
    let app = Router::new()
        .route(
            "/sse",
            get(move |headers: HeaderMap| async move {
                on_get.seen.lock().unwrap().push((Method::GET, headers));
                let chunks = stream::iter(
                    on_get
                        .chunks
                        .into_iter()
                        .map(|chunk| Ok::<_, std::io::Error>(Bytes::from(chunk))),
                );
                let tail = match on_get.tail {
                    Tail::HoldOpen => stream::pending().boxed(),
                    Tail::End => stream::empty().boxed(),
                    // The pause lets hyper flush the head and the endpoint first, so
                    // the failure hits an established stream.
                    Tail::Abort => stream::once(async {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Err(std::io::Error::other("scripted connection failure"))
                    })
                    .boxed(),
                };
                let mut response = Response::builder().status(on_get.status);
                if let Some(content_type) = on_get.content_type {
                    response = response.header(header::CONTENT_TYPE, content_type);
                }
                response
                    .body(Body::from_stream(chunks.chain(tail)))
                    .unwrap()
            }),
        )
        .route(
            "/message",
            axum::routing::post(move |headers: HeaderMap| async move {
                on_post.seen.lock().unwrap().push((Method::POST, headers));
                (on_post.post_status, on_post.post_body)
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    sse_url
}

async fn receive(transport: &mut LegacySseClientTransport) -> Option<ServerJsonRpcMessage> {
    tokio::time::timeout(WAIT, transport.receive())
        .await
        .expect("receive returns in time")
}

fn response_id(message: &ServerJsonRpcMessage) -> serde_json::Value {
    serde_json::to_value(message).unwrap()["id"].clone()
}

fn notification() -> ClientJsonRpcMessage {
    serde_json::from_value(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .unwrap()
}

#[tokio::test]
async fn malformed_and_foreign_events_are_skipped() {
    let url = scripted(Script::sse(&[
        ": a comment before anything\n\n",
        ENDPOINT,
        ":keep-alive\n\n",
        "event: message\ndata: not json at all\n\n",
        "event: message\ndata: {\"hello\": \"world\"}\n\n",
        "event: message\ndata: [1, 2\n\n",
        "event: message\n\n",
        "event: endpoint\ndata: /elsewhere\n\n",
        "event: progress\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n",
        "retry: 1000\n\n",
        "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
        // No event type means `message`; CRLF line ends and a split chunk are allowed.
        "data: {\"jsonrpc\":\"2.0\",",
        "\"id\":2,\"result\":{}}\r\n\r\n",
    ]))
    .await;
    let mut transport = connect(&url).await.unwrap();
    assert_eq!(transport.endpoint().path(), "/message");
    assert_eq!(response_id(&receive(&mut transport).await.unwrap()), 1);
    assert_eq!(response_id(&receive(&mut transport).await.unwrap()), 2);
}

#[tokio::test]
async fn an_invalid_sse_line_closes_the_transport() {
    let url = scripted(Script::sse(&[
        ENDPOINT,
        "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
        "this line has no colon\n\n",
        "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{}}\n\n",
    ]))
    .await;
    let mut transport = connect(&url).await.unwrap();
    assert_eq!(response_id(&receive(&mut transport).await.unwrap()), 1);
    assert!(receive(&mut transport).await.is_none());
    // Once closed, it stays closed.
    assert!(receive(&mut transport).await.is_none());
}

#[tokio::test]
async fn the_end_of_the_stream_closes_the_transport() {
    for tail in [Tail::End, Tail::Abort] {
        let url = scripted(Script::sse(&[ENDPOINT]).tail(tail)).await;
        let mut transport = connect(&url).await.unwrap();
        assert!(receive(&mut transport).await.is_none());
    }
}

#[tokio::test]
async fn foreign_origin_endpoints_are_refused() {
    for endpoint in [
        "http://evil.example/message",
        "//evil.example/message",
        "http://127.0.0.1:1/message",
        "https://127.0.0.1/message",
    ] {
        let event = format!("event: endpoint\ndata: {endpoint}\n\n");
        let url = scripted(Script::sse(&[&event])).await;
        let error = connect(&url).await.unwrap_err();
        assert!(
            matches!(error, LegacySseError::CrossOriginEndpoint { .. }),
            "{endpoint}: {error}"
        );
    }
}

#[tokio::test]
async fn bad_endpoints_are_refused() {
    let url = scripted(Script::sse(&["event: endpoint\ndata:\n\n"])).await;
    let error = connect(&url).await.unwrap_err();
    assert!(matches!(error, LegacySseError::EmptyEndpoint), "{error}");

    let url = scripted(Script::sse(&["event: endpoint\ndata: http://[::1\n\n"])).await;
    let error = connect(&url).await.unwrap_err();
    assert!(
        matches!(error, LegacySseError::InvalidEndpoint { .. }),
        "{error}"
    );
}

#[tokio::test]
async fn connect_times_out_without_an_endpoint_event() {
    let url = scripted(Script::sse(&[
        ":keep-alive\n\n",
        "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
    ]))
    .await;
    let started = Instant::now();
    let error = LegacySseClientTransport::connect(
        reqwest::Client::new(),
        url,
        HeaderMap::new(),
        Duration::from_millis(300),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(error, LegacySseError::ConnectTimeout { timeout } if timeout == Duration::from_millis(300)),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn connect_fails_cleanly_on_broken_handshakes() {
    let url = scripted(Script::sse(&[":hello\n\n"]).tail(Tail::End)).await;
    let error = connect(&url).await.unwrap_err();
    assert!(
        matches!(error, LegacySseError::StreamEndedBeforeEndpoint),
        "{error}"
    );

    let url = scripted(Script::sse(&["no colon here\n\n", ENDPOINT])).await;
    let error = connect(&url).await.unwrap_err();
    assert!(matches!(error, LegacySseError::Sse(_)), "{error}");

    let mut script = Script::sse(&[ENDPOINT]);
    script.status = StatusCode::UNAUTHORIZED;
    let error = connect(&scripted(script).await).await.unwrap_err();
    assert!(
        matches!(error, LegacySseError::ConnectStatus { status } if status == StatusCode::UNAUTHORIZED),
        "{error}"
    );

    let mut script = Script::sse(&["<html></html>"]);
    script.content_type = Some("text/html; charset=utf-8");
    let error = connect(&scripted(script).await).await.unwrap_err();
    assert!(
        matches!(error, LegacySseError::NotEventStream { .. }),
        "{error}"
    );

    let mut script = Script::sse(&[ENDPOINT]);
    script.content_type = None;
    let error = connect(&scripted(script).await).await.unwrap_err();
    assert!(
        matches!(error, LegacySseError::NotEventStream { .. }),
        "{error}"
    );

    // Nothing listens on port 1.
    let error = connect(&"http://127.0.0.1:1/sse".parse().unwrap())
        .await
        .unwrap_err();
    assert!(matches!(error, LegacySseError::Connect(_)), "{error}");
}

#[tokio::test]
async fn post_errors_are_surfaced() {
    let mut script = Script::sse(&[ENDPOINT]);
    script.post_status = StatusCode::INTERNAL_SERVER_ERROR;
    script.post_body = "session exploded";
    let url = scripted(script).await;

    let mut transport = connect(&url).await.unwrap();
    let error = transport.send(notification()).await.unwrap_err();
    assert!(
        matches!(
            &error,
            LegacySseError::PostStatus { status, body }
                if *status == StatusCode::INTERNAL_SERVER_ERROR && body == "session exploded"
        ),
        "{error}"
    );

    // rmcp sees the failed initialize POST as a failed start, not a hang.
    let transport = connect(&url).await.unwrap();
    let started = Instant::now();
    let result = tokio::time::timeout(WAIT, ().serve(transport))
        .await
        .expect("serve gives up in time");
    assert!(result.is_err());
    assert!(started.elapsed() < WAIT);
}

#[tokio::test]
async fn headers_go_with_the_stream_and_every_post() {
    let script = Script::sse(&[ENDPOINT]);
    let seen = Arc::clone(&script.seen);
    let url = scripted(script).await;
    let mut headers = HeaderMap::new();
    headers.insert(header::AUTHORIZATION, "Bearer s3cret".parse().unwrap());
    let mut transport =
        LegacySseClientTransport::connect(reqwest::Client::new(), url, headers, WAIT)
            .await
            .unwrap();
    transport.send(notification()).await.unwrap();
    transport.send(notification()).await.unwrap();

    let seen = seen.lock().unwrap();
    let methods: Vec<&Method> = seen.iter().map(|(method, _)| method).collect();
    assert_eq!(methods, [&Method::GET, &Method::POST, &Method::POST]);
    for (method, headers) in seen.iter() {
        assert_eq!(headers[header::AUTHORIZATION], "Bearer s3cret", "{method}");
    }
    assert_eq!(seen[0].1[header::ACCEPT], "text/event-stream");
    assert_eq!(seen[1].1[header::CONTENT_TYPE], "application/json");
}

// ---------------------------------------------------------------------------------------
// Interop with the reference TypeScript server (manual: needs Node and the npm registry)

/// Run the reference server, then this test:
///
/// ```text
/// PORT=3001 npx -y @modelcontextprotocol/server-everything sse &
/// cargo test -p quiver-mcp --test legacy_sse -- --ignored interop
/// ```
///
/// `QUIVER_LEGACY_SSE_URL` overrides the default `http://127.0.0.1:3001/sse`.
#[tokio::test]
#[ignore = "needs a running `npx @modelcontextprotocol/server-everything sse`"]
async fn interop_with_server_everything() {
    let sse_url = std::env::var("QUIVER_LEGACY_SSE_URL")
        .unwrap_or_else(|_| "http://127.0.0.1:3001/sse".to_owned())
        .parse()
        .unwrap();
    let client = ().serve(connect(&sse_url).await.unwrap()).await.unwrap();
    let info = client.peer_info().expect("server info");
    println!(
        "server {:?} speaks {}",
        info.server_info, info.protocol_version
    );

    let tools = client.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|tool| tool.name == "echo"));
    let calls = (0..10).map(|i| {
        let client = client.clone();
        async move {
            let result = client
                .call_tool(call("echo", json!({"message": format!("hi {i}")})))
                .await
                .unwrap();
            (i, text(&result).to_owned())
        }
    });
    for (i, echoed) in join_all(calls).await {
        assert_eq!(echoed, format!("Echo: hi {i}"));
    }
    client.cancel().await.unwrap();
}
