//! The legacy HTTP+SSE server, driven over real HTTP with a raw client so that the wire
//! format itself is checked (the rmcp-level client lives in quiver-mcp's tests).

use std::time::Duration;

use futures::{Stream, StreamExt};
use quiver_testkit::{legacy_sse, mcp_server::ExampleServer};
use serde_json::{Value, json};
use sse_stream::{Sse, SseStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);

struct Server {
    base: String,
    shutdown: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start() -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(legacy_sse::serve(
        listener,
        ExampleServer::example,
        shutdown.clone(),
    ));
    Server {
        base,
        shutdown,
        task,
    }
}

type Events = std::pin::Pin<Box<dyn Stream<Item = Result<Sse, sse_stream::Error>> + Send>>;

/// Opens a session and returns its event stream and the announced endpoint path.
async fn open(http: &reqwest::Client, server: &Server) -> (Events, String) {
    let response = http
        .get(format!("{}/sse", server.base))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"].to_str().unwrap();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let mut events: Events = Box::pin(SseStream::from_bytes_stream(response.bytes_stream()));
    let first = next_event(&mut events).await.expect("endpoint event");
    assert_eq!(first.event.as_deref(), Some("endpoint"));
    let endpoint = first.data.unwrap();
    assert!(endpoint.starts_with("/message?sessionId="), "{endpoint}");
    (events, endpoint)
}

async fn next_event(events: &mut Events) -> Option<Sse> {
    tokio::time::timeout(WAIT, events.next())
        .await
        .expect("event in time")
        .map(|event| event.unwrap())
}

async fn post(http: &reqwest::Client, server: &Server, path: &str, body: &str) -> (u16, String) {
    let response = http
        .post(format!("{}{path}", server.base))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

fn initialize(id: u64) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "initialize",
        "params": {
            "protocolVersion": "2024-11-05",
            "capabilities": {},
            "clientInfo": {"name": "raw-test", "version": "0"}
        }
    })
    .to_string()
}

#[tokio::test]
async fn session_speaks_the_2024_11_05_wire_format() {
    let server = start().await;
    let http = reqwest::Client::new();
    let (mut events, endpoint) = open(&http, &server).await;

    assert_eq!(
        post(&http, &server, &endpoint, &initialize(1)).await,
        (202, "Accepted".to_owned())
    );
    let event = next_event(&mut events).await.expect("initialize response");
    assert_eq!(event.event.as_deref(), Some("message"));
    let response: Value = serde_json::from_str(&event.data.unwrap()).unwrap();
    assert_eq!(response["id"], 1);
    assert_eq!(response["result"]["protocolVersion"], "2024-11-05");

    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(
        post(&http, &server, &endpoint, &initialized.to_string())
            .await
            .0,
        202
    );
    let call = json!({
        "jsonrpc": "2.0",
        "id": "call-1",
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "hi"}}
    });
    assert_eq!(
        post(&http, &server, &endpoint, &call.to_string()).await.0,
        202
    );
    let event = next_event(&mut events).await.expect("tools/call response");
    let response: Value = serde_json::from_str(&event.data.unwrap()).unwrap();
    assert_eq!(response["id"], "call-1");
    assert_eq!(response["result"]["content"][0]["text"], "hi");
}

#[tokio::test]
async fn bad_posts_are_refused() {
    let server = start().await;
    let http = reqwest::Client::new();
    let (_events, endpoint) = open(&http, &server).await;

    let (status, body) = post(&http, &server, &endpoint, "{not json").await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = post(&http, &server, &endpoint, r#"{"hello":"world"}"#).await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = post(&http, &server, "/message?sessionId=nope", &initialize(1)).await;
    assert_eq!(status, 404);
    let (status, _) = post(&http, &server, "/message", &initialize(1)).await;
    assert_eq!(status, 400);
    // The session survives bad posts.
    assert_eq!(post(&http, &server, &endpoint, &initialize(1)).await.0, 202);
}

#[tokio::test]
async fn session_ends_when_the_stream_is_dropped() {
    let server = start().await;
    let http = reqwest::Client::new();
    let (events, endpoint) = open(&http, &server).await;
    assert_eq!(post(&http, &server, &endpoint, &initialize(1)).await.0, 202);
    drop(events);

    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (status, _) = post(&http, &server, &endpoint, &initialize(2)).await;
        if status == 404 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "session still open: {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn sessions_are_independent() {
    let server = start().await;
    let http = reqwest::Client::new();
    let (mut first, first_endpoint) = open(&http, &server).await;
    let (mut second, second_endpoint) = open(&http, &server).await;
    assert_ne!(first_endpoint, second_endpoint);

    assert_eq!(
        post(&http, &server, &second_endpoint, &initialize(2))
            .await
            .0,
        202
    );
    assert_eq!(
        post(&http, &server, &first_endpoint, &initialize(1))
            .await
            .0,
        202
    );
    for (events, id) in [(&mut first, 1), (&mut second, 2)] {
        let event = next_event(events).await.expect("response");
        let response: Value = serde_json::from_str(&event.data.unwrap()).unwrap();
        assert_eq!(response["id"], id);
    }
}

#[tokio::test]
async fn shutdown_ends_open_streams_and_the_server() {
    let mut server = start().await;
    let http = reqwest::Client::new();
    let (mut events, _endpoint) = open(&http, &server).await;

    server.shutdown.cancel();
    assert!(next_event(&mut events).await.is_none());
    let result = tokio::time::timeout(WAIT, &mut server.task)
        .await
        .expect("server stops in time");
    result.unwrap().unwrap();
}
