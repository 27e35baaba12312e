"""An MCP server returning images of a chosen size, written with the official
Python SDK (`mcp` 2.x). Stdio.

- `image(seed, size, mime="image/png", text=None)`: a text item and an
  image item of `size` bytes (deterministic for `seed`, different for
  different seeds), so a test can fill the worker's artifact store with
  distinct artifacts; declared as `mime`, with `text` (UTF-8) as its bytes
  when given, so a test can store active content (HTML, SVG with script).
"""

import base64
import hashlib

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ImageContent, TextContent

app = MCPServer("images")


@app.tool()
def image(seed: int, size: int, mime: str = "image/png", text: str | None = None) -> CallToolResult:
    block = hashlib.sha256(str(seed).encode()).digest()
    data = (block * (size // len(block) + 1))[:size]
    if text is not None:
        data = text.encode()
    return CallToolResult(
        content=[
            TextContent(type="text", text=f"image {seed}"),
            ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=mime),
        ]
    )


if __name__ == "__main__":
    app.run()
