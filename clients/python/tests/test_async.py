"""The asyncio twin, and a server reached over HTTP with a token."""

from __future__ import annotations

import asyncio

import pytest

from cellbox import AsyncSandbox, Sandbox, ServerError


def test_async_twin_same_names(binary):
    async def main():
        async with AsyncSandbox(binary) as sbx:
            ex = await sbx.run_code("x = [1, 2]\nlen(x)")
            assert ex.value == 2
            chunks = []
            ex = await sbx.run_code("print('live')", on_stdout=chunks.append)
            assert chunks == ["live\n"]
            async with await sbx.session() as s:
                await s.run_code("y = 5")
                assert await s.get("y") == 5
                await s.files.write("f.txt", "data")
                assert await s.files.read("f.txt") == "data"
            # Sessions run side by side.
            a, b = await sbx.session(), await sbx.session()
            ra, rb = await asyncio.gather(
                a.run_code("import time\ntime.sleep(0.2)\n'a'"), b.run_code("import time\ntime.sleep(0.2)\n'b'")
            )
            assert (ra.value, rb.value) == ("a", "b")
            assert len(await sbx.list_sessions()) == 3  # the default one, a and b
        assert sbx.closed

    asyncio.run(main())


def test_async_create_and_close_from_another_task(binary):
    async def main():
        sbx = await AsyncSandbox.create(binary)
        assert (await sbx.run_code("1 + 1")).value == 2
        await asyncio.get_running_loop().create_task(sbx.close())
        assert sbx.closed

    asyncio.run(main())


def test_http_with_token_and_sessions_released(http_server):
    # The server allows 4 sessions per principal; 6 sandboxes in turn each
    # open one and must give it back.
    for i in range(6):
        with Sandbox(url=http_server.url, token=http_server.token) as sbx:
            assert sbx.run_code(f"{i} * 2").value == i * 2
    with Sandbox(url=http_server.url, token=http_server.token) as sbx:
        assert sbx.list_sessions() == []


def test_http_wrong_token_is_refused(http_server):
    with pytest.raises(Exception) as info:
        with Sandbox(url=http_server.url, token="x" * 32) as sbx:
            sbx.run_code("1")
    assert "401" in str(info.value) or "nauthor" in str(info.value) or isinstance(info.value, ServerError)
