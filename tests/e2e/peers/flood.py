"""A stdio MCP server that floods its client (plain JSON-RPC, see
raw_jsonrpc.py): once initialized, for SECONDS it writes, as fast as the
pipe takes them, `notifications/message` log notifications (a 200-byte
payload each) interleaved with non-JSON garbage lines, and it still answers
`ping_tool` at once. Usage: flood.py SECONDS."""

import json
import sys

# The local modules below are imported from the source tree: no __pycache__ there.
sys.dont_write_bytecode = True
import time

from raw_jsonrpc import serve

SECONDS = float(sys.argv[1])
PAYLOAD = "p" * 200


def flood(write):
    log = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                      "params": {"level": "warning", "logger": "flood", "data": PAYLOAD}})
    garbage = "this is not json " + "g" * 100
    until = time.monotonic() + SECONDS
    while time.monotonic() < until:
        for _ in range(100):
            write(log)
            write(garbage)


if __name__ == "__main__":
    serve({"ping_tool": lambda arguments: "pong"}, on_initialized=flood)
