"""A client of the official Python SDK (`mcp` 2.x) against a worker's MCP
endpoint, over streamable HTTP or over stdio through `quiver mcp-stdio`.
Driven by tests/e2e/gateway.rs, which checks the JSON report this prints.

Usage: gateway_client.py '<json config>'
  transport  "http" (url, token) or "stdio" (command, args, env)
  names      {"add": tool name, "slow": ..., "greet": prompt name} as listed here
  state_dir  where the upstream notes cancelled calls
  skip       steps not to run ("cancel", "upstream_changed")
  edit       {"url": registry REST URL of the record, "token": admin token,
              "record": the edited record}: applied after the first listing;
              the report says whether tools/list_changed arrived.
Every step is bounded; a failed step is reported, not raised."""

import json
import os
import sys
import time

import anyio
import httpx2
from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

config = json.loads(sys.argv[1])
report = {}
list_changed = anyio.Event()
progress = []


async def on_message(message):
    if isinstance(message, types.ServerNotification) or hasattr(message, "root"):
        root = getattr(message, "root", message)
        if isinstance(root, types.ToolListChangedNotification):
            list_changed.set()


def dump(value):
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


async def step(name, coro, seconds=20):
    try:
        with anyio.fail_after(seconds):
            report[name] = await coro
    except Exception as err:  # reported, the test says which step failed
        report[name] = {"error": f"{type(err).__name__}: {err}"}


async def session_steps(session):
    names = config["names"]
    init = await session.initialize()
    report["initialize"] = {
        "server": init.server_info.name,
        "protocol_version": init.protocol_version,
        "capabilities": dump(init.capabilities),
        "instructions": init.instructions,
    }

    async def tools():
        listed = await session.list_tools()
        return [dump(t) for t in listed.tools]

    await step("tools", tools())

    async def add():
        result = await session.call_tool(names["add"], {"a": 2, "b": 3})
        return dump(result)

    await step("add", add())

    async def fail():
        return dump(await session.call_tool(names["fail"], {}))

    await step("fail", fail())

    async def unknown():
        return dump(await session.call_tool("no-such-tool", {}))

    await step("unknown_tool", unknown())

    async def resources():
        listed = await session.list_resources()
        return [r.uri for r in listed.resources]

    await step("resources", resources())

    async def read(uri):
        result = await session.read_resource(uri)
        return [dump(c) for c in result.contents]

    await step("read_public", read("notes://public"))
    await step("read_secret", read("notes://secret"))

    async def prompts():
        listed = await session.list_prompts()
        return [dump(p) for p in listed.prompts]

    await step("prompts", prompts())

    async def greet():
        got = await session.get_prompt(names["greet"], {"name": "Ada"})
        return [dump(m) for m in got.messages]

    await step("greet", greet())

    async def on_progress(done, total, message):
        progress.append(done)

    async def slow_with_progress():
        result = await session.call_tool(names["slow"], {"seconds": 1.0}, progress_callback=on_progress)
        return {"result": dump(result), "progress": len(progress)}

    await step("progress", slow_with_progress())

    async def cancel():
        state_dir = config["state_dir"]
        before = set(os.listdir(state_dir))
        started = time.monotonic()
        with anyio.move_on_after(1.5):
            await session.call_tool(names["slow"], {"seconds": 60})
        cancelled_at = time.monotonic()
        seen = None
        while time.monotonic() - cancelled_at < 10:
            if set(os.listdir(state_dir)) - before:
                seen = time.monotonic() - cancelled_at
                break
            await anyio.sleep(0.05)
        # The record allows one call at a time: this one runs only once the
        # cancelled call's slot is free.
        after = await session.call_tool(names["add"], {"a": 1, "b": 1})
        return {
            "upstream_saw_cancel_after_s": seen,
            "next_call_after_s": time.monotonic() - cancelled_at,
            "next_call": dump(after),
            "waited_s": cancelled_at - started,
        }

    if "cancel" not in config.get("skip", []):
        await step("cancel", cancel(), seconds=30)

    async def upstream_changed():
        await session.call_tool(names["grow"], {})
        started = time.monotonic()
        with anyio.move_on_after(10):
            await list_changed.wait()
        arrived = list_changed.is_set()
        listed = await session.list_tools()
        return {
            "notified": arrived,
            "after_s": time.monotonic() - started,
            "tools": [t.name for t in listed.tools],
        }

    if "upstream_changed" not in config.get("skip", []):
        await step("upstream_changed", upstream_changed(), seconds=30)
    global list_changed
    list_changed = anyio.Event()

    edit = config.get("edit")
    if edit:
        async def changed():
            async with httpx2.AsyncClient(timeout=10) as http:
                response = await http.post(
                    edit["url"],
                    json=edit["record"],
                    headers={"authorization": f"Bearer {edit['token']}"},
                )
            applied_at = time.monotonic()
            with anyio.move_on_after(10):
                await list_changed.wait()
            arrived = list_changed.is_set()
            listed = await session.list_tools()
            return {
                "status": response.status_code,
                "notified": arrived,
                "after_s": time.monotonic() - applied_at,
                "tools": [t.name for t in listed.tools],
            }

        await step("list_changed", changed(), seconds=30)


async def main():
    if config["transport"] == "http":
        headers = {}
        if config.get("token"):
            headers["authorization"] = f"Bearer {config['token']}"
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http:
            async with streamable_http_client(config["url"], http_client=http) as (read, write, *_):
                async with ClientSession(read, write, message_handler=on_message) as session:
                    await session_steps(session)
    else:
        params = StdioServerParameters(
            command=config["command"], args=config["args"], env=config.get("env")
        )
        async with stdio_client(params) as (read, write, *_):
            async with ClientSession(read, write, message_handler=on_message) as session:
                await session_steps(session)


anyio.run(main)
print(json.dumps(report))
