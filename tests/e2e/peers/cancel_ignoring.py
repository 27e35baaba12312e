"""A stdio MCP server that keeps working after a cancellation and answers
anyway (plain JSON-RPC, see raw_jsonrpc.py): `work(seconds)` sleeps, then
answers. Usage: cancel_ignoring.py STATS_DIR (see concurrency.py)."""

import sys

# The local modules below are imported from the source tree: no __pycache__ there.
sys.dont_write_bytecode = True
import time

from concurrency import Concurrency
from raw_jsonrpc import serve

concurrency = Concurrency(sys.argv[1])


def work(arguments):
    concurrency.enter()
    try:
        time.sleep(float(arguments.get("seconds", 0)))
        return "worked"
    finally:
        concurrency.leave()


if __name__ == "__main__":
    serve({"work": work})
