"""The client command the MCP conformance suite runs in client mode
(tests/e2e/conformance_client.rs): turns the suite's scenario context
(`MCP_CONFORMANCE_CONTEXT`: pre-registered client credentials, tool calls)
into flags of `quiver mcp probe` and runs it on the URL the suite appends.

Usage: probe_client.py <quiver binary> <server URL>"""

import json
import os
import subprocess
import sys

quiver, url = sys.argv[1], sys.argv[-1]
context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
args = [
    quiver, "mcp", "probe", url,
    "--oauth-auto-authorize",
    # The suite's authorization servers accept a client ID metadata document
    # URL without fetching it; servers without support get dynamic registration.
    "--oauth-client-metadata-url", "https://conformance-test.local/client-metadata.json",
    "--oauth-redirect-uri", "http://localhost:3000/callback",
]
if context.get("client_id"):
    args += ["--oauth-client-id", context["client_id"]]
if context.get("client_secret"):
    args += ["--oauth-client-secret", context["client_secret"]]
# The calls a scenario checks when its context names none.
SCENARIO_CALLS = {
    # The server offers `add_numbers {a, b}` and checks it is called.
    "tools_call": [{"name": "add_numbers", "arguments": {"a": 5, "b": 3}}],
    # Each tool answers in input_required rounds (or not) and checks the
    # retry; `test_mrtr_unrelated` must carry nothing of another call's rounds.
    "sep-2322-client-request-state": [
        {"name": name}
        for name in (
            "test_mrtr_echo_state",
            "test_mrtr_no_state",
            "test_mrtr_unrelated",
            "test_mrtr_no_result_type",
        )
    ],
    # `valid_tool` must be called; the others carry malformed x-mcp-header
    # annotations and must not be, even when asked for (the probe then
    # exits non-zero, which the scenario allows).
    "http-invalid-tool-headers": [{"name": "valid_tool", "arguments": {"region": "us-west1"}}]
    + [
        {"name": name}
        for name in (
            "invalid_empty_header",
            "invalid_object_header",
            "invalid_array_header",
            "invalid_null_header",
            "invalid_number_header",
            "invalid_duplicate_same_case",
            "invalid_duplicate_diff_case",
            "invalid_space_in_name",
            "invalid_colon_in_name",
            "invalid_non_ascii_name",
            "invalid_control_char_name",
        )
    ],
}
calls = context.get("toolCalls") or context.get("tool_calls") or []
scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
if not calls:
    calls = SCENARIO_CALLS.get(scenario, [])
if not calls and scenario.startswith("auth/"):
    # The authorization scenarios' servers offer `test-tool`; calling it is
    # what may need more scopes (step-up).
    calls = [{"name": "test-tool", "arguments": {}}]
for call in calls:
    args += ["--call", call["name"], "--args", json.dumps(call.get("arguments") or {})]
sys.exit(subprocess.run(args).returncode)
