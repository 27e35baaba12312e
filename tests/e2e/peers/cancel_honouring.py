"""A stdio MCP server written with the official Python SDK (`mcp` 2.x) whose
async tool `work(seconds)` honours cancellation: the SDK interrupts it on
`notifications/cancelled` (and, as MCP asks, never answers the cancelled
call). Usage: cancel_honouring.py STATS_DIR (see concurrency.py)."""

import sys

# The local modules below are imported from the source tree: no __pycache__ there.
sys.dont_write_bytecode = True

import anyio
from mcp.server.mcpserver import MCPServer

from concurrency import Concurrency

app = MCPServer("cancel-honouring")
concurrency = Concurrency(sys.argv[1])


@app.tool()
async def work(seconds: float) -> str:
    concurrency.enter()
    try:
        await anyio.sleep(seconds)
        return f"worked {seconds}s"
    finally:
        concurrency.leave()


if __name__ == "__main__":
    app.run()
