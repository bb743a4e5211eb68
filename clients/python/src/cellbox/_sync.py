"""`Sandbox`: the synchronous twin of `AsyncSandbox`, for programs that are
not async (an rlms environment, a script, a notebook cell).

Every sync sandbox runs its async twin on one event loop in a background
thread of this process (started on first use, a daemon); each method
submits the coroutine there and waits for it. Live-output callbacks are
called on that thread. A sandbox left open is closed when it is
garbage-collected or when the interpreter exits, so a forgotten one does
not keep a server or a session.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Coroutine, Iterable, TypeVar

from ._async import _DEFAULT, AsyncFiles, AsyncSandbox, AsyncSession, OutputCallback
from .models import Execution

T = TypeVar("T")

_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _loop_lock:
        if _loop is None or not _thread or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            _thread = threading.Thread(target=run, name="cellbox-client-loop", daemon=True)
            _thread.start()
            started.wait()
            _loop = loop
        return _loop


def _run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    loop = _background_loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("a sync cellbox call cannot be made from an output callback; use AsyncSandbox there")
    fut: Future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return fut.result(timeout)
    except KeyboardInterrupt:
        # Ctrl-C: cancel the call (serve kills the cell), then re-raise.
        fut.cancel()
        raise


def _close_quietly(inner: AsyncSandbox) -> None:
    """Close a sandbox that its owner dropped (from a finalizer)."""
    if inner.closed or _loop is None or not _loop.is_running():
        return
    fut = asyncio.run_coroutine_threadsafe(inner.close(), _loop)
    if threading.current_thread() is not _thread:
        try:
            fut.result(10)
        except Exception:
            pass


class Sandbox:
    """A connection to `cellbox serve`, synchronous. Same arguments and
    methods as `AsyncSandbox`, without `await`:

    ```python
    with Sandbox() as sbx:
        ex = sbx.run_code("x = 6 * 7\\nx")
        assert ex.value == 42
    ```
    """

    def __init__(self, binary: Any = None, **kwargs: Any):
        self._inner = AsyncSandbox(binary, **kwargs)
        self.files = Files(self._inner.files)
        self._finalizer = weakref.finalize(self, _close_quietly, self._inner)

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> "Sandbox":
        sbx = cls(*args, **kwargs)
        sbx.open()
        return sbx

    def open(self) -> "Sandbox":
        _run(self._inner.open())
        return self

    def close(self) -> None:
        """Close every session this sandbox opened, then the connection."""
        if not self._inner.closed:
            _run(self._inner.close())
        self._finalizer.detach()

    kill = close  # E2B's name

    def __enter__(self) -> "Sandbox":
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def run_code(
        self,
        code: str,
        language: str = "python",
        *,
        timeout: float | None = None,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        session: Any = _DEFAULT,
        max_output_bytes: int | None = None,
    ) -> Execution:
        """See `AsyncSandbox.run_code`."""
        if isinstance(session, Session):
            session = session._inner
        return _run(
            self._inner.run_code(
                code,
                language,
                timeout=timeout,
                on_stdout=on_stdout,
                on_stderr=on_stderr,
                session=session,
                max_output_bytes=max_output_bytes,
            )
        )

    def session(self) -> "Session":
        """Open a new session (closed with the sandbox or by `close()` / `with`)."""
        return Session(self, _run(self._inner.session()))

    def list_sessions(self) -> list[dict]:
        return _run(self._inner.list_sessions())

    def checkpoint(self, name: str) -> None:
        _run(self._inner.checkpoint(name))

    def restore(self, name: str) -> None:
        _run(self._inner.restore(name))

    def reset(self) -> None:
        _run(self._inner.reset())

    def call_tool(self, name: str, args: dict | None = None, *, timeout: float | None = None) -> dict:
        return _run(self._inner.call_tool(name, args, timeout=timeout))

    def tools(self) -> list[str]:
        return _run(self._inner.tools())

    def read_file(self, path: str, start_line: int | None = None, end_line: int | None = None) -> dict:
        return _run(self._inner.read_file(path, start_line, end_line))

    def list_dir(self, path: str = ".", **kwargs: Any) -> dict:
        return _run(self._inner.list_dir(path, **kwargs))

    def search_files(self, pattern: str, **kwargs: Any) -> dict:
        return _run(self._inner.search_files(pattern, **kwargs))

    def write_file(self, path: str, content: str) -> dict:
        return _run(self._inner.write_file(path, content))

    def edit_file(self, path: str, old_text: str, new_text: str) -> dict:
        return _run(self._inner.edit_file(path, old_text, new_text))

    def aggregate_context(self, results: list, query: str, budget_tokens: int, **kwargs: Any) -> dict:
        return _run(self._inner.aggregate_context(results, query, budget_tokens, **kwargs))


class Session:
    """A session of a `Sandbox` (see `AsyncSession`)."""

    def __init__(self, sandbox: Sandbox, inner: AsyncSession):
        self.sandbox = sandbox
        self._inner = inner
        self.id = inner.id
        self.files = Files(inner.files)

    def __repr__(self) -> str:
        return f"<Session {self.id}{' closed' if self.closed else ''}>"

    @property
    def closed(self) -> bool:
        return self._inner.closed

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run_code(self, code: str, language: str = "python", **kwargs: Any) -> Execution:
        return self.sandbox.run_code(code, language, session=self._inner, **kwargs)

    def checkpoint(self, name: str) -> None:
        _run(self._inner.checkpoint(name))

    def restore(self, name: str) -> None:
        _run(self._inner.restore(name))

    def reset(self) -> None:
        _run(self._inner.reset())

    def close(self) -> None:
        if self._inner.closed or self.sandbox.closed:
            return
        if threading.current_thread() is _thread:
            # From a finalizer the collector ran on the loop's own thread:
            # it cannot wait there, so the close goes ahead on its own.
            asyncio.ensure_future(self._inner.close())
            return
        _run(self._inner.close())

    def info(self) -> dict:
        return _run(self._inner.info())

    def variables(self) -> dict[str, Any]:
        return _run(self._inner.variables())

    def get(self, name: str) -> Any:
        return _run(self._inner.get(name))

    def set(self, name: str, value: Any) -> None:
        _run(self._inner.set(name, value))


class Files:
    """A session's working directory (see `AsyncFiles`)."""

    def __init__(self, inner: AsyncFiles):
        self._inner = inner

    def write(self, path: str, data: str | bytes) -> dict:
        return _run(self._inner.write(path, data))

    def read(self, path: str, format: str = "text") -> str | bytes:
        return _run(self._inner.read(path, format))

    def list(self, path: str = ".") -> list[dict]:
        return _run(self._inner.list(path))


__all__: Iterable[str] = ["Sandbox", "Session", "Files"]
