"""Collects the tool catalog of crates/quiver-worker/benches/data/tools.json
from the official MCP reference servers, run for real: each server is
started over stdio with placeholder credentials (listing tools needs none)
and asked `tools/list` with the official Python SDK (`mcp` 2.x).

Usage: python collect_tools.py NODE NPM_PREFIX PYTHON_WITH_SERVERS > tools.json
where NPM_PREFIX holds the npm packages below (npm install --prefix) and
PYTHON_WITH_SERVERS has the PyPI packages below installed.
"""

import asyncio
import json
import os
import sys
import tempfile

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

NODE, PREFIX, PYTHON = sys.argv[1:4]
TMP = tempfile.mkdtemp()
ENV = {
    "GITHUB_PERSONAL_ACCESS_TOKEN": "placeholder",
    "GITLAB_PERSONAL_ACCESS_TOKEN": "placeholder",
    "SLACK_BOT_TOKEN": "placeholder",
    "SLACK_TEAM_ID": "placeholder",
    "BRAVE_API_KEY": "placeholder",
    "GOOGLE_MAPS_API_KEY": "placeholder",
    "EVERART_API_KEY": "placeholder",
    "AWS_ACCESS_KEY_ID": "placeholder",
    "AWS_SECRET_ACCESS_KEY": "placeholder",
    "AWS_REGION": "us-east-1",
}


def npm(package, *args):
    entry = os.path.join(PREFIX, "node_modules", "@modelcontextprotocol", package, "dist", "index.js")
    return (NODE, [entry, *args])


SERVERS = {
    "everything": npm("server-everything", "stdio"),
    "filesystem": npm("server-filesystem", TMP),
    "memory": npm("server-memory"),
    "github": npm("server-github"),
    "gitlab": npm("server-gitlab"),
    "slack": npm("server-slack"),
    "puppeteer": npm("server-puppeteer"),
    "brave-search": npm("server-brave-search"),
    "google-maps": npm("server-google-maps"),
    "postgres": npm("server-postgres", "postgresql://localhost/placeholder"),
    "redis": npm("server-redis", "redis://localhost:6379"),
    "everart": npm("server-everart"),
    "aws-kb-retrieval": npm("server-aws-kb-retrieval"),
    "sequential-thinking": npm("server-sequential-thinking"),
    "git": (PYTHON, ["-m", "mcp_server_git"]),
    "time": (PYTHON, ["-m", "mcp_server_time"]),
    "fetch": (PYTHON, ["-m", "mcp_server_fetch"]),
}


async def tools_of(command, args):
    params = StdioServerParameters(command=command, args=args, env={**os.environ, **ENV}, cwd=TMP)
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await asyncio.wait_for(session.initialize(), 30)
            listed = await asyncio.wait_for(session.list_tools(), 30)
            return listed.tools


async def main():
    catalog = []
    for server, (command, args) in SERVERS.items():
        try:
            tools = await tools_of(command, args)
        except BaseException as err:  # noqa: BLE001 - report and go on
            print(f"{server}: {err!r}", file=sys.stderr)
            continue
        print(f"{server}: {len(tools)} tools", file=sys.stderr)
        for tool in tools:
            properties = (tool.input_schema or {}).get("properties", {}) or {}
            catalog.append(
                {
                    "server": server,
                    "name": tool.name,
                    "title": tool.title,
                    "description": tool.description or "",
                    "arguments": sorted(properties.keys()),
                }
            )
    json.dump(catalog, sys.stdout, indent=1, ensure_ascii=False)
    print()


asyncio.run(main())
