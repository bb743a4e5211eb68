"""Host functions a cell may call: the supervisor's `kind = "http"` tools
pointed at a small HTTP server in this process.

A cell has no network; what it may reach is the supervisor's capabilities.
To let cells call Python functions of the program that runs them (rlms'
LM handler and sub-RLMs, smolagents' tools), the program declares one
`[tools.NAME]` per function whose URL is this bridge on 127.0.0.1; the
supervisor makes the POST (the cell's arguments as JSON), the bridge calls
the function in a thread of its own and answers with its JSON result. Each
group of functions is registered under a random token, which is part of
the URL (or an argument the cell passes), so one bridge serves every
environment of the process and none can call another's.
"""

from __future__ import annotations

import json
import secrets
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

Handler = Callable[[str, dict], Any]

_lock = threading.Lock()
_server: ThreadingHTTPServer | None = None
_routes: dict[str, Handler] = {}
_MAX_BODY = 64 << 20


class _Requests(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        return

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        parts = self.path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "t":
            return self._send(404, {"error": "no such route"})
        token, name = parts[1], parts[2]
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            return self._send(413, {"error": "request too large"})
        try:
            args = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self._send(400, {"error": "the body is not JSON"})
        handler = _routes.get(token)
        if handler is None:
            return self._send(404, {"error": "this environment is closed"})
        try:
            result = handler(name, args if isinstance(args, dict) else {})
        except Exception as e:  # the cell gets a RuntimeError with this text
            return self._send(500, {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=5)})
        try:
            body = json.dumps(result)
        except (TypeError, ValueError):
            body = json.dumps(repr(result))
            return self._send(200, None, body)
        self._send(200, None, body)

    def _send(self, status: int, value: Any, body: str | None = None) -> None:
        data = (body if body is not None else json.dumps(value)).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _ensure() -> ThreadingHTTPServer:
    global _server
    with _lock:
        if _server is None:
            server = ThreadingHTTPServer(("127.0.0.1", 0), _Requests)
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, name="cellbox-bridge", daemon=True).start()
            _server = server
        return _server


def register(handler: Handler) -> str:
    """Route calls for a new token to `handler(name, args)`; the token."""
    _ensure()
    token = secrets.token_hex(16)
    _routes[token] = handler
    return token


def unregister(token: str) -> None:
    _routes.pop(token, None)


def url(token: str, name: str) -> str:
    server = _ensure()
    return f"http://127.0.0.1:{server.server_address[1]}/t/{token}/{name}"


def toml_value(v: Any) -> str:
    """A TOML value for `v` (str, bool, int, float, list, dict as inline tables)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def tool_toml(name: str, url_: str, description: str, schema: dict, timeout_ms: int = 3_600_000) -> str:
    """A `[tools.NAME]` table for an http tool."""
    return (
        f"[tools.{name}]\n"
        f'kind = "http"\n'
        f"description = {toml_value(description)}\n"
        f"url = {toml_value(url_)}\n"
        f"schema = {toml_value(schema)}\n"
        f"timeout_ms = {timeout_ms}\n"
    )
