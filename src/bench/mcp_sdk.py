"""`cellbox bench --mcp --mcp-python PYTHON`: the official MCP Python SDK
(1.x or 2.x, whichever PYTHON has) drives `cellbox serve` over stdio, as
an agent built on it calls the server.

    PYTHON -c <this> CELLBOX SERVE_PYTHON ITERATIONS SETTLE_SECONDS

Each of ITERATIONS rounds times, in turn and each after a pause of
SETTLE_SECONDS: list_sessions, a Python `pass` without a session, a Rhai
`1` without a session, a Rhai `1` in a session, and a Python `pass`
without a session through a second server that lists the full output
schema (`--output-schema full`; the first lists the default, compact
one), both clients of one SDK in one process. Prints one JSON line:
the SDK's version and each call's durations in seconds. A call that fails
or whose result is an error ends the run with a message and status 1.
"""

import asyncio
import json
import os
import sys
import time
from importlib.metadata import version

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def field(result, *names):
    """A result's attribute under its 1.x or its 2.x name."""
    for name in names:
        if hasattr(result, name):
            return getattr(result, name)
    return None


async def call(session, tool, args):
    result = await session.call_tool(tool, args)
    if field(result, "is_error", "isError"):
        sys.exit(f"{tool} {args} failed: {result}")
    return result


async def main(cellbox, serve_python, n, settle):
    args = ["serve", "--python", serve_python]
    server = StdioServerParameters(command=cellbox, args=args)
    full = StdioServerParameters(command=cellbox, args=[*args, "--output-schema", "full"])
    with open(os.devnull, "w") as quiet:
        async with (
            stdio_client(server, errlog=quiet) as (read, write),
            stdio_client(full, errlog=quiet) as (full_read, full_write),
            ClientSession(read, write) as session,
            ClientSession(full_read, full_write) as full_session,
        ):
            await session.initialize()
            await full_session.initialize()
            created = await call(session, "create_session", {})
            sid = field(created, "structured_content", "structuredContent")["session_id"]
            python = ("execute_code", {"language": "python", "code": "pass"})
            calls = {
                "list": (session, "list_sessions", {}),
                "python": (session, *python),
                "rhai": (session, "execute_code", {"language": "rhai", "code": "1"}),
                "rhai_session": (
                    session,
                    "execute_code",
                    {"language": "rhai", "code": "1", "session_id": sid},
                ),
                "python_full_schema": (full_session, *python),
            }
            # Warm-up: what is made once (the tools' schemas fetched,
            # a session's first worker) is not charged to the samples.
            for _ in range(5):
                for on, tool, args in calls.values():
                    await call(on, tool, args)
            samples = {key: [] for key in calls}
            for _ in range(n):
                for key, (on, tool, args) in calls.items():
                    await asyncio.sleep(settle)
                    t = time.perf_counter()
                    await call(on, tool, args)
                    samples[key].append(time.perf_counter() - t)
    print(json.dumps({"version": version("mcp"), **samples}), flush=True)


if __name__ == "__main__":
    exe, serve_python, n, settle = sys.argv[1:5]
    asyncio.run(main(exe, serve_python, int(n), float(settle)))
