"""cellbox: run untrusted code in sandboxed cells from Python.

`Sandbox` (sync) and `AsyncSandbox` talk to `cellbox serve` over MCP (the
official `mcp` SDK): a server they start over stdio, or one reached over
streamable HTTP. See the package README for examples, and
`cellbox.integrations` for rlms and smolagents.
"""

from ._async import AsyncFiles, AsyncSandbox, AsyncSession
from ._sync import Files, Sandbox, Session
from .exceptions import (
    STATUS_EXCEPTIONS,
    CellboxError,
    CellKilledError,
    CellTimeoutError,
    CodeError,
    ExecutionFailed,
    LimitExceededError,
    PolicyDeniedError,
    ProtocolError,
    SandboxClosedError,
    SandboxFailedError,
    ServerError,
    SessionNotFoundError,
)
from .models import DisplayItem, Execution, ExecutionError, Logs, OutputMessage, Usage

__version__ = "0.1.0"

__all__ = [
    "AsyncFiles",
    "AsyncSandbox",
    "AsyncSession",
    "CellKilledError",
    "CellTimeoutError",
    "CellboxError",
    "CodeError",
    "DisplayItem",
    "Execution",
    "ExecutionError",
    "ExecutionFailed",
    "Files",
    "LimitExceededError",
    "Logs",
    "OutputMessage",
    "PolicyDeniedError",
    "ProtocolError",
    "STATUS_EXCEPTIONS",
    "Sandbox",
    "SandboxClosedError",
    "SandboxFailedError",
    "ServerError",
    "Session",
    "SessionNotFoundError",
    "Usage",
]
