//! The web admin's Usage page (issue #25) in Chromium, over usage that real
//! tool calls produced: a registry on SQLite, two servers of the testkit MCP
//! server, two policies with one API key each, and two workers started
//! without caller tokens that report usage every 200 ms.
//!
//! What it shows: after a known number of calls alternating between the two
//! workers, some of them failing, `GET /admin/api/usage` counts them exactly
//! per principal, policy and server (totals and per-minute rows agree, and
//! stay exact after further reports); then, signed in as a viewer
//! (`tests/web/usage.spec.mjs`), the page shows those counts in its totals
//! table (principals named by their API key), draws the calls, errors and
//! p95 charts with one series per principal, and does the same grouped by
//! server. The screenshot `target/web-admin-screenshots/usage/usage.png` shows the
//! page with its charts.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{
    ADMIN, Admin, RegistryProcess, WORKER, WorkerProcess, eventually, injected, sqlite,
    stdio_record,
};
use crate::oauth_per_user::{Principal, create_key};
use crate::web_admin::{run_browser_script, workspace};

const VIEWER: &str = "e2e-usage-viewer-token";
/// How often the workers report usage.
const FLUSH_MS: &str = "200";
/// How long the counts may take to reach the registry (a few flushes; a
/// loaded CI host is slow).
const REPORT_TIMEOUT: Duration = Duration::from_secs(15);

/// Counts per group key: `(calls, errors)`.
type Counts = BTreeMap<String, (u64, u64)>;

/// One caller and the calls it makes: `(server, tool, how many)`.
struct Caller {
    who: Principal,
    policy: &'static str,
    calls: &'static [(&'static str, &'static str, u64)],
}

async fn json_of(response: reqwest::Response) -> (StatusCode, Value) {
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(json!(text)))
}

/// `PUT /admin/api/policies/<name>` allowing `servers`.
async fn put_policy(registry: &RegistryProcess, name: &str, servers: &[&str]) {
    let (status, body) = json_of(
        reqwest::Client::new()
            .put(format!("{}/admin/api/policies/{name}", registry.http_url()))
            .bearer_auth(ADMIN)
            .json(&json!({"allowed_server_ids": servers}))
            .send()
            .await
            .expect("PUT policy"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// `GET /admin/api/usage` with the viewer token.
async fn usage(registry: &RegistryProcess, query: &str) -> (StatusCode, Value) {
    json_of(
        reqwest::Client::new()
            .get(format!("{}/admin/api/usage?{query}", registry.http_url()))
            .bearer_auth(VIEWER)
            .send()
            .await
            .expect("GET usage"),
    )
    .await
}

/// The rows of a usage answer summed per `group_by` key (rows per minute
/// add up to the totals).
fn counts_of(body: &Value, group_by: &str) -> Counts {
    let mut counts = Counts::new();
    for row in body["rows"].as_array().expect("rows") {
        let key = row[group_by].as_str().expect("group key").to_owned();
        let entry = counts.entry(key).or_default();
        entry.0 += row["calls"].as_u64().expect("calls");
        entry.1 += row["errors"].as_u64().expect("errors");
    }
    counts
}

/// The counts of the last hour grouped by `group_by`: the totals, or with
/// `step` the per-minute rows summed (each row must carry its minute, and a
/// p95 when calls ran).
async fn counted(registry: &RegistryProcess, group_by: &str, step: bool) -> Counts {
    let query = format!(
        "group_by={group_by}&since={}{}",
        // The last hour, as the page asks for it.
        epoch_ms_ago(3_600_000),
        if step { "&step_s=60" } else { "" }
    );
    let (status, body) = usage(registry, &query).await;
    assert_eq!(status, StatusCode::OK, "GET usage?{query}: {body}");
    for row in body["rows"].as_array().expect("rows") {
        assert_eq!(row["time"].is_string(), step, "{row}");
        assert!(
            row["calls"].as_u64() == Some(0) || row["p95_ms"].is_number(),
            "a p95 for calls that ran: {row}"
        );
    }
    counts_of(&body, group_by)
}

/// Milliseconds since the epoch, `ago` milliseconds back.
fn epoch_ms_ago(ago: u64) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch");
    u64::try_from(now.as_millis()).expect("ms fit u64") - ago
}

/// Makes `caller`'s calls, alternating between `workers` (each must run:
/// `echo` succeeds, `fail` is a tool error); adds them to `expected`.
async fn make_calls(
    workers: &[WorkerProcess; 2],
    caller: &Caller,
    expected: &mut BTreeMap<&'static str, Counts>,
) {
    let client = reqwest::Client::new();
    let mut at = 0;
    for (server, tool, times) in caller.calls {
        let failing = *tool == "fail";
        for _ in 0..*times {
            let worker = &workers[at % workers.len()];
            at += 1;
            let arguments = if failing {
                json!({"message": "usage test"})
            } else {
                json!({"text": "usage"})
            };
            let (status, body) = json_of(
                client
                    .post(format!("{}/v1/mcp/tools/call", worker.url()))
                    .bearer_auth(&caller.who.key)
                    .json(&json!({"name": injected(server, tool), "arguments": arguments}))
                    .send()
                    .await
                    .expect("tools/call"),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{server}.{tool}: {body}");
            assert_eq!(body["is_error"], failing, "{server}.{tool}: {body}");
            for (group_by, key) in [
                ("principal", caller.who.principal.as_str()),
                ("policy", caller.policy),
                ("server", server),
            ] {
                let entry = expected
                    .entry(group_by)
                    .or_default()
                    .entry(key.to_owned())
                    .or_default();
                entry.0 += 1;
                entry.1 += u64::from(failing);
            }
        }
    }
}

fn expect_json(counts: &Counts) -> Value {
    counts
        .iter()
        .map(|(key, (calls, errors))| (key.clone(), json!({"calls": calls, "errors": errors})))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_page_charts_the_calls_two_workers_reported() {
    let (_dir, db_url) = sqlite();
    let registry = RegistryProcess::start(&[
        "--database-url",
        &db_url,
        "--admin-token",
        ADMIN,
        "--worker-token",
        WORKER,
        "--viewer-token",
        VIEWER,
    ])
    .await;
    let admin = Admin::new(&registry, ADMIN);
    admin.upsert(stdio_record("alpha", &["echo", "fail"])).await;
    admin.upsert(stdio_record("beta", &["echo", "fail"])).await;
    put_policy(&registry, "team-a", &["alpha", "beta"]).await;
    put_policy(&registry, "team-b", &["beta"]).await;
    let (alice, _) = create_key(&registry, "alice", "team-a").await;
    let (bob, revision) = create_key(&registry, "bob", "team-b").await;
    let key_names = json!({(alice.principal.clone()): "alice", (bob.principal.clone()): "bob"});

    let args = ["--usage-flush-ms", FLUSH_MS];
    let workers = [
        WorkerProcess::start_without_callers(&registry.grpc_url(), WORKER, &args).await,
        WorkerProcess::start_without_callers(&registry.grpc_url(), WORKER, &args).await,
    ];
    for worker in &workers {
        worker.synced(revision, Duration::from_secs(10)).await;
    }

    // Nothing called yet: no rows.
    assert_eq!(counted(&registry, "principal", false).await, Counts::new());

    let callers = [
        Caller {
            who: alice,
            policy: "team-a",
            calls: &[
                ("alpha", "echo", 6),
                ("alpha", "fail", 2),
                ("beta", "echo", 1),
            ],
        },
        Caller {
            who: bob,
            policy: "team-b",
            calls: &[("beta", "echo", 3), ("beta", "fail", 1)],
        },
    ];
    let mut expected = BTreeMap::new();
    for caller in &callers {
        make_calls(&workers, caller, &mut expected).await;
    }

    // The workers' reports reach the registry: exact counts per principal.
    let principals = &expected["principal"];
    eventually(
        REPORT_TIMEOUT,
        &format!("usage per principal to be {principals:?}"),
        || async { (counted(&registry, "principal", false).await == *principals).then_some(()) },
    )
    .await;
    // Further reports add nothing (no call is counted twice), and every
    // grouping, per minute or not, agrees.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    for (group_by, counts) in &expected {
        for step in [false, true] {
            assert_eq!(
                counted(&registry, group_by, step).await,
                *counts,
                "group_by={group_by} step={step}; registry log:\n{}",
                registry.log_tail()
            );
        }
    }
    // A bad grouping is refused, naming the parameter.
    let (status, body) = usage(&registry, "group_by=nope").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "group_by", "{body}");

    // Its own directory: other browser tests running at the same time
    // clear theirs.
    let screenshots = workspace().join("target/web-admin-screenshots/usage");
    run_browser_script(
        "usage.spec.mjs",
        &[
            ("QUIVER_REGISTRY_URL", registry.http_url()),
            ("QUIVER_VIEWER_TOKEN", VIEWER.to_owned()),
            (
                "QUIVER_USAGE_EXPECT",
                json!({
                    "principal": expect_json(&expected["principal"]),
                    "server": expect_json(&expected["server"]),
                    "key_names": key_names,
                })
                .to_string(),
            ),
            ("QUIVER_SCREENSHOTS", screenshots.display().to_string()),
        ],
    )
    .await;
    assert!(
        screenshots.join("usage.png").is_file(),
        "the screenshot {}/usage.png",
        screenshots.display()
    );
}
