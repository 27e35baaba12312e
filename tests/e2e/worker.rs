//! The worker as a real process between a real registry and real MCP
//! servers (`quiver-testkit-mcp` as stdio children and as HTTP peers):
//! listing and calling on every transport, live record changes, budgets,
//! faults, clean shutdown of child processes, and riding out a registry
//! outage.
//!
//! Every test starts its own SQLite registry and worker on ephemeral loopback
//! ports. The test MCP server binary must be built (`cargo build -p
//! quiver-testkit`; `cargo nextest run --workspace` builds it).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{
    McpServerProcess, ProcStat, WorkerProcess, eventually, proc_stat, processes, testkit_mcp_bin,
};
// The e2e tokens and record helpers live in the harness (the `Stack` uses
// them); the other test modules import them from here.
pub(crate) use crate::harness::{ADMIN, CALLER, WORKER, injected, registry, stdio_record};
use crate::stack::Stack;

/// Sorted injected names of `tools` on each of `servers`.
fn names(servers: &[&str], tools: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = servers
        .iter()
        .flat_map(|server| tools.iter().map(move |tool| injected(server, tool)))
        .collect();
    names.sort();
    names
}

/// Asserts a call is refused with `status` and the §10 `code`.
async fn assert_refused(
    worker: &WorkerProcess,
    name: &str,
    status: StatusCode,
    code: &str,
) -> Value {
    let (got, body) = worker.call(name, json!({"text": "x"})).await;
    assert_eq!(got, status, "call {name:?}: {body}");
    assert_eq!(body["error"]["code"], code, "call {name:?}: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "call {name:?}: an error message: {body}"
    );
    body
}

/// `stats` of the test server behind `server_id`.
async fn stats(worker: &WorkerProcess, server_id: &str) -> Value {
    let text = worker
        .call_text(&injected(server_id, "stats"), json!({}))
        .await;
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("stats is JSON ({err}): {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_end_to_end() {
    let http_server = McpServerProcess::start("streamable-http").await;
    let sse_server = McpServerProcess::start("sse").await;
    let stack = Stack::builder().start().await;
    let (admin, worker) = (&stack.admin, &stack.worker);

    admin
        .upsert(stdio_record("e2e-stdio", &["echo", "add"]))
        .await;
    admin
        .upsert(json!({
            "server_id": "e2e-http",
            "transport": "streamable_http",
            "http": {"url": http_server.url()},
            "allowed_tools": ["echo", "add"],
        }))
        .await;
    let head = admin
        .upsert(json!({
            "server_id": "e2e-sse",
            "transport": "http_sse_legacy",
            "http": {"url": sse_server.url()},
            "allowed_tools": ["echo", "add"],
        }))
        .await;
    stack.synced(head).await;

    // Exactly the allowed tools, under their injected names.
    let all = ["e2e-http", "e2e-sse", "e2e-stdio"];
    assert_eq!(worker.tool_names().await, names(&all, &["echo", "add"]));
    for tool in worker.tools().await {
        let (server_id, tool_name) = (
            tool["server_id"].as_str().unwrap(),
            tool["tool_name"].as_str().unwrap(),
        );
        assert_eq!(tool["name"], injected(server_id, tool_name), "{tool}");
        assert_eq!(tool["input_schema"]["type"], "object", "{tool}");
        assert!(tool["description"].is_string(), "{tool}");
    }

    // Calls work on each transport.
    for server_id in all {
        let text = format!("héllo over {server_id}");
        assert_eq!(
            worker
                .call_text(&injected(server_id, "echo"), json!({"text": text}))
                .await,
            text
        );
        assert_eq!(
            worker
                .call_text(&injected(server_id, "add"), json!({"a": 2, "b": 40}))
                .await,
            "42"
        );
    }
    // The compatibility form routes too.
    assert_eq!(
        worker
            .call_text("mcp.e2e-sse.echo", json!({"text": "compat"}))
            .await,
        "compat"
    );

    // A change of allowed_tools reaches the listing within a second.
    let counter = injected("e2e-stdio", "counter");
    admin
        .upsert(stdio_record("e2e-stdio", &["echo", "add", "counter"]))
        .await;
    let committed = Instant::now();
    loop {
        if worker.tool_names().await.contains(&counter) {
            break;
        }
        assert!(
            committed.elapsed() < Duration::from_secs(1),
            "counter not listed within 1 s of the update; log:\n{}",
            worker.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "update propagation (commit → listing): {:?}",
        committed.elapsed()
    );
    let mut expected = names(&all, &["echo", "add"]);
    expected.push(counter.clone());
    expected.sort();
    assert_eq!(worker.tool_names().await, expected);
    assert_eq!(worker.call_text(&counter, json!({})).await, "1");

    // A deleted server disappears and its names are refused.
    admin.delete("e2e-stdio").await;
    let remaining = names(&["e2e-http", "e2e-sse"], &["echo", "add"]);
    eventually(Duration::from_secs(5), "e2e-stdio gone", || async {
        (worker.tool_names().await == remaining).then_some(())
    })
    .await;
    for name in [injected("e2e-stdio", "echo"), counter] {
        let body = assert_refused(worker, &name, StatusCode::FORBIDDEN, "mcp_policy_denied").await;
        assert_eq!(body["error"]["retryable"], false, "{body}");
    }

    // Names that were never injected, and malformed names, are refused.
    for name in [
        injected("e2e-http", "crash"), // offered by the server, not allowed
        injected("e2e-http", "no_such_tool"),
        injected("no-such-server", "echo"),
        "echo".to_owned(),
        "mcp.e2e-http.crash".to_owned(),
        "mcp__ZTJlLWh0dHA".to_owned(),
        "mcp__ZTJlLWh0dHA__".to_owned(),
        "mcp__!!__ZWNobw".to_owned(),
        "mcp__ZTJlLWh0dHA__ZWNobw==".to_owned(),
        String::new(),
    ] {
        assert_refused(worker, &name, StatusCode::FORBIDDEN, "mcp_policy_denied").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_budgets() {
    let stack = Stack::builder().start().await;
    let (admin, worker) = (&stack.admin, &stack.worker);
    let mut record = stdio_record("budget-conc", &["inflight", "stats"]);
    record["budgets"] = json!({"max_concurrency": 4});
    admin.upsert(record).await;
    let mut record = stdio_record("budget-timeout", &["sleep", "stats"]);
    record["budgets"] = json!({"tool_timeout_ms": 300});
    admin.upsert(record).await;
    let mut record = stdio_record("budget-output", &["big_output"]);
    record["budgets"] = json!({"max_tool_output_bytes": 1000});
    let head = admin.upsert(record).await;
    stack.synced(head).await;
    let mut expected = vec![
        injected("budget-conc", "inflight"),
        injected("budget-conc", "stats"),
        injected("budget-timeout", "sleep"),
        injected("budget-timeout", "stats"),
        injected("budget-output", "big_output"),
    ];
    expected.sort();
    assert_eq!(worker.tool_names().await, expected);

    // max_concurrency = 4: 200 concurrent calls all succeed, at most 4 at once.
    let inflight = injected("budget-conc", "inflight");
    let started = Instant::now();
    let results =
        futures::future::join_all((0..200).map(|_| worker.call(&inflight, json!({"ms": 50}))))
            .await;
    eprintln!(
        "200 calls of inflight(50 ms) at max_concurrency 4: {:?}",
        started.elapsed()
    );
    for (status, body) in &results {
        assert_eq!(*status, StatusCode::OK, "{body}");
        assert_eq!(body["is_error"], false, "{body}");
    }
    let seen = stats(worker, "budget-conc").await;
    assert_eq!(seen["calls"], 200, "{seen}");
    assert_eq!(seen["inflight_now"], 0, "{seen}");
    let max = seen["inflight_max"].as_u64().expect("inflight_max");
    assert!(
        (2..=4).contains(&max),
        "inflight_max {max} not in 2..=4: {seen}"
    );

    // tool_timeout_ms = 300: a 5 s sleep ends as mcp_timeout after ~300 ms,
    // and the server is told to stop.
    let started = Instant::now();
    let (status, body) = worker
        .call(&injected("budget-timeout", "sleep"), json!({"ms": 5000}))
        .await;
    let took = started.elapsed();
    eprintln!("tool_timeout_ms = 300 answered after {took:?}");
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(body["error"]["code"], "mcp_timeout", "{body}");
    assert_eq!(body["error"]["retryable"], true, "{body}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "timeout answered after {took:?}"
    );
    eventually(
        Duration::from_secs(2),
        "the server saw the cancellation",
        || async {
            let seen = stats(worker, "budget-timeout").await;
            (seen["cancelled"] == 1).then_some(())
        },
    )
    .await;
    let seen = stats(worker, "budget-timeout").await;
    assert_eq!(
        (&seen["calls"], &seen["inflight_now"]),
        (&json!(1), &json!(0)),
        "{seen}"
    );

    // max_tool_output_bytes = 1000: cut on a character boundary and marked.
    let (status, body) = worker
        .call(
            &injected("budget-output", "big_output"),
            json!({"bytes": 5000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["truncated"], true, "{body}");
    assert_eq!(body["is_error"], false, "{body}");
    assert_eq!(body["error"]["code"], "mcp_output_too_large", "{body}");
    let content = body["content"].as_array().expect("content");
    let texts: Vec<&str> = content
        .iter()
        .map(|item| {
            assert_eq!(item["type"], "text", "{body}");
            item["text"].as_str().expect("text")
        })
        .collect();
    assert_eq!(texts.len(), 2, "kept text + marker: {body}");
    let kept = texts[0];
    assert!(kept.len() <= 1000, "kept {} bytes", kept.len());
    // "é" is 2 bytes: 500 whole characters fit exactly, none is split.
    assert_eq!(kept, "é".repeat(500));
    let marker = texts[1];
    assert!(
        marker.contains("truncated") && marker.contains("5000"),
        "marker: {marker}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_faults() {
    let mut stack = Stack::builder().start().await;
    let admin = &stack.admin;
    let mut crashy = stdio_record("crashy", &["counter", "crash"]);
    // A crash must surface as unavailable, not wait for the default 30 s.
    crashy["budgets"] = json!({"tool_timeout_ms": 5000});
    admin.upsert(crashy).await;
    // The bystander's shell leaves a grandchild in the server's process
    // group that ignores stdin EOF: only a group kill stops it.
    admin
        .upsert(json!({
            "server_id": "bystander",
            "transport": "stdio",
            "stdio": {
                "command": "/bin/sh",
                "args": ["-c", "sleep 300 & exec \"$0\"", testkit_mcp_bin()],
            },
            "allowed_tools": ["echo"],
        }))
        .await;
    admin
        .upsert(json!({
            "server_id": "no-command",
            "transport": "stdio",
            "stdio": {"command": "/nonexistent/quiver-e2e/no-such-mcp-server"},
            "allowed_tools": ["*"],
        }))
        .await;
    let head = admin
        .upsert(json!({
            "server_id": "no-env",
            "transport": "stdio",
            "stdio": {
                "command": testkit_mcp_bin(),
                "env": {"X": "${ENV:QUIVER_TEST_UNSET_VAR}"},
            },
            "allowed_tools": ["*"],
        }))
        .await;
    stack.synced(head).await;
    let worker = &stack.worker;

    // Broken servers are absent from the listing; healthy ones list and work.
    let mut expected = vec![
        injected("bystander", "echo"),
        injected("crashy", "counter"),
        injected("crashy", "crash"),
    ];
    expected.sort();
    assert_eq!(worker.tool_names().await, expected);
    let no_command = worker
        .server("no-command")
        .await
        .expect("no-command listed");
    let error = no_command["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("/nonexistent/quiver-e2e/no-such-mcp-server"),
        "no-command: {no_command}"
    );
    // "down" while the restart backoff runs, "idle" after it: never up.
    assert_ne!(no_command["state"], "connected", "{no_command}");
    assert_eq!(no_command["pid"], Value::Null, "{no_command}");
    let no_env = worker.server("no-env").await.expect("no-env listed");
    let error = no_env["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("QUIVER_TEST_UNSET_VAR"), "no-env: {no_env}");
    assert_eq!(no_env["state"], "down", "{no_env}");
    assert_refused(
        worker,
        &injected("no-env", "echo"),
        StatusCode::SERVICE_UNAVAILABLE,
        "mcp_unavailable",
    )
    .await;
    assert_eq!(
        worker
            .call_text(
                &injected("bystander", "echo"),
                json!({"text": "still here"})
            )
            .await,
        "still here"
    );

    // A crash mid-call: unavailable, then a fresh process serves the next call.
    let counter = injected("crashy", "counter");
    assert_eq!(worker.call_text(&counter, json!({})).await, "1");
    assert_eq!(worker.call_text(&counter, json!({})).await, "2");
    let before = worker.server("crashy").await.expect("crashy listed");
    let old_pid = before["pid"].as_i64().expect("pid of the live child") as i32;
    let reconnects = before["reconnects"].as_u64().expect("reconnects");
    let started = Instant::now();
    assert_refused(
        worker,
        &injected("crashy", "crash"),
        StatusCode::SERVICE_UNAVAILABLE,
        "mcp_unavailable",
    )
    .await;
    eprintln!(
        "crash reported as mcp_unavailable after {:?}",
        started.elapsed()
    );
    assert_eq!(worker.call_text(&counter, json!({})).await, "1");
    let after = worker.server("crashy").await.expect("crashy listed");
    let new_pid = after["pid"].as_i64().expect("pid of the new child") as i32;
    assert_ne!(new_pid, old_pid, "{after}");
    assert!(
        after["reconnects"].as_u64().expect("reconnects") > reconnects,
        "before {before}, after {after}"
    );
    // The crashed child was reaped, not left a zombie.
    eventually(Duration::from_secs(2), "crashed child reaped", || async {
        proc_stat(old_pid).is_none().then_some(())
    })
    .await;

    // SIGTERM: the worker exits and takes every child (and its group) along.
    let worker_pid = worker.pid().as_raw();
    let bystander_pid = worker.server("bystander").await.expect("bystander")["pid"]
        .as_i64()
        .expect("bystander pid") as i32;
    let children: Vec<ProcStat> = processes()
        .into_iter()
        .filter(|p| p.ppid == worker_pid)
        .collect();
    let child_pids: BTreeSet<i32> = children.iter().map(|p| p.pid).collect();
    assert!(
        child_pids.contains(&new_pid) && child_pids.contains(&bystander_pid),
        "children of the worker {child_pids:?} include {new_pid} and {bystander_pid}"
    );
    let family: Vec<ProcStat> = processes()
        .into_iter()
        .filter(|p| child_pids.contains(&p.pid) || child_pids.contains(&p.pgrp))
        .collect();
    assert!(
        family
            .iter()
            .any(|p| p.ppid == bystander_pid && p.pgrp == bystander_pid),
        "the bystander's grandchild runs in its group: {family:?}"
    );
    let (status, took) = stack.worker_mut().terminate(Duration::from_secs(15)).await;
    eprintln!("worker exited {status} {took:?} after SIGTERM");
    assert!(status.success(), "worker exit status {status}");
    assert!(
        stack.worker.logged("quiver worker stopped"),
        "log:\n{}",
        stack.worker.log_tail()
    );
    let survivors = || {
        processes()
            .into_iter()
            .filter(|p| {
                p.ppid == worker_pid
                    || child_pids.contains(&p.pgrp)
                    || family
                        .iter()
                        .any(|f| f.pid == p.pid && f.start_time == p.start_time)
            })
            .collect::<Vec<_>>()
    };
    let started = Instant::now();
    while !survivors().is_empty() && started.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        survivors(),
        vec![],
        "processes of the worker left after it exited (was: {family:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_registry_down() {
    let mut stack = Stack::builder().start().await;
    let rev1 = stack.admin.upsert(stdio_record("steady", &["echo"])).await;
    stack.synced(rev1).await;
    let worker = &stack.worker;
    let echo = injected("steady", "echo");
    assert_eq!(worker.tool_names().await, vec![echo.clone()]);
    assert_eq!(worker.call_text(&echo, json!({"text": "a"})).await, "a");
    let child_pid = worker.server("steady").await.expect("steady")["pid"].clone();
    assert!(child_pid.is_u64(), "steady has a child: {child_pid}");

    // The registry goes away: the worker serves its snapshot, degraded.
    let (status, _) = stack.registry.terminate(Duration::from_secs(10)).await;
    assert!(status.success(), "registry exit status {status}");
    let stopped = Instant::now();
    let ready = eventually(Duration::from_secs(5), "readyz degraded", || async {
        let (status, ready) = worker.readyz().await;
        (ready["degraded"] == true).then_some((status, ready))
    })
    .await;
    eprintln!(
        "degraded {:?} after the registry stopped",
        stopped.elapsed()
    );
    assert_eq!(ready.0, StatusCode::OK, "{}", ready.1);
    assert!(ready.1["last_error"].is_string(), "{}", ready.1);
    assert_eq!(
        (&ready.1["ready"], &ready.1["revision"]),
        (&json!(true), &json!(rev1))
    );
    assert_eq!(worker.tool_names().await, vec![echo.clone()]);
    assert_eq!(worker.call_text(&echo, json!({"text": "b"})).await, "b");

    // A registry on the same database and port: the worker resyncs to head.
    stack.restart_registry().await;
    let rev2 = stack
        .admin
        .upsert(stdio_record("steady", &["echo", "add"]))
        .await;
    assert!(rev2 > rev1);
    let restarted = Instant::now();
    let worker = &stack.worker;
    eventually(
        Duration::from_secs(15),
        "worker resynced to head",
        || async {
            let (_, ready) = worker.readyz().await;
            (ready["revision"] == rev2 && ready["degraded"] == false).then_some(())
        },
    )
    .await;
    eprintln!(
        "resynced {:?} after the change on the new registry",
        restarted.elapsed()
    );
    let mut expected = vec![echo.clone(), injected("steady", "add")];
    expected.sort();
    assert_eq!(worker.tool_names().await, expected);
    assert_eq!(
        worker
            .call_text(&injected("steady", "add"), json!({"a": 1, "b": 2}))
            .await,
        "3"
    );
    // Same worker process, and the record change kept the child (only the
    // tool filter changed).
    assert!(stack.worker_mut().is_running());
    assert_eq!(
        stack.worker.server("steady").await.expect("steady")["pid"],
        child_pid
    );
}
