"""A stand-in supervisor for the Python runtime shim.

It speaks the worker protocol over a socketpair exactly as the Rust
supervisor does (4-byte big-endian length + UTF-8 JSON object tagged "t"),
checks every frame the shim sends against the serde shapes of
src/protocol/messages.rs (unknown fields rejected, as serde's
deny_unknown_fields does), and answers capability calls from a handler.
"""

import atexit
import json
import os
import resource
import signal
import socket
import struct
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIM_PATH = os.path.join(ROOT, "src", "worker", "python", "shim.py")
LOADER_PATH = os.path.join(ROOT, "src", "worker", "python", "loader.py")
ZYGOTE_PATH = os.path.join(ROOT, "src", "worker", "python", "zygote.py")
PYTHON = "/usr/bin/python3"
DEFAULT_MAX_FRAME = 8 * 1024 * 1024

with open(SHIM_PATH, encoding="utf-8") as _f:
    SHIM = _f.read()
with open(LOADER_PATH, encoding="utf-8") as _f:
    LOADER = _f.read()
with open(ZYGOTE_PATH, encoding="utf-8") as _f:
    ZYGOTE = _f.read()

# "source": python3 -c <shim>; "precompiled": python3 -c <loader> PATH, PATH
# holding the shim's --precompile output. The test suite runs in both modes.
MODE = os.environ.get("CELLBOX_SHIM_MODE", "source")
_blob = None


def precompiled_blob():
    global _blob
    if _blob is None:
        _blob = subprocess.run(
            [PYTHON, "-I", "-S", "-B", "-c", SHIM, "--precompile", ZYGOTE], stdin=subprocess.DEVNULL, capture_output=True, env={}, check=True
        ).stdout
    return _blob


def blob_path():
    """A file holding the precompiled shim (made once per test process)."""
    global _blob_path
    if _blob_path is None:
        fd, _blob_path = tempfile.mkstemp(prefix="cellbox-shim-", suffix=".marshal")
        os.write(fd, precompiled_blob())
        os.close(fd)
        atexit.register(os.remove, _blob_path)
    return _blob_path


_blob_path = None


def shim_argv():
    """The interpreter command line, as the worker would exec it."""
    if MODE == "precompiled":
        return [PYTHON, "-I", "-S", "-B", "-c", LOADER, blob_path()]
    return [PYTHON, "-I", "-S", "-B", "-c", SHIM]

CAPABILITIES = [
    {"name": "answer", "params": ["value"]},
    {"name": "emit", "params": ["event"]},
    {"name": "add", "params": ["a", "b"]},
    {"name": "echo", "params": ["value"]},
    {"name": "fail", "params": ["kind"]},
]


class ProtocolViolation(AssertionError):
    pass


def _no_lone_surrogates(value, where):
    """serde_json rejects lone surrogates; so must we."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ProtocolViolation("%s holds a string with a lone surrogate" % where) from None
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _no_lone_surrogates(v, "%s[%d]" % (where, i))
    elif isinstance(value, dict):
        for k, v in value.items():
            _no_lone_surrogates(k, where + " key")
            _no_lone_surrogates(v, "%s[%r]" % (where, k))
    elif isinstance(value, int) and not isinstance(value, bool):
        if not -(1 << 63) <= value < (1 << 64):
            raise ProtocolViolation("%s holds an integer outside the 64-bit range" % where)


def _fields(obj, where, required, optional=()):
    if not isinstance(obj, dict):
        raise ProtocolViolation("%s is not an object: %r" % (where, obj))
    unknown = set(obj) - set(required) - set(optional)
    if unknown:
        raise ProtocolViolation("%s has unknown fields %s" % (where, sorted(unknown)))
    missing = set(required) - set(obj)
    if missing:
        raise ProtocolViolation("%s lacks fields %s" % (where, sorted(missing)))


def _opt(obj, key, types, where):
    if key in obj and obj[key] is not None and not isinstance(obj[key], types):
        raise ProtocolViolation("%s.%s has the wrong type: %r" % (where, key, obj[key]))


def validate_from_worker(msg):
    """Check a frame against FromWorker in src/protocol/messages.rs."""
    _no_lone_surrogates(msg, "frame")
    t = msg.get("t")
    if t == "call":
        _fields(msg, "call", ["t", "id", "cap"], ["args"])
        if not isinstance(msg["id"], int) or isinstance(msg["id"], bool) or msg["id"] < 0:
            raise ProtocolViolation("call.id is not a u64")
        if not isinstance(msg["cap"], str) or not isinstance(msg.get("args", {}), dict):
            raise ProtocolViolation("call has a bad cap or args")
    elif t == "emit":
        _fields(msg, "emit", ["t", "event"])
    elif t == "log":
        _fields(msg, "log", ["t", "level", "message"])
    elif t == "done":
        _fields(msg, "done", ["t", "status"], ["value", "repr", "vars", "dropped", "definitions", "error", "limit"])
        _opt(msg, "repr", str, "done")
        if msg["status"] not in ("ok", "error", "limit_exceeded", "timeout"):
            raise ProtocolViolation("done.status %r" % msg["status"])
        if not isinstance(msg.get("vars", {}), dict):
            raise ProtocolViolation("done.vars is not an object")
        for d in msg.get("dropped", []):
            _fields(d, "dropped item", ["name", "type", "reason"])
            if not all(isinstance(d[k], str) for k in d):
                raise ProtocolViolation("dropped item has a non-string field: %r" % d)
        for d in msg.get("definitions", []):
            _fields(d, "definition", ["names", "source"])
            if not isinstance(d["source"], str) or not all(isinstance(n, str) for n in d["names"]):
                raise ProtocolViolation("bad definition %r" % d)
        err = msg.get("error")
        if err is not None:
            _fields(err, "error", ["type", "message"], ["traceback", "line", "column"])
            _opt(err, "traceback", str, "error")
            _opt(err, "line", int, "error")
            _opt(err, "column", int, "error")
            if not isinstance(err["type"], str) or not isinstance(err["message"], str):
                raise ProtocolViolation("error.type/message must be strings")
        _opt(msg, "limit", str, "done")
    else:
        raise ProtocolViolation("unknown tag %r" % t)


def default_handler(call):
    """Host capabilities for the tests."""
    cap, args = call["cap"], call.get("args", {})
    if cap == "add":
        a, b = args.get("a"), args.get("b")
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return {"error": {"kind": "invalid_args", "message": "add needs numbers a and b"}}
        return {"ok": a + b}
    if cap in ("answer", "emit"):
        return {"ok": None}
    if cap == "echo":
        return {"ok": args.get("value")}
    if cap == "fail":
        kind = args.get("kind", "failed")
        return {"error": {"kind": kind, "message": "fail(%s) as asked" % kind}}
    if cap == "secret":
        return {"error": {"kind": "denied", "message": "capability 'secret' is not allowed by the policy"}}
    return {"error": {"kind": "unknown", "message": "no capability named %r" % cap}}


class Result:
    def __init__(self):
        self.done = None
        self.frames = []
        self.calls = []
        self.stdout = b""
        self.stderr = b""
        self.returncode = None
        self.killed = False

    @property
    def status(self):
        return self.done["status"] if self.done else None

    @property
    def value(self):
        return self.done.get("value")

    @property
    def vars(self):
        return self.done.get("vars", {})

    @property
    def error(self):
        return self.done.get("error")

    @property
    def dropped(self):
        return {d["name"]: d for d in self.done.get("dropped", [])}

    @property
    def out(self):
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self):
        return self.stderr.decode("utf-8", "replace")

    def __repr__(self):
        return "Result(done=%r, stdout=%r, stderr=%r, rc=%r)" % (self.done, self.stdout[:2000], self.stderr[:2000], self.returncode)


def _read_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return bytes(buf)
        buf += chunk
    return bytes(buf)


def read_frame(sock, max_frame):
    prefix = _read_exact(sock, 4)
    if not prefix:
        return None
    if len(prefix) < 4:
        raise ProtocolViolation("truncated length prefix")
    (length,) = struct.unpack(">I", prefix)
    if length > max_frame:
        raise ProtocolViolation("frame of %d bytes exceeds %d" % (length, max_frame))
    body = _read_exact(sock, length)
    if len(body) < length:
        raise ProtocolViolation("truncated frame body")
    text = body.decode("utf-8")  # strict, as serde
    msg = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ProtocolViolation("non-finite number " + c)))
    if not isinstance(msg, dict) or not isinstance(msg.get("t"), str):
        raise ProtocolViolation("frame is not a tagged object")
    return msg


def write_frame(sock, msg):
    body = json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    sock.sendall(struct.pack(">I", len(body)) + body)


def start_frame(code, vars=None, definitions=None, capabilities=None, timeout_ms=20000, max_frame=DEFAULT_MAX_FRAME):
    return {
        "t": "start",
        "language": "python",
        "code": code,
        "vars": vars or {},
        "definitions": definitions or [],
        "capabilities": CAPABILITIES if capabilities is None else capabilities,
        "limits": {
            "timeout_ms": timeout_ms,
            "max_operations": 0,
            "max_call_levels": 0,
            "max_expr_depth": 0,
            "max_string_bytes": 0,
            "max_array_len": 0,
            "max_map_len": 0,
        },
        "max_frame_bytes": max_frame,
    }


def spawn(cwd, address_space=None, nproc=None):
    """Start the shim the way the worker execs it; return (proc, sock, out, err)."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    child_fd = child.fileno()

    def in_child():
        os.dup2(child_fd, 3)
        os.closerange(4, 1 << 16)
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))

    proc = subprocess.Popen(
        shim_argv(),
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        cwd=cwd,
        env={},
        close_fds=False,
        preexec_fn=in_child,
    )
    child.close()
    return proc, parent, out, err


def run_cell(code, vars=None, definitions=None, capabilities=None, handler=default_handler, timeout_ms=20000, max_frame=DEFAULT_MAX_FRAME, kill_after=30.0, address_space=None, cwd=None, raw_reply=None):
    """Run one cell; `kill_after` is the stand-in supervisor's wall clock."""
    result = Result()
    with tempfile.TemporaryDirectory(prefix="cellbox-shim-") as tmp:
        proc, sock, out, err = spawn(cwd or tmp, address_space=address_space)
        deadline = time.monotonic() + kill_after
        try:
            write_frame(sock, start_frame(code, vars, definitions, capabilities, timeout_ms, max_frame))
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout()
                sock.settimeout(left)
                msg = read_frame(sock, max_frame)
                if msg is None:
                    break
                validate_from_worker(msg)
                result.frames.append(msg)
                if msg["t"] == "call":
                    result.calls.append(msg)
                    if raw_reply is not None:
                        write_frame(sock, raw_reply(msg))
                    else:
                        reply = {"t": "reply", "id": msg["id"]}
                        reply.update(handler(msg))
                        write_frame(sock, reply)
                elif msg["t"] == "done":
                    if result.done is not None:
                        raise ProtocolViolation("second done frame")
                    result.done = msg
        except socket.timeout:
            result.killed = True
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            sock.close()
            try:
                result.returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                result.killed = True
                proc.kill()
                result.returncode = proc.wait()
            out.seek(0)
            err.seek(0)
            result.stdout = out.read()
            result.stderr = err.read()
            out.close()
            err.close()
    return result


class Session:
    """Carries vars and definitions across cells as the supervisor does:
    a successful cell's vars replace the namespace, its definitions are
    appended; a failed cell changes nothing."""

    def __init__(self, **defaults):
        self.vars = {}
        self.definitions = []
        self.defaults = defaults

    def run(self, code, **kw):
        opts = dict(self.defaults)
        opts.update(kw)
        r = run_cell(code, vars=self.vars, definitions=self.definitions, **opts)
        if r.done and r.done["status"] == "ok":
            self.vars = r.done.get("vars", {})
            self.definitions = self.definitions + r.done.get("definitions", [])
        return r
