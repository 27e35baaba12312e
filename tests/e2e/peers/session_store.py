"""A stateful MCP server of the official Python SDK (`mcp` 2.x, stdio): an
in-memory key-value store (`put`, `get`), so whoever shares its process
shares its data. Used by tests/e2e/sessions.rs. `get` answers
`<value or empty>@<pid>` so a test also sees which process answered."""

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("session-store")
values = {}


@server.tool()
def put(key: str, value: str) -> str:
    """Stores value under key in this process."""
    values[key] = value
    return f"stored@{os.getpid()}"


@server.tool()
def get(key: str) -> str:
    """The value under key in this process (empty when unset)."""
    return f"{values.get(key, '')}@{os.getpid()}"


if __name__ == "__main__":
    server.run("stdio")
