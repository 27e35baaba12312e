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
calls = context.get("toolCalls") or context.get("tool_calls") or []
scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
if not calls and scenario == "tools_call":
    # The scenario's server offers `add_numbers {a, b}` and checks it is called.
    calls = [{"name": "add_numbers", "arguments": {"a": 5, "b": 3}}]
if not calls and scenario.startswith("auth/"):
    # The authorization scenarios' servers offer `test-tool`; calling it is
    # what may need more scopes (step-up).
    calls = [{"name": "test-tool", "arguments": {}}]
for call in calls[:1]:
    args += ["--call", call["name"], "--args", json.dumps(call.get("arguments") or {})]
sys.exit(subprocess.run(args).returncode)
