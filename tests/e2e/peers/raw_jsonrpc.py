"""A minimal MCP server over stdio in plain JSON-RPC (no SDK), for peers that
behave as no SDK would: each `tools/call` runs in a thread of its own and is
answered when its handler returns, whatever notifications arrive meanwhile.

`serve(tools, on_initialized=None)`: `tools` maps a name to a handler
`f(arguments) -> str`; `on_initialized(write)` runs in a thread once the
client sent `notifications/initialized`, with `write(line)` writing one raw
line to stdout."""

import json
import sys
import threading

_out = threading.Lock()


def write(line):
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _send(message):
    write(json.dumps(message))


def _call(tools, request):
    params = request.get("params") or {}
    handler = tools.get(params.get("name"))
    if handler is None:
        _send({"jsonrpc": "2.0", "id": request["id"],
               "error": {"code": -32602, "message": "unknown tool"}})
        return
    text = handler(params.get("arguments") or {})
    _send({"jsonrpc": "2.0", "id": request["id"],
           "result": {"content": [{"type": "text", "text": text}], "isError": False}})


def serve(tools, on_initialized=None):
    schema = {"type": "object", "properties": {"seconds": {"type": "number"}}}
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        method = message.get("method")
        if method == "initialize":
            _send({"jsonrpc": "2.0", "id": message["id"], "result": {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}, "logging": {}},
                "serverInfo": {"name": "raw-jsonrpc", "version": "1"},
            }})
        elif method == "notifications/initialized" and on_initialized:
            threading.Thread(target=on_initialized, args=(write,), daemon=True).start()
        elif method == "tools/list":
            listed = [{"name": name, "inputSchema": schema} for name in tools]
            _send({"jsonrpc": "2.0", "id": message["id"], "result": {"tools": listed}})
        elif method == "tools/call":
            threading.Thread(target=_call, args=(tools, message), daemon=True).start()
        elif method == "ping":
            _send({"jsonrpc": "2.0", "id": message["id"], "result": {}})
        # Everything else, notifications/cancelled included, is ignored.
