//! Hostile MCP servers (issue #10, items 2, 3 and 10): real `quiver registry`
//! and `quiver worker` processes, and `quiver-testkit-hostile` as a stdio
//! server that misbehaves while listing or answering.
//!
//! - `endless_cursor_listing_is_bounded`: every `tools/list` page carries a
//!   `nextCursor`.
//! - `unanswered_listing_bounds_the_call`: `tools/list` is never answered.
//! - `oversized_call_answer_fails_at_once`: a 24 MB `tools/call` answer.
//! - `oversized_and_deep_listings_fail_at_once`: a 20 MB listing, and a
//!   schema nested 300 deep.
//! - `servers_beyond_the_child_cap_say_so`: more stdio servers than
//!   `max_child_processes`.
//!
//! Each prints its figures (`eprintln!`, shown by nextest on failure).

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{WorkerProcess, eventually, processes, testkit_bin};
use crate::stack::Stack;
use crate::worker::{injected, stdio_record};

/// Path of the `quiver-testkit-hostile` binary.
fn hostile_bin() -> String {
    testkit_bin("quiver-testkit-hostile")
}

/// A stdio record running the hostile server with `args`.
fn hostile_record(server_id: &str, args: &[&str], tool_timeout_ms: u64) -> Value {
    json!({
        "server_id": server_id,
        "transport": "stdio",
        "stdio": {"command": hostile_bin(), "args": args},
        "allowed_tools": ["*"],
        "budgets": {"tool_timeout_ms": tool_timeout_ms},
    })
}

/// A stack whose worker has `pool` as the `[pool]` section of its config.
async fn start(pool: &str) -> Stack {
    Stack::builder()
        .worker_config(&format!("[pool]\n{pool}\n"))
        .start()
        .await
}

/// Waits (at most `within`) until the `/v1/mcp/servers` entry of
/// `server_id` has a `last_error` containing `needle`; returns the entry
/// and how long it took.
async fn error_naming(
    stack: &Stack,
    server_id: &str,
    needle: &str,
    within: Duration,
) -> (Value, Duration) {
    let started = Instant::now();
    let worker = &stack.worker;
    let entry = eventually(
        within,
        &format!("{server_id}: last_error naming {needle}"),
        || async move {
            let server = worker.server(server_id).await?;
            server["last_error"]
                .as_str()
                .is_some_and(|error| error.contains(needle))
                .then_some(server)
        },
    )
    .await;
    (entry, started.elapsed())
}

/// `VmRSS` of `pid`, in KiB.
fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Children of `parent` running `hostile_bin()`.
fn hostile_children(parent: i32) -> Vec<i32> {
    processes()
        .into_iter()
        .filter(|p| p.ppid == parent && p.state != 'Z')
        .filter(|p| {
            std::fs::read_link(format!("/proc/{}/exe", p.pid))
                .is_ok_and(|exe| exe.ends_with("quiver-testkit-hostile"))
        })
        .map(|p| p.pid)
        .collect()
}

/// A call with an outer bound, so a hang fails the test instead of stalling it.
async fn bounded_call(
    worker: &WorkerProcess,
    name: &str,
    bound: Duration,
) -> (StatusCode, Value, Duration) {
    let started = Instant::now();
    let (status, body) = tokio::time::timeout(bound, worker.call(name, json!({"text": "x"})))
        .await
        .unwrap_or_else(|_| panic!("call {name} still unanswered after {bound:?}"));
    (status, body, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_cursor_listing_is_bounded() {
    let stack = start("").await;
    stack
        .upsert(hostile_record(
            "endless",
            &["--mode", "endless-cursor"],
            2000,
        ))
        .await;
    let worker_pid = stack.worker.pid().as_raw();
    let before = rss_kib(worker_pid);
    // Any listing of the server starts the paging.
    let listed = Instant::now();
    let tools = stack.worker.tools().await;
    let list_took = listed.elapsed();
    let (entry, took) =
        error_naming(&stack, "endless", "max_list_pages", Duration::from_secs(3)).await;
    eprintln!(
        "[hostile::endless_cursor] GET /v1/mcp/tools: {} tools after {list_took:.2?}; last_error after {took:.2?}: {}; state {}",
        tools.len(),
        entry["last_error"],
        entry["state"]
    );
    assert_ne!(entry["state"], "connected", "{entry}");
    assert_eq!(entry["tool_count"], Value::Null, "{entry}");
    // Nothing keeps paging: memory stays flat while the server stays up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib(worker_pid);
    eprintln!("[hostile::endless_cursor] worker RSS {before} KiB → {after} KiB");
    assert!(after < before + 20 * 1024, "RSS {before} → {after} KiB");
    // Deleting the record ends the server.
    assert_eq!(hostile_children(worker_pid).len(), 1);
    let head = stack.admin.delete("endless").await;
    stack.synced(head).await;
    eventually(Duration::from_secs(5), "hostile server ended", || async {
        hostile_children(worker_pid).is_empty().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_listing_bounds_the_call() {
    const TOOL_TIMEOUT_MS: u64 = 2000;
    let stack = start("").await;
    stack
        .upsert(hostile_record(
            "silent",
            &["--mode", "silent-list"],
            TOOL_TIMEOUT_MS,
        ))
        .await;
    let (status, body, took) = bounded_call(
        &stack.worker,
        &injected("silent", "echo"),
        Duration::from_secs(8),
    )
    .await;
    eprintln!(
        "[hostile::unanswered_listing] call with tool_timeout_ms {TOOL_TIMEOUT_MS}: HTTP {status} {} after {took:.2?}",
        body["error"]
    );
    assert!(
        ["mcp_timeout", "mcp_unavailable"]
            .contains(&body["error"]["code"].as_str().unwrap_or_default()),
        "{status} {body}"
    );
    assert!(
        took < Duration::from_millis(TOOL_TIMEOUT_MS + 700),
        "the call took {took:?}"
    );
    let entry = stack.worker.server("silent").await.expect("server entry");
    eprintln!(
        "[hostile::unanswered_listing] /v1/mcp/servers: state {} last_error {}",
        entry["state"], entry["last_error"]
    );
    assert!(
        entry["state"] != "connected" && entry["last_error"].is_string(),
        "a server that does not list its tools is not healthy: {entry}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_call_answer_fails_at_once() {
    // "At once" is "long before the timeout": the bound is half of a
    // generous timeout, so a loaded machine streaming 24 MB still passes
    // while a call that waited for the timeout does not.
    const TOOL_TIMEOUT_MS: u64 = 20_000;
    let at_once = Duration::from_millis(TOOL_TIMEOUT_MS / 2);
    let stack = start("").await;
    stack
        .upsert(hostile_record(
            "huge",
            &["--mode", "huge-call", "--bytes", "24000000"],
            TOOL_TIMEOUT_MS,
        ))
        .await;
    let name = injected("huge", "echo");
    let wait = Duration::from_millis(TOOL_TIMEOUT_MS + 5000);
    let (status, body, took) = bounded_call(&stack.worker, &name, wait).await;
    eprintln!(
        "[hostile::oversized_call] 24 MB answer, tool_timeout_ms {TOOL_TIMEOUT_MS}: HTTP {status} {} after {took:.2?}",
        body["error"]
    );
    assert_eq!(
        body["error"]["code"], "mcp_output_too_large",
        "{status} {body}"
    );
    // No output at all: the server's answer was unusable, not truncated.
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_message_bytes"), "{message}");
    assert!(took < at_once, "the call took {took:?}");
    // The connection survives: the next call fails the same way, as fast.
    let (_, again, took_again) = bounded_call(&stack.worker, &name, wait).await;
    eprintln!(
        "[hostile::oversized_call] the same call again: {} after {took_again:.2?}",
        again["error"]["code"]
    );
    assert_eq!(again["error"]["code"], "mcp_output_too_large", "{again}");
    assert!(took_again < at_once, "{took_again:?}");
    let entry = stack.worker.server("huge").await.expect("server entry");
    assert!(
        entry["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("max_message_bytes")),
        "{entry}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_and_deep_listings_fail_at_once() {
    // "At once" is "long before any wait runs out": the catalog's wait for
    // a server and the tools' timeout are generous, the bounds half of
    // them, so a loaded machine passes while waiting them out does not.
    const WAIT_MS: u64 = 20_000;
    let at_once = Duration::from_millis(WAIT_MS / 2);
    let stack = start(&format!("catalog_wait_ms = {WAIT_MS}")).await;
    stack
        .upsert(hostile_record(
            "biglist",
            &["--mode", "huge-list", "--bytes", "20000000"],
            WAIT_MS,
        ))
        .await;
    stack
        .upsert(hostile_record(
            "deep",
            &["--mode", "deep-schema", "--depth", "300"],
            WAIT_MS,
        ))
        .await;
    stack.upsert(stdio_record("steady", &["echo"])).await;
    let started = Instant::now();
    let tools = stack.worker.tools().await;
    let list_took = started.elapsed();
    let (big, big_took) = error_naming(&stack, "biglist", "max_message_bytes", at_once).await;
    let (deep, deep_took) = error_naming(&stack, "deep", "recursion limit", at_once).await;
    eprintln!(
        "[hostile::listings] GET /v1/mcp/tools: {} tools after {list_took:.2?}; 20 MB listing → {} after {big_took:.2?}; 300-deep schema → {} after {deep_took:.2?}",
        tools.len(),
        big["last_error"],
        deep["last_error"]
    );
    assert!(
        tools
            .iter()
            .any(|t| t["name"] == injected("steady", "echo")),
        "{tools:?}"
    );
    assert!(list_took < at_once, "{list_took:?}");
    for entry in [&big, &deep] {
        assert_ne!(entry["state"], "connected", "{entry}");
    }
    // A call to the deep server fails at once too (it cannot resolve the tool).
    let (_, body, took) = bounded_call(
        &stack.worker,
        &injected("deep", "echo"),
        Duration::from_millis(WAIT_MS + 5000),
    )
    .await;
    assert!(took < at_once, "{took:?}: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_beyond_the_child_cap_say_so() {
    let stack = start("max_child_processes = 1").await;
    stack.upsert(stdio_record("first", &["echo"])).await;
    stack.upsert(stdio_record("second", &["echo"])).await;
    let tools = stack.worker.tools().await;
    let listed: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(listed.len(), 1, "one server fits under the cap: {listed:?}");
    let refused = if listed[0] == injected("first", "echo") {
        "second"
    } else {
        "first"
    };
    let (entry, _) = error_naming(
        &stack,
        refused,
        "max_child_processes",
        Duration::from_secs(3),
    )
    .await;
    eprintln!(
        "[hostile::child_cap] server beyond max_child_processes = 1: state {} last_error {}",
        entry["state"], entry["last_error"]
    );
    assert!(
        ["down", "degraded"].contains(&entry["state"].as_str().unwrap_or_default()),
        "{entry}"
    );
}
