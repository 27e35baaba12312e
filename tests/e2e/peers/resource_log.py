"""An MCP server over stdio in plain JSON-RPC (no SDK) that appends every
line it receives to a log file (argv[1]) before answering, so a test can
prove what reached it.

- resources: `file:///data/notes.md`, `file:///secret/key.txt` and
  `file:///data/../secret/key.txt` listed; any URI read answers its own URI
  as text; subscribe and unsubscribe answer `{}`.
- one resource template, `file:///data/{name}`, whose `name` completions
  include names that climb out of `/data`;
- one prompt, `greet`, whose `who` completions are answered as given;
- no tools.
"""

import json
import sys

LOG = sys.argv[1]

NAMES = ["notes.md", "../secret/key.txt", "..%2fsecret%2fkey.txt", "sub/ok.md", ".."]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def result(request, value):
    send({"jsonrpc": "2.0", "id": request["id"], "result": value})


def main():
    for line in sys.stdin:
        with open(LOG, "a", encoding="utf-8") as log:
            log.write(line.rstrip("\n") + "\n")
        try:
            request = json.loads(line)
        except ValueError:
            continue
        method = request.get("method")
        params = request.get("params") or {}
        if "id" not in request:
            continue
        if method == "initialize":
            result(request, {
                "protocolVersion": params.get("protocolVersion", "2025-11-25"),
                "capabilities": {
                    "resources": {"subscribe": True},
                    "prompts": {},
                    "completions": {},
                    "tools": {},
                },
                "serverInfo": {"name": "resource-log", "version": "1"},
            })
        elif method == "tools/list":
            result(request, {"tools": []})
        elif method == "resources/list":
            result(request, {"resources": [
                {"uri": "file:///data/notes.md", "name": "notes"},
                {"uri": "file:///secret/key.txt", "name": "key"},
                {"uri": "file:///data/../secret/key.txt", "name": "climb"},
            ]})
        elif method == "resources/templates/list":
            result(request, {"resourceTemplates": [
                {"uriTemplate": "file:///data/{name}", "name": "data"},
            ]})
        elif method == "resources/read":
            uri = params.get("uri")
            result(request, {"contents": [{"uri": uri, "mimeType": "text/plain", "text": f"content of {uri}"}]})
        elif method in ("resources/subscribe", "resources/unsubscribe"):
            result(request, {})
        elif method == "prompts/list":
            result(request, {"prompts": [{"name": "greet", "arguments": [{"name": "who"}]}]})
        elif method == "completion/complete":
            ref = params.get("ref") or {}
            values = NAMES if ref.get("type") == "ref/resource" else ["../anyone", "bob"]
            result(request, {"completion": {"values": values, "total": len(values), "hasMore": False}})
        elif method == "ping":
            result(request, {})
        else:
            send({"jsonrpc": "2.0", "id": request["id"],
                  "error": {"code": -32601, "message": f"no method {method}"}})


if __name__ == "__main__":
    main()
