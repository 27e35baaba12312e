//! `/metrics` of a real registry and worker after an end-to-end run: every
//! series docs/reference.md §11 names, plus the operability series of issue 6, is
//! present with a non-zero value.
//!
//! The run: a stdio record of the test MCP server, successful calls, a
//! failing call (`fail` → `mcp_tool_error`), a truncated call
//! (`big_output` over `max_tool_output_bytes`), a refused record and a
//! stale `expected_revision` on the registry, and at the end the registry
//! stopped so the worker reports itself degraded.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::{Admin, WorkerProcess, eventually};
use crate::worker::{ADMIN, CALLER, WORKER, injected, registry, stdio_record};

/// One sample of the Prometheus text format: name, labels, value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the Prometheus text exposition format (comments skipped).
fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (series, value) = line
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("sample line without a value: {line:?}"));
            let value: f64 = value
                .parse()
                .unwrap_or_else(|err| panic!("sample value of {line:?}: {err}"));
            let (name, labels) = match series.split_once('{') {
                None => (series.to_owned(), BTreeMap::new()),
                Some((name, rest)) => {
                    let body = rest
                        .strip_suffix('}')
                        .unwrap_or_else(|| panic!("unclosed labels: {line:?}"));
                    (name.to_owned(), parse_labels(body))
                }
            };
            Sample {
                name,
                labels,
                value,
            }
        })
        .collect()
}

/// `a="x",b="y"` (values may contain escaped quotes and commas).
fn parse_labels(body: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("label without a value: {body:?}"));
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(if escaped == 'n' { '\n' } else { escaped });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_owned(), value);
        rest = after[end..].trim_start_matches(',');
    }
    labels
}

/// The samples of one `/metrics` page.
struct Page {
    url: String,
    text: String,
    samples: Vec<Sample>,
}

impl Page {
    async fn fetch(url: String) -> Page {
        let response = reqwest::get(&url)
            .await
            .unwrap_or_else(|err| panic!("GET {url}: {err}"));
        assert_eq!(response.status(), StatusCode::OK, "GET {url}");
        let text = response.text().await.expect("metrics text");
        let samples = parse(&text);
        Page { url, text, samples }
    }

    /// Samples of `name` whose labels include every pair of `labels`.
    fn find(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|got| got == v))
            })
            .collect()
    }

    /// Asserts a sample of `name` with `labels` (and a label of each name
    /// in `label_names`) has a value > 0; returns the largest such value.
    fn non_zero(&self, name: &str, labels: &[(&str, &str)], label_names: &[&str]) -> f64 {
        let found = self.find(name, labels);
        assert!(
            !found.is_empty(),
            "{}: no series {name}{labels:?}; page:\n{}",
            self.url,
            self.text
        );
        for sample in &found {
            for label in label_names {
                assert!(
                    sample.labels.contains_key(*label),
                    "{}: {name} lacks label {label:?}: {sample:?}",
                    self.url
                );
            }
        }
        let max = found.iter().map(|s| s.value).fold(f64::MIN, f64::max);
        assert!(
            max > 0.0,
            "{}: {name}{labels:?} is not > 0: {found:?}",
            self.url
        );
        max
    }

    /// A histogram (or the summary the exporter renders by default) was
    /// observed: its `_count` is > 0.
    fn observed(&self, name: &str, labels: &[(&str, &str)], label_names: &[&str]) -> f64 {
        self.non_zero(&format!("{name}_count"), labels, label_names)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_every_series() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db_url = format!("sqlite://{}", dir.path().join("quiver.db").display());
    let mut registry = registry(&db_url, None).await;
    let admin = Admin::new(&registry, ADMIN);
    let worker = WorkerProcess::start(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &["--worker-id", "metrics-worker"],
    )
    .await;

    let server = "metrics-stdio";
    let mut record = stdio_record(server, &["echo", "fail", "big_output"]);
    record["budgets"] = json!({"max_tool_output_bytes": 100});
    let head = admin.upsert(record).await;
    eventually(Duration::from_secs(5), "worker synced", || async {
        let (_, ready) = worker.readyz().await;
        (ready["revision"] == head).then_some(())
    })
    .await;

    // Calls: two listings (the second a cache hit), successes, a failure, a
    // truncation.
    assert_eq!(worker.tools().await.len(), 3);
    assert_eq!(worker.tools().await.len(), 3);
    for i in 0..3 {
        let text = format!("call {i}");
        assert_eq!(
            worker
                .call_text(&injected(server, "echo"), json!({"text": text}))
                .await,
            text
        );
    }
    let (status, body) = worker
        .call(&injected(server, "fail"), json!({"message": "boom"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["is_error"], true, "{body}");
    let (status, body) = worker
        .call(&injected(server, "big_output"), json!({"bytes": 5000}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["truncated"], true, "{body}");

    // Registry errors: a refused record and a write with a stale revision.
    let client = reqwest::Client::new();
    let servers = format!("{}/admin/api/mcp/servers", registry.http_url());
    let refused = client
        .post(&servers)
        .bearer_auth(ADMIN)
        .json(&json!({"server_id": "", "transport": "stdio"}))
        .send()
        .await
        .expect("POST invalid record");
    assert!(refused.status().is_client_error(), "{}", refused.status());
    let stale = client
        .post(format!("{servers}?expected_revision={}", head + 10))
        .bearer_auth(ADMIN)
        .json(&stdio_record(server, &["echo"]))
        .send()
        .await
        .expect("POST stale record");
    assert_eq!(stale.status(), StatusCode::CONFLICT);

    // The worker reports its snapshot revision after changes; wait for it.
    let registry_metrics = format!("{}/metrics", registry.http_url());
    let page = eventually(
        Duration::from_secs(15),
        "registry shows the worker's revision",
        || async {
            let page = Page::fetch(registry_metrics.clone()).await;
            page.find(
                "quiver_registry_worker_snapshot_revision",
                &[("worker_id", "metrics-worker")],
            )
            .iter()
            .any(|s| s.value >= head as f64)
            .then_some(page)
        },
    )
    .await;

    // Registry: docs/reference.md §11 (revision, watchers, upserts, errors) and issue 6.
    assert_eq!(
        page.non_zero("quiver_registry_revision", &[], &[]),
        head as f64
    );
    page.non_zero("quiver_registry_watchers", &[], &[]);
    page.non_zero("quiver_registry_upserts_total", &[], &[]);
    page.non_zero("quiver_registry_errors_total", &[("code", "conflict")], &[]);
    page.non_zero("quiver_registry_errors_total", &[], &["code"]);
    page.non_zero(
        "quiver_registry_write_errors_total",
        &[("code", "conflict")],
        &[],
    );
    let lag = page.find(
        "quiver_registry_worker_lag",
        &[("worker_id", "metrics-worker")],
    );
    assert_eq!(lag.len(), 1, "worker lag series: {}", page.text);
    assert!(lag[0].value >= 0.0, "{lag:?}");

    eprintln!("registry /metrics after the run:\n{}", page.text);

    // Worker: docs/reference.md §11 and issue 6.
    let worker_metrics = format!("{}/metrics", worker.url());
    let page = Page::fetch(worker_metrics.clone()).await;
    let by_server = [("server_id", server)];
    let echo = [("server_id", server), ("tool", "echo")];
    page.non_zero("mcp_server_connect_total", &by_server, &[]);
    assert!(page.non_zero("mcp_tool_call_total", &echo, &[]) >= 3.0);
    page.non_zero(
        "mcp_tool_call_error_total",
        &[
            ("server_id", server),
            ("tool", "fail"),
            ("code", "mcp_tool_error"),
        ],
        &[],
    );
    page.non_zero(
        "mcp_tool_call_error_total",
        &[
            ("server_id", server),
            ("tool", "big_output"),
            ("code", "mcp_output_too_large"),
        ],
        &[],
    );
    page.observed("mcp_tool_call_latency_ms", &echo, &[]);
    page.observed("mcp_tool_call_output_bytes", &echo, &[]);
    assert_eq!(
        page.non_zero("quiver_worker_snapshot_revision", &[], &[]),
        head as f64
    );
    assert_eq!(page.non_zero("mcp_child_processes", &[], &[]), 1.0);
    page.observed(
        "mcp_semaphore_wait_ms",
        &[("server_id", server), ("semaphore", "server")],
        &[],
    );
    page.observed(
        "mcp_semaphore_wait_ms",
        &[("server_id", server), ("semaphore", "worker")],
        &[],
    );
    page.non_zero("mcp_tools_list_cache_misses_total", &by_server, &[]);
    page.non_zero("mcp_tools_list_cache_hits_total", &by_server, &[]);
    page.non_zero(
        "mcp_tool_output_truncated_total",
        &[("server_id", server), ("tool", "big_output")],
        &[],
    );
    eprintln!("worker /metrics after the run:\n{}", page.text);
    // Healthy so far: the degraded flag is exported, and 0.
    let degraded = page.find("quiver_worker_registry_degraded", &[]);
    assert_eq!(degraded.len(), 1, "degraded flag: {}", page.text);
    assert_eq!(degraded[0].value, 0.0);

    // The registry goes away: the flag turns 1.
    let (status, _) = registry.terminate(Duration::from_secs(10)).await;
    assert!(status.success(), "registry exit status {status}");
    eventually(Duration::from_secs(10), "worker degraded", || async {
        let page = Page::fetch(worker_metrics.clone()).await;
        page.find("quiver_worker_registry_degraded", &[])
            .iter()
            .any(|s| s.value == 1.0)
            .then_some(())
    })
    .await;
}

#[test]
fn parses_the_text_format() {
    let samples =
        parse("# TYPE x counter\nx{a=\"1\",b=\"q\\\"u,o\"} 3\ny 0.5\n\nz_count{k=\"v\"} 2\n");
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[0].labels["b"], "q\"u,o");
    assert_eq!(samples[0].labels["a"], "1");
    assert_eq!(samples[0].value, 3.0);
    assert_eq!(samples[1].name, "y");
    assert_eq!(samples[2].labels["k"], "v");
}
