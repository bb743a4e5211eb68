"""Drive `cellbox serve` with the official MCP Python SDK (1.x or 2.x).

    python_client.py stdio CELLBOX [SERVE_ARGS...]
    python_client.py http URL

Runs the client matrix's checks (tests/suite/clients.rs) and prints one
`ok: ...` line per check; any failure raises and exits non-zero. With
CELLBOX_BIG_CAP=1 the server keeps more output than fits one response
(--max-output above the response budget), and the 2 MB check expects the
server to have cut it to fit.
"""

import os
import sys
import time
from datetime import timedelta
from importlib.metadata import version

import anyio

import mcp
from mcp import StdioServerParameters

MAJOR = int(version("mcp").split(".")[0])
LABEL = f"python-sdk-{version('mcp')}"
FREED_WITHIN = 20.0  # seconds; the cancelled cell would sleep for 120


def ok(what):
    print(f"ok: {LABEL} {sys.argv[1]}: {what}", flush=True)


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError(f"{LABEL} {sys.argv[1]}: {what} {detail}")


class Logs:
    def __init__(self):
        self.messages = []

    async def __call__(self, params):
        self.messages.append(params)

    def output(self):
        return [m for m in self.messages if getattr(m, "logger", None) in ("stdout", "stderr")]


if MAJOR >= 2:
    from mcp import Client

    class Conn:
        """The 2.x high-level client, as its README shows it."""

        def __init__(self, target, logs):
            self.client = Client(target, logging_callback=logs)

        async def __aenter__(self):
            await self.client.__aenter__()
            return self

        async def __aexit__(self, *exc):
            return await self.client.__aexit__(*exc)

        async def list_tools(self):
            return await self.client.list_tools()

        async def set_logging_level(self, level):
            return await self.client.set_logging_level(level)

        async def call(self, name, args, timeout=None, progress=None, log_level=None):
            meta = {"io.modelcontextprotocol/logLevel": log_level} if log_level else None
            return await self.client.call_tool(
                name, args, read_timeout_seconds=timeout, progress_callback=progress, meta=meta
            )

        def protocol(self):
            return self.client.protocol_version

        async def call_then_cancel(self, name, args, after):
            # Cancelling the caller's scope: the SDK sends notifications/cancelled.
            with anyio.move_on_after(after):
                await self.call(name, args)
                raise AssertionError("the call ended before it was cancelled")

        client_timeout_cancels = True

else:
    from contextlib import AsyncExitStack

    from mcp import ClientSession, types
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamablehttp_client

    class Conn:
        """The 1.x ClientSession over stdio_client / streamablehttp_client."""

        def __init__(self, target, logs):
            self.target = target
            self.logs = logs
            self.stack = AsyncExitStack()

        async def __aenter__(self):
            if isinstance(self.target, str):
                read, write, _ = await self.stack.enter_async_context(
                    streamablehttp_client(self.target)
                )
            else:
                read, write = await self.stack.enter_async_context(stdio_client(self.target))
            self.session = await self.stack.enter_async_context(
                ClientSession(read, write, logging_callback=self.logs)
            )
            await self.session.initialize()
            return self

        async def __aexit__(self, *exc):
            return await self.stack.__aexit__(*exc)

        async def list_tools(self):
            return await self.session.list_tools()

        async def set_logging_level(self, level):
            return await self.session.set_logging_level(level)

        def protocol(self):
            return "(initialize)"

        async def call(self, name, args, timeout=None, progress=None):
            t = timedelta(seconds=timeout) if timeout else None
            return await self.session.call_tool(
                name, args, read_timeout_seconds=t, progress_callback=progress
            )

        async def call_then_cancel(self, name, args, after):
            # 1.x has no cancel API: an application sends the notification
            # itself, naming the id the call went out with.
            request_id = self.session._request_id
            async with anyio.create_task_group() as tg:

                async def run():
                    try:
                        await self.call(name, args, timeout=FREED_WITHIN + 120)
                    except Exception as e:  # the server answers the cancelled call with an error
                        print(f"   (cancelled call ended with: {e})", flush=True)

                tg.start_soon(run)
                await anyio.sleep(after)
                await self.session.send_notification(
                    types.ClientNotification(
                        types.CancelledNotification(
                            params=types.CancelledNotificationParams(
                                requestId=request_id, reason="test"
                            )
                        )
                    )
                )
                tg.cancel_scope.cancel()

        # 1.x stops waiting on a read timeout but tells the server nothing.
        client_timeout_cancels = False


def structured(r):
    # 1.x names fields as on the wire, 2.x in snake case.
    return getattr(r, "structured_content", None) or getattr(r, "structuredContent", None) or {}


def is_error(r):
    return bool(getattr(r, "is_error", None) or getattr(r, "isError", None))


def text(r):
    return "".join(getattr(c, "text", "") for c in r.content)


async def main():
    mode = sys.argv[1]
    if mode == "stdio":
        target = StdioServerParameters(command=sys.argv[2], args=["serve", *sys.argv[3:]])
    else:
        target = sys.argv[2]
    big_cap = os.environ.get("CELLBOX_BIG_CAP") == "1"
    logs = Logs()
    async with Conn(target, logs) as c:
        tools = await c.list_tools()
        names = {t.name for t in tools.tools}
        check(
            {"execute_code", "create_session", "close_session", "reset_session", "list_sessions"}
            <= names,
            "tools listed",
            str(names),
        )
        desc = next(t.description for t in tools.tools if t.name == "execute_code")
        check("standard library only" in desc, "the description says what Python imports", desc)
        ok("tools/list")

        # logging/setLevel: above info, live output is not sent.
        await c.set_logging_level("warning")
        progress = []

        async def on_progress(p, total, message):
            progress.append(p)

        r = await c.call(
            "execute_code",
            {"language": "python", "code": "print('live')\n7"},
            progress=on_progress,
        )
        check(structured(r).get("value") == 7, "cell with progress", str(r))
        check(logs.output() == [], "no output logged at level warning", str(logs.messages))
        if MAJOR >= 2:
            # The 2.x client asks per request (`_meta` logLevel, protocol
            # 2026-07-28); the server honours that on any protocol.
            await c.call(
                "execute_code",
                {"language": "python", "code": "print('live')\n7"},
                progress=on_progress,
                log_level="info",
            )
        else:
            await c.set_logging_level("info")
            await c.call(
                "execute_code",
                {"language": "python", "code": "print('live')\n7"},
                progress=on_progress,
            )
        check(
            any("live" in str(m.data) for m in logs.output()),
            "output logged at level info",
            str(logs.messages),
        )
        ok(f"logging/setLevel filters the log notifications (protocol {c.protocol()})")

        # A session keeps variables; plumbing only on request.
        r = await c.call("create_session", {})
        sid = structured(r)["session_id"]
        await c.call("execute_code", {"language": "python", "code": "x = 40", "session_id": sid})
        r = await c.call("execute_code", {"language": "python", "code": "x + 2", "session_id": sid})
        s = structured(r)
        check(not is_error(r) and s.get("value") == 42, "session value", str(r))
        check("=> 42" in text(r), "the value in the text", text(r))
        check("sandbox" not in s and "run" not in s, "no sandbox report unless asked", str(s))
        r = await c.call(
            "execute_code",
            {"language": "python", "code": "x", "session_id": sid, "verbose": True},
        )
        check("sandbox" in structured(r) and "run" in structured(r), "verbose result", str(r))
        ok("cells in a session")

        r = await c.call("execute_code", {"language": "python", "code": "1/0"})
        s = structured(r)
        check(is_error(r), "an exception is an error")
        check((s.get("error") or {}).get("type") == "ZeroDivisionError", "error type", str(s))
        check("ZeroDivisionError" in text(r), "error in the text", text(r))
        ok("an error")

        r = await c.call(
            "execute_code",
            {"language": "python", "code": "import time\ntime.sleep(30)", "timeout_seconds": 1},
        )
        check(is_error(r) and structured(r).get("status") == "timeout", "timeout status", str(r))
        ok("a timeout")

        # Cancel a long cell; the session's next call runs at once.
        sleeper = {"language": "python", "code": "import time\ntime.sleep(120)", "session_id": sid}
        await c.call_then_cancel("execute_code", sleeper, after=1.5)
        t0 = time.monotonic()
        r = await c.call(
            "execute_code",
            {"language": "python", "code": "x", "session_id": sid},
            timeout=FREED_WITHIN,
        )
        check(structured(r).get("value") == 40, "the session after a cancel", str(r))
        ok(f"a cancel frees the session ({time.monotonic() - t0:.1f} s)")

        if c.client_timeout_cancels:
            try:
                await c.call("execute_code", sleeper, timeout=1.5)
                raise AssertionError("the client timeout did not fire")
            except AssertionError:
                raise
            except Exception as e:
                print(f"   (client timeout: {type(e).__name__})", flush=True)
            r = await c.call(
                "execute_code",
                {"language": "python", "code": "x", "session_id": sid},
                timeout=FREED_WITHIN,
            )
            check(structured(r).get("value") == 40, "the session after a client timeout", str(r))
            ok("a client timeout cancels the cell")
        else:
            print(f"note: {LABEL}: a read timeout sends no cancellation (the SDK's own behaviour)")

        # 2 MB of output: a result the client accepts, a bounded text.
        r = await c.call(
            "execute_code",
            {"language": "python", "code": "print('x' * 2_000_000)\n'done'"},
        )
        s = structured(r)
        check(not is_error(r) and s.get("value") == "done", "2 MB output call", str(s)[:500])
        t = s["truncated"]["stdout"]
        check(t and t["total_bytes"] >= 2_000_000, "2 MB counted", str(t))
        kept = t["kept_head"] + t["kept_tail"]
        if big_cap:
            check(kept < 1_000_000, "cut to the response budget", str(t))
        else:
            check(kept <= 32 * 1024, "the default cap", str(t))
        check(len(text(r)) < 16 * 1024, "a bounded text", str(len(text(r))))
        ok(f"2 MB output (kept {kept} bytes, text {len(text(r))} chars)")

        # A cell that asks a model (the test's fake endpoint) and one that
        # calls a declared tool: their results carry `models` and the calls'
        # details, which the output schema must allow (2.x validates).
        r = await c.call("execute_code", {"language": "python", "code": "model_query('hello')"})
        s = structured(r)
        check(not is_error(r) and s.get("value") == "echo:hello", "a cell that asks a model", str(r))
        check(s["models"]["cell"]["model_calls"] == 1, "its model usage", str(s))
        r = await c.call(
            "execute_code", {"language": "python", "code": "tools.shout(text='hi')['stdout']"}
        )
        s = structured(r)
        check(not is_error(r) and s.get("value") == "hi\n", "a cell that calls a tool", str(r))
        check(s["models"]["cell"]["tool_calls"] == 1, "its tool usage", str(s))
        ok("cells that ask a model and call a declared tool")

        # 200,001 display items, each empty (so no byte cap holds them),
        # in a done frame the cell writes itself: the whole result still
        # fits what the client reads, and the items' count is capped.
        code = (
            "import json, os, struct\n"
            "items = [{'mime': 'text/markdown', 'data': ''}] * 200001\n"
            "frame = json.dumps({'t': 'done', 'status': 'ok', 'value': 'shown', "
            "'display': items}, separators=(',', ':')).encode()\n"
            "data = struct.pack('>I', len(frame)) + frame\n"
            "while data:\n    data = data[os.write(3, data):]\n"
            "os._exit(0)\n"
        )
        r = await c.call("execute_code", {"language": "python", "code": code})
        s = structured(r)
        check(not is_error(r) and s.get("value") == "shown", "200,001 display items", str(s)[:500])
        blocks = len(r.content)
        check(2 <= blocks <= 65, "display items capped", str(blocks))
        reasons = " ".join(d["reason"] for d in s.get("display_dropped", []))
        check("more items were left out" in reasons, "the items left out are counted", reasons[:500])
        ok(f"200,001 display items ({blocks} content blocks)")

        await c.call("close_session", {"session_id": sid})
    print(f"PASS {LABEL} {mode}", flush=True)


if __name__ == "__main__":
    anyio.run(main)
