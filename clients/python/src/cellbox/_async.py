"""`AsyncSandbox`: the asyncio client. `Sandbox` (sync) wraps it.

A sandbox is one connection to `cellbox serve`: a server it starts over
stdio (the `cellbox` binary, found on PATH or given) or one it reaches over
streamable HTTP (`url=`, `token=`). It keeps a default session, made on
first use, so that successive `run_code` calls share variables as in a
notebook (as E2B's sandbox does); `session()` opens more. Whatever it
opened it closes: its sessions, then the connection (and the server it
started), on `close()`, at the end of an `async with`, or when it is
garbage-collected still open.
"""

from __future__ import annotations

import asyncio
import base64
import os
import tempfile
from typing import Any, Callable, Iterable

from ._conn import Connection, content_text, find_binary
from .exceptions import (
    STATUS_EXCEPTIONS,
    CellboxError,
    SandboxClosedError,
    ServerError,
    SessionNotFoundError,
)
from .models import Execution, OutputMessage

OutputCallback = Callable[[OutputMessage], Any]
_DEFAULT = object()


class AsyncSandbox:
    """An asyncio connection to `cellbox serve`.

    ```python
    async with AsyncSandbox() as sbx:
        ex = await sbx.run_code("x = 6 * 7\\nx")
        assert ex.value == 42
    ```

    Start-up options (stdio): `binary` (path or name of `cellbox`; default
    $CELLBOX_BIN or `cellbox` on PATH), `config` (a TOML file, `--config`),
    `config_text` (TOML written to a temporary file), `allow` (capabilities
    cells may call, `--allow`), `languages`, `timeout` (seconds per cell,
    `--timeout`), `args` (more `serve` flags), `env` (environment of the
    server: where `api_key_env` keys come from). Or `url` and `token` for a
    server already running with `--http`.
    """

    def __init__(
        self,
        binary: str | os.PathLike | None = None,
        *,
        url: str | None = None,
        token: str | None = None,
        config: str | os.PathLike | None = None,
        config_text: str | None = None,
        allow: Iterable[str] | None = None,
        languages: Iterable[str] | None = None,
        timeout: float | None = None,
        args: Iterable[str] = (),
        env: dict[str, str] | None = None,
        request_timeout: float | None = None,
        errlog: Any = None,
    ):
        self._url, self._token = url, token
        self._binary = binary
        self._config = os.fspath(config) if config is not None else None
        self._config_text = config_text
        self._allow = list(allow) if allow is not None else None
        self._languages = list(languages) if languages is not None else None
        self._timeout = timeout
        self._args = list(args)
        self._env = dict(env or {})
        self.request_timeout = request_timeout
        self._errlog = errlog
        self._conn: Connection | None = None
        self._owner: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self._state = "new"
        self._sessions: dict[str, AsyncSession] = {}
        self._default: AsyncSession | None = None
        self._default_lock: asyncio.Lock | None = None
        self._listeners: dict[str | None, list[tuple[OutputCallback | None, OutputCallback | None, list, list]]] = {}
        self._tmp_config: str | None = None
        self.files = AsyncFiles(self, None)

    # ---------------------------------------------------------------- life

    @classmethod
    async def create(cls, *args: Any, **kwargs: Any) -> "AsyncSandbox":
        """Make and open a sandbox (E2B's spelling of `async with`)."""
        sbx = cls(*args, **kwargs)
        await sbx.open()
        return sbx

    async def __aenter__(self) -> "AsyncSandbox":
        await self.open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._state == "closed"

    def _server_command(self) -> tuple[str, list[str], dict[str, str]]:
        binary = find_binary(self._binary)
        args = ["serve"]
        if self._config_text is not None:
            fd, path = tempfile.mkstemp(prefix="cellbox-client-", suffix=".toml")
            with os.fdopen(fd, "w") as f:
                f.write(self._config_text)
            self._tmp_config = path
            args += ["--config", path]
        elif self._config is not None:
            args += ["--config", self._config]
        for cap in self._allow or ():
            args += ["--allow", cap]
        if self._languages:
            args += ["--language", ",".join(self._languages)]
        if self._timeout is not None:
            args += ["--timeout", str(self._timeout)]
        args += self._args
        env = {"CELLBOX_LOG": os.environ.get("CELLBOX_LOG", "warn")}
        env.update(self._env)
        return binary, args, env

    async def open(self) -> "AsyncSandbox":
        """Start (or connect to) the server. Idempotent."""
        if self._state == "open":
            return self
        if self._state == "closed":
            raise SandboxClosedError("this sandbox was closed; make a new one")
        if self._url is not None:
            conn = Connection(url=self._url, token=self._token, on_log=self._on_log, errlog=self._errlog)
        else:
            command, args, env = self._server_command()
            conn = Connection(command=command, args=args, env=env, on_log=self._on_log, errlog=self._errlog)
        loop = asyncio.get_running_loop()
        ready: asyncio.Future = loop.create_future()
        self._stop = asyncio.Event()
        self._default_lock = asyncio.Lock()
        # The connection is entered and left by one task of its own, so that
        # `close()` may come from any task (the SDK's task groups must be
        # left by the task that entered them).
        self._owner = loop.create_task(self._own(conn, ready))
        try:
            await ready
        except BaseException:
            self._state = "closed"
            self._remove_tmp()
            raise
        self._state = "open"
        return self

    async def _own(self, conn: Connection, ready: asyncio.Future) -> None:
        try:
            async with conn:
                self._conn = conn
                if not ready.done():
                    ready.set_result(None)
                assert self._stop is not None
                await self._stop.wait()
        except BaseException as e:
            if not ready.done():
                leaf = _leaf(e)
                where = self._url or "cellbox serve"
                err = ServerError(f"failed to connect to {where}: {leaf}")
                err.__cause__ = e
                ready.set_exception(err)
        finally:
            self._conn = None

    async def close(self) -> None:
        """Close every session this sandbox opened, then the connection (a
        server started over stdio exits with it). Idempotent."""
        if self._state != "open":
            self._state = "closed"
            self._remove_tmp()
            return
        self._state = "closing"
        for s in list(self._sessions.values()):
            try:
                await s.close()
            except Exception:
                pass
        self._state = "closed"
        if self._stop is not None:
            self._stop.set()
        if self._owner is not None:
            try:
                await self._owner
            except BaseException:
                pass
        self._remove_tmp()

    def _remove_tmp(self) -> None:
        if self._tmp_config is not None:
            try:
                os.unlink(self._tmp_config)
            except OSError:
                pass
            self._tmp_config = None

    def _connection(self) -> Connection:
        if self._state == "closed" or self._conn is None:
            if self._state == "new":
                raise SandboxClosedError("this sandbox is not open: use `async with` or `await sandbox.open()`")
            raise SandboxClosedError("this sandbox is closed")
        return self._conn

    # ---------------------------------------------------------------- calls

    async def call_tool(self, name: str, args: dict | None = None, *, timeout: float | None = None) -> dict:
        """Call one of the server's MCP tools; its structured content, or
        `ServerError` (`SessionNotFoundError` for an unknown session)."""
        structured, content, is_error = await self._connection().call(name, args or {}, timeout=timeout or self.request_timeout)
        if is_error:
            text = content_text(content) or f"{name} failed"
            cls = SessionNotFoundError if ("unknown session" in text.lower() or "no session" in text.lower()) else ServerError
            raise cls(text, tool=name, data=structured)
        return structured

    def _on_log(self, stream: str, data: dict) -> None:
        text = data.get("text")
        if not isinstance(text, str):
            return
        key = data.get("session_id")
        for on_out, on_err, outs, errs in list(self._listeners.get(key, ())):
            if stream == "stdout":
                outs.append(text)
                cb = on_out
            else:
                errs.append(text)
                cb = on_err
            if cb is not None:
                try:
                    cb(OutputMessage(text, error=stream == "stderr"))
                except Exception:
                    pass

    async def _default_session(self) -> "AsyncSession":
        self._connection()
        assert self._default_lock is not None
        async with self._default_lock:
            if self._default is None or self._default.closed:
                self._default = await self.session()
            return self._default

    async def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        session: "AsyncSession | str | None | object" = _DEFAULT,
        max_output_bytes: int | None = None,
    ) -> Execution:
        """Run one cell and return its `Execution`.

        By default the cell runs in this sandbox's default session (made on
        first use), so variables carry from one call to the next; pass
        `session=` another session (or its id), or `session=None` for a
        fresh throwaway one. `timeout` (seconds) can only lower the
        server's limit. `on_stdout` / `on_stderr` get the output live, as
        `OutputMessage`s. A cell that raised comes back with `.error`; any
        other status but `ok` raises its typed exception (`CellTimeoutError`,
        `LimitExceededError`, ...) carrying the `Execution`.
        """
        if session is _DEFAULT:
            sid: str | None = (await self._default_session()).id
        elif isinstance(session, AsyncSession):
            sid = session.id
        else:
            sid = session  # type: ignore[assignment]
        args: dict[str, Any] = {"language": language, "code": code}
        if sid is not None:
            args["session_id"] = sid
        if timeout is not None:
            args["timeout_seconds"] = float(timeout)
        if max_output_bytes is not None:
            args["max_output_bytes"] = int(max_output_bytes)
        live = on_stdout is not None or on_stderr is not None
        entry = (on_stdout, on_stderr, [], [])
        if live:
            self._listeners.setdefault(sid, []).append(entry)
        try:
            structured, content, is_error = await self._connection().call(
                "execute_code", args, timeout=self.request_timeout, live=live
            )
        finally:
            if live:
                entries = self._listeners.get(sid, [])
                if entry in entries:
                    entries.remove(entry)
                if not entries:
                    self._listeners.pop(sid, None)
        if not isinstance(structured, dict) or "status" not in structured:
            raise ServerError(content_text(content) or "execute_code returned no result", tool="execute_code")
        ex = Execution.from_result(structured, content, sid)
        if entry[2]:
            ex.logs.stdout = list(entry[2])
        if entry[3]:
            ex.logs.stderr = list(entry[3])
        err_type = ex.error.type if ex.error else None
        if err_type == "UnknownSession":
            raise SessionNotFoundError(ex.error.message if ex.error else "unknown session", tool="execute_code", data=structured)
        if ex.status not in ("ok", "error"):
            raise STATUS_EXCEPTIONS.get(ex.status, STATUS_EXCEPTIONS["protocol_error"])(ex)
        return ex

    # ---------------------------------------------------------------- sessions

    async def session(self) -> "AsyncSession":
        """Open a new session (closed with the sandbox, or by `close()` / `async with`)."""
        s = await self.call_tool("create_session")
        sess = AsyncSession(self, s["session_id"])
        self._sessions[sess.id] = sess
        return sess

    async def list_sessions(self) -> list[dict]:
        """This principal's sessions: ids, cells run, variable names, expiry."""
        return list((await self.call_tool("list_sessions")).get("sessions") or [])

    async def checkpoint(self, name: str) -> None:
        await (await self._default_session()).checkpoint(name)

    async def restore(self, name: str) -> None:
        await (await self._default_session()).restore(name)

    async def reset(self) -> None:
        await (await self._default_session()).reset()

    # ---------------------------------------------------------------- server tools

    async def read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> dict:
        """The `read_file` file tool (beneath the server's `[files] roots`)."""
        args: dict[str, Any] = {"path": path}
        if start_line is not None:
            args["start_line"] = start_line
        if end_line is not None:
            args["end_line"] = end_line
        return await self.call_tool("read_file", args)

    async def list_dir(self, path: str = ".", **kwargs: Any) -> dict:
        return await self.call_tool("list_dir", {"path": path, **kwargs})

    async def search_files(self, pattern: str, **kwargs: Any) -> dict:
        return await self.call_tool("search_files", {"pattern": pattern, **kwargs})

    async def write_file(self, path: str, content: str, **kwargs: Any) -> dict:
        return await self.call_tool("write_file", {"path": path, "content": content, **kwargs})

    async def edit_file(self, path: str, old_text: str, new_text: str) -> dict:
        return await self.call_tool("edit_file", {"path": path, "old_text": old_text, "new_text": new_text})

    async def aggregate_context(self, results: list, query: str, budget_tokens: int, **kwargs: Any) -> dict:
        """Merge, dedupe, rank and cut file-tool results to a token budget."""
        return await self.call_tool(
            "aggregate_context", {"results": results, "query": query, "budget_tokens": budget_tokens, **kwargs}
        )

    async def tools(self) -> list[str]:
        """Names of the server's MCP tools."""
        conn = self._connection()
        client = conn._client
        listed = await client.list_tools()
        return [t.name for t in listed.tools]


def _leaf(e: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


class AsyncSession:
    """A session of a sandbox: a namespace (every Python object, in a live
    session), a working directory and checkpoints, kept between its cells."""

    def __init__(self, sandbox: AsyncSandbox, session_id: str):
        self.sandbox = sandbox
        self.id = session_id
        self.closed = False
        self.files = AsyncFiles(sandbox, self)

    def __repr__(self) -> str:
        return f"<AsyncSession {self.id}{' closed' if self.closed else ''}>"

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def run_code(self, code: str, language: str = "python", **kwargs: Any) -> Execution:
        return await self.sandbox.run_code(code, language, session=self, **kwargs)

    async def checkpoint(self, name: str) -> None:
        """Keep the session's state under `name` (a live session keeps an
        idle copy of its state process)."""
        await self.sandbox.call_tool("checkpoint_session", {"session_id": self.id, "name": name})

    async def restore(self, name: str) -> None:
        """Go back to the state of checkpoint `name`."""
        await self.sandbox.call_tool("restore_session", {"session_id": self.id, "name": name})

    async def reset(self) -> None:
        """Forget every variable and definition (files stay)."""
        await self.sandbox.call_tool("reset_session", {"session_id": self.id})

    async def close(self) -> None:
        """End the session (a running cell is killed). Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.sandbox._sessions.pop(self.id, None)
        if self.sandbox._conn is None:
            return
        try:
            await self.sandbox.call_tool("close_session", {"session_id": self.id})
        except SessionNotFoundError:
            pass

    async def info(self) -> dict:
        """This session's entry in `list_sessions`."""
        for s in await self.sandbox.list_sessions():
            if s.get("session_id") == self.id:
                return s
        raise SessionNotFoundError(f"session {self.id} is not open", tool="list_sessions")

    async def variables(self) -> dict[str, Any]:
        """The session's variables that have a JSON value, by name (read by
        running a cell that leaves the namespace as it was)."""
        ex = await self.run_code(_VARIABLES_CELL)
        ex.raise_for_status()
        return dict(ex.value or {})

    async def get(self, name: str) -> Any:
        """One variable's value (JSON values as they are, others as their repr)."""
        if not name.isidentifier():
            raise ValueError(f"not a variable name: {name!r}")
        ex = await self.run_code(name)
        ex.raise_for_status()
        return ex.value

    async def set(self, name: str, value: Any) -> None:
        """Bind `name` to a JSON value in the session."""
        import json

        if not name.isidentifier():
            raise ValueError(f"not a variable name: {name!r}")
        text = json.dumps(value)
        ex = await self.run_code(f"import json as _cellbox_json\n{name} = _cellbox_json.loads({text!r})\ndel _cellbox_json")
        ex.raise_for_status()


# Reads the namespace without changing it: the comprehension's names are
# its own, and nothing is bound at top level.
_VARIABLES_CELL = (
    "(lambda g: {k: v for k, v in g.items() if not k.startswith('_') and "
    "type(v) in (str, int, float, bool, list, dict, tuple, type(None))})(globals())"
)


class AsyncFiles:
    """Files in a session's working directory (its scratch directory):
    what a cell reads by relative path and what it leaves there."""

    def __init__(self, sandbox: AsyncSandbox, session: AsyncSession | None):
        self._sandbox = sandbox
        self._session = session

    async def _sid(self) -> str:
        if self._session is not None:
            return self._session.id
        return (await self._sandbox._default_session()).id

    async def write(self, path: str, data: str | bytes) -> dict:
        """Write a file (text as UTF-8, bytes as base64 on the wire)."""
        if isinstance(data, bytes):
            content, encoding = base64.b64encode(data).decode("ascii"), "base64"
        else:
            content, encoding = data, "utf-8"
        return await self._sandbox.call_tool(
            "upload_file", {"session_id": await self._sid(), "path": path, "content": content, "encoding": encoding}
        )

    async def read(self, path: str, format: str = "text") -> str | bytes:
        """Read a file: `format="text"` (str) or `"bytes"`."""
        r = await self._sandbox.call_tool("download_file", {"session_id": await self._sid(), "path": path})
        content = r.get("content", "")
        if r.get("encoding") == "base64":
            raw = base64.b64decode(content)
            return raw if format == "bytes" else raw.decode("utf-8", "replace")
        return content.encode("utf-8") if format == "bytes" else content

    async def list(self, path: str = ".") -> list[dict]:
        """Entries of a directory: name, type, size."""
        r = await self._sandbox.call_tool("list_files", {"session_id": await self._sid(), "path": path})
        return list(r.get("entries") or [])
