//! The web admin's server list at fleet scale (issue #25), measured in
//! Chromium: a real registry (SQLite) and a real worker following it, first
//! with [`BASELINE`] records, then with [`FLEET`] records.
//! `tests/web/scale.bench.mjs` measures, for each size, the time from the
//! page being ready (`DOMContentLoaded` of `/admin/servers`, signed in) until
//! the first server rows are on screen, and from a search keystroke until
//! the rows show its result (median of several keystrokes); at
//! [`FLEET`] records it also checks that the periodic refresh redraws
//! nothing when nothing changed and keeps the scroll position. It prints the
//! raw figures and their ratio to the baseline, and fails above three times
//! the goals (300 ms to first rows, 100 ms per keystroke): the machine is
//! shared, and the list that drew every row took seconds for either (3.0 s
//! and 2.6 s in this test).
//!
//! Results and method: BENCHMARKS.md, "Web admin at 10,000 servers".

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{
    ADMIN, CALLER, RegistryProcess, WORKER, WorkerProcess, eventually, registry, sqlite,
};
use crate::web_admin::run_browser_script;

/// Records of the baseline measurement.
const BASELINE: usize = 100;
/// Records of the fleet-scale measurement.
const FLEET: usize = 10_000;
/// Records per `POST /admin/api/servers/apply` (well under its 2 MiB body limit).
const APPLY_BATCH: usize = 2_000;
const WORKER_ID: &str = "e2e-scale-worker";
/// Goal: first rows this long after the page is ready (the test fails above 3×).
const FIRST_ROWS_GOAL_MS: f64 = 300.0;
/// Goal: rows updated this long after a search keystroke (the test fails above 3×).
const KEYSTROKE_GOAL_MS: f64 = 100.0;
const TEAMS: [&str; 8] = [
    "payments", "search", "platform", "growth", "infra", "data", "mobile", "support",
];

/// Record `n` of the fleet: mostly stdio, every tenth Streamable HTTP, every
/// seventh disabled, with a display name and labels to search.
fn record(n: usize) -> Value {
    let team = TEAMS[n % TEAMS.len()];
    let mut record = json!({
        "server_id": format!("srv-{n:05}"),
        "display_name": format!("{team} tools {n}"),
        "labels": {"team": team, "tier": if n.is_multiple_of(3) { "gold" } else { "standard" }},
        "enabled": !n.is_multiple_of(7),
    });
    let fields = record.as_object_mut().expect("an object");
    if n % 10 == 9 {
        fields.insert("transport".into(), json!("streamable_http"));
        fields.insert(
            "http".into(),
            json!({"url": format!("https://mcp.example.com/{team}/{n}")}),
        );
    } else {
        fields.insert("transport".into(), json!("stdio"));
        fields.insert(
            "stdio".into(),
            // Workers connect on first use: nothing runs this command.
            json!({"command": format!("/opt/mcp/bin/{team}-server"), "args": ["--team", team]}),
        );
    }
    record
}

/// Creates records `from..to` with batch applies; the last revision.
async fn create(registry: &RegistryProcess, from: usize, to: usize) -> u64 {
    let client = reqwest::Client::new();
    let url = format!("{}/admin/api/servers/apply", registry.http_url());
    let mut revision = 0;
    for start in (from..to).step_by(APPLY_BATCH) {
        let servers: Vec<Value> = (start..to.min(start + APPLY_BATCH)).map(record).collect();
        let response = client
            .post(&url)
            .bearer_auth(ADMIN)
            .json(&json!({ "servers": servers }))
            .send()
            .await
            .expect("POST /admin/api/servers/apply");
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "apply {start}..: {status} {body}");
        revision = body["last_revision"].as_u64().expect("last_revision");
    }
    revision
}

/// Waits until the worker reported its snapshot at `revision` to the
/// registry, so the page joins the records with a real report.
async fn reported(registry: &RegistryProcess, revision: u64) {
    let client = reqwest::Client::new();
    let url = format!("{}/admin/api/workers", registry.http_url());
    eventually(
        Duration::from_secs(30),
        &format!("a worker report at revision {revision}"),
        || {
            let request = client.get(&url).bearer_auth(ADMIN);
            async move {
                let body: Value = request.send().await.ok()?.json().await.ok()?;
                body["workers"]
                    .as_array()?
                    .iter()
                    .any(|w| w["worker_id"] == WORKER_ID && w["snapshot_revision"] == revision)
                    .then_some(())
            }
        },
    )
    .await;
}

/// What `scale.bench.mjs` measured at one size (all in milliseconds).
#[derive(Debug, serde::Deserialize)]
struct Figures {
    /// Page ready to first rows on screen, per load.
    first_rows_ms: Vec<f64>,
    /// Keystroke to updated rows, per keystroke.
    keystroke_ms: Vec<f64>,
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    assert!(!sorted.is_empty(), "no sample");
    sorted[sorted.len() / 2]
}

/// Runs the benchmark script against `base` holding `records` records; its figures.
async fn measure(base: &str, records: usize, out: &std::path::Path) -> Figures {
    run_browser_script(
        "scale.bench.mjs",
        &[
            ("QUIVER_REGISTRY_URL", base.to_owned()),
            ("QUIVER_ADMIN_TOKEN", ADMIN.to_owned()),
            ("QUIVER_SCALE_RECORDS", records.to_string()),
            ("QUIVER_SCALE_OUT", out.display().to_string()),
        ],
    )
    .await;
    let text = std::fs::read_to_string(out).expect("the script's figures");
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("figures {text}: {err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_admin_server_list_at_10000_records() {
    let started = Instant::now();
    let (dir, db_url) = sqlite();
    let registry = registry(&db_url, None).await;
    let worker = WorkerProcess::start(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &["--worker-id", WORKER_ID],
    )
    .await;
    let base = registry.http_url();

    let revision = create(&registry, 0, BASELINE).await;
    worker.synced(revision, Duration::from_secs(30)).await;
    reported(&registry, revision).await;
    let baseline = measure(&base, BASELINE, &dir.path().join("baseline.json")).await;

    let creating = Instant::now();
    let revision = create(&registry, BASELINE, FLEET).await;
    worker.synced(revision, Duration::from_secs(60)).await;
    reported(&registry, revision).await;
    eprintln!(
        "created {} more records in {:.1?}",
        FLEET - BASELINE,
        creating.elapsed()
    );
    let fleet = measure(&base, FLEET, &dir.path().join("fleet.json")).await;

    let rows = (
        median(&baseline.first_rows_ms),
        median(&fleet.first_rows_ms),
    );
    let keys = (median(&baseline.keystroke_ms), median(&fleet.keystroke_ms));
    eprintln!("baseline ({BASELINE} records): {baseline:?}");
    eprintln!("fleet ({FLEET} records): {fleet:?}");
    eprintln!(
        "first rows after page ready: {:.0} ms at {BASELINE}, {:.0} ms at {FLEET} (×{:.2}); \
         keystroke to rows: {:.1} ms at {BASELINE}, {:.1} ms at {FLEET} (×{:.2}); \
         whole test {:.1?}",
        rows.0,
        rows.1,
        rows.1 / rows.0,
        keys.0,
        keys.1,
        keys.1 / keys.0,
        started.elapsed()
    );
    assert!(
        rows.1 <= 3.0 * FIRST_ROWS_GOAL_MS,
        "first rows at {FLEET} records took {:.0} ms (goal {FIRST_ROWS_GOAL_MS} ms)",
        rows.1
    );
    assert!(
        keys.1 <= 3.0 * KEYSTROKE_GOAL_MS,
        "a keystroke at {FLEET} records took {:.1} ms (goal {KEYSTROKE_GOAL_MS} ms)",
        keys.1
    );
}
