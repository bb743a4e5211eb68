"""cellbox runtime shim for Python cells.

The worker applies its sandbox and then runs `python3 -I -S -B -c <this>`
with fd 0 = /dev/null, fd 1/2 = the stdout/stderr pipes and fd 3 = the
protocol channel (4-byte big-endian length + a UTF-8 JSON object tagged
"t"; the field names are those of src/protocol/messages.rs).

One run of the shim is one cell:
  1. read the `start` frame;
  2. build the cell's globals: the carried `vars`, then the replayed
     `definitions` (a failure is reported on stderr and skipped), then the
     vars again (a JSON value bound after a definition of the same name is
     the newer binding). The capability functions the policy allows are
     not globals: they live in the cell's own builtins (its
     `__builtins__`, a copy of the real ones), so a name the cell or an
     earlier cell bound wins over a capability of the same name, and the
     capabilities never overwrite it; a denied one is not there at all;
  3. run the code statement by statement; a final expression statement is
     the cell's value (like Jupyter);
  4. send `done` and leave with _exit, so no atexit hook, `__del__` or
     thread outlives the cell.

Carried to the next cell: globals holding JSON values of the exact types
None, bool, int (64-bit range), float (finite), str, list, tuple (it comes
back as a list) and dict with str keys; and the source of the top-level
def / async def / class / import / from-import statements. Every other
global is listed in `dropped` with a reason; names starting with "_" are
private to the cell.

Start-up is paid by every cell, so the shim imports only modules that are
built in or tiny C extensions (`_ast`, not `ast`; `_json`, not `json`,
which drags in `re`), and the source compiled on every start is kept to
what a successful cell needs: error formatting and the rarer paths live in
the `_COLD` string below, compiled only when needed. Compiling this source
is still most of the shim's start-up cost; `--precompile` (at the end of
this file) prints the compiled shim so that loader.py can start a cell
without compiling anything.

The cell runs in this same interpreter and can always write to fd 3; the
shim keeps no protocol object for it to pick up, and treats every object the
cell made as hostile while building `done`: exact type checks only, and the
few user methods it must call (repr of the value, str of an exception,
flushing the cell's own sys.stdout) run while the cell's deadline is armed.
"""

from builtins import *  # noqa: F403 - the shim's own binding of every builtin,
# so that a cell rebinding builtins.len or builtins.str cannot break `done`.
import sys
import posix
import _signal
import _thread
import _ast

try:
    import _json
except ImportError:  # an interpreter built without the accelerator
    _json = None

_FD = 3
_CELL = "<cell>"
_EXIT_PROTOCOL = 7  # as the worker's own protocol failures
_ONLY_AST = 0x400
_AWAIT = 0x2000  # PyCF_ALLOW_TOP_LEVEL_AWAIT
_FUTURE_MASK = 0x1FE0000  # the CO_FUTURE_* flags a code object records
_CO_COROUTINE = 0x80
_G = globals()
_MISSING = object()
_DEF_TYPES = (_ast.FunctionDef, _ast.AsyncFunctionDef, _ast.ClassDef, _ast.Import, _ast.ImportFrom)
_type_qualname = type.__dict__["__qualname__"].__get__
_type_module = type.__dict__["__module__"].__get__

# Mutable state of this run (a dict, so no `global` statements).
_st = {"max": 1 << 31, "armed": False, "expired": False, "io": False, "id": 0, "pid": 0, "ms": 0, "loop": None}
_lock = _thread.allocate_lock()
_sources = {}  # filename -> source lines, for tracebacks
# Given back on MemoryError so `done` can still be built. `bytes(n)` is
# calloc'd: fresh zero pages the kernel maps only when touched, so the
# reserve holds address space (what RLIMIT_AS and RLIMIT_DATA count) but
# no memory, in the zygote or in any process forked from it.
_reserve = [bytes(1 << 18)]


class CellTimeout(BaseException):
    """Raised in the cell when its time limit passes."""


class _ProtocolError(Exception):
    pass


class _NotJSON(Exception):
    def __init__(self, what):
        self.what = what
        self.path = ""


# ---------------------------------------------------------------- JSON

if _json is not None:

    class _ScanContext:
        strict = True
        object_hook = object_pairs_hook = None
        parse_float = float
        parse_int = int

        def parse_constant(name):
            raise ValueError("non-finite number " + name + " in JSON")

    _scan = _json.make_scanner(_ScanContext)
    _iterencode = _json.make_encoder(None, None, _json.encode_basestring, None, ":", ",", False, False, False)

    def _loads(text):
        try:
            value, end = _scan(text, 0)
        except StopIteration:
            raise ValueError("no JSON value") from None
        if text[end:].strip():
            raise ValueError("trailing data after the JSON value")
        return value

    def _dumps(value):
        return "".join(_iterencode(value, 0))

else:
    import json as _pyjson

    def _reject_constant(name):
        raise ValueError("non-finite number " + name + " in JSON")

    def _loads(text):
        return _pyjson.loads(text, parse_constant=_reject_constant)

    def _dumps(value):
        return _pyjson.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _check(v, active):
    """Raise _NotJSON unless `v` is made only of exact JSON types. Calls no
    method of any object, so it is safe on hostile values."""
    t = type(v)
    if t is str or t is bool or v is None or t is ModelReply:
        return
    if t is int:
        if -(1 << 63) <= v < (1 << 64):
            return
        raise _NotJSON("an integer outside the 64-bit range that JSON carries exactly")
    if t is float:
        if v - v == 0.0:
            return
        raise _NotJSON("a NaN or infinite float, which JSON cannot represent")
    if t is not list and t is not tuple and t is not dict:
        raise _NotJSON("a value of type " + _type_name(t))
    key = id(v)
    if key in active:
        raise _NotJSON("a reference cycle")
    active.add(key)
    if t is dict:
        for k, item in v.items():
            if type(k) is not str:
                raise _NotJSON("a dict key of type " + _type_name(type(k)) + " (keys must be str)")
            try:
                _check(item, active)
            except _NotJSON as e:
                e.path = "[" + _dumps(_clean(k)) + "]" + e.path
                raise
    else:
        for i, item in enumerate(v):
            try:
                _check(item, active)
            except _NotJSON as e:
                e.path = "[%d]%s" % (i, e.path)
                raise
    active.discard(key)


def _to_json(v):
    """JSON text of `v`; raises _NotJSON (or RecursionError) if it has none."""
    _check(v, set())
    text = _dumps(v)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _NotJSON("a string that is not valid Unicode (a lone surrogate)") from None
    return text


_MAX_PLAIN_REPR = 64 * 1024


def _plain_repr(v):
    """JSON string of repr(v) for a value made of exact JSON types, as the
    REPL shows it (Python's spelling: 'a', True, None, (1, 2))."""
    text = repr(v)
    if len(text) > _MAX_PLAIN_REPR:
        text = text[:_MAX_PLAIN_REPR] + "... [%d characters left out]" % (len(text) - _MAX_PLAIN_REPR)
    return _dumps(_clean(text))


def _clean(s):
    """A str that encodes as UTF-8 (lone surrogates become escapes)."""
    if type(s) is not str:
        return "<not a str>"
    return s if s.isascii() else s.encode("utf-8", "backslashreplace").decode("utf-8")


def _type_name(t):
    """`module.QualName` of a type, read past any metaclass trickery."""
    try:
        name, mod = _type_qualname(t), _type_module(t)
    except Exception:
        return "<unknown type>"
    if type(mod) is str and mod != "builtins" and mod != "__main__":
        name = mod + "." + name
    return _clean(name)


# ---------------------------------------------------------------- protocol


def _die(message):
    """The channel is unusable: say why on the real stderr and leave."""
    try:
        posix.write(2, ("cellbox python shim: protocol error: %s\n" % message).encode("utf-8", "replace"))
    finally:
        posix._exit(_EXIT_PROTOCOL)


def _read_exact(n):
    chunks = []
    while n:
        b = posix.read(_FD, min(n, 1 << 24))
        if not b:
            raise _ProtocolError("the channel was closed")
        chunks.append(b)
        n -= len(b)
    return b"".join(chunks)


def _recv():
    length = int.from_bytes(_read_exact(4), "big")
    if length > _st["max"]:
        raise _ProtocolError("a frame of %d bytes exceeds the limit of %d" % (length, _st["max"]))
    msg = _loads(_read_exact(length).decode("utf-8"))
    if type(msg) is not dict or type(msg.get("t")) is not str:
        raise _ProtocolError('a frame is not an object with a "t" tag')
    return msg


def _send(data):
    if len(data) > _st["max"]:
        raise _ProtocolError("a frame of %d bytes exceeds the limit of %d" % (len(data), _st["max"]))
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[posix.write(_FD, view) :]


def _call(cap, args):
    """One capability round-trip: send `call`, block for its `reply`."""
    if posix.getpid() != _st["pid"]:
        raise RuntimeError("capabilities cannot be called from a forked child process")
    try:
        payload = _to_json(args)
    except _NotJSON as e:
        raise TypeError("argument%s of %s() is not JSON-serializable: it contains %s" % (e.path, cap, e.what)) from None
    except RecursionError:
        raise TypeError("arguments of %s() are nested too deeply for JSON" % cap) from None
    main = _thread.get_ident() == _MAIN_THREAD
    with _lock:
        cid = _st["id"] + 1
        data = ('{"t":"call","id":%d,"cap":%s,"args":%s}' % (cid, _dumps(cap), payload)).encode("utf-8")
        if len(data) > _st["max"]:
            raise ValueError("arguments of %s() are too large: the frame limit is %d bytes" % (cap, _st["max"]))
        _st["id"] = cid
        # While the main thread waits on the channel the deadline only takes
        # note: a half-written frame would break the channel for `done`.
        if main:
            _st["io"] = True
        try:
            _send(data)
            reply = _recv()
        except (_ProtocolError, OSError, ValueError) as e:
            _die("capability call %s: %s" % (cap, e))
        finally:
            if main:
                _st["io"] = False
    if main and _st["expired"] and _st["armed"]:
        raise CellTimeout(_timeout_message())
    if reply["t"] != "reply" or type(reply.get("id")) is not int or reply["id"] != cid:
        _die("expected the reply to call %d, got a %r frame with id %r" % (cid, reply["t"], reply.get("id")))
    err = reply.get("error")
    if err is None:
        return reply.get("ok")
    if type(err) is not dict or type(err.get("kind")) is not str or type(err.get("message")) is not str:
        _die("malformed error in the reply to call %d" % cid)
    kind = err["kind"]
    if kind == "denied" or kind == "unknown":
        raise PermissionError(err["message"])
    if kind == "invalid_args":
        raise ValueError(err["message"])
    raise RuntimeError(err["message"])


def _capability(name, params):
    """The cell-side function for one capability: positional arguments map
    onto `params` in order; the supervisor validates the rest."""

    def capability(*args, **kwargs):
        if len(args) > len(params):
            raise TypeError("%s() takes at most %d positional arguments (%d given)" % (name, len(params), len(args)))
        merged = dict(zip(params, args))
        for k in kwargs:
            if k in merged:
                raise TypeError("%s() got multiple values for argument %r" % (name, k))
        merged.update(kwargs)
        return _call(name, merged)

    capability.__name__ = capability.__qualname__ = name
    capability.__module__ = "cellbox"
    capability.__doc__ = "%s(%s): a cellbox capability (one call to the supervisor)." % (name, ", ".join(params))
    return capability


class ModelReply(str):
    """A model's reply text; `.usage` (input_tokens, output_tokens), `.model`
    and `.cost` tell what it took. Carried to later cells as a plain str."""

    usage = None
    model = None
    cost = None


def _model_reply(v):
    if type(v) is not dict or type(v.get("text")) is not str:
        _die("malformed model reply %r" % (type(v),))
    r = ModelReply(v["text"])
    r.usage, r.model, r.cost = v.get("usage"), v.get("model"), v.get("cost")
    return r


# Model capabilities and the names recursive-language-model code calls them by.
_MODEL_ALIASES = {"model_query": "llm_query", "model_query_batched": "llm_query_batched"}
# Model capabilities whose value is one reply (a ModelReply), or a list of them.
_MODEL_SINGLE = ("model_query", "summarize")
_MODEL_CAPS = _MODEL_SINGLE + ("model_query_batched",)


def _model_capability(name, params):
    """model_query / summarize / model_query_batched: the reply as a ModelReply."""
    inner = _capability(name, params)
    if name in _MODEL_SINGLE:
        def capability(*args, **kwargs):
            return _model_reply(inner(*args, **kwargs))
    else:
        def capability(*args, **kwargs):
            return [_model_reply(v) for v in inner(*args, **kwargs)]
    capability.__name__ = capability.__qualname__ = name
    capability.__module__ = "cellbox"
    capability.__doc__ = inner.__doc__
    return capability


def call(name, args=None, /, **kwargs):
    """call(name, {args}) or call(name, **args): call a capability by name."""
    if type(name) is not str:
        raise TypeError("call() needs the capability name as a str")
    if args is not None and type(args) is not dict:
        raise TypeError("call() takes the arguments as a dict or as keywords")
    merged = dict(args or ())
    for k in kwargs:
        if k in merged:
            raise TypeError("call() got multiple values for argument %r" % k)
    merged.update(kwargs)
    return _call(name, merged)


call.__module__ = "cellbox"


def tool_call(name, args=None, /, **kwargs):
    """tool_call(name, {args}) or tool_call(name, **args): call a tool (any capability) by name."""
    return call(name, args, **kwargs)


def tool_call_batched(calls):
    """tool_call_batched([(name, {args}), ...]): the results in order; a call
    that fails gives {"error": message, "type": exception name} in its place."""
    out = []
    for item in calls:
        if type(item) is dict:
            name, args = item.get("name"), item.get("args")
        else:
            name, args = item
        try:
            out.append(call(name, args))
        except (PermissionError, ValueError, RuntimeError, TypeError) as e:
            out.append({"error": str(e), "type": type(e).__name__})
    return out


class _ToolGroup:
    """tools.NAME(**args), and tools.SERVER.TOOL(**args) for a tool named SERVER.TOOL."""

    __slots__ = ("_prefix",)

    def __init__(self, prefix):
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _ToolFn(self._prefix + name)

    def __setattr__(self, name, value):
        raise AttributeError("tools is read-only")

    def __repr__(self):
        return "<cellbox tools %s>" % (self._prefix.rstrip(".") or "")


class _ToolFn(_ToolGroup):
    __slots__ = ()

    def __call__(self, args=None, /, **kwargs):
        return call(self._prefix, args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _ToolFn(self._prefix + "." + name)


for _f in (tool_call, tool_call_batched):
    _f.__module__ = "cellbox"


class _Capabilities:
    """capabilities.NAME(...): any capability by name, allowed or not (a
    denied or unknown one raises PermissionError, as the supervisor
    answers), whatever the cell bound to NAME itself."""

    __slots__ = ()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: (_st.get("caps") or {}).get(name, _ToolFn(name))(*args, **kwargs)

    def __setattr__(self, name, value):
        raise AttributeError("capabilities is read-only")

    def __dir__(self):
        return sorted(_st.get("caps") or ())

    def __repr__(self):
        return "<cellbox capabilities: %s>" % (", ".join(sorted(_st.get("caps") or ())) or "none")


class _AnswerDict(dict):
    """The final-answer dict of recursive-language-model code: set
    answer["content"] and answer["ready"] = True (or bind `answer` to such
    a dict) and the content is the cell's final answer."""

    __slots__ = ()


class _CallableAnswer(_AnswerDict):
    """`answer` where the policy allows it: also answer(value)."""

    __slots__ = ()

    def __call__(self, value):
        return _call("answer", {"value": value})


def _answer_of(g):
    """The answer dict the cell sees: its own `answer` if it bound one,
    else the one in its builtins."""
    v = g.get("answer", _MISSING)
    if v is _MISSING:
        v = _st.get("answer")
    return v if isinstance(v, dict) else None


def _answer_state(g, out):
    a = _answer_of(g)
    if a is None:
        return None
    try:
        return (id(a), bool(a.get("ready")), id(a.get("content")))
    except Exception:
        return None


def _report_answer(g, out):
    """An answer dict made ready by this cell gives its content as the
    final answer, through the `answer` capability (so the policy, the
    budget and the record apply as to answer(value))."""
    a = _answer_of(g)
    if a is None:
        return
    try:
        ready = bool(a.get("ready"))
    except Exception:
        return
    if not ready or _answer_state(g, out) == out.get("answer_seen"):
        return
    content = a.get("content")
    try:
        _to_json(content)
    except Exception:
        content = _cold("_safe_str")(content)
    try:
        _call("answer", {"value": content})
    except (PermissionError, ValueError, RuntimeError):
        pass


def _show_vars(g):
    def SHOW_VARS():
        """The cell's variables and their types (as rlms shows them)."""
        shown = {}
        for k, v in list(g.items()):
            if type(k) is str and k[:1] != "_" and k != "answer":
                shown[k] = _type_qualname(type(v))
        if not shown:
            return "No variables created yet. Use ```repl``` blocks to create variables."
        return "Available variables: %r" % (shown,)

    return SHOW_VARS


def _final_var(g):
    def FINAL_VAR(name):
        """Give the variable `name` (or a value) as the final answer."""
        if type(name) is str and name.strip() in g:
            value = g[name.strip()]
        elif type(name) is str and name.isidentifier():
            raise NameError("FINAL_VAR: no variable named %r" % name)
        else:
            value = name
        a = _answer_of(g)
        if a is None:
            a = g["answer"] = _AnswerDict()
        a["content"] = value
        a["ready"] = True
        return value

    return FINAL_VAR


def _rlm_queries():
    def rlm_query(prompt, model=None):
        """A sub-agent (a model writing code in a fresh session, one level
        deeper) works on `prompt`; its answer."""
        args = {"task": prompt}
        if model is not None:
            args["model"] = model
        return _call("agent_query", args)

    def rlm_query_batched(prompts, model=None):
        """rlm_query for each prompt, answers in order; a failed one gives
        "Error: ..." in its place."""
        out = []
        for p in prompts:
            try:
                out.append(rlm_query(p, model))
            except (PermissionError, ValueError, RuntimeError) as e:
                out.append("Error: RLM query failed - %s" % e)
        return out

    for f in (rlm_query, rlm_query_batched):
        f.__module__ = "cellbox"
    return rlm_query, rlm_query_batched


def _cell_builtins(caps, out, g):
    """The cell's builtins: Python's, plus the capabilities the policy
    allows (spec `allowed`, absent meaning allowed) and the names
    recursive-language-model code uses. Python looks a name up in the
    cell's globals first, so whatever the cell binds wins."""
    b = type(sys)("builtins")
    b.__dict__.update(sys.modules["builtins"].__dict__)
    d = b.__dict__
    allowed = {}
    for spec in caps:
        name = spec["name"]
        make = _model_capability if name in _MODEL_CAPS else _capability
        f = make(name, tuple(map(str, spec["params"])))
        _st.setdefault("caps", {})[name] = f
        if spec.get("allowed", True) is not True:
            continue
        allowed[name] = f
        if "." not in name:
            d[name] = f
        if name in _MODEL_ALIASES:
            d[_MODEL_ALIASES[name]] = f
    if "agent_query" in allowed:
        d["rlm_query"], d["rlm_query_batched"] = _rlm_queries()
    # One answer dict per process: a live session's state carries it on.
    kind = _CallableAnswer if "answer" in allowed else _AnswerDict
    a = _st.get("answer")
    if type(a) is not kind:
        a = _st["answer"] = kind(a if a is not None else {"content": "", "ready": False})
    d["answer"] = a
    d["call"] = call
    d["tool_call"] = tool_call
    d["tool_call_batched"] = tool_call_batched
    d["tools"] = _ToolGroup("")
    d["capabilities"] = _Capabilities()
    d["SHOW_VARS"] = _show_vars(g)
    d["FINAL_VAR"] = _final_var(g)
    if _st.get("live"):
        d["checkpoint"] = _live_request("checkpoint", out)
        d["restore"] = _live_request("restore", out)
    out["installed"] = d
    return b


# ---------------------------------------------------------------- deadline


def _timeout_message():
    return "the cell exceeded its time limit of %d ms" % _st["ms"]


def _on_alarm(signum, frame):
    _st["expired"] = True
    if _st["armed"] and not _st["io"]:
        raise CellTimeout(_timeout_message())


# ---------------------------------------------------------------- the cell


def _split_lines(src):
    # The tokenizer's line ends only; str.splitlines also splits on \f,
    # \x1c, \u2028 ... and would disagree with the compiler's line numbers.
    return src.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _segment(lines, node):
    """Exact source of a top-level statement, decorators included."""
    first, col = node.lineno, node.col_offset
    decorators = getattr(node, "decorator_list", None)
    if decorators:
        # The "@" opens a logical line at column 0 (top level); a backslash
        # continuation may put it on an earlier physical line.
        first, col = decorators[0].lineno, 0
        while first > 1 and not lines[first - 1].lstrip().startswith("@"):
            first -= 1
    last, end = node.end_lineno, node.end_col_offset
    if first == last:
        return lines[first - 1].encode("utf-8")[col:end].decode("utf-8")
    parts = [lines[first - 1].encode("utf-8")[col:].decode("utf-8")]
    parts.extend(lines[first : last - 1])
    parts.append(lines[last - 1].encode("utf-8")[:end].decode("utf-8"))
    return "\n".join(parts)


def _run_code(code, g):
    """Evaluate a compiled statement; drive it if it awaits at top level."""
    result = eval(code, g)
    if code.co_flags & _CO_COROUTINE:
        loop = _st["loop"]
        if loop is None:
            import asyncio

            loop = _st["loop"] = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
        result = loop.run_until_complete(result)
    return result


# ---------------------------------------------------------------- packages

# Numeric libraries start one thread per core unless told otherwise; a cell
# has a process limit and one core's worth of CPU time.
_PACKAGE_ENV = (("OPENBLAS_NUM_THREADS", "1"), ("OMP_NUM_THREADS", "1"), ("MKL_NUM_THREADS", "1"), ("MPLBACKEND", "module://_cellbox_backend"))


def _notebook_start(start):
    """Packages and display limits of this cell, from its start frame."""
    # A live session's state process carries the last cell's items along.
    _display["items"] = []
    _display["dropped"] = []
    _display["total"] = 0
    limits = start.get("limits")
    if type(limits) is dict:
        for key in ("max_display_bytes", "max_display_item_bytes"):
            v = limits.get(key)
            if type(v) is int and v >= 0:
                _display[key] = min(v, _st["max"] // 4)
    _use_packages(start.get("python_paths"))


def _use_packages(paths):
    """The profile's package directories on sys.path (before the scratch
    dir, which a cell's own modules come from) and the environment the
    numeric and plotting libraries read. Nothing without package paths."""
    if not paths:
        return
    if type(paths) is not list or any(type(p) is not str for p in paths):
        raise _ProtocolError("the start frame has a malformed python_paths field")
    _st["python_paths"] = paths
    _install_backend()
    import os

    for k, v in _PACKAGE_ENV:
        os.environ.setdefault(k, v)
    try:
        cwd = posix.getcwd()
    except OSError:
        cwd = None
    if cwd is not None and "MPLCONFIGDIR" not in os.environ:
        os.environ["MPLCONFIGDIR"] = cwd + "/.matplotlib"
    at = len(sys.path) - 1 if sys.path and sys.path[-1] == cwd else len(sys.path)
    for p in paths:
        if p not in sys.path:
            sys.path.insert(at, p)
            at += 1


# ---------------------------------------------------------------- display

# Rich values for the result's `display` list (like Jupyter's display_data):
# figures a cell made with matplotlib, and the _repr_png_ / _repr_html_ /
# _repr_markdown_ of its last value. Images travel as base64. The byte
# limits (of the base64 or UTF-8 text) come with the start frame; what does
# not fit is listed in `display_dropped`.
_display = {"items": [], "dropped": [], "total": 0, "max_display_bytes": 327680, "max_display_item_bytes": 262144}
_REPR_MIMES = (("_repr_png_", "image/png"), ("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"))


def _display_add(mime, data):
    """Keep one display item (`data`: base64 for an image, else text)."""
    n = len(data) if data.isascii() else len(data.encode("utf-8", "replace"))
    if n > _display["max_display_item_bytes"]:
        reason = "larger than max_display_item_bytes (%d)" % _display["max_display_item_bytes"]
    elif _display["total"] + n > _display["max_display_bytes"]:
        reason = "over max_display_bytes (%d) for the whole cell" % _display["max_display_bytes"]
    else:
        _display["items"].append({"mime": mime, "data": _clean(data)})
        _display["total"] += n
        return
    _display["dropped"].append({"mime": mime, "bytes": n, "reason": reason})


def _b64(data):
    import binascii

    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _display_value(value):
    """The rich representations of the cell's last value. A _repr_*_
    method is the cell's code: it runs under the cell's deadline."""
    for method, mime in _REPR_MIMES:
        try:
            f = getattr(value, method, None)
            if f is None or type(value) is type:
                continue
            data = f()
        except CellTimeout:
            raise
        except Exception as e:
            _display["dropped"].append({"mime": mime, "bytes": 0, "reason": "%s() raised %s" % (method, _type_name(type(e)))})
            continue
        if type(data) is tuple and data:
            data = data[0]  # (data, metadata)
        if data is None:
            continue
        if mime == "image/png" and type(data) is bytes:
            data = _b64(data)
        if type(data) is not str:
            _display["dropped"].append({"mime": mime, "bytes": 0, "reason": "%s() returned %s, not %s" % (method, _type_name(type(data)), "bytes" if mime == "image/png" else "str")})
            continue
        _display_add(mime, data)


def _display_figures():
    """Every open matplotlib figure as a PNG, in order; then closed (as
    Jupyter shows a figure left open at the end of a cell)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    import io

    for num in plt.get_fignums():
        buf = io.BytesIO()
        plt.figure(num).savefig(buf, format="png")
        _display_add("image/png", _b64(buf.getvalue()))
    plt.close("all")


# matplotlib's backend for cells (MPLBACKEND=module://_cellbox_backend):
# Agg, with plt.show() sending the open figures to `display`.
_BACKEND_SRC = '''
from matplotlib.backends.backend_agg import _BackendAgg
from matplotlib.backend_bases import _Backend


@_Backend.export
class _BackendCellbox(_BackendAgg):
    @staticmethod
    def show(*args, **kwargs):
        _cellbox_show()
'''


class _BackendFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "_cellbox_backend":
            return None
        return type(sys.__spec__)(name, _BackendFinder)

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        module.__dict__["_cellbox_show"] = _display_figures
        exec(compile(_BACKEND_SRC, "<cellbox matplotlib backend>", "exec", 0, True), module.__dict__)


def _install_backend():
    if _BackendFinder not in sys.meta_path:
        sys.meta_path.append(_BackendFinder)


def _execute(start, out):
    """Everything that runs cell-controlled code, under the deadline."""
    code = start.get("code")
    carried = start.get("vars") or {}
    definitions = start.get("definitions") or []
    caps = start.get("capabilities") or []
    if type(code) is not str or type(carried) is not dict or type(definitions) is not list or type(caps) is not list:
        raise _ProtocolError("the start frame has a malformed code, vars, definitions or capabilities field")
    _notebook_start(start)
    reserved = out["reserved"]
    for spec in caps:
        if type(spec) is not dict or type(spec.get("name")) is not str or type(spec.get("params")) is not list:
            raise _ProtocolError("malformed capability spec %r" % (spec,))

    # The cell's module is a real module installed as __main__, so pickle,
    # dataclasses and typing find classes the cell defines. In a session's
    # state process it is the live namespace every cell of the session
    # runs in (see zygote.py, `_state_main`).
    module = _st.get("live_module")
    if module is None:
        module = type(sys)("__main__")
        if _st.get("live"):
            _st["live_module"] = module
    sys.modules["__main__"] = module
    g = out["g"] = module.__dict__
    # Before any definition is replayed: a function keeps the builtins of
    # the globals it was defined in.
    g["__builtins__"] = _cell_builtins(caps, out, g)
    if _st.get("live"):
        out["before"] = dict(g)
    def_bound = out["def_bound"]
    for k, v in carried.items():
        if k not in reserved:
            g[k] = v
    flags = 0
    for d in definitions:
        names = d.get("names") if type(d) is dict else None
        source = d.get("source") if type(d) is dict else None
        if type(names) is not list or type(source) is not str:
            raise _ProtocolError("malformed definition %r" % (d,))
        label = ", ".join(map(str, names))
        filename = "<definition of %s>" % label
        _sources[filename] = _split_lines(source)
        try:
            co = compile(source, filename, "exec", flags, True)
            flags |= co.co_flags & _FUTURE_MASK  # `from __future__` carries on
            exec(co, g)
        except (Exception, SystemExit) as e:
            sys.stderr.write("cellbox: could not restore %s from an earlier cell: %s: %s\n" % (label, _type_name(type(e)), _cold("_safe_str")(e)))
            continue
        for n in names:
            def_bound[n] = g.get(n, _MISSING)
    out["earlier"] = tuple(def_bound)
    for k, v in carried.items():
        if k not in reserved:
            g[k] = v
    out["answer_seen"] = _answer_state(g, out)
    try:
        _run_statements(code, g, flags, out)
        _display_figures()
        _report_answer(g, out)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except CellTimeout:
                raise
            except BaseException:
                pass


def _run_statements(code, g, flags, out):
    lines = _sources[_CELL] = _split_lines(code)
    reserved = out["reserved"]
    def_bound = out["def_bound"]
    body = compile(code, _CELL, "exec", _ONLY_AST | _AWAIT | flags, True).body
    last = len(body) - 1
    for i, node in enumerate(body):
        if "linecache" in sys.modules:
            _cold("_publish_sources")()
        kind = type(node)
        if i == last and kind is _ast.Expr:
            co = compile(_ast.Expression(node.value), _CELL, "eval", _AWAIT | flags, True)
            value = _run_code(co, g)
            if value is not None:
                _display_value(value)
                try:
                    out["value"] = _to_json(value)
                    # Exact JSON types only (checked): their repr() calls
                    # no method of the cell's.
                    out["repr"] = _plain_repr(value)
                except Exception:
                    out["value"] = out["repr"] = _cold("_repr_json")(value)
            return
        co = compile(_ast.Module([node], []), _CELL, "exec", _AWAIT | flags, True)
        flags |= co.co_flags & _FUTURE_MASK
        if kind not in _DEF_TYPES:
            _run_code(co, g)
            continue
        if kind is _ast.FunctionDef or kind is _ast.AsyncFunctionDef or kind is _ast.ClassDef:
            names = [node.name]
        elif any(a.name == "*" for a in node.names):
            before = dict(g)
        else:
            names = [a.asname or (a.name.partition(".")[0] if kind is _ast.Import else a.name) for a in node.names]
        _run_code(co, g)
        if kind is _ast.ImportFrom and any(a.name == "*" for a in node.names):
            names = [k for k, v in g.items() if before.get(k, _MISSING) is not v]
        bound = {n: g.get(n, _MISSING) for n in names if n not in reserved}
        def_bound.update(bound)
        if bound:
            out["defs"].append((bound, node))


# ---------------------------------------------------------------- live


def _live_request(kind, out):
    """checkpoint(name) / restore(name) in a live session: done once the
    cell is over (a checkpoint keeps the namespace the cell leaves, if it
    succeeds; a restore replaces it with the checkpoint's)."""

    def request(name):
        if type(name) is not str or not name or len(name) > 64 or not all(c.isalnum() or c in "_-." for c in name):
            raise ValueError("a checkpoint name is 1 to 64 letters, digits, '_', '-' or '.'")
        out["requests"][kind] = name

    request.__name__ = request.__qualname__ = kind
    return request


def _live_done(out):
    """The done frame of a cell in a live session: the names it rebound or
    deleted (from the live namespace, by identity), JSON values of the
    rebound ones where they have one (the supervisor's mirror, replayed if
    the state process is ever lost), its definitions, and any checkpoint or
    restore it asked for."""
    changed, deleted, items, definitions = [], [], [], []
    threads = 0
    if out["status"] == "ok":
        g, reserved, before = out["g"], out["reserved"], out.get("before") or {}
        for name, v in list(g.items()):
            if type(name) is not str or (name[:2] == "__" and name[-2:] == "__") or name in reserved:
                continue
            if before.get(name, _MISSING) is v:
                continue
            changed.append(name)
            if name[:1] != "_" and name.isascii() and name.isidentifier():
                try:
                    items.append((name, _to_json(v)))
                except Exception:
                    pass
        deleted = [n for n in before if type(n) is str and n not in g and n not in reserved and not (n[:2] == "__" and n[-2:] == "__")]
        if out["defs"]:
            lines = _sources[_CELL]
            for bound, node in out["defs"]:
                live = [n for n, v in bound.items() if g.get(n, _MISSING) is v]
                if live:
                    definitions.append({"names": live, "source": _segment(lines, node)})
        threading = sys.modules.get("threading")
        if threading is not None:
            try:
                threads = max(0, threading.active_count() - 1)
            except Exception:
                threads = 0
    data = (
        '{"t":"done","status":"%s","value":%s,"repr":%s,"vars":{%s},"dropped":[],"definitions":%s,"error":%s,"limit":%s,"live":{"changed":%s,"deleted":%s,"threads":%d,"checkpoint":%s,"restore":%s}%s}'
        % (out["status"], out["value"], out.get("repr", "null"), ",".join(_dumps(k) + ":" + v for k, v in items), _dumps(definitions), _dumps(out["error"]), _dumps(out["limit"]), _dumps(changed), _dumps(deleted), threads, _dumps(out["requests"].get("checkpoint")), _dumps(out["requests"].get("restore")), _display_fields())
    ).encode("utf-8")
    if len(data) > _st["max"]:
        # The mirror's values go first: the namespace itself is live.
        out["requests"].clear()
        data = (
            '{"t":"done","status":"%s","value":null,"vars":{},"dropped":[],"definitions":[],"error":%s,"limit":%s,"live":{"changed":[],"deleted":[],"threads":%d}}'
            % (out["status"], _dumps(out["error"]), _dumps(out["limit"]), threads)
        ).encode("utf-8")
    return data


# ---------------------------------------------------------------- done


def _carried_state(out):
    """(vars as [(name, json text)], dropped, definitions) after a successful
    cell."""
    g, reserved, installed, def_bound = out["g"], out["reserved"], out["installed"], out["def_bound"]
    items = []
    dropped = []
    for name, v in list(g.items()):
        if type(name) is not str or (name[:2] == "__" and name[-2:] == "__"):
            continue
        if name in reserved:
            if installed.get(name) is not v:
                dropped.append({"name": name, "type": _type_name(type(v)), "reason": "reserved name: the capability %s is restored in the next cell" % name})
            continue
        err = None
        if name[:1] != "_" and name.isascii() and name.isidentifier():
            try:
                items.append((name, _to_json(v)))
                continue
            except _NotJSON as e:
                err = e
            except Exception as e:  # RecursionError, a dict resized by a thread, ...
                err = _NotJSON("something that failed to encode (%s)" % _type_name(type(e)))
        if def_bound.get(name, _MISSING) is not v:
            dropped.append(_cold("_dropped")(name, v, err))
    for name in out["earlier"]:
        if name not in g and name not in reserved:
            dropped.append({"name": _clean(name), "type": "unbound", "reason": "deleted by this cell; its earlier definition is no longer carried"})
    definitions = []
    if out["defs"]:
        lines = _sources[_CELL]
        for bound, node in out["defs"]:
            # A name rebound later in the cell is carried by its newer value.
            live = [n for n, v in bound.items() if g.get(n, _MISSING) is v]
            if live:
                definitions.append({"names": live, "source": _segment(lines, node)})
    return items, dropped, definitions


def _done_frame(out):
    if _st.get("live"):
        return _live_done(out)
    items, dropped, definitions = _carried_state(out) if out["status"] == "ok" else ((), [], [])
    data = _assemble(out, items, dropped, definitions)
    if len(data) > _st["max"]:
        data = _cold("_shrink_done")(out, items, dropped, definitions)
    return data


def _assemble(out, items, dropped, definitions):
    return (
        '{"t":"done","status":"%s","value":%s,"repr":%s,"vars":{%s},"dropped":%s,"definitions":%s,"error":%s,"limit":%s%s}'
        % (out["status"], out["value"], out.get("repr", "null"), ",".join(_dumps(k) + ":" + v for k, v in items), _dumps(dropped), _dumps(definitions), _dumps(out["error"]), _dumps(out["limit"]), _display_fields())
    ).encode("utf-8")


def _display_fields():
    """The `display` and `display_dropped` fields of `done` (none when
    empty)."""
    text = ""
    if _display["items"]:
        text += ',"display":' + _dumps(_display["items"])
    if _display["dropped"]:
        text += ',"display_dropped":' + _dumps(_display["dropped"])
    return text


def _fallback_done(message):
    return ('{"t":"done","status":"error","value":null,"error":{"type":"ShimError","message":%s}}' % _dumps(_clean(message))).encode("utf-8")


def _finish(out):
    _st["armed"] = False
    _signal.setitimer(_signal.ITIMER_REAL, 0)
    _reserve.clear()
    for stream in (_STDOUT, _STDERR):
        try:
            stream.flush()
        except BaseException:
            pass
    if posix.getpid() != _st["pid"]:
        posix._exit(0)  # a forked child of the cell never speaks for it
    try:
        data = _done_frame(out)
    except BaseException as e:
        data = _fallback_done("the shim failed to build its result: %s" % _type_name(type(e)))
        out["status"] = "error"
    become = _st.get("live") and out["status"] == "ok" and _live_keep()
    try:
        _send(data)
    except BaseException as e:
        become = False
        try:
            _send(_fallback_done("the shim failed to send its result: %s" % _type_name(type(e))))
        except BaseException:
            posix._exit(_EXIT_PROTOCOL)
    if become:
        _live_become()
    if _st.get("linger"):
        # Stay until the supervisor has read what this process used.
        try:
            while posix.read(_FD, 512):
                pass
        except BaseException:
            pass
    posix._exit(0)


def _cold(name):
    """A function of the rarely needed part, compiled on first use (or
    taken ready-made from the loader, see loader.py)."""
    f = _G.get(name)
    if f is None:
        code = _G.get("_COLD_CODE")
        exec(code if code is not None else compile(_COLD, "<cellbox shim>", "exec", 0, True), _G)
        f = _G[name]
    return f


def _main():
    try:
        # Only this process speaks on the channel: a program the cell might
        # manage to exec does not inherit it.
        posix.set_inheritable(_FD, False)
        if _st.pop("waits", False) and not _readable():
            _warm_up()
        start = _recv()
    except (_ProtocolError, OSError, ValueError) as e:
        _die("reading the start frame: %s" % e)
    if start["t"] != "start":
        _die("expected a start frame, got %r" % start["t"])
    max_frame = start.get("max_frame_bytes")
    if type(max_frame) is not int or max_frame < 256:
        _die("the start frame has no valid max_frame_bytes")
    _st["max"] = max_frame
    _st["pid"] = posix.getpid()
    _st["linger"] = start.get("linger") is True
    limits = start.get("limits")
    ms = limits.get("timeout_ms") if type(limits) is dict else None
    if type(ms) is int and ms > 0:
        # Stop a little before the supervisor's own deadline (as the Rhai
        # backend does), so a runaway cell still reports where it was.
        _st["ms"] = ms
        _signal.signal(_signal.SIGALRM, _on_alarm)
        _st["armed"] = True
        _signal.setitimer(_signal.ITIMER_REAL, (ms - min(ms // 10, 200)) / 1000.0)
    out = _new_out()
    try:
        try:
            _execute(start, out)
        except _ProtocolError as e:
            _die(str(e))
        except BaseException as exc:
            if issubclass(type(exc), MemoryError):
                # Give memory back before anything else allocates: the
                # reserve, then the cell's globals (which no longer matter).
                _reserve.clear()
                if out["g"] is not None:
                    out["g"].clear()
            try:
                _cold("_record_failure")(out, exc)
            except MemoryError:
                # Still short: the cell's frames (kept alive by the
                # traceback) go, and the error is reported without one.
                tb = exc.__traceback__
                while tb is not None:
                    try:
                        tb.tb_frame.clear()
                    except RuntimeError:  # a frame of the shim, still running
                        pass
                    tb = tb.tb_next
                exc = None
                out.update(status="limit_exceeded", value="null", limit="memory", error={"type": "MemoryError", "message": "out of memory", "traceback": None})
            except BaseException as inner:
                # The deadline may fire while the error is being formatted.
                _cold("_record_failure")(out, inner)
    except BaseException as e:
        out.update(status="error", value="null", error={"type": "ShimError", "message": "the shim failed to record the cell's outcome: " + _type_name(type(e))})
    _finish(out)


def _new_out():
    """What a cell's run records, before it runs."""
    return {"status": "ok", "value": "null", "error": None, "limit": None, "g": None, "defs": [], "def_bound": {}, "installed": {}, "reserved": set(), "earlier": (), "requests": {}}


def _readable():
    """Whether the channel has something to read now."""
    import select

    try:
        p = select.poll()
        p.register(_FD, select.POLLIN)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return True


_WARM_START = '{"t":"start","language":"python","code":"x = [1, \\"a\\", {\\"k\\": 2.5}]\\nx","vars":{"v":1},"capabilities":[{"name":"emit","params":["event"]}],"limits":{"timeout_ms":1000},"max_frame_bytes":65536}'


def _warm_up():
    """In a cell's process forked ahead of its cell (its start frame comes
    later): run what every cell runs (the frame parsed, the namespace built,
    code compiled and run, `done` encoded) on a cell of our own, so that the
    zygote's pages this writes are copied now rather than on the cell's
    path. Nothing is sent or printed, and what it set is put back."""
    main = sys.modules.get("__main__")
    try:
        out = _new_out()
        _execute(_loads(_WARM_START), out)
        _done_frame(out)
    except BaseException:
        pass
    if main is None:
        sys.modules.pop("__main__", None)
    else:
        sys.modules["__main__"] = main
    _sources.pop(_CELL, None)


_COLD = r'''
# The rarely needed part of the shim: compiled into the shim's globals on
# first use (errors, dropped values, definitions, oversized results).

_MAX_TRACEBACK = 64 * 1024
_MAX_REPR = 64 * 1024
_exc_cause = BaseException.__dict__["__cause__"].__get__
_exc_context = BaseException.__dict__["__context__"].__get__
_exc_suppress = BaseException.__dict__["__suppress_context__"].__get__
_exc_traceback = BaseException.__dict__["__traceback__"].__get__
_FunctionType = type(_cold)
_BuiltinType = type(len)
_GeneratorType = type((lambda: (yield))())
_file_cache = {}
_published = {}


def _safe_str(obj):
    try:
        s = str(obj)
    except CellTimeout:
        raise
    except BaseException:
        return "<str() failed>"
    return _clean(s) if type(s) is str else "<str() failed>"


def _repr_json(value):
    """The cell's value as a JSON string holding its repr()."""
    try:
        text = repr(value)
    except CellTimeout:
        raise
    except BaseException:
        text = None
    if type(text) is not str:
        text = "<%s object; repr() failed>" % _type_name(type(value))
    if len(text) > _MAX_REPR:
        text = text[:_MAX_REPR] + "... [%d characters left out]" % (len(text) - _MAX_REPR)
    return _dumps(_clean(text))


def _publish_sources():
    # So that traceback, inspect and linecache used by the cell itself find
    # the cell's lines (an entry with mtime None is never evicted).
    cache = getattr(sys.modules.get("linecache"), "cache", None)
    if type(cache) is not dict:
        return
    for name, lines in _sources.items():
        entry = _published.get(name)
        if entry is None:
            text = [line + "\n" for line in lines]
            entry = _published[name] = (sum(map(len, text)), None, text, name)
        if cache.get(name) is not entry:
            cache[name] = entry


def _dropped(name, v, err):
    t = type(v)
    if name[:1] == "_":
        reason = "names starting with '_' are private to the cell and not carried"
    elif not (name.isascii() and name.isidentifier()):
        reason = "only ASCII identifiers are carried as variable names"
    elif t is _FunctionType and v.__code__.co_name == "<lambda>":
        reason = "a lambda is not carried; define it with a top-level def to keep it"
    elif t is _FunctionType:
        reason = "a function is carried only by the top-level def that made it"
    elif issubclass(t, type):
        reason = "a class is carried only by the top-level class statement that made it"
    elif t is type(sys):
        reason = "a module is carried only by a top-level import statement"
    elif t is _BuiltinType:
        reason = "a built-in function is carried only by a top-level import statement"
    elif t is _GeneratorType:
        reason = "a generator is live state and cannot be carried"
    else:
        reason = "not JSON-serializable: it contains " + err.what + (" at " + name + err.path if err.path else "")
    return {"name": _clean(name), "type": _type_name(t), "reason": reason}


def _shrink_done(out, items, dropped, definitions):
    """`done` did not fit in one frame: leave out the largest vars (saying
    so), then an oversized value, then give up with an error."""
    limit = _st["max"]
    # The repr is only for display: the first thing to go.
    out["repr"] = "null"
    if len(out["value"]) > limit // 2:
        out["value"] = _dumps("<the value's %d bytes of JSON do not fit in one %d-byte frame>" % (len(out["value"]), limit))
    sizes = {k: len(v.encode("utf-8")) + len(k) + 4 for k, v in items}
    total = sum(sizes.values())
    fixed = len(_dumps(dropped)) + len(_dumps(definitions)) + len(out["value"]) + 8192
    keep = dict(items)
    for name in sorted(sizes, key=sizes.get, reverse=True):
        if total + fixed <= limit:
            break
        del keep[name]
        total -= sizes[name]
        dropped.append({"name": _clean(name), "type": "json", "reason": "too large to carry: %d bytes of JSON against a frame limit of %d bytes" % (sizes[name], limit)})
    data = _assemble(out, list(keep.items()), dropped, definitions)
    if len(data) <= limit:
        return data
    return _fallback_done("the cell's result does not fit in one %d-byte frame" % limit)


def _record_failure(out, exc):
    t = type(exc)
    out["value"] = out["repr"] = "null"
    if t is CellTimeout:
        out["status"] = "timeout"
    elif issubclass(t, MemoryError):
        _reserve.clear()
        out["status"] = "limit_exceeded"
        out["limit"] = "memory"
        if out["g"] is not None:
            out["g"].clear()  # give the memory back before formatting
    elif issubclass(t, SystemExit) and (exc.code is None or (type(exc.code) in (int, bool) and exc.code == 0)):
        out["status"] = "ok"  # sys.exit(0) ends the cell early, successfully
        return
    else:
        out["status"] = "error"
    out["error"] = info = _error_info(exc)
    if issubclass(t, ImportError) and type(getattr(exc, "name", None)) is str:
        _explain_missing_module(exc, info)
    if out["limit"] == "memory" and not info["message"]:
        info["message"] = "out of memory"  # MemoryError() says nothing itself


def _explain_missing_module(exc, info):
    """A module that is not found: say where modules are looked up."""
    if not issubclass(type(exc), ModuleNotFoundError):
        return
    paths = _st.get("python_paths") or ()
    if paths:
        where = "the standard library, the package paths of the sandbox profile (%s) and the scratch directory" % ", ".join(map(_clean, paths))
    else:
        where = "the standard library and the scratch directory (the sandbox profile names no package paths; its [python] paths adds some)"
    note = "cellbox: modules are found in " + where
    info["message"] = (info["message"] + " (" + note + ")") if info["message"] else note
    if type(info.get("traceback")) is str:
        info["traceback"] += note + "\n"


# ---- tracebacks: the cell's own lines, no frame of the shim


def _file_lines(path):
    if path in _sources:
        return _sources[path]
    if path not in _file_cache:
        lines = None
        try:
            st = posix.stat(path)
            if (st.st_mode & 0o170000) == 0o100000 and st.st_size <= (4 << 20):
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = _split_lines(f.read())
        except Exception:
            pass
        _file_cache[path] = lines
    return _file_cache[path]


def _frames(tb):
    out = []
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_globals is not _G:
            code = frame.f_code
            out.append((code.co_filename, tb.tb_lineno, code.co_name, code, tb.tb_lasti))
        tb = tb.tb_next
    return out


def _format_frames(frames, out):
    prev, repeat = None, 0
    for filename, lineno, name, _code, _lasti in frames + [(None, None, None, None, None)]:
        key = (filename, lineno, name)
        if key == prev:
            repeat += 1
            if repeat > 3:
                continue
        else:
            if repeat > 3:
                out.append("  [Previous line repeated %d more times]\n" % (repeat - 3))
            prev, repeat = key, 1
        if filename is None:
            break
        out.append('  File "%s", line %s, in %s\n' % (_clean(filename), lineno, _clean(name)))
        lines = _file_lines(filename) if type(filename) is str else None
        if lines and type(lineno) is int and 0 < lineno <= len(lines) and lines[lineno - 1].strip():
            out.append("    " + _clean(lines[lineno - 1].strip()) + "\n")


def _format_syntax_error(exc, out):
    filename, lineno, text = exc.filename, exc.lineno, exc.text
    offset, end_offset = exc.offset, getattr(exc, "end_offset", None)
    if type(filename) is str and type(lineno) is int:
        out.append('  File "%s", line %d\n' % (_clean(filename), lineno))
    if type(text) is str and text.strip():
        line = text.split("\n")[0].rstrip()
        stripped = line.lstrip()
        out.append("    " + _clean(stripped) + "\n")
        if type(offset) is int and offset > 0:
            start = max(0, offset - 1 - (len(line) - len(stripped)))
            width = end_offset - offset if type(end_offset) is int and end_offset > offset else 1
            out.append("    " + " " * start + "^" * width + "\n")


def _message(exc):
    if issubclass(type(exc), SyntaxError):
        return _safe_str(getattr(exc, "msg", ""))
    return _safe_str(exc)


def _format_one(exc, out):
    frames = _frames(_exc_traceback(exc))
    if frames:
        out.append("Traceback (most recent call last):\n")
        _format_frames(frames, out)
    if issubclass(type(exc), SyntaxError):
        try:
            _format_syntax_error(exc, out)
        except Exception:
            pass
    msg = _message(exc)
    out.append(_type_name(type(exc)) + (": " + msg if msg else "") + "\n")
    try:
        notes = getattr(exc, "__notes__", None)
    except Exception:
        notes = None
    if type(notes) is list:
        out.extend(_safe_str(note) + "\n" for note in notes)
    return frames


def _column(code, lasti, lineno):
    """1-based character column of the failing instruction, when known."""
    try:
        for i, pos in enumerate(code.co_positions()):
            if i == lasti // 2:
                if pos[0] != lineno or pos[2] is None:
                    return None
                lines = _sources[_CELL]
                text = lines[lineno - 1] if 0 < lineno <= len(lines) else ""
                return len(text.encode("utf-8")[: pos[2]].decode("utf-8", "ignore")) + 1
    except Exception:
        pass
    return None


def _error_info(exc):
    """{type, message, traceback, line, column}: line and column point into
    the cell's own source; the traceback has no frame of the shim."""
    chain, seen, cur = [], set(), exc
    while cur is not None and id(cur) not in seen and len(chain) < 32:
        seen.add(id(cur))
        cause, context = _exc_cause(cur), _exc_context(cur)
        if cause is not None:
            chain.append((cur, "\nThe above exception was the direct cause of the following exception:\n\n"))
            cur = cause
        elif context is not None and not _exc_suppress(cur):
            chain.append((cur, "\nDuring handling of the above exception, another exception occurred:\n\n"))
            cur = context
        else:
            chain.append((cur, ""))
            cur = None
    out, frames = [], []
    for i in range(len(chain) - 1, -1, -1):
        frames = _format_one(chain[i][0], out)
        if i:
            out.append(chain[i - 1][1])
    line = column = None
    if type(exc) in (SyntaxError, IndentationError, TabError) and exc.filename == _CELL:
        line = exc.lineno if type(exc.lineno) is int else None
        column = exc.offset if type(exc.offset) is int else None
    else:
        for filename, lineno, _name, code, lasti in reversed(frames):
            if filename == _CELL and type(lineno) is int:
                line, column = lineno, _column(code, lasti, lineno)
                break
    text = "".join(out)
    if len(text) > _MAX_TRACEBACK:
        head = _MAX_TRACEBACK // 4
        text = text[:head] + "\n  [... %d characters of traceback left out ...]\n" % (len(text) - _MAX_TRACEBACK) + text[head - _MAX_TRACEBACK :]
    return {"type": _type_name(type(exc)), "message": _message(exc), "traceback": text, "line": line, "column": column}
'''

_MAIN_THREAD = _thread.get_ident()
_STDOUT = sys.stdout
_STDERR = sys.stderr

if sys.argv[1:2] == ["--precompile"] and len(sys.argv) == 3 and "_COLD_CODE" not in _G:
    # `python3 -I -S -B -c <shim> --precompile <zygote.py>`, run once
    # outside any sandbox by the same interpreter the cells use: print this
    # module's code, the cold part's and the zygote's, marshalled, for
    # loader.py.
    import marshal

    _STDOUT.buffer.write(
        marshal.dumps(
            (
                sys.hexversion,
                sys._getframe().f_code,
                compile(_COLD, "<cellbox shim>", "exec", 0, True),
                compile(sys.argv[2], "<cellbox zygote>", "exec", 0, True),
            )
        )
    )
    _STDOUT.flush()
else:
    try:
        _STDOUT.reconfigure(line_buffering=True)  # output up to a kill is not lost
    except Exception:
        pass
    if sys.argv[1:2] == ["--zygote"] and len(sys.argv) in (3, 4):
        # `... -c <shim> --zygote <zygote.py> <config>`, or from loader.py
        # `--zygote <config>` with the zygote's code ready-made: stay
        # resident and fork one child per cell; each child ends in _main()
        # below.
        _ZYGOTE_CONFIG = sys.argv[-1]
        _zygote_code = _G.pop("_ZYGOTE_CODE", None)
        if _zygote_code is None:
            if len(sys.argv) != 4:
                posix.write(2, b"cellbox zygote: no zygote code given\n")
                posix._exit(7)
            _zygote_code = compile(sys.argv[2], "<cellbox zygote>", "exec", 0, True)
        sys.argv = [_CELL]
        exec(_zygote_code, _G)
        posix._exit(0)
    _G.pop("_ZYGOTE_CODE", None)
    sys.argv = [_CELL]
    try:
        sys.path.append(posix.getcwd())  # modules in the scratch dir, after the stdlib
    except OSError:
        pass
    _main()
