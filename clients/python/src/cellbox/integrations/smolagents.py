"""A smolagents `CodeAgent` executor that runs the agent's code in cellbox.

```python
from smolagents import CodeAgent
from cellbox.integrations.smolagents import CellboxExecutor

agent = CodeAgent(tools=[...], model=model, executor=CellboxExecutor())
agent.run("...")
```

`CellboxExecutor` is a smolagents remote executor (`RemotePythonExecutor`):
each code action is one cell of a live cellbox session, so variables,
functions and imports carry from step to step. The agent's tools run in
this process, not in the sandbox: in the cell each tool is a function of
the same name that calls it through the supervisor (a declared
`kind = "http"` tool posting to a bridge on 127.0.0.1 here), so model-
written code reaches a tool only through a call the supervisor checks and
records. `final_answer(x)` gives the run's answer and ends the code action.
The sandbox has no network and no pip: extra imports must come from the
cellbox profile's `[python]` package paths.
"""

from __future__ import annotations

import json
from typing import Any

from .. import ExecutionFailed, Sandbox
from . import _bridge

try:
    from smolagents.local_python_executor import CodeOutput
    from smolagents.monitoring import AgentLogger, LogLevel
    from smolagents.remote_executors import RemotePythonExecutor
    from smolagents.utils import AgentError
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("cellbox.integrations.smolagents needs smolagents: pip install smolagents") from e

_TOOL = "smolagents_tool"

_FINAL = '''
def final_answer(answer):
    """Give the final answer of the run; ends this code action."""
    import json as _smol_json
    try:
        _smol_json.dumps(answer)
    except (TypeError, ValueError):
        answer = str(answer)
    capabilities.answer(answer)
    raise SystemExit(0)
'''

_TOOL_FN = '''
def {name}(*args, **kwargs):
    """{doc}"""
    return tools.{tool}(name={name!r}, args=list(args), kwargs=kwargs)
'''


class CellboxExecutor(RemotePythonExecutor):
    """Runs a CodeAgent's code in a cellbox session (see the module doc).

    `sandbox` is an open `cellbox.Sandbox` to use (its server must declare
    the bridge tool; leave it out and one is started with `sandbox_kwargs`,
    e.g. `binary=`). `timeout` is the seconds one code action may take.
    """

    def __init__(
        self,
        additional_imports: list[str] | None = None,
        logger: Any = None,
        allow_pickle: bool = False,
        *,
        timeout: float = 300.0,
        **sandbox_kwargs: Any,
    ):
        super().__init__(list(additional_imports or []), logger or AgentLogger(level=LogLevel.ERROR), allow_pickle)
        self.tools: dict[str, Any] = {}
        self._token = _bridge.register(self._host_call)
        config = (
            "[policy]\n"
            f'allow = ["answer", "{_TOOL}"]\n'
            "max_calls = 1000000\nmax_tool_calls = 1000000\n"
            f"[limits]\ntimeout_ms = {int(timeout * 1000)}\n"
            + _bridge.tool_toml(_TOOL, _bridge.url(self._token, "tool"), "a tool of the smolagents agent", {"type": "object"})
        )
        self.sandbox = Sandbox(config_text=config, languages=["python"], **sandbox_kwargs)
        self.sandbox.open()
        self.session = self.sandbox.session()
        self.installed_packages = self.install_packages(self.additional_imports)
        self.logger.log("cellbox is running", level=LogLevel.INFO)

    # ------------------------------------------------------------ tools

    def send_tools(self, tools: dict[str, Any]) -> None:
        """Make each tool a function of the cell that calls it here."""
        code = [_FINAL]
        for name, tool in tools.items():
            if name == "final_answer":
                continue
            if not name.isidentifier():
                raise ValueError(f"tool name {name!r} is not a Python identifier")
            self.tools[name] = tool
            doc = str(getattr(tool, "description", "") or name).replace('"""', "'''").replace("\\", "\\\\")
            code.append(_TOOL_FN.format(name=name, doc=doc, tool=_TOOL))
        self.run_code_raise_errors("\n".join(code))

    def _host_call(self, _route: str, args: dict) -> Any:
        name = str(args.get("name"))
        tool = self.tools.get(name)
        if tool is None:
            raise RuntimeError(f"no tool named {name!r}")
        result = tool(*(args.get("args") or []), **(args.get("kwargs") or {}))
        try:
            json.dumps(result)
            return result
        except (TypeError, ValueError):
            return str(result)

    def install_packages(self, additional_imports: list[str]) -> list[str]:
        """Nothing is installed (a cell has no network): packages come from
        the sandbox profile's `[python]` paths. Returns the names as given."""
        return list(additional_imports)

    # ------------------------------------------------------------ code

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        try:
            ex = self.session.run_code(code)
        except ExecutionFailed as e:
            ex = e.execution
        logs = ex.stdout + (ex.stderr if ex.stderr else "")
        if ex.final_answer is not None:
            return CodeOutput(output=ex.final_answer, logs=logs, is_final_answer=True)
        if ex.status != "ok":
            err = ex.error
            detail = f"{err.type}\n{err.message}\n{err.traceback or ''}" if err else ex.status
            raise AgentError(f"{logs}\nExecuting code yielded an error:\n{detail}", self.logger)
        return CodeOutput(output=ex.value, logs=logs, is_final_answer=False)

    def cleanup(self) -> None:
        """Close the session and the sandbox."""
        _bridge.unregister(self._token)
        try:
            self.sandbox.close()
        except Exception:
            pass

    def delete(self) -> None:
        self.cleanup()


__all__ = ["CellboxExecutor"]
