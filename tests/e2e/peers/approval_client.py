"""A client of the official Python SDK (`mcp` 2.x) calling a tool that needs
an approval through a worker's `/mcp/{id}` (tests/e2e/approvals.rs).

Usage: approval_client.py <mcp url> <caller token> <registry http url> <admin token> <mode>
  elicit   the client declares elicitation; when asked, it approves the
           approval named in the message over the registry's REST API and
           accepts; the call then runs.
  retry    no elicitation: the call fails with the approval's id; the client
           approves it and repeats the call with _meta["quiver/approval_id"].
  modern   the SDK's high-level Client in its default mode (MCP 2026-07-28, no
           session): the gateway's `input_required` result asks; the client
           approves as in `elicit`, accepts, and the SDK retries the call with
           the answer and the gateway's requestState.
Prints a JSON report."""

import json
import re
import sys

import anyio
import httpx2
from mcp import Client, ClientSession, types
from mcp.client.streamable_http import streamable_http_client

url, token, registry, admin, mode = sys.argv[1:6]
report = {}


async def approve(approval_id):
    async with httpx2.AsyncClient(timeout=10) as http:
        response = await http.post(
            f"{registry}/admin/api/approvals/{approval_id}",
            json={"decision": "approve", "note": "python client"},
            headers={"authorization": f"Bearer {admin}"},
        )
    report.setdefault("approved", []).append(response.status_code)


async def on_elicit(context, params):
    report["asked"] = params.message
    found = re.search(r"apr_[0-9a-f]+", params.message)
    if found:
        await approve(found.group(0))
    return types.ElicitResult(action="accept", content={})


def dump(value):
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


async def modern(http):
    client = Client(streamable_http_client(url, http_client=http), elicitation_callback=on_elicit, cache=None)
    async with client:
        report["protocol_version"] = client.protocol_version
        with anyio.fail_after(30):
            report["first"] = dump(await client.call_tool("add", {"a": 2, "b": 3}))


async def main():
    headers = {"authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http:
        if mode == "modern":
            await modern(http)
            return
        async with streamable_http_client(url, http_client=http) as (read, write, *_):
            callback = on_elicit if mode == "elicit" else None
            async with ClientSession(read, write, elicitation_callback=callback) as session:
                await session.initialize()
                with anyio.fail_after(30):
                    first = await session.call_tool("add", {"a": 2, "b": 3})
                report["first"] = dump(first)
                if mode == "retry":
                    approval_id = (first.structured_content or {}).get("error", {}).get("approval_id")
                    report["approval_id"] = approval_id
                    await approve(approval_id)
                    with anyio.fail_after(30):
                        second = await session.call_tool(
                            "add", {"a": 2, "b": 3}, meta={"quiver/approval_id": approval_id}
                        )
                    report["second"] = dump(second)


anyio.run(main)
print(json.dumps(report))
