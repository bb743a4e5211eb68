"""What a cell gives back: `Execution` and its parts.

The field names are those of the cell result `cellbox serve` returns (its
`structuredContent`); a few E2B-style aliases (`logs`, `results`, `text`,
`error.name` / `error.value`) make code written for E2B's code interpreter
read the same.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

from .exceptions import STATUS_EXCEPTIONS


class OutputMessage(str):
    """One piece of live output as a callback receives it: a `str` (the
    text), with `.line` (the same text), `.error` (True for stderr) and
    `.timestamp` (nanoseconds since the epoch), as E2B's `OutputMessage`."""

    line: str
    error: bool
    timestamp: int

    def __new__(cls, text: str, error: bool = False):
        self = super().__new__(cls, text)
        self.line = text
        self.error = error
        self.timestamp = time.time_ns()
        return self


@dataclass
class ExecutionError:
    """The error a cell raised: `type` (`ZeroDivisionError`), `message`,
    `traceback` (the cell's own frames), `line` and `column` in the cell."""

    type: str
    message: str
    traceback: str | None = None
    line: int | None = None
    column: int | None = None

    @property
    def name(self) -> str:
        """E2B's name for `type`."""
        return self.type

    @property
    def value(self) -> str:
        """E2B's name for `message`."""
        return self.message

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type


@dataclass
class Usage:
    """What the cell used: wall and CPU time, peak memory, capability calls."""

    wall_ms: int = 0
    cpu_ms: int = 0
    max_rss_kb: int = 0
    calls: int = 0


@dataclass
class DisplayItem:
    """A rich value the cell showed: a matplotlib figure (`image/png`,
    base64 `data`), or the `_repr_html_` / `_repr_markdown_` of its value."""

    mime: str
    data: str

    @property
    def png(self) -> str | None:
        """Base64 PNG (as E2B's `Result.png`)."""
        return self.data if self.mime == "image/png" else None

    @property
    def html(self) -> str | None:
        return self.data if self.mime == "text/html" else None

    @property
    def markdown(self) -> str | None:
        return self.data if self.mime == "text/markdown" else None

    def bytes(self) -> bytes:
        """The item's bytes (decoded from base64 for an image)."""
        if self.mime.startswith("image/"):
            return base64.b64decode(self.data)
        return self.data.encode("utf-8")


@dataclass
class Logs:
    """E2B's shape of the output: lists of the chunks seen live (one item
    when nothing streamed)."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass
class Execution:
    """The result of `run_code`.

    `status` is one of ok, error, timeout, killed, limit_exceeded,
    policy_denied, protocol_error, sandbox_error. `value` is the last
    expression's value (JSON when it has one, else its repr), `value_repr`
    its repr; `final_answer` what the cell gave `answer(...)` or left in an
    `answer` dict marked ready.
    """

    status: str
    stdout: str = ""
    stderr: str = ""
    value: Any = None
    value_repr: str | None = None
    error: ExecutionError | None = None
    final_answer: Any = None
    display: list[DisplayItem] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    execution_count: int | None = None
    language: str = "python"
    session_id: str | None = None
    calls: list[dict] = field(default_factory=list)
    vars: dict = field(default_factory=dict)
    state: str | None = None
    truncated: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def text(self) -> str | None:
        """The value as text (E2B's `Execution.text`): its repr, or None."""
        if self.value_repr is not None:
            return self.value_repr
        if self.value is None:
            return None
        return self.value if isinstance(self.value, str) else repr(self.value)

    @property
    def results(self) -> list[DisplayItem]:
        """E2B's name for the rich items."""
        return self.display

    def raise_for_status(self) -> "Execution":
        """Raise the typed exception of the status unless it is `ok`."""
        if self.status != "ok":
            raise STATUS_EXCEPTIONS.get(self.status, STATUS_EXCEPTIONS["error"])(self)
        return self

    @classmethod
    def from_result(cls, structured: dict, content: list | None = None, session_id: str | None = None) -> "Execution":
        """Build from `execute_code`'s structured content (and its content
        blocks, which hold the display items' bytes)."""
        s = structured or {}
        err = s.get("error")
        error = None
        if isinstance(err, dict):
            error = ExecutionError(
                type=str(err.get("type") or "Error"),
                message=str(err.get("message") or ""),
                traceback=err.get("traceback"),
                line=err.get("line"),
                column=err.get("column"),
            )
        u = s.get("usage") or {}
        usage = Usage(
            wall_ms=int(u.get("wall_ms") or 0),
            cpu_ms=int(u.get("cpu_ms") or 0),
            max_rss_kb=int(u.get("max_rss_kb") or 0),
            calls=int(u.get("calls") or 0),
        )
        display = []
        for item in s.get("display") or []:
            if not isinstance(item, dict):
                continue
            data = item.get("data")
            idx = item.get("content_index")
            if data is None and isinstance(idx, int) and content and 0 <= idx < len(content):
                block = content[idx]
                data = _block_field(block, "data") or _block_field(block, "text") or ""
            display.append(DisplayItem(mime=str(item.get("mime") or ""), data=str(data or "")))
        stdout, stderr = s.get("stdout") or "", s.get("stderr") or ""
        return cls(
            status=str(s.get("status") or "protocol_error"),
            stdout=stdout,
            stderr=stderr,
            value=s.get("value"),
            value_repr=s.get("value_repr"),
            error=error,
            final_answer=s.get("final_answer"),
            display=display,
            usage=usage,
            execution_count=s.get("execution_count"),
            language=str(s.get("language") or "python"),
            session_id=session_id,
            calls=list(s.get("calls") or []),
            vars=dict(s.get("vars") or {}),
            state=s.get("state"),
            truncated=dict(s.get("truncated") or {}),
            notes=list(s.get("notes") or []),
            logs=Logs(stdout=[stdout] if stdout else [], stderr=[stderr] if stderr else []),
            raw=s,
        )


def _block_field(block: Any, name: str) -> Any:
    if isinstance(block, dict):
        return block.get(name)
    return getattr(block, name, None)
