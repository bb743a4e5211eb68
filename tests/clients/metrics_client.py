"""Make calls through a `cellbox serve --http --metrics` with the official
MCP Python SDK 1.x and read `/metrics` with the official Prometheus text
parser (`prometheus_client`) before and after (tests/suite/service.rs).

    metrics_client.py MCP_URL METRICS_URL

The server runs Rhai with `--allow emit`. Every counter the calls touch
must move by exactly what they did. Prints PASS at the end; any failure
raises.
"""

import sys

import anyio
import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError
from prometheus_client.parser import text_string_to_metric_families

URL, METRICS = sys.argv[1], sys.argv[2]


def check(cond, what, detail=""):
    if not cond:
        raise AssertionError(f"metrics: {what} {detail}")


def ok(what):
    print(f"ok: metrics: {what}", flush=True)


async def scrape(web):
    r = await web.get(METRICS)
    check(r.status_code == 200, "GET /metrics", r.status_code)
    check(
        r.headers["content-type"].startswith("text/plain; version=0.0.4"),
        "content type",
        r.headers["content-type"],
    )
    types, samples = {}, {}
    for family in text_string_to_metric_families(r.text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return r.text, types, samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0)


def total(samples, name, **labels):
    """The sum over every series of `name` whose labels include `labels`."""
    return sum(
        v
        for (n, ls), v in samples.items()
        if n == name and all(dict(ls).get(k) == want for k, want in labels.items())
    )


async def main():
    async with httpx.AsyncClient(timeout=60) as web, streamablehttp_client(URL) as (
        read,
        write,
        _,
    ), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        _, types, before = await scrape(web)
        check(types.get("cellbox_cells") == "counter", "cellbox_cells type", types)
        check(
            types.get("cellbox_cell_duration_seconds") == "histogram",
            "cell duration type",
            types,
        )
        ok("parsed before the calls")

        results = []

        async def run(code, **extra):
            r = await session.call_tool(
                "execute_code", {"language": "rhai", "code": code, **extra}
            )
            sc = r.structuredContent
            check(sc is not None, "a structured result", r)
            results.append(sc)
            return sc

        for code in ['print("hello"); 1 + 1', "2 + 2", "emit(#{a: 1}); 7"]:
            sc = await run(code)
            check(sc["status"] == "ok", f"{code!r} ends ok", sc)
        denied = await run("answer(1)")
        check(denied["status"] == "policy_denied", "answer(1) is denied", denied)
        stopped = await run("let x = 0; loop { x += 1; }", timeout_seconds=1)
        check(
            stopped["status"] in ("timeout", "limit_exceeded"),
            "the endless loop is stopped",
            stopped,
        )
        failed = await run('throw "boom"')
        check(failed["status"] == "error", "a thrown error", failed)

        created = await session.call_tool("create_session", {})
        sid = created.structuredContent["session_id"]
        sc = await run("40 + 2", session_id=sid)
        check(sc["status"] == "ok", "a session's cell", sc)
        text, _, during = await scrape(web)
        check(
            value(during, "cellbox_sessions_open", principal="local") == 1,
            "one session open for the principal",
        )
        check(sid not in text, "no session id in the metrics")
        await session.call_tool("close_session", {"session_id": sid})
        try:
            await session.call_tool("no_such_tool", {})
            check(False, "an unknown tool is refused")
        except McpError:
            pass

        text, _, after = await scrape(web)
        check(sid not in text, "no session id in the metrics")

        def moved(name, want, summed=False, **labels):
            f = total if summed else value
            got = f(after, name, **labels) - f(before, name, **labels)
            check(got == want, f"{name}{labels} moved by {got}, not {want}")

        cells = "cellbox_cells_total"
        moved(cells, 4, summed=True, language="rhai", status="ok")
        moved(cells, 1, summed=True, language="rhai", status="policy_denied")
        moved(cells, 1, summed=True, language="rhai", status=stopped["status"])
        moved(cells, 1, summed=True, language="rhai", status="error")
        moved(cells, 7, summed=True)
        paths = {dict(ls)["path"] for (n, ls) in after if n == cells}
        check(paths <= {"fresh", "warm", "live", "none"}, "path values", paths)
        moved("cellbox_cell_duration_seconds_count", 7, language="rhai")
        moved("cellbox_queue_wait_seconds_count", 7)
        calls = "cellbox_tool_calls_total"
        moved(calls, 4, tool="execute_code", outcome="ok")
        moved(calls, 3, tool="execute_code", outcome="error")
        moved(calls, 1, tool="create_session", outcome="ok")
        moved(calls, 1, tool="close_session", outcome="ok")
        moved(calls, 1, tool="unknown", outcome="failed")
        moved(calls, 10, summed=True)
        caps = "cellbox_capability_calls_total"
        moved(caps, 1, capability="emit", outcome="ok")
        moved(caps, 1, capability="answer", outcome="denied")
        moved(caps, 2, summed=True)
        refusals = "cellbox_refusals_total"
        moved(refusals, 1, kind="call_denied")
        moved(refusals, 1, kind=denied["error"]["type"])
        moved(refusals, 1, kind=stopped["error"]["type"])
        moved(refusals, 3, summed=True)
        moved("cellbox_sessions_created_total", 1)
        moved("cellbox_sessions_closed_total", 1)
        moved("cellbox_sessions_expired_total", 0)
        check(
            value(after, "cellbox_sessions_open", principal="local") == 0,
            "no session open after the close",
        )
        kept = sum(len(sc["stdout"].encode()) for sc in results)
        check(kept > 0, "some output was kept")
        moved("cellbox_output_bytes_total", kept, stream="stdout", fate="kept")
        moved("cellbox_output_bytes_total", 0, stream="stdout", fate="dropped")
        check(value(after, "cellbox_pool_workers", pool="rhai_fork_server") == 1, "fork server")
        check(value(after, "cellbox_cells_running") == 0, "nothing running")
        for g in ("process_resident_memory_bytes", "process_open_fds", "process_threads"):
            check(value(after, g) > 0, g)
        ok("every counter moved by what the calls did")

        r = await web.get(METRICS.replace("/metrics", "/readyz"))
        check(r.status_code == 200, "/readyz on the metrics listener", r.text)
        r = await web.get(METRICS.replace("/metrics", "/healthz"))
        check(r.status_code == 200, "/healthz on the metrics listener", r.text)
        r = await web.get(METRICS.replace("/metrics", "/other"))
        check(r.status_code == 404, "anything else is not found", r.status_code)
        ok("probes on the metrics listener")
    print("PASS", flush=True)


anyio.run(main)
