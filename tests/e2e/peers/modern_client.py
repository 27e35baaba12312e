"""The official Python SDK's (`mcp` 2.x) high-level `Client` against a
worker's MCP endpoint (tests/e2e/gateway_2026.rs), in its default mode
(`auto`: `server/discover`, MCP 2026-07-28, no session) or `legacy`
(`initialize`, a 2025-11-25 session).

Usage: modern_client.py '<json config>'
  url     the endpoint;  token  the caller's bearer token;  mode  "auto" | "legacy"
  names   {"add", "ask", "think", "greet"}: tool and prompt names as listed here
  resource  a resource URI to read
The client answers elicitation with the colour "teal" and sampling with
"hi from the client"; both reach the server through the gateway. Every step
is bounded; a failed step is reported, not raised. Prints a JSON report."""

import json
import sys

import anyio
import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

config = json.loads(sys.argv[1])
names = config["names"]
report = {"asked": [], "sampled": 0}


def dump(value):
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


async def on_elicit(context, params):
    report["asked"].append(params.message)
    return types.ElicitResult(action="accept", content={"colour": "teal"})


async def on_sample(context, params):
    report["sampled"] += 1
    return types.CreateMessageResult(
        role="assistant",
        content=types.TextContent(type="text", text="hi from the client"),
        model="test-model",
        stop_reason="endTurn",
    )


async def step(name, coro, seconds=30):
    try:
        with anyio.fail_after(seconds):
            report[name] = await coro
    except Exception as err:  # reported, the test says which step failed
        report[name] = {"error": f"{type(err).__name__}: {err}"}


async def main():
    headers = {"authorization": f"Bearer {config['token']}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http:
        transport = streamable_http_client(config["url"], http_client=http)
        client = Client(
            transport,
            mode=config["mode"],
            elicitation_callback=on_elicit,
            sampling_callback=on_sample,
            cache=None,
        )
        async with client:
            report["protocol_version"] = client.protocol_version
            report["server"] = client.server_info.name if client.server_info else None

            async def tools():
                return sorted(t.name for t in (await client.list_tools()).tools)

            await step("tools", tools())

            async def call(name, arguments):
                return dump(await client.call_tool(name, arguments))

            await step("add", call(names["add"], {"a": 2, "b": 3}))
            await step("ask", call(names["ask"], {}))
            await step("think", call(names["think"], {}))

            async def read():
                return [dump(c) for c in (await client.read_resource(config["resource"])).contents]

            await step("read", read())

            async def greet():
                return [dump(m) for m in (await client.get_prompt(names["greet"], {"name": "Ada"})).messages]

            await step("greet", greet())


anyio.run(main)
print(json.dumps(report))
