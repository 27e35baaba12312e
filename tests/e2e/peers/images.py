"""An MCP server returning images of a chosen size, written with the official
Python SDK (`mcp` 2.x). Stdio.

- `image(seed, size)`: a text item and an `image/png` item of `size` bytes
  (deterministic for `seed`, different for different seeds), so a test can
  fill the worker's artifact store with distinct artifacts.
"""

import base64
import hashlib

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ImageContent, TextContent

app = MCPServer("images")


@app.tool()
def image(seed: int, size: int) -> CallToolResult:
    block = hashlib.sha256(str(seed).encode()).digest()
    data = (block * (size // len(block) + 1))[:size]
    return CallToolResult(
        content=[
            TextContent(type="text", text=f"image {seed}"),
            ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type="image/png"),
        ]
    )


if __name__ == "__main__":
    app.run()
