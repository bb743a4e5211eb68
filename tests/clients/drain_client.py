"""Drive a `cellbox serve --http` through its drain with the official MCP
Python SDK 1.x (tests/suite/service.rs).

    drain_client.py finish URL SERVER_PID
    drain_client.py expire URL SERVER_PID

Starts a cell, and once the server reports it running sends the server
SIGTERM. `finish`: the cell (5 s) is within the drain timeout and must end
`ok` for this client, while /readyz turns 503, a new call gets the
draining error and a new connection HTTP 503 with Retry-After. `expire`:
the cell (60 s) outlives the drain timeout and must come back `killed` with
error type `Draining`. Prints PASS at the end; any failure raises.
"""

import json
import os
import signal
import sys
import time
from contextlib import AsyncExitStack

import anyio
import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError

MODE, URL, PID = sys.argv[1], sys.argv[2], int(sys.argv[3])
BASE = URL.rstrip("/")
PATIENCE = 30.0  # seconds the server gets to do what it is asked


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError(f"drain {MODE}: {what} {detail}")


def ok(what):
    print(f"ok: drain {MODE}: {what}", flush=True)


async def get(client, path):
    return await client.get(BASE + path)


async def wait_status(client, path, status):
    deadline = time.monotonic() + PATIENCE
    while True:
        r = await get(client, path)
        if r.status_code == status:
            return r
        check(time.monotonic() < deadline, f"{path} never answered {status}", r.text)
        await anyio.sleep(0.05)


async def main():
    async with httpx.AsyncClient(timeout=PATIENCE) as web, AsyncExitStack() as stack:
        read, write, _ = await stack.enter_async_context(streamablehttp_client(URL))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        await session.list_tools()
        r = await wait_status(web, "/readyz", 200)
        check(r.json() == {"status": "ready"}, "readyz body", r.text)
        ok("ready before the drain")

        running = anyio.Event()

        async def progress(done, total, message):
            if message and "running" in message:
                running.set()

        secs = 5 if MODE == "finish" else 60
        code = f"import time\ntime.sleep({secs})\nprint('finished')"
        result = {}

        async def long_call():
            result["r"] = await session.call_tool(
                "execute_code",
                {"language": "python", "code": code},
                progress_callback=progress,
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_call)
            with anyio.fail_after(PATIENCE):
                await running.wait()
            os.kill(PID, signal.SIGTERM)
            ok("SIGTERM sent while the cell ran")

            r = await wait_status(web, "/readyz", 503)
            check(r.json() == {"status": "not_ready", "reason": "draining"}, "readyz", r.text)
            check(r.headers.get("retry-after") == "5", "readyz Retry-After", r.headers)
            r = await get(web, "/healthz")
            check(r.status_code == 200, "healthz while draining", r.status_code)
            ok("/readyz 503 draining, /healthz 200")

            try:
                await session.call_tool("execute_code", {"language": "python", "code": "print(1)"})
                raise AssertionError("a call made while draining was run")
            except McpError as e:
                check(e.error.message == "server is draining", "draining error", e.error)
            ok("a new call gets 'server is draining'")

            init = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "late", "version": "0"},
                },
            }
            r = await web.post(
                URL,
                content=json.dumps(init),
                headers={
                    "content-type": "application/json",
                    "accept": "application/json, text/event-stream",
                },
            )
            check(r.status_code == 503, "a new connection while draining", r.status_code)
            check(r.headers.get("retry-after") == "5", "initialize Retry-After", r.headers)
            check(r.json()["error"]["message"] == "server is draining", "initialize", r.text)
            ok("a new connection gets HTTP 503 with Retry-After")

        r = result["r"].structuredContent
        if MODE == "finish":
            check(r["status"] == "ok", "the running cell's status", r)
            check("finished" in r["stdout"], "the running cell's output", r)
            ok("the cell started before SIGTERM ended ok")
        else:
            check(r["status"] == "killed", "the cell past the timeout", r)
            check(r["error"]["type"] == "Draining", "its error type", r)
            ok("the cell past the drain timeout was killed: Draining")
    print("PASS", flush=True)


anyio.run(main)
