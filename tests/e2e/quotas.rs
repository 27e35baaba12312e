//! Rate limits counted across the fleet and usage you can see (issue #25),
//! end to end: a registry on PostgreSQL, two workers without caller tokens
//! following it, API keys of one policy created over REST.
//!
//! What it shows: a limit of 10 calls per minute on one tool holds over 30
//! calls alternating between the workers, also across a registry restart
//! in the middle of the window (what it acknowledged stays counted);
//! refusals are 429 `mcp_rate_limited` with `Retry-After` and
//! `retry_after_ms`, a tool error on the gateway; another principal and
//! another tool are unaffected; `max_concurrent_calls` refuses the extra
//! call; usage rows from both workers match the calls exactly; the limit
//! recovers after the window; bad limits are refused naming the field.

use std::time::Duration;

use quiver_testkit::postgres::TestDatabase;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{
    ADMIN, Admin, RegistryProcess, WORKER, WorkerProcess, eventually, injected, mcp_2026, registry,
    stdio_record,
};

const LIMIT: u64 = 10;

struct Fleet {
    registry: RegistryProcess,
    workers: [WorkerProcess; 2],
    http: reqwest::Client,
}

impl Fleet {
    async fn rest(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        Admin::new(&self.registry, ADMIN)
            .rest(method, path, body)
            .await
    }

    /// A tool-API call at worker `at`: status, `Retry-After`, body.
    async fn call(
        &self,
        at: usize,
        key: &str,
        tool: &str,
        arguments: Value,
    ) -> (StatusCode, Option<u64>, Value) {
        let response = self
            .http
            .post(format!("{}/v1/mcp/tools/call", self.workers[at].url()))
            .bearer_auth(key)
            .json(&json!({"name": injected("alpha", tool), "arguments": arguments}))
            .send()
            .await
            .expect("tools/call");
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        (
            status,
            retry_after,
            response.json().await.unwrap_or(Value::Null),
        )
    }

    async fn echo(&self, at: usize, key: &str) -> (StatusCode, Option<u64>, Value) {
        self.call(at, key, "echo", json!({"text": "hi"})).await
    }

    async fn create_key(&self, name: &str) -> (String, String) {
        let (status, created) = self
            .rest(
                reqwest::Method::POST,
                "/admin/api/keys",
                Some(json!({"name": name, "policy": "metered"})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        (
            created["key"].as_str().expect("key").to_owned(),
            format!("key:{}", created["id"].as_str().expect("id")),
        )
    }

    async fn synced(&self) {
        let (_, head) = self
            .rest(reqwest::Method::GET, "/admin/api/mcp/servers", None)
            .await;
        let revision = head["revision"].as_u64().expect("revision");
        for worker in &self.workers {
            worker.synced(revision, Duration::from_secs(20)).await;
        }
    }
}

fn row<'a>(rows: &'a Value, field: &str, value: &str) -> &'a Value {
    rows["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|row| row[field] == value)
        .unwrap_or_else(|| panic!("no {field} {value} in {rows}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_holds_across_two_workers_and_a_registry_restart() {
    let db = TestDatabase::create().await;
    let first = registry(db.url(), None).await;
    let grpc = first.grpc_addr();
    Admin::new(&first, ADMIN)
        .upsert(stdio_record("alpha", &["echo", "add", "fail", "sleep"]))
        .await;
    let args = ["--usage-flush-ms", "200"];
    let workers = [
        WorkerProcess::start_without_callers(&first.grpc_url(), WORKER, &args).await,
        WorkerProcess::start_without_callers(&first.grpc_url(), WORKER, &args).await,
    ];
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    let mut fleet = Fleet {
        registry: first,
        workers,
        http,
    };

    // Bad limits are refused naming the field.
    for (policy, field) in [
        (
            json!({"rate_limits": [{"tools": "alpha.echo", "calls": 0, "per_s": 60}]}),
            "rate_limits[0].calls",
        ),
        (
            json!({"rate_limits": [{"tools": "alpha.echo", "calls": -1, "per_s": 60}]}),
            "rate_limits[0].calls",
        ),
        (
            json!({"rate_limits": [{"tools": "alpha.echo", "calls": 1, "per_s": 0}]}),
            "rate_limits[0].per_s",
        ),
        (
            json!({"rate_limits": [{"tools": "alpha.echo", "calls": 1, "per_s": 60}, {"tools": "echo", "calls": 1, "per_s": 60}]}),
            "rate_limits[1].tools",
        ),
        (
            json!({"rate_limits": [{"tools": "alpha.[", "calls": 1, "per_s": 60}]}),
            "rate_limits[0].tools",
        ),
        (
            json!({"rate_limits": [{"tools": "a b.echo", "calls": 1, "per_s": 60}]}),
            "rate_limits[0].tools",
        ),
        (
            json!({"rate_limits": [{"tools": "alpha.echo", "calls": 1, "per_s": 60, "per": "team"}]}),
            "rate_limits[0].per",
        ),
        (json!({"max_concurrent_calls": 0}), "max_concurrent_calls"),
    ] {
        let (status, body) = fleet
            .rest(
                reqwest::Method::PUT,
                "/admin/api/policies/bad",
                Some(policy.clone()),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{policy}: {body}");
        assert_eq!(body["error"]["field"], field, "{policy}: {body}");
    }

    let (status, body) = fleet
        .rest(
            reqwest::Method::PUT,
            "/admin/api/policies/metered",
            Some(json!({
                "allowed_server_ids": ["alpha"],
                "rate_limits": [{"tools": "alpha.echo", "calls": LIMIT, "per_s": 60}],
                "max_concurrent_calls": 2,
            })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (alice, alice_principal) = fleet.create_key("alice").await;
    let (bob, bob_principal) = fleet.create_key("bob").await;
    fleet.synced().await;

    // Five calls, then the registry dies and comes back on the same
    // database in the middle of the window; 25 more calls.
    let mut admitted = 0;
    let mut refused = Vec::new();
    for i in 0..30 {
        if i == 5 {
            fleet.registry.kill_hard();
            fleet.registry = registry(db.url(), Some(grpc)).await;
            fleet.synced().await;
        }
        let (status, retry_after, body) = fleet.echo(i % 2, &alice).await;
        match status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => refused.push((retry_after, body)),
            other => panic!("call {i}: {other} {body}"),
        }
    }
    // The issue allows ±1; with a limit under 40 each lease is one call,
    // so the count is exact, across the restart too.
    assert_eq!(
        admitted, LIMIT,
        "{admitted} of 30 calls ran under a limit of {LIMIT}"
    );
    let mut last_retry_ms = 0;
    for (retry_after, body) in &refused {
        let error = &body["error"];
        assert_eq!(error["code"], "mcp_rate_limited", "{body}");
        assert_eq!(error["retryable"], true, "{body}");
        assert!(
            error["message"]
                .as_str()
                .unwrap_or("")
                .contains("rate_limits[0]"),
            "the refusal names the rule: {body}"
        );
        let ms = error["retry_after_ms"].as_u64().expect("retry_after_ms");
        assert!(ms > 0 && ms <= 60_000, "{body}");
        let seconds = retry_after.expect("Retry-After header");
        assert_eq!(seconds, ms.div_ceil(1000), "{body}");
        last_retry_ms = ms;
    }

    // The gateway answers a tool error; another tool and another
    // principal are unaffected.
    let answer = mcp_2026(
        &format!("{}/mcp/alpha", fleet.workers[0].url()),
        &alice,
        "tools/call",
        Some("echo"),
        json!({"name": "echo", "arguments": {"text": "hi"}}),
    )
    .await;
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert!(answer.to_string().contains("mcp_rate_limited"), "{answer}");
    let (status, _, body) = fleet.call(1, &alice, "add", json!({"a": 1, "b": 2})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, body) = fleet.call(0, &alice, "fail", json!({})).await;
    assert_eq!(
        (status, &body["is_error"]),
        (StatusCode::OK, &json!(true)),
        "{body}"
    );
    for at in [0, 1, 0] {
        let (status, _, body) = fleet.echo(at, &bob).await;
        assert_eq!(status, StatusCode::OK, "bob is not alice: {body}");
    }

    // max_concurrent_calls 2: the third call at once is refused.
    let sleeps: Vec<_> = (0..3)
        .map(|i| {
            let (url, key, http) = (fleet.workers[0].url(), bob.clone(), fleet.http.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(150 * i)).await;
                let response = http
                    .post(format!("{url}/v1/mcp/tools/call"))
                    .bearer_auth(key)
                    .json(&json!({"name": injected("alpha", "sleep"), "arguments": {"ms": 1500}}))
                    .send()
                    .await
                    .expect("sleep call");
                let status = response.status();
                (
                    status,
                    response.json::<Value>().await.unwrap_or(Value::Null),
                )
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for sleep in sleeps {
        let (status, body) = sleep.await.expect("task");
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("max_concurrent_calls"),
                "{body}"
            );
        }
        statuses.push(status);
    }
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count(),
        1,
        "{statuses:?}"
    );

    // Usage from both workers, exact.
    let alice_calls = LIMIT + 2;
    let alice_limited = refused.len() as u64 + 1;
    eventually(
        Duration::from_secs(15),
        "usage rows of both workers",
        || async {
            let (status, rows) = fleet
                .rest(
                    reqwest::Method::GET,
                    "/admin/api/usage?group_by=principal",
                    None,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{rows}");
            let counts = |principal: &str| {
                rows["rows"]
                    .as_array()?
                    .iter()
                    .find(|r| r["principal"] == principal)
                    .map(|r| {
                        (
                            r["calls"].as_u64(),
                            r["errors"].as_u64(),
                            r["rate_limited"].as_u64(),
                        )
                    })
            };
            (counts(&alice_principal) == Some((Some(alice_calls), Some(1), Some(alice_limited)))
                && counts(&bob_principal) == Some((Some(5), Some(0), Some(1))))
            .then_some(())
        },
    )
    .await;
    let (_, tools) = fleet
        .rest(reqwest::Method::GET, "/admin/api/usage?group_by=tool", None)
        .await;
    let echo = row(&tools, "tool", "echo");
    assert_eq!(
        (
            echo["server"].clone(),
            echo["calls"].clone(),
            echo["rate_limited"].clone()
        ),
        (json!("alpha"), json!(LIMIT + 3), json!(alice_limited)),
        "{tools}"
    );
    assert!(
        echo["p50_ms"].as_f64().is_some() && echo["p95_ms"].as_f64().is_some(),
        "{tools}"
    );
    let (_, policies) = fleet
        .rest(
            reqwest::Method::GET,
            "/admin/api/usage?group_by=policy&step_s=60",
            None,
        )
        .await;
    let stepped: u64 = policies["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["policy"] == "metered")
        .map(|r| r["calls"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(stepped, alice_calls + 5, "{policies}");
    for (query, field) in [
        ("group_by=team", "group_by"),
        ("since=yesterday", "since"),
        ("step_s=30", "step_s"),
    ] {
        let (status, body) = fleet
            .rest(
                reqwest::Method::GET,
                &format!("/admin/api/usage?{query}"),
                None,
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
    }

    // The window ends; the limit recovers.
    tokio::time::sleep(Duration::from_millis(last_retry_ms + 500)).await;
    let (status, _, body) = fleet.echo(1, &alice).await;
    assert_eq!(status, StatusCode::OK, "after the window: {body}");

    // No key secret in any log.
    for secret in [&alice, &bob] {
        assert!(
            !fleet.registry.logged(secret),
            "a key secret is in the registry's log"
        );
        for worker in &fleet.workers {
            assert!(!worker.logged(secret), "a key secret is in a worker's log");
        }
    }
}
