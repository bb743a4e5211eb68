"""One MCP connection to `cellbox serve`, over the official `mcp` SDK, 1.x or 2.x.

The two major versions of the SDK differ in how a client is made and in
the attribute names of a result; everything above this module sees one
`Connection` with `call(name, args)` returning `(structured, content,
is_error)`. A connection must be entered and left in the same task (the
SDK's task groups require it): `AsyncSandbox` keeps one owner task for it.
"""

from __future__ import annotations

import os
import sys
from contextlib import AsyncExitStack
from datetime import timedelta
from importlib.metadata import version
from typing import Any, Awaitable, Callable

from .exceptions import ServerError

MCP_MAJOR = int(version("mcp").split(".")[0])
# The SDK's logging callback gets the notification's params; serve sends a
# cell's live output as `notifications/message` with logger stdout/stderr.
LogHandler = Callable[[str, dict], None]


def _get(obj: Any, *names: str) -> Any:
    for n in names:
        if isinstance(obj, dict) and n in obj:
            return obj[n]
        if hasattr(obj, n):
            return getattr(obj, n)
    return None


class Connection:
    def __init__(
        self,
        *,
        command: str | None = None,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        url: str | None = None,
        token: str | None = None,
        on_log: LogHandler | None = None,
        errlog: Any = None,
    ):
        self.command, self.args, self.env = command, list(args or []), env
        self.url, self.token = url, token
        self.on_log = on_log
        self.errlog = errlog if errlog is not None else sys.stderr
        self._stack = AsyncExitStack()
        self._client: Any = None

    async def _logging(self, params: Any) -> None:
        if self.on_log is None:
            return
        logger = _get(params, "logger")
        data = _get(params, "data")
        if isinstance(data, dict) and logger in ("stdout", "stderr"):
            self.on_log(logger, data)

    async def __aenter__(self) -> "Connection":
        try:
            await self._open()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def _open(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else None
        if MCP_MAJOR >= 2:
            from mcp import Client

            if self.url is not None:
                from mcp.client.streamable_http import streamable_http_client
                from mcp.shared._httpx_utils import create_mcp_http_client

                http = await self._stack.enter_async_context(create_mcp_http_client(headers=headers))
                target: Any = streamable_http_client(self.url, http_client=http)
            else:
                from mcp.client.stdio import stdio_client

                target = stdio_client(self._params(), errlog=self.errlog)
            self._client = await self._stack.enter_async_context(Client(target, logging_callback=self._logging))
        else:
            from mcp import ClientSession

            if self.url is not None:
                from mcp.client.streamable_http import streamablehttp_client

                read, write, _ = await self._stack.enter_async_context(streamablehttp_client(self.url, headers=headers))
            else:
                from mcp.client.stdio import stdio_client

                read, write = await self._stack.enter_async_context(stdio_client(self._params(), errlog=self.errlog))
            self._client = await self._stack.enter_async_context(ClientSession(read, write, logging_callback=self._logging))
            await self._client.initialize()
            try:
                await self._client.set_logging_level("info")
            except Exception:
                pass

    def _params(self) -> Any:
        from mcp import StdioServerParameters

        env = dict(self.env or {})
        return StdioServerParameters(command=self.command or "cellbox", args=self.args, env=env)

    async def __aexit__(self, *exc: Any) -> None:
        self._client = None
        await self._stack.aclose()

    async def call(self, name: str, args: dict, *, timeout: float | None = None, live: bool = False) -> tuple[dict, list, bool]:
        """Call a tool; `live` asks for the cell's output as it is written
        (serve sends it to calls that carry a progress token)."""
        client = self._client
        if client is None:
            raise ServerError("the connection is closed", tool=name)
        progress: Callable[..., Awaitable[None]] | None = _ignore_progress if live else None
        try:
            if MCP_MAJOR >= 2:
                meta = {"io.modelcontextprotocol/logLevel": "info"} if live else None
                r = await client.call_tool(name, args, read_timeout_seconds=timeout, progress_callback=progress, meta=meta)
            else:
                t = timedelta(seconds=timeout) if timeout else None
                r = await client.call_tool(name, args, read_timeout_seconds=t, progress_callback=progress)
        except ServerError:
            raise
        except Exception as e:
            raise ServerError(f"{name}: {e}", tool=name) from e
        structured = _get(r, "structured_content", "structuredContent") or {}
        content = list(_get(r, "content") or [])
        is_error = bool(_get(r, "is_error", "isError"))
        return structured, content, is_error


async def _ignore_progress(*_args: Any, **_kwargs: Any) -> None:
    return None


def content_text(content: list) -> str:
    """The text of a result's text blocks, joined."""
    parts = []
    for block in content:
        text = _get(block, "text")
        if isinstance(text, str):
            parts.append(text)
    return "\n".join(parts)


def find_binary(binary: str | os.PathLike | None = None) -> str:
    """The `cellbox` binary: the argument, $CELLBOX_BIN, or `cellbox` on PATH."""
    import shutil

    from .exceptions import CellboxError

    if binary is not None:
        path = os.fspath(binary)
        if os.sep in path:
            if not os.access(path, os.X_OK):
                raise CellboxError(f"failed to find the cellbox binary: {path} is not an executable file")
            return path
        found = shutil.which(path)
        if found is None:
            raise CellboxError(f"failed to find the cellbox binary: {path!r} is not on PATH")
        return found
    env = os.environ.get("CELLBOX_BIN")
    if env:
        return find_binary(env)
    found = shutil.which("cellbox")
    if found is None:
        raise CellboxError(
            "failed to find the cellbox binary: no `cellbox` on PATH; pass binary=PATH, set CELLBOX_BIN, "
            "or connect to a running server with url=..."
        )
    return found
