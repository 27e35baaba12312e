"""A hostile-output MCP server written with the official Python SDK (`mcp` 2.x).

Stdio. Every tool takes `n`, a size in bytes:

- `text`: returns a `str` of `n` bytes; the SDK sends it twice, as a text
  item and as `structuredContent {"result": ...}`;
- `tool_error`: raises `ToolError` with an `n`-byte message (an `isError`
  result carrying the message as text);
- `server_error`: raises `MCPError` with an `n`-byte message (a JSON-RPC
  error answer);
- `meta`: a small text item with an `n`-byte result `_meta`.
"""

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent

app = MCPServer("hostile-output")


@app.tool()
def text(n: int) -> str:
    return "x" * n


@app.tool()
def tool_error(n: int) -> str:
    raise ToolError("e" * n)


@app.tool()
def server_error(n: int) -> str:
    raise MCPError(-32000, "s" * n)


@app.tool()
def meta(n: int) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text="small")], _meta={"pad": "m" * n})


if __name__ == "__main__":
    app.run()
