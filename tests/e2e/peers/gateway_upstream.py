"""An MCP server of the official Python SDK (`mcp` 2.x, stdio) behind the
gateway in tests/e2e/gateway.rs and gateway_2026.rs: tools (one with
structured output and a title, one slow that reports progress and notes its
cancellation, two that ask the client during the call: elicitation and
sampling), resources and prompts, some of which the record's allow lists
hide.

Usage: gateway_upstream.py <state dir>
A cancelled `slow` call creates `<state dir>/cancelled-<pid>`."""

import os
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

state_dir = sys.argv[1]
server = MCPServer("python-upstream", instructions="a test server behind the gateway")


class Sum(BaseModel):
    total: int


@server.tool(title="Add two numbers", annotations={"readOnlyHint": True})
def add(a: int, b: int) -> Sum:
    """Adds a and b."""
    return Sum(total=a + b)


@server.tool()
async def slow(seconds: float, ctx: Context) -> str:
    """Sleeps, reporting progress; notes a cancellation."""
    try:
        steps = 10
        for step in range(steps):
            await ctx.report_progress(step, steps, f"step {step}")
            await anyio.sleep(seconds / steps)
        return "done"
    except anyio.get_cancelled_exc_class():
        with open(os.path.join(state_dir, f"cancelled-{os.getpid()}"), "w") as f:
            f.write("cancelled\n")
        raise


@server.tool()
def fail() -> str:
    """Always fails (isError)."""
    raise ValueError("this tool always fails")


def grown() -> str:
    """A tool added at run time by `grow`."""
    return "grown"


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds the tool `grown` and announces the change (tools/list_changed)."""
    server.add_tool(grown, name="grown")
    await ctx.session.send_tool_list_changed()
    return "grew"


class Colour(BaseModel):
    colour: str


@server.tool()
async def ask(ctx: Context) -> str:
    """Asks the person at the client for a colour (elicitation) during the call."""
    answer = await ctx.elicit("Which colour?", Colour)
    if answer.action != "accept":
        return f"no colour ({answer.action})"
    return f"colour: {answer.data.colour}"


@server.tool()
async def think(ctx: Context) -> str:
    """Asks the client's model (sampling) during the call."""
    from mcp import types

    result = await ctx.session.create_message(
        messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text="Say hi"))],
        max_tokens=20,
        related_request_id=ctx.request_id,
    )
    return f"model said: {result.content.text}"


@server.resource("notes://public", name="public", mime_type="text/plain")
def public_note() -> str:
    return "a public note"


@server.resource("notes://secret", name="secret", mime_type="text/plain")
def secret_note() -> str:
    return "a secret note"


@server.prompt(title="Greeting")
def greet(name: str) -> str:
    """Greets someone."""
    return f"Hello, {name}!"


@server.prompt()
def hidden() -> str:
    return "not for callers"


if __name__ == "__main__":
    server.run("stdio")
