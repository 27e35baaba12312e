"""An MCP server of the official Python SDK (`mcp` 2.x, which speaks
2026-07-28 and the older revisions), for the protocol negotiation tests of
crates/quiver-mcp/tests/protocol_era.rs and tests/e2e/upstream_2026.rs.
Tools: `echo(text)`; `meta()`, the `_meta` of its own request as JSON;
`greet()`, which asks the client for a name (elicitation), and `think()`,
which asks the client's model to say hello (sampling): on 2026-07-28 by
answering `input_required`, on the older revisions by a request during the
call.

Usage: stateless_server.py stdio
       stateless_server.py http
`http` serves streamable HTTP at /mcp on a free loopback port, in stateless
mode (no session is kept between requests), and prints one line,
`{"listening": "http://127.0.0.1:PORT/mcp"}`, once the port is bound."""

import json
import socket
import sys

from typing import Annotated

import anyio
import uvicorn
from mcp import types
from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve, Sample
from pydantic import BaseModel

server = MCPServer("python-stateless")


@server.tool()
def echo(text: str) -> str:
    """Returns the text."""
    return text


@server.tool()
def meta(ctx: Context) -> str:
    """The `_meta` of this request, as JSON."""
    return json.dumps(dict(ctx.request_context.meta or {}), sort_keys=True)


class Name(BaseModel):
    name: str


def ask_name() -> Elicit[Name]:
    return Elicit("What is your name?", Name)


@server.tool()
def greet(person: Annotated[Name, Resolve(ask_name)]) -> str:
    """Greets the person the client names."""
    return f"Hello, {person.name}!"


def ask_model() -> Sample:
    prompt = types.TextContent(type="text", text="Say hello.")
    return Sample([types.SamplingMessage(role="user", content=prompt)], max_tokens=20)


@server.tool()
def think(reply: Annotated[types.CreateMessageResult, Resolve(ask_model)]) -> str:
    """Asks the client's model to say hello."""
    return f"model said: {reply.content.text}"


async def serve_http():
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    # Listening before the line is printed: a client may connect at once.
    listener.listen(128)
    port = listener.getsockname()[1]
    app = server.streamable_http_app(stateless_http=True, host="127.0.0.1")
    http = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    print(json.dumps({"listening": f"http://127.0.0.1:{port}/mcp"}), flush=True)
    await http.serve(sockets=[listener])


if __name__ == "__main__":
    match sys.argv[1:]:
        case ["stdio"]:
            server.run()
        case ["http"]:
            anyio.run(serve_http)
        case _:
            sys.exit(__doc__)
