"""Typed exceptions: one per cell status that is not `ok`, and the client's own.

A cell that ran and raised (`status == "error"`) comes back as an
`Execution` whose `error` says what happened (as E2B's `run_code` does);
`Execution.raise_for_status()` turns it into `CodeError`. Every other status
(the cell did not finish on its own) is raised by `run_code` as the
exception below, with the `Execution` in `.execution`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .models import Execution


class CellboxError(Exception):
    """Base class of every error this package raises."""


class ServerError(CellboxError):
    """The server refused a request or could not be reached (an MCP error,
    a tool error such as an unknown session, a closed connection)."""

    def __init__(self, message: str, *, tool: str | None = None, data: Any = None):
        super().__init__(message)
        self.tool = tool
        self.data = data


class SessionNotFoundError(ServerError):
    """The session is closed, expired, or belongs to another principal."""


class SandboxClosedError(CellboxError):
    """The sandbox (its connection to `cellbox serve`) is closed."""


class ExecutionFailed(CellboxError):
    """A cell did not end `ok`. `.status` is its status, `.execution` its
    whole result."""

    status = "error"

    def __init__(self, execution: "Execution"):
        self.execution = execution
        err = execution.error
        detail = f"{err.type}: {err.message}" if err is not None else execution.status
        super().__init__(f"cell {execution.status}: {detail}")


class CodeError(ExecutionFailed):
    """The cell's code raised (status `error`)."""

    status = "error"


class CellTimeoutError(ExecutionFailed, TimeoutError):
    """The cell passed its time limit (status `timeout`)."""

    status = "timeout"


class CellKilledError(ExecutionFailed):
    """The cell was killed: cancelled, a signal, its session closed (status `killed`)."""

    status = "killed"


class LimitExceededError(ExecutionFailed):
    """A limit or budget was passed: memory, output, calls, tokens, a full
    queue (status `limit_exceeded`)."""

    status = "limit_exceeded"


class PolicyDeniedError(ExecutionFailed, PermissionError):
    """The policy refused the cell (status `policy_denied`)."""

    status = "policy_denied"


class ProtocolError(ExecutionFailed):
    """The worker broke the protocol (status `protocol_error`)."""

    status = "protocol_error"


class SandboxFailedError(ExecutionFailed):
    """The sandbox could not be applied; no code ran (status `sandbox_error`)."""

    status = "sandbox_error"


STATUS_EXCEPTIONS: dict[str, type[ExecutionFailed]] = {
    cls.status: cls
    for cls in (
        CodeError,
        CellTimeoutError,
        CellKilledError,
        LimitExceededError,
        PolicyDeniedError,
        ProtocolError,
        SandboxFailedError,
    )
}
