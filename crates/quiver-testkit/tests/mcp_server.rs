//! The test MCP server, driven by rmcp's own client over stdio (the real
//! binary as a child process) and Streamable HTTP (in-process and binary).

use std::{process::Stdio, time::Duration};

use base64::Engine as _;
use quiver_testkit::mcp_server::{
    EXAMPLE_TOOL_NAMES, ExampleServer, FULL_TOOL_NAMES, LONG_TOOL_NAME, Profile, Stats, TEST_PNG,
    generated_tool_name, spawn_streamable_http,
};
use rmcp::{
    RoleClient, ServiceError, ServiceExt as _,
    model::{CallToolRequestParams, CallToolResult, ErrorCode},
    service::{Peer, RunningService},
    transport::{StreamableHttpClientTransport, TokioChildProcess},
};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt as _;

const BIN: &str = env!("CARGO_BIN_EXE_quiver-testkit-mcp");
/// Upper bound for anything that should be quick; generous because the CI
/// machine is small and shared.
const WAIT: Duration = Duration::from_secs(20);

type Client = RunningService<RoleClient, ()>;

async fn stdio_client(args: &[&str]) -> Client {
    let mut command = tokio::process::Command::new(BIN);
    command.args(args);
    let (transport, _stderr) = TokioChildProcess::builder(command)
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn quiver-testkit-mcp");
    tokio::time::timeout(WAIT, ().serve(transport))
        .await
        .expect("initialize timed out")
        .expect("initialize over stdio")
}

async fn http_client(url: &str) -> Client {
    let transport = StreamableHttpClientTransport::from_uri(url.to_owned());
    tokio::time::timeout(WAIT, ().serve(transport))
        .await
        .expect("initialize timed out")
        .expect("initialize over HTTP")
}

fn request(name: &str, args: Value) -> CallToolRequestParams {
    let Value::Object(args) = args else {
        panic!("tool arguments must be an object");
    };
    CallToolRequestParams::new(name.to_owned()).with_arguments(args)
}

async fn try_call(
    peer: &Peer<RoleClient>,
    name: &str,
    args: Value,
) -> Result<CallToolResult, ServiceError> {
    tokio::time::timeout(WAIT, peer.call_tool(request(name, args)))
        .await
        .unwrap_or_else(|_| panic!("tools/call {name} timed out"))
}

async fn call(peer: &Peer<RoleClient>, name: &str, args: Value) -> CallToolResult {
    try_call(peer, name, args)
        .await
        .unwrap_or_else(|err| panic!("tools/call {name}: {err}"))
}

fn text(result: &CallToolResult) -> &str {
    assert_eq!(result.content.len(), 1, "{result:?}");
    &result.content[0]
        .as_text()
        .unwrap_or_else(|| panic!("not text: {result:?}"))
        .text
}

async fn call_text(peer: &Peer<RoleClient>, name: &str, args: Value) -> String {
    let result = call(peer, name, args).await;
    assert_ne!(result.is_error, Some(true), "{name} failed: {result:?}");
    text(&result).to_owned()
}

async fn stats(peer: &Peer<RoleClient>) -> Stats {
    serde_json::from_str(&call_text(peer, "stats", json!({})).await).expect("stats JSON")
}

async fn tool_names(peer: &Peer<RoleClient>) -> Vec<String> {
    let tools = tokio::time::timeout(WAIT, peer.list_all_tools())
        .await
        .expect("tools/list timed out")
        .expect("tools/list");
    tools
        .into_iter()
        .map(|tool| tool.name.into_owned())
        .collect()
}

/// The checks shared by every transport, on a fresh full-profile server.
async fn smoke(peer: &Peer<RoleClient>) {
    let info = peer.peer_info().expect("server info after initialize");
    let implementation = info.server_info.as_ref().expect("serverInfo");
    assert_eq!(implementation.name, "quiver-testkit");
    assert_eq!(implementation.version, env!("CARGO_PKG_VERSION"));
    assert!(info.capabilities.tools.is_some());

    assert_eq!(tool_names(peer).await, FULL_TOOL_NAMES);

    assert_eq!(
        call_text(peer, "echo", json!({"text": "héllo"})).await,
        "héllo"
    );
    for awkward in ["dotted.name", "dashed-name", "ünïcödé_tool", LONG_TOOL_NAME] {
        assert_eq!(
            call_text(peer, awkward, json!({"text": awkward})).await,
            awkward
        );
    }
    assert_eq!(call_text(peer, "add", json!({"a": 2, "b": 3})).await, "5");
    assert_eq!(
        call_text(peer, "add", json!({"a": 0.5, "b": 2})).await,
        "2.5"
    );

    let failed = call(peer, "fail", json!({"message": "boom"})).await;
    assert_eq!(failed.is_error, Some(true));
    assert_eq!(text(&failed), "boom");
    let failed = call(peer, "fail", json!({})).await;
    assert_eq!(failed.is_error, Some(true));

    // 100_001 is odd, so the 2-byte default fill needs one byte of padding.
    let big = call_text(peer, "big_output", json!({"bytes": 100_001})).await;
    assert_eq!(big.len(), 100_001);
    assert!(big.starts_with("éé") && big.ends_with("éx"));
    let big = call_text(peer, "big_output", json!({"bytes": 10, "char": "€"})).await;
    assert_eq!(big, "€€€x");

    let image = call(peer, "image", json!({})).await;
    assert_eq!(image.content.len(), 1);
    let image = image.content[0].as_image().expect("image content");
    assert_eq!(image.mime_type, "image/png");
    let png = base64::engine::general_purpose::STANDARD
        .decode(&image.data)
        .expect("base64 image data");
    assert_eq!(png, TEST_PNG);
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));

    assert_eq!(call_text(peer, "counter", json!({})).await, "1");
    assert_eq!(call_text(peer, "counter", json!({})).await, "2");

    assert_eq!(
        call_text(peer, "sleep", json!({"ms": 10})).await,
        "slept 10ms"
    );

    let unknown = try_call(peer, "no_such_tool", json!({})).await;
    assert!(
        matches!(&unknown, Err(ServiceError::McpError(err)) if err.code == ErrorCode::INVALID_PARAMS),
        "{unknown:?}"
    );
}

/// Polls `stats` until `done` holds or `timeout` elapses.
async fn wait_for_stats(
    peer: &Peer<RoleClient>,
    timeout: Duration,
    done: impl Fn(&Stats) -> bool,
) -> Stats {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let stats = stats(peer).await;
        if done(&stats) || tokio::time::Instant::now() >= deadline {
            return stats;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs 20 `inflight {ms: 200}` calls at once; the server must run them
/// concurrently.
async fn assert_concurrent(peer: &Peer<RoleClient>) {
    let calls = (0..20).map(|_| call_text(peer, "inflight", json!({"ms": 200})));
    let seen: Vec<u64> = futures::future::join_all(calls)
        .await
        .iter()
        .map(|max| max.parse().expect("inflight returns a number"))
        .collect();
    assert_eq!(seen.iter().max(), Some(&20), "{seen:?}");
    let stats = stats(peer).await;
    assert_eq!(stats.inflight_max, 20);
    assert_eq!(stats.inflight_now, 0);
}

#[tokio::test]
async fn stdio_smoke() {
    let client = stdio_client(&[]).await;
    smoke(&client).await;
    client.cancel().await.expect("close client");
}

#[tokio::test]
async fn streamable_http_smoke_and_cancellation() {
    let http = spawn_streamable_http(ExampleServer::full())
        .await
        .expect("start HTTP server");
    let client = http_client(http.url()).await;
    smoke(&client).await;

    // Dropping a pending request future is how an rmcp client abandons a
    // call; it must reach the server as notifications/cancelled.
    let peer = client.peer().clone();
    let pending = tokio::spawn(async move {
        peer.call_tool(request("sleep", json!({"ms": 60_000})))
            .await
    });
    let started = wait_for_stats(&client, WAIT, |stats| stats.inflight_now == 1).await;
    assert_eq!(started.inflight_now, 1, "sleep never started: {started:?}");
    pending.abort();
    let after = wait_for_stats(&client, Duration::from_secs(2), |stats| {
        stats.cancelled == 1
    })
    .await;
    assert_eq!(after.cancelled, 1, "{after:?}");
    assert_eq!(after.inflight_now, 0, "{after:?}");
    assert_eq!(http.server().stats().cancelled, 1);

    client.cancel().await.expect("close client");
    http.shutdown().await.expect("HTTP server shutdown");
}

#[tokio::test]
async fn http_sessions_share_state() {
    let http = spawn_streamable_http(ExampleServer::full())
        .await
        .expect("start HTTP server");
    let first = http_client(http.url()).await;
    let second = http_client(http.url()).await;
    assert_eq!(call_text(&first, "counter", json!({})).await, "1");
    assert_eq!(call_text(&second, "counter", json!({})).await, "2");
    first.cancel().await.expect("close client");
    second.cancel().await.expect("close client");
}

#[tokio::test]
async fn pagination_follows_cursors() {
    let client = stdio_client(&["--page-size", "3"]).await;
    let first = tokio::time::timeout(WAIT, client.list_tools(None))
        .await
        .expect("tools/list timed out")
        .expect("tools/list");
    assert_eq!(first.tools.len(), 3);
    assert_eq!(first.next_cursor.as_deref(), Some("3"));
    assert_eq!(tool_names(&client).await, FULL_TOOL_NAMES);
    client.cancel().await.expect("close client");

    let http = spawn_streamable_http(ExampleServer::example().with_page_size(Some(2)))
        .await
        .expect("start HTTP server");
    let client = http_client(http.url()).await;
    assert_eq!(tool_names(&client).await, EXAMPLE_TOOL_NAMES);
    client.cancel().await.expect("close client");
}

#[tokio::test]
async fn stdio_runs_calls_concurrently() {
    let client = stdio_client(&[]).await;
    assert_concurrent(&client).await;
    client.cancel().await.expect("close client");
}

#[tokio::test]
async fn http_runs_calls_concurrently() {
    let http = spawn_streamable_http(ExampleServer::full())
        .await
        .expect("start HTTP server");
    let client = http_client(http.url()).await;
    assert_concurrent(&client).await;
    client.cancel().await.expect("close client");
}

#[tokio::test]
async fn crash_closes_the_transport() {
    let client = stdio_client(&[]).await;
    assert_eq!(
        call_text(&client, "echo", json!({"text": "alive"})).await,
        "alive"
    );
    let crashed = try_call(&client, "crash", json!({"code": 3})).await;
    assert!(crashed.is_err(), "crash replied: {crashed:?}");
    let after = try_call(&client, "echo", json!({"text": "dead"})).await;
    assert!(after.is_err(), "call after crash succeeded: {after:?}");
    assert!(client.is_transport_closed());
}

#[tokio::test]
async fn example_profile_offers_five_tools() {
    let client = stdio_client(&["--profile", "example"]).await;
    assert_eq!(tool_names(&client).await, EXAMPLE_TOOL_NAMES);
    assert_eq!(EXAMPLE_TOOL_NAMES.len(), 5);
    assert_eq!(
        call_text(&client, "add", json!({"a": 40, "b": 2})).await,
        "42"
    );
    let refused = try_call(&client, "fail", json!({})).await;
    assert!(
        matches!(&refused, Err(ServiceError::McpError(err)) if err.code == ErrorCode::INVALID_PARAMS),
        "{refused:?}"
    );
    client.cancel().await.expect("close client");

    assert_eq!(ExampleServer::example().profile(), Profile::Example);
}

#[tokio::test]
async fn binary_serves_streamable_http() {
    let mut child = tokio::process::Command::new(BIN)
        .args(["--transport", "streamable-http", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn quiver-testkit-mcp");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("no listening line in time")
        .expect("read stdout")
        .expect("stdout closed before the listening line");
    let announced: Value = serde_json::from_str(&line).expect("listening line is JSON");
    let url = announced["listening"].as_str().expect("listening URL");
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
        "{url}"
    );
    assert_eq!(announced.as_object().map(|o| o.len()), Some(1), "{line}");

    let client = http_client(url).await;
    assert_eq!(
        call_text(&client, "echo", json!({"text": "over http"})).await,
        "over http"
    );
    assert_eq!(call_text(&client, "counter", json!({})).await, "1");
    client.cancel().await.expect("close client");
    child.kill().await.expect("kill server");
}

#[tokio::test]
async fn slow_start_delays_initialize() {
    let started = tokio::time::Instant::now();
    let client = stdio_client(&["--slow-start-ms", "600"]).await;
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(
        call_text(&client, "echo", json!({"text": "late"})).await,
        "late"
    );
    client.cancel().await.expect("close client");
}

#[tokio::test]
async fn exit_after_ends_the_process() {
    let client = stdio_client(&["--exit-after-ms", "300"]).await;
    let result = try_call(&client, "sleep", json!({"ms": 30_000})).await;
    assert!(result.is_err(), "sleep outlived the process: {result:?}");
    assert!(client.is_transport_closed());
}

/// `base` plus `generated` generated tools, in `tools/list` order.
fn with_generated(base: &[&str], generated: usize) -> Vec<String> {
    let mut names: Vec<String> = base.iter().map(|name| (*name).to_owned()).collect();
    names.extend((0..generated).map(generated_tool_name));
    names.sort();
    names
}

#[tokio::test]
async fn generated_tools_are_listed_and_callable() {
    let client = stdio_client(&[
        "--profile",
        "example",
        "--generated-tools",
        "50",
        "--page-size",
        "7",
    ])
    .await;
    assert_eq!(
        tool_names(&client).await,
        with_generated(EXAMPLE_TOOL_NAMES, 50)
    );
    let tools = client.list_all_tools().await.expect("tools/list");
    let generated = tools
        .iter()
        .find(|tool| tool.name == "generated_049")
        .expect("generated_049 listed");
    assert_eq!(
        Value::Object((*generated.input_schema).clone()),
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "Text to echo back."},
                "limit": {"type": "integer", "description": "Ignored."},
            },
            "required": ["query"],
        })
    );
    assert!(
        generated
            .description
            .as_deref()
            .is_some_and(|d| !d.is_empty())
    );
    assert_eq!(
        call_text(
            &client,
            "generated_007",
            json!({"query": "héllo", "limit": 3})
        )
        .await,
        "generated_007: héllo"
    );
    let missing = call(&client, "generated_007", json!({"limit": 3})).await;
    assert_eq!(missing.is_error, Some(true), "{missing:?}");
    client.cancel().await.expect("close client");

    let http = spawn_streamable_http(ExampleServer::full().with_generated_tools(3))
        .await
        .expect("start HTTP server");
    assert_eq!(http.server().generated_tools(), 3);
    let client = http_client(http.url()).await;
    assert_eq!(
        tool_names(&client).await,
        with_generated(FULL_TOOL_NAMES, 3)
    );
    assert_eq!(
        call_text(&client, "generated_002", json!({"query": "over http"})).await,
        "generated_002: over http"
    );
    let refused = try_call(&client, "generated_003", json!({"query": "x"})).await;
    assert!(
        matches!(&refused, Err(ServiceError::McpError(err)) if err.code == ErrorCode::INVALID_PARAMS),
        "{refused:?}"
    );
    assert_eq!(http.server().stats().calls, 2);
    client.cancel().await.expect("close client");
    http.shutdown().await.expect("HTTP server shutdown");
}
