"""The official Python SDK's (`mcp` 2.x) high-level `Client` against a
worker's MCP endpoint (tests/e2e/gateway_2026.rs, upstream_2026.rs), in its
default mode (`auto`: `server/discover`, MCP 2026-07-28, no session) or
`legacy` (`initialize`, a 2025-11-25 session).

Usage: modern_client.py '<json config>'
  url     the endpoint;  token  the caller's bearer token;  mode  "auto" | "legacy"
  names   {"add", "ask", "think", "greet"}: tool and prompt names as listed here
  resource  a resource URI to read
  calls   (instead of names and resource) {"step": [tool, arguments]}: the
          tool calls to make, each reported under its step
  elicit  the ElicitResult to answer elicitation with; by default it
          accepts with the colour "teal"
  consent true: a URL elicitation (a consent link) is followed as a browser
          would (cookies, redirects; the authorization server approves at
          once), then accepted; the links are reported in `links`
  no_elicitation  true: the client declares no elicitation at all
The client answers sampling with "hi from the client"; both answers reach
the server through the gateway, and the report lists what the client was
asked (`asked`: elicitation messages, `prompts`: the text of each sampling
request's last message). Every step is bounded; a failed step is reported,
not raised. Prints a JSON report."""

import json
import sys

import anyio
import httpx2
from mcp import Client, types
from mcp.client.streamable_http import streamable_http_client

config = json.loads(sys.argv[1])
teal = {"action": "accept", "content": {"colour": "teal"}}
elicited = types.ElicitResult.model_validate(config.get("elicit", teal))
report = {"asked": [], "sampled": 0, "prompts": [], "links": []}


def dump(value):
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


async def follow(url):
    """A browser's way through a consent link: registry, authorization
    server, back to the registry's callback with the flow's cookie."""
    async with httpx2.AsyncClient(follow_redirects=True, timeout=30) as browser:
        landed = await browser.get(url)
        report["landed"] = landed.status_code


async def on_elicit(context, params):
    report["asked"].append(params.message)
    if getattr(params, "mode", None) == "url" and config.get("consent"):
        report["links"].append(params.url)
        await follow(params.url)
        return types.ElicitResult(action="accept")
    return elicited


async def on_sample(context, params):
    report["sampled"] += 1
    report["prompts"].append(params.messages[-1].content.text)
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
            elicitation_callback=None if config.get("no_elicitation") else on_elicit,
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

            if "calls" in config:
                for name, (tool, arguments) in config["calls"].items():
                    await step(name, call(tool, arguments))
                return
            names = config["names"]
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
