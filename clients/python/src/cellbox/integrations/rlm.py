"""An rlms environment whose REPL is a cellbox session.

```python
from rlm import RLM
import cellbox.integrations.rlm as cellbox_rlm

cellbox_rlm.register()                 # RLM(..., environment="cellbox") from now on
rlm = RLM(backend="openai", backend_kwargs={...}, environment="cellbox")
```

The environment (`CellboxREPL`) is what rlms' `LocalREPL` is, run in a
sandbox: each `execute_code` is one cell of a live cellbox session (every
object survives between cells), `context` / `context_N` / `history_N` are
variables of that session, and the REPL names rlms gives the model —
`llm_query`, `llm_query_batched`, `rlm_query`, `rlm_query_batched`,
`SHOW_VARS`, the `answer` dict — behave as rlms documents: a name the model
overwrites is restored after the cell, `answer["ready"] = True` (or `answer`
bound to such a dict) ends the run with `answer["content"]`.

Where `llm_query` is answered (`llm=`):

- `"rlms"` (the default): by rlms' own LM handler, the one `RLM` starts for
  the completion (`lm_handler_address`). A cell has no network: its call
  goes to the supervisor as a declared `kind = "http"` tool, which the
  supervisor POSTs to a bridge on 127.0.0.1 in this process, which sends it
  to the handler. Usage is counted by rlms as for `LocalREPL`.
- `"cellbox"`: by cellbox's own model client (`[models.NAME]`), the key held
  by the supervisor. `models=` gives the endpoints, or
  `models_from_backend(backend, backend_kwargs)` makes them from an RLM's
  client settings (OpenAI-compatible backends: `openai`, `vllm`,
  `openrouter`, `vercel`, `azure_openai` with `base_url`).

`rlm_query` runs rlms' sub-RLM (`subcall_fn`, which rlms passes to
environments it knows; pass it yourself in `environment_kwargs` or use
`register(subcalls=True)`), and falls back to `llm_query` without one, as
`LocalREPL` does. A failed cell is rolled back whole (cellbox sessions keep
nothing of a cell that raised), where `LocalREPL` keeps what ran before the
error.

All environments of a process share one `cellbox serve` per model setting
(a session each, closed by `cleanup()`, `with`, or when the environment is
garbage-collected), so environments are cheap to make and never leak a
session.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import shutil
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Mapping

from .. import ExecutionFailed, Sandbox
from . import _bridge

try:
    from rlm.core.types import REPLResult, RLMChatCompletion
    from rlm.environments.base_env import NonIsolatedEnv, extract_tool_value, validate_custom_tools
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("cellbox.integrations.rlm needs rlms: pip install rlms") from e

SCAFFOLD = ("llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched", "SHOW_VARS")
_TOOLS = ("rlms_llm_query", "rlms_llm_query_batched", "rlms_rlm_query", "rlms_rlm_query_batched", "rlms_custom")
# A value larger than this (as JSON) is not sent back after each cell; the
# environment's `locals` fetches it when asked.
_INLINE_LIMIT = 16 * 1024
_CHUNK = 2 << 20
# Under serve's download limit (512 KiB by default), as base64 or text.
_PIECE = 256 * 1024

_envs: "weakref.WeakValueDictionary[str, CellboxREPL]" = weakref.WeakValueDictionary()
_shared: dict[tuple, Sandbox] = {}
_shared_lock = threading.Lock()
_route: str | None = None


def _dispatch(name: str, args: dict) -> Any:
    env = _envs.get(str(args.get("env") or ""))
    if env is None:
        raise RuntimeError("this rlms environment is closed")
    return env._host_call(name, args)


def _route_token() -> str:
    global _route
    if _route is None:
        _route = _bridge.register(_dispatch)
    return _route


def models_from_backend(backend: str, backend_kwargs: dict | None, name: str = "rlm") -> dict:
    """cellbox `[models.NAME]` settings from an RLM's client settings
    (OpenAI-compatible backends). The key, if any, is passed to the server
    in its environment, never to a cell."""
    kw = dict(backend_kwargs or {})
    endpoint = kw.get("base_url")
    if endpoint is None:
        endpoint = {
            "openai": "https://api.openai.com/v1",
            "openrouter": "https://openrouter.ai/api/v1",
        }.get(backend)
    if endpoint is None:
        raise ValueError(f"no OpenAI-compatible endpoint for backend {backend!r}: give base_url")
    model = kw.get("model_name") or kw.get("model")
    if not model:
        raise ValueError("backend_kwargs has no model_name")
    m: dict[str, Any] = {"endpoint": endpoint, "model": model}
    if kw.get("api_key"):
        m["api_key"] = kw["api_key"]
    return {name: m}


def _config(models: dict | None, timeout: float) -> tuple[str, dict[str, str]]:
    """The serve config of the shared server: the bridge tools, the models."""
    route = _route_token()
    lines = ["[policy]"]
    allow = ["answer", *_TOOLS]
    if models:
        allow += ["model_query", "model_query_batched"]
    lines.append(f"allow = {_bridge.toml_value(allow)}")
    lines.append("max_calls = 1000000\nmax_tool_calls = 1000000\nmax_model_calls = 1000000")
    lines.append("[sessions]\nmax_sessions = 1024")
    lines.append(f"[limits]\ntimeout_ms = {int(timeout * 1000)}")
    schema = {"type": "object"}
    for tool in _TOOLS:
        lines.append(_bridge.tool_toml(tool, _bridge.url(route, tool), f"rlms host call {tool}", schema))
    env: dict[str, str] = {}
    for i, (name, m) in enumerate((models or {}).items()):
        lines.append(f"[models.{name}]")
        lines.append(f"endpoint = {_bridge.toml_value(m['endpoint'])}")
        lines.append(f"model = {_bridge.toml_value(m['model'])}")
        if m.get("api_key"):
            var = f"CELLBOX_RLM_KEY_{i}"
            env[var] = m["api_key"]
            lines.append(f'api_key_env = "{var}"')
        if i == 0:
            lines.append("default = true")
    return "\n".join(lines) + "\n", env


def _sandbox(binary: Any, models: dict | None, timeout: float) -> Sandbox:
    key = (str(binary), json.dumps(models or {}, sort_keys=True), timeout)
    with _shared_lock:
        sbx = _shared.get(key)
        if sbx is None or sbx.closed:
            text, env = _config(models, timeout)
            sbx = Sandbox(binary, config_text=text, env=env, languages=["python"])
            sbx.open()
            _shared[key] = sbx
        return sbx


@atexit.register
def _close_shared() -> None:
    for sbx in list(_shared.values()):
        try:
            sbx.close()
        except Exception:
            pass


_SETUP = r'''
import json as _rlms_json
_rlms_env = {token!r}
_rlms_mode = {mode!r}
_rlms_subcalls = {subcalls!r}
_rlms_compaction = {compaction!r}

def llm_query(prompt, model=None):
    """Query the LM with a single plain completion (no REPL, no recursion)."""
    if _rlms_mode == "cellbox":
        try:
            return str(capabilities.model_query(prompt, model))
        except Exception as e:
            return f"Error: LM query failed - {{e}}"
    return tools.rlms_llm_query(env=_rlms_env, prompt=prompt, model=model)

def llm_query_batched(prompts, model=None):
    """Query the LM with several prompts concurrently; replies in order."""
    if _rlms_mode == "cellbox":
        try:
            return [str(r) for r in capabilities.model_query_batched(list(prompts), model)]
        except Exception as e:
            return [f"Error: LM query failed - {{e}}"] * len(prompts)
    return tools.rlms_llm_query_batched(env=_rlms_env, prompts=list(prompts), model=model)

def rlm_query(prompt, model=None):
    """A recursive RLM sub-call (falls back to llm_query without one)."""
    if not _rlms_subcalls:
        return _rlms_scaffold["llm_query"](prompt, model)
    return tools.rlms_rlm_query(env=_rlms_env, prompt=prompt, model=model)

def rlm_query_batched(prompts, model=None):
    """Recursive RLM sub-calls, one per prompt, run concurrently; in order."""
    if not _rlms_subcalls:
        return _rlms_scaffold["llm_query_batched"](prompts, model)
    return tools.rlms_rlm_query_batched(env=_rlms_env, prompts=list(prompts), model=model)

def SHOW_VARS():
    """Show all available variables in the REPL environment."""
    shown = {{k: type(v).__name__ for k, v in globals().items() if k not in _rlms_hidden() and k != "answer"}}
    if not shown:
        return "No variables created yet. Use ```repl``` blocks to create variables."
    return f"Available variables: {{shown}}"

def _rlms_hidden():
    return set(_rlms_scaffold) | {{k for k in globals() if k.startswith("_")}} | set(_rlms_tool_names)

def _rlms_tool(name):
    def tool(*args, **kwargs):
        return tools.rlms_custom(env=_rlms_env, name=name, args=list(args), kwargs=kwargs)
    tool.__name__ = tool.__qualname__ = name
    return tool

_rlms_scaffold = {{"llm_query": llm_query, "llm_query_batched": llm_query_batched, "rlm_query": rlm_query,
                  "rlm_query_batched": rlm_query_batched, "SHOW_VARS": SHOW_VARS}}
_rlms_tool_names = {tool_names!r}
for _n in _rlms_tool_names:
    _rlms_scaffold[_n] = _rlms_tool(_n)
globals().update(_rlms_scaffold)
answer = {{"content": "", "ready": False}}

def _rlms_after():
    """After each cell, as rlms does: the REPL's own names back in place,
    then what the cell's variables are (small values inline)."""
    g = globals()
    for _k, _f in _rlms_scaffold.items():
        if g.get(_k) is not _f:
            g[_k] = _f
    if "context_0" in g:
        g["context"] = g["context_0"]
    if _rlms_compaction:
        g["history"] = g["_rlms_history"]
    elif "history_0" in g:
        g["history"] = g["history_0"]
    if not isinstance(g.get("answer"), dict):
        g["answer"] = {{"content": "", "ready": False}}
    hidden = _rlms_hidden()
    snap, room = {{}}, 256 * 1024
    for _k, _v in list(g.items()):
        if _k in hidden:
            continue
        entry = [type(_v).__name__]
        if type(_v) in (str, int, float, bool, type(None), list, dict, tuple):
            small = len(_v) <= {limit} if isinstance(_v, (str, list, dict, tuple)) else True
            if small:
                try:
                    text = _rlms_json.dumps(_v)
                except Exception:
                    text = None
                if text is not None and len(text) <= min({limit}, room):
                    entry.append(_v)
                    room -= len(text)
        snap[_k] = entry
    return {{"__rlms_locals__": snap}}
'''


class _RemoteValue:
    """A variable with no JSON value (a module, a function, an object): its
    type and repr, as read from the session."""

    def __init__(self, type_name: str, text: str | None):
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return self.text if self.text is not None else f"<{self.type_name}>"


class RemoteLocals(Mapping):
    """The session's variables as rlms' `locals`: names and small values
    come with each cell's result, a larger value is read when asked for."""

    def __init__(self, env: "CellboxREPL"):
        self._env = env

    def _snap(self) -> dict:
        return self._env._snapshot()

    def __getitem__(self, key: str) -> Any:
        entry = self._snap()[key]
        if len(entry) > 1:
            return entry[1]
        return self._env._fetch(key, entry[0])

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._snap()))

    def __len__(self) -> int:
        return len(self._snap())

    def __contains__(self, key: object) -> bool:
        return key in self._snap()

    def copy(self) -> dict:
        return {k: self[k] for k in self}

    def __repr__(self) -> str:
        return f"RemoteLocals({list(self._snap())})"


class CellboxREPL(NonIsolatedEnv):
    """rlms' REPL environment in a cellbox session (see the module doc)."""

    def __init__(
        self,
        lm_handler_address: tuple[str, int] | None = None,
        context_payload: dict | list | str | None = None,
        setup_code: str | None = None,
        persistent: bool = False,
        depth: int = 1,
        subcall_fn: Callable[[str, str | None], RLMChatCompletion] | None = None,
        custom_tools: dict[str, Any] | None = None,
        custom_sub_tools: dict[str, Any] | None = None,
        compaction: bool = False,
        max_concurrent_subcalls: int = 4,
        *,
        binary: Any = None,
        llm: str = "rlms",
        models: dict | None = None,
        timeout: float = 600.0,
        **kwargs: Any,
    ):
        super().__init__(persistent=persistent, depth=depth, max_concurrent_subcalls=max_concurrent_subcalls, **kwargs)
        if llm not in ("rlms", "cellbox"):
            raise ValueError('llm must be "rlms" (rlms\' LM handler) or "cellbox" (cellbox\'s models)')
        if llm == "cellbox" and not models:
            raise ValueError('llm="cellbox" needs models= (see models_from_backend)')
        self.lm_handler_address = lm_handler_address
        self.subcall_fn = subcall_fn
        self.compaction = compaction
        self.custom_tools = custom_tools or {}
        self.custom_sub_tools = custom_sub_tools if custom_sub_tools is not None else self.custom_tools
        validate_custom_tools(self.custom_tools)
        self.llm = llm
        self._models = models if llm == "cellbox" else None
        self._binary = binary
        self._timeout = timeout
        self._lock = threading.Lock()
        self._pending: list[RLMChatCompletion] = []
        self._context_count = 0
        self._history_count = 0
        self._snap: dict | None = {}
        self._closed = False
        self._session = None
        self._token = ""
        # Where contexts and histories are staged on the host before they go
        # to the session (as LocalREPL's temp_dir); removed by cleanup().
        self.temp_dir = tempfile.mkdtemp(prefix="cellbox-rlms-")
        self.locals = RemoteLocals(self)
        self.setup()
        if context_payload is not None:
            self.load_context(context_payload)
        if setup_code:
            self.execute_code(setup_code)

    # ------------------------------------------------------------ life

    def setup(self) -> None:
        import secrets

        self._sandbox = _sandbox(self._binary, self._models, self._timeout)
        self._session = self._sandbox.session()
        self._token = secrets.token_hex(16)
        _envs[self._token] = self
        tool_names = [n for n, e in self.custom_tools.items() if callable(extract_tool_value(e))]
        code = _SETUP.format(
            token=self._token,
            mode=self.llm,
            subcalls=self.subcall_fn is not None,
            compaction=self.compaction,
            tool_names=tool_names,
            limit=_INLINE_LIMIT,
        )
        if self.compaction:
            code += "_rlms_history = []\nhistory = _rlms_history\n"
        self._cell(code + "\n_rlms_after()")
        values = {n: extract_tool_value(e) for n, e in self.custom_tools.items() if not callable(extract_tool_value(e))}
        for name, value in values.items():
            self._put(name, value)

    def cleanup(self) -> None:
        """Close the session; forget the variables."""
        if self._closed:
            return
        self._closed = True
        _envs.pop(self._token, None)
        self._snap = {}
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        s, self._session = self._session, None
        if s is not None:
            try:
                s.close()
            except Exception:
                pass

    def __enter__(self) -> "CellboxREPL":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.cleanup()
        return False

    def __del__(self) -> None:
        try:
            self.cleanup()
        except Exception:
            pass

    # ------------------------------------------------------------ cells

    def _cell(self, code: str):
        if self._session is None:
            raise RuntimeError("this environment was cleaned up")
        try:
            ex = self._session.run_code(code)
        except ExecutionFailed as e:
            ex = e.execution
        if ex.status == "ok":
            self._take_snapshot(ex.value)
        return ex

    def _take_snapshot(self, value: Any) -> None:
        if isinstance(value, dict) and isinstance(value.get("__rlms_locals__"), dict):
            self._snap = value["__rlms_locals__"]
        else:
            self._snap = None

    def _snapshot(self) -> dict:
        if self._closed:
            return {}
        if self._snap is None:
            self._cell("_rlms_after()")
        return self._snap or {}

    def _fetch(self, name: str, type_name: str) -> Any:
        """A value too large to come with the cell's result: written by a
        cell as JSON in pieces under the download limit, then downloaded."""
        if self._session is None:
            raise KeyError(name)
        if type_name not in ("str", "int", "float", "bool", "NoneType", "list", "dict", "tuple"):
            ex = self._session.run_code(f"repr({name})[:65536]")
            return _RemoteValue(type_name, ex.value if ex.status == "ok" else None)
        code = (
            "import os as _rlms_os\n"
            "_rlms_os.makedirs('.rlms', exist_ok=True)\n"
            f"_rlms_b = _rlms_json.dumps({name}).encode()\n"
            f"_rlms_n = [open(f'.rlms/out.{{i}}', 'wb').write(_rlms_b[i * {_PIECE}:(i + 1) * {_PIECE}]) for i in range((len(_rlms_b) + {_PIECE - 1}) // {_PIECE})]\n"
            "del _rlms_b\n"
            "len(_rlms_n)"
        )
        ex = self._session.run_code(code)
        if ex.status != "ok":
            raise KeyError(name)
        data = b"".join(self._session.files.read(f".rlms/out.{i}", format="bytes") for i in range(int(ex.value)))
        self._session.run_code(f"for _i in range({int(ex.value)}):\n    _rlms_os.remove(f'.rlms/out.{{_i}}')")
        return json.loads(data.decode("utf-8"))

    def _put(self, name: str, value: Any) -> None:
        """Bind `name` in the session to a JSON value of any size (sent as
        files, read by a cell)."""
        staged = os.path.join(self.temp_dir, f"{name}.json")
        with open(staged, "w") as f:
            json.dump(value, f)
        with open(staged) as f:
            data = f.read()
        parts = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)] or [""]
        files = []
        for i, part in enumerate(parts):
            path = f".rlms/{name}.{i}.json"
            self._session.files.write(path, part)
            files.append(path)
        code = (
            "import os as _rlms_os\n"
            f"{name} = _rlms_json.loads(''.join(open(_p).read() for _p in {files!r}))\n"
            f"for _p in {files!r}:\n    _rlms_os.remove(_p)\n"
            "_rlms_after()"
        )
        ex = self._cell(code)
        if ex.status != "ok":
            raise RuntimeError(f"failed to load {name} into the session: {ex.error}")

    def execute_code(self, code: str) -> REPLResult:
        """Run `code` as one cell; its output, the variables, the final answer."""
        start = time.perf_counter()
        with self._lock:
            self._pending = []
            ex = self._cell(code + "\n_rlms_after()")
            pending = list(self._pending)
        stderr = ex.stderr
        if ex.status != "ok":
            err = ex.error
            detail = (err.traceback or f"{err.type}: {err.message}") if err else f"cell {ex.status}"
            stderr = (stderr + "\n" if stderr else "") + detail
        final = ex.final_answer
        if final is not None and not isinstance(final, str):
            final = str(final)
        return REPLResult(
            stdout=ex.stdout,
            stderr=stderr,
            locals=self.locals,
            execution_time=time.perf_counter() - start,
            rlm_calls=pending,
            final_answer=final,
        )

    # ------------------------------------------------------------ contexts

    def load_context(self, context_payload: dict | list | str) -> None:
        self.add_context(context_payload, 0)

    def add_context(self, context_payload: dict | list | str, context_index: int | None = None) -> int:
        if context_index is None:
            context_index = self._context_count
        self._put(f"context_{context_index}", context_payload)
        self._context_count = max(self._context_count, context_index + 1)
        return context_index

    def get_context_count(self) -> int:
        return self._context_count

    def add_history(self, message_history: list[dict[str, Any]], history_index: int | None = None) -> int:
        if history_index is None:
            history_index = self._history_count
        self._put(f"history_{history_index}", copy.deepcopy(message_history))
        self._history_count = max(self._history_count, history_index + 1)
        return history_index

    def get_history_count(self) -> int:
        return self._history_count

    def append_compaction_entry(self, entry: list[dict[str, Any]] | dict[str, Any]) -> None:
        if not self.compaction:
            return
        self._put("_rlms_entry", copy.deepcopy(entry))
        self._cell("_rlms_history.append(_rlms_entry)\ndel _rlms_entry\n_rlms_after()")

    def update_handler_address(self, address: tuple[str, int]) -> None:
        """The next turn of a persistent RLM (each completion has a handler
        of its own): its answer starts unready again, as in rlms' docker
        environment (a ready answer of the last turn would end this one)."""
        self.lm_handler_address = address
        if self._session is not None:
            self._cell("answer = {'content': '', 'ready': False}\n_rlms_after()")

    # ------------------------------------------------------------ host calls

    def _host_call(self, name: str, args: dict) -> Any:
        model = args.get("model")
        if name == "rlms_llm_query":
            return self._llm_query(args.get("prompt"), model)
        if name == "rlms_llm_query_batched":
            return self._llm_query_batched(list(args.get("prompts") or []), model)
        if name == "rlms_rlm_query":
            return self._rlm_query(args.get("prompt"), model)
        if name == "rlms_rlm_query_batched":
            return self._rlm_query_batched(list(args.get("prompts") or []), model)
        if name == "rlms_custom":
            tool = self.custom_tools.get(str(args.get("name")))
            fn = extract_tool_value(tool) if tool is not None else None
            if not callable(fn):
                raise RuntimeError(f"no custom tool {args.get('name')!r}")
            return fn(*(args.get("args") or []), **(args.get("kwargs") or {}))
        raise RuntimeError(f"unknown host call {name}")

    def _llm_query(self, prompt: Any, model: str | None) -> str:
        from rlm.core.comms_utils import LMRequest, send_lm_request

        if not self.lm_handler_address:
            return "Error: No LM handler configured"
        try:
            response = send_lm_request(self.lm_handler_address, LMRequest(prompt=prompt, model=model, depth=self.depth))
        except Exception as e:
            return f"Error: LM query failed - {e}"
        if not response.success:
            return f"Error: {response.error}"
        self._pending.append(response.chat_completion)
        return response.chat_completion.response

    def _llm_query_batched(self, prompts: list, model: str | None) -> list[str]:
        from rlm.core.comms_utils import send_lm_request_batched

        if not self.lm_handler_address:
            return ["Error: No LM handler configured"] * len(prompts)
        try:
            responses = send_lm_request_batched(self.lm_handler_address, prompts, model=model, depth=self.depth)
        except Exception as e:
            return [f"Error: LM query failed - {e}"] * len(prompts)
        out = []
        for r in responses:
            if r.success:
                self._pending.append(r.chat_completion)
                out.append(r.chat_completion.response)
            else:
                out.append(f"Error: {r.error}")
        return out

    def _subcall(self, prompt: Any, model: str | None) -> tuple[RLMChatCompletion | None, str]:
        try:
            completion = self.subcall_fn(prompt, model)  # type: ignore[misc]
        except Exception as e:
            return None, f"Error: RLM query failed - {e}"
        return completion, completion.response

    def _rlm_query(self, prompt: Any, model: str | None) -> str:
        if self.subcall_fn is None:
            return self._llm_query(prompt, model)
        completion, text = self._subcall(prompt, model)
        if completion is not None:
            self._pending.append(completion)
        return text

    def _rlm_query_batched(self, prompts: list, model: str | None) -> list[str]:
        if self.subcall_fn is None:
            return self._llm_query_batched(prompts, model)
        if not prompts:
            return []
        workers = max(1, min(self.max_concurrent_subcalls, len(prompts)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            done = list(pool.map(lambda p: self._subcall(p, model), prompts))
        for completion, _ in done:
            if completion is not None:
                self._pending.append(completion)
        return [text for _, text in done]


def register(*, subcalls: bool = True, **defaults: Any) -> None:
    """Make `RLM(..., environment="cellbox")` use `CellboxREPL`.

    rlms picks environments by name in `rlm.environments.get_environment`;
    this wraps it (and the name rlms' core imported) so that "cellbox" makes
    a `CellboxREPL` with `environment_kwargs` plus `defaults` (e.g.
    `binary=`, `llm=`, `models=`). With `subcalls`, an RLM with
    `max_depth > 1` also gets its sub-RLM callback passed to the
    environment, as rlms does for its local one. Calling it again replaces
    the defaults."""
    import rlm.core.rlm as core
    import rlm.environments as envs

    original = getattr(envs.get_environment, "__cellbox_original__", envs.get_environment)

    def get_environment(environment: str, environment_kwargs: dict) -> Any:
        if environment == "cellbox":
            return CellboxREPL(**{**defaults, **environment_kwargs})
        return original(environment, environment_kwargs)

    get_environment.__cellbox_original__ = original  # type: ignore[attr-defined]
    envs.get_environment = get_environment
    core.get_environment = get_environment
    if subcalls and not getattr(core.RLM._spawn_completion_context, "__cellbox__", False):
        spawn = core.RLM._spawn_completion_context

        def _spawn(self: Any, prompt: Any):  # the same context, with subcall_fn for "cellbox"
            if self.environment_type == "cellbox" and self.max_depth > 1 and "subcall_fn" not in self.environment_kwargs:
                self.environment_kwargs = {**self.environment_kwargs, "subcall_fn": self._subcall}
            return spawn(self, prompt)

        _spawn.__cellbox__ = True  # type: ignore[attr-defined]
        core.RLM._spawn_completion_context = _spawn


__all__ = ["CellboxREPL", "RemoteLocals", "models_from_backend", "register"]
