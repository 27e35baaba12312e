//! The protocol era of each connection, negotiated per server by the
//! record's `protocol` (docs/reference.md §1): `auto` opens with a session
//! (`initialize`) where the server offers one and with `server/discover`
//! where it offers 2026-07-28 alone (`quiver-testkit-scenarios
//! --stateless-only`); `"2026-07-28"` insists on the new era. Against real
//! servers of both eras: the official Python SDK (`mcp` 2.x, 2026-07-28 and older;
//! `tests/e2e/peers/stateless_server.py` over stdio and stateless streamable
//! HTTP, run by `QUIVER_TEST_PYTHON`), the product's `quiver mcp-example` and
//! the testkit's `quiver-testkit-mcp` (rmcp, both eras), the npm reference
//! server `@modelcontextprotocol/server-everything` (TypeScript SDK 1.x, the
//! `initialize` era; `QUIVER_TEST_EVERYTHING` run by `QUIVER_TEST_NODE`),
//! an rmcp server that offers only the `initialize` era
//! (`quiver-testkit-scenarios --legacy`), and a hand-written stdio server
//! that ignores methods it does not know (`tests/e2e/peers/cancel_ignoring.py`).
//! The binaries must be built first (`cargo build -p quiver -p quiver-testkit`).
//! Connect times are printed (`--no-capture`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_mcp::{
    CallOptions, HealthState, JsonObject, McpError, McpPool, PoolOptions, UpstreamInput,
};
use quiver_model::{
    ErrorCode, HttpConfig, McpServerSpec, Protocol, StdioConfig, StoredServer, Transport,
};
use quiver_testkit::mcp_server::testkit_mcp_bin;
use serde_json::{Value, json};

const V2026: &str = "2026-07-28";
const V2025: &str = "2025-11-25";

/// A variable the suite's setup exports (scripts/test.sh); the tests fail
/// without it rather than skip.
fn env_path(name: &str) -> String {
    let value = std::env::var(name).unwrap_or_default();
    assert!(
        !value.is_empty() && Path::new(&value).exists(),
        "{name}={value:?} must name an existing file: run the tests with scripts/test.sh, \
         which installs Python with the `mcp` SDK, Node 24 and server-everything and exports it"
    );
    value
}

fn peer(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/e2e/peers")
        .join(name)
        .display()
        .to_string()
}

/// A binary of the workspace, built next to `quiver-testkit-mcp`.
fn workspace_bin(name: &str) -> PathBuf {
    let path = testkit_mcp_bin().with_file_name(name);
    assert!(
        path.is_file(),
        "{} is missing; build it: cargo build --workspace",
        path.display()
    );
    path
}

fn stored(spec: McpServerSpec) -> Arc<StoredServer> {
    Arc::new(StoredServer::created(spec, 1, "test"))
}

fn stdio(id: &str, command: &str, args: &[&str], protocol: Protocol) -> Arc<StoredServer> {
    let mut spec = McpServerSpec::new(id, Transport::Stdio);
    spec.stdio = Some(StdioConfig {
        command: command.into(),
        args: args.iter().map(|arg| (*arg).to_owned()).collect(),
        ..Default::default()
    });
    spec.protocol = protocol;
    stored(spec)
}

fn http(id: &str, url: &str, protocol: Protocol) -> Arc<StoredServer> {
    let mut spec = McpServerSpec::new(id, Transport::StreamableHttp);
    spec.http = Some(HttpConfig {
        url: url.into(),
        ..Default::default()
    });
    spec.protocol = protocol;
    stored(spec)
}

/// A server process serving HTTP; killed and reaped on drop.
struct HttpServer {
    child: Child,
    url: String,
}

impl HttpServer {
    /// Starts `command`, which prints `{"listening": URL}` as its first
    /// line once bound.
    fn announced(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the HTTP server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the listening line");
        let announced: Value = serde_json::from_str(&line)
            .unwrap_or_else(|err| panic!("{line:?} is not the listening line: {err}"));
        let url = announced["listening"]
            .as_str()
            .expect("listening url")
            .to_owned();
        HttpServer { child, url }
    }

    /// Starts server-everything's streamable HTTP transport, which listens on
    /// `$PORT` and says so on no pipe of its own: waits until it accepts.
    fn everything() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(env_path("QUIVER_TEST_NODE"))
            .args([&env_path("QUIVER_TEST_EVERYTHING"), "streamableHttp"])
            .env("PORT", port.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start server-everything");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "server-everything listens on {port} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        HttpServer {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn arguments(value: Value) -> Option<JsonObject> {
    value.as_object().cloned()
}

fn text(outcome: &quiver_mcp::CallOutcome) -> String {
    outcome.result.content[0]
        .as_text()
        .expect("text content")
        .text
        .clone()
}

/// Connects `server` (the handshake only) and returns the protocol version
/// the connection settled on and how long connecting took.
async fn connect(pool: &McpPool, server: &Arc<StoredServer>) -> (String, Duration) {
    let id = &server.spec.server_id;
    let started = Instant::now();
    pool.server_info(server, None)
        .await
        .unwrap_or_else(|err| panic!("{id} connects: {err}"));
    let took = started.elapsed();
    let health = pool
        .health()
        .into_iter()
        .find(|health| &health.server_id == id)
        .expect("health of the server");
    let version = health
        .protocol_version
        .unwrap_or_else(|| panic!("{id}: no protocol version while connected"));
    eprintln!(
        "{id} (protocol = {}): {version} in {} ms",
        server.spec.protocol.as_str(),
        took.as_millis()
    );
    (version, took)
}

/// Connects, checks the version, and calls `tool`, whose text must contain
/// `expected`; returns the connect time.
async fn negotiates(
    server: &Arc<StoredServer>,
    version: &str,
    tool: &str,
    args: Value,
    expected: &str,
) -> Duration {
    let pool = McpPool::new(PoolOptions::default());
    // Known to the pool (no I/O), not connected: no version yet.
    assert!(pool.cached_tools(server).is_none());
    assert_eq!(pool.health()[0].protocol_version, None);
    let (negotiated, took) = connect(&pool, server).await;
    assert_eq!(negotiated, version, "{}", server.spec.server_id);
    let outcome = pool
        .call_tool(server, tool, arguments(args))
        .await
        .unwrap_or_else(|err| panic!("{} {tool}: {err}", server.spec.server_id));
    assert!(
        text(&outcome).contains(expected),
        "{}: {}",
        server.spec.server_id,
        text(&outcome)
    );
    pool.shutdown().await;
    took
}

/// `protocol = "2026-07-28"` on a server without it: the connect fails
/// soon, naming the protocol.
async fn refuses_2026(server: &Arc<StoredServer>, within: Duration) -> McpError {
    let pool = McpPool::new(PoolOptions::default());
    let started = Instant::now();
    let err = pool.server_info(server, None).await.unwrap_err();
    let took = started.elapsed();
    eprintln!(
        "{} (protocol = 2026-07-28): refused in {} ms: {err}",
        server.spec.server_id,
        took.as_millis()
    );
    assert_eq!(err.code(), ErrorCode::McpUnavailable, "{err}");
    assert!(
        err.to_string().contains(
            "does not speak MCP 2026-07-28, which the record asks for (protocol = \"2026-07-28\""
        ),
        "{err}"
    );
    assert!(took < within, "refused after {took:?}");
    pool.shutdown().await;
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_speaks_2026_over_stdio_and_stateless_http_when_asked() {
    let python = env_path("QUIVER_TEST_PYTHON");
    let script = peer("stateless_server.py");
    let served = HttpServer::announced({
        let mut command = Command::new(&python);
        command.args([&script, "http"]);
        command
    });
    let hello = json!({"text": "hello"});
    for (transport, new, auto) in [
        (
            "stdio",
            stdio(
                "py-stdio",
                &python,
                &[&script, "stdio"],
                Protocol::V2026_07_28,
            ),
            stdio(
                "py-stdio-auto",
                &python,
                &[&script, "stdio"],
                Protocol::Auto,
            ),
        ),
        (
            "stateless http",
            http("py-http", &served.url, Protocol::V2026_07_28),
            http("py-http-auto", &served.url, Protocol::Auto),
        ),
    ] {
        let modern = negotiates(&new, V2026, "echo", hello.clone(), "hello").await;
        // It offers sessions too: `auto` opens one.
        let legacy = negotiates(&auto, V2025, "echo", hello.clone(), "hello").await;
        eprintln!(
            "python sdk over {transport}: auto {} ms, initialize {} ms",
            modern.as_millis(),
            legacy.as_millis()
        );
        // A 2026-07-28 connection carries the protocol in every request.
        let pool = McpPool::new(PoolOptions::default());
        let outcome = pool.call_tool(&new, "meta", None).await.unwrap();
        let meta: Value = serde_json::from_str(&text(&outcome)).unwrap();
        assert_eq!(
            meta["io.modelcontextprotocol/protocolVersion"], V2026,
            "{transport}: {meta}"
        );
        assert!(
            meta["io.modelcontextprotocol/clientCapabilities"].is_object(),
            "{transport}: {meta}"
        );
        pool.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_required_reaches_the_caller_and_its_answers_reach_the_server() {
    let python = env_path("QUIVER_TEST_PYTHON");
    let served = HttpServer::announced({
        let mut command = Command::new(&python);
        command.args([&peer("stateless_server.py"), "http"]);
        command
    });
    let server = http("py-greet", &served.url, Protocol::V2026_07_28);
    let pool = McpPool::new(PoolOptions::default());
    let err = pool.call_tool(&server, "greet", None).await.unwrap_err();
    let McpError::InputRequired(asked) = &err else {
        panic!("not input_required: {err:?}");
    };
    assert_eq!(err.code(), ErrorCode::McpInputRequired);
    assert_eq!(err.code().as_str(), "mcp_input_required");
    assert!(!err.retryable());
    let keys: Vec<String> = asked
        .input_requests
        .iter()
        .flatten()
        .map(|(key, _)| key.clone())
        .collect();
    assert_eq!(keys.len(), 1, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("{:?} (elicitation)", keys[0])),
        "the message names the key: {err}"
    );
    // Asking is an answer, not a failure of the server.
    let health = pool.health();
    assert_eq!(health[0].state, HealthState::Connected, "{health:?}");
    assert_eq!(health[0].last_error, None);

    let answered = CallOptions {
        input: Some(UpstreamInput {
            responses: BTreeMap::from([(
                keys[0].clone(),
                json!({"action": "accept", "content": {"name": "Ada"}}),
            )]),
            request_state: asked.request_state.clone(),
        }),
        ..CallOptions::default()
    };
    let outcome = pool
        .call_tool_with(&server, "greet", None, Instant::now(), answered)
        .await
        .unwrap();
    assert_eq!(text(&outcome), "Hello, Ada!");
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rmcp_servers_of_quiver_speak_2026_when_asked() {
    let quiver = workspace_bin("quiver").display().to_string();
    let testkit = testkit_mcp_bin().display().to_string();
    let hello = json!({"text": "hello"});
    let example = stdio("example", &quiver, &["mcp-example"], Protocol::V2026_07_28);
    negotiates(&example, V2026, "echo", hello.clone(), "hello").await;
    let example_auto = stdio("example-auto", &quiver, &["mcp-example"], Protocol::Auto);
    negotiates(&example_auto, V2025, "echo", hello.clone(), "hello").await;
    // The testkit's server is the same rmcp server: both eras.
    let pinned = stdio("testkit-2026", &testkit, &[], Protocol::V2026_07_28);
    let modern = negotiates(&pinned, V2026, "echo", hello.clone(), "hello").await;
    let auto = stdio("testkit", &testkit, &[], Protocol::Auto);
    negotiates(&auto, V2025, "echo", hello.clone(), "hello").await;
    let old = stdio("testkit-old", &testkit, &[], Protocol::V2025_11_25);
    let legacy = negotiates(&old, V2025, "echo", hello, "hello").await;
    eprintln!(
        "quiver-testkit-mcp: server/discover {} ms, initialize {} ms",
        modern.as_millis(),
        legacy.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_of_2026_07_28_alone_is_opened_with_discovery_under_auto() {
    let scenarios = workspace_bin("quiver-testkit-scenarios")
        .display()
        .to_string();
    let served = HttpServer::announced({
        let mut command = Command::new(&scenarios);
        command.args(["--listen", "127.0.0.1:0", "--stateless-only"]);
        command
    });
    let simple = "This is a simple text response for testing.";
    for (transport, auto, old) in [
        (
            "stdio",
            stdio(
                "modern-rmcp",
                &scenarios,
                &["--stdio", "--stateless-only"],
                Protocol::Auto,
            ),
            stdio(
                "modern-rmcp-old",
                &scenarios,
                &["--stdio", "--stateless-only"],
                Protocol::V2025_11_25,
            ),
        ),
        (
            "streamable http",
            http("modern-rmcp-http", &served.url, Protocol::Auto),
            http("modern-rmcp-http-old", &served.url, Protocol::V2025_11_25),
        ),
    ] {
        // `initialize` is refused; the connection is opened anew with
        // `server/discover`.
        let took = negotiates(&auto, V2026, "test_simple_text", json!({}), simple).await;
        eprintln!(
            "2026-07-28 alone over {transport}: auto {} ms",
            took.as_millis()
        );
        let pool = McpPool::new(PoolOptions::default());
        let err = pool.server_info(&old, None).await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::McpUnavailable, "{transport}: {err}");
        pool.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_server_falls_back_to_initialize_over_stdio_and_http() {
    let node = env_path("QUIVER_TEST_NODE");
    let everything = env_path("QUIVER_TEST_EVERYTHING");
    let served = HttpServer::everything();
    let echo = json!({"message": "hello"});
    let record = |transport: &str, id: &str, protocol| match transport {
        "stdio" => stdio(id, &node, &[&everything, "stdio"], protocol),
        _ => http(id, &served.url, protocol),
    };
    for transport in ["stdio", "streamable http"] {
        let auto = negotiates(
            &record(transport, "everything", Protocol::Auto),
            V2025,
            "echo",
            echo.clone(),
            "Echo: hello",
        )
        .await;
        let legacy = negotiates(
            &record(transport, "everything-old", Protocol::V2025_11_25),
            V2025,
            "echo",
            echo.clone(),
            "Echo: hello",
        )
        .await;
        eprintln!(
            "server-everything over {transport}: auto {} ms, initialize {} ms",
            auto.as_millis(),
            legacy.as_millis()
        );
        // `auto` opens with `initialize`: no cost over it.
        assert!(
            auto < legacy + Duration::from_secs(2),
            "{transport}: auto {auto:?}, initialize {legacy:?}"
        );
        refuses_2026(
            &record(transport, "everything-2026", Protocol::V2026_07_28),
            Duration::from_secs(8),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rmcp_server_of_the_initialize_era_opens_a_session_and_refuses_2026() {
    let scenarios = workspace_bin("quiver-testkit-scenarios")
        .display()
        .to_string();
    let served = HttpServer::announced({
        let mut command = Command::new(&scenarios);
        command.args(["--listen", "127.0.0.1:0", "--legacy"]);
        command
    });
    let simple = "This is a simple text response for testing.";
    for (transport, auto, pinned) in [
        (
            "stdio",
            stdio(
                "legacy-rmcp",
                &scenarios,
                &["--stdio", "--legacy"],
                Protocol::Auto,
            ),
            stdio(
                "legacy-rmcp-2026",
                &scenarios,
                &["--stdio", "--legacy"],
                Protocol::V2026_07_28,
            ),
        ),
        (
            "streamable http",
            http("legacy-rmcp-http", &served.url, Protocol::Auto),
            http("legacy-rmcp-http-2026", &served.url, Protocol::V2026_07_28),
        ),
    ] {
        let took = negotiates(&auto, V2025, "test_simple_text", json!({}), simple).await;
        assert!(took < Duration::from_secs(5), "{transport}: {took:?}");
        let err = refuses_2026(&pinned, Duration::from_secs(5)).await;
        assert!(
            err.to_string()
                .contains("the server offers only 2024-11-05, 2025-03-26, 2025-06-18, 2025-11-25"),
            "{err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_discovery_is_refused_2026_once_it_answers_ping() {
    let python = env_path("QUIVER_TEST_PYTHON");
    let stats = tempfile::tempdir().unwrap();
    let stats = stats.path().display().to_string();
    let script = peer("cancel_ignoring.py");
    let auto = stdio("ignoring", &python, &[&script, &stats], Protocol::Auto);
    let took = negotiates(&auto, V2025, "work", json!({"seconds": 0}), "worked").await;
    let old = stdio(
        "ignoring-old",
        &python,
        &[&script, &stats],
        Protocol::V2025_11_25,
    );
    let legacy = negotiates(&old, V2025, "work", json!({"seconds": 0}), "worked").await;
    eprintln!(
        "a server ignoring server/discover: auto {} ms, initialize {} ms",
        took.as_millis(),
        legacy.as_millis()
    );
    assert!(
        took < legacy + Duration::from_secs(2),
        "auto {took:?}, initialize {legacy:?}"
    );
    let pinned = stdio(
        "ignoring-2026",
        &python,
        &[&script, &stats],
        Protocol::V2026_07_28,
    );
    let err = refuses_2026(&pinned, Duration::from_secs(6)).await;
    assert!(err.to_string().contains("answered ping"), "{err}");
}
