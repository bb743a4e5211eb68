"""A scripted stand-in for a model endpoint, for examples and tests.

`FakeModel` is an OpenAI-compatible chat-completions server on 127.0.0.1
(in a thread of this process) that answers from a script: a list of reply
texts (taken in order) or a function of the request's messages. Point any
OpenAI-compatible client at `model.url` (rlms' `openai` backend,
smolagents' `OpenAIServerModel`, cellbox's `[models.NAME]`). Every request
is kept in `model.seen`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable


class FakeModel:
    def __init__(self, replies: list[str] | Callable[[list[dict]], str], *, when_done: str = ""):
        self._script = list(replies) if not callable(replies) else None
        self._reply = replies if callable(replies) else None
        self._when_done = when_done
        self._lock = threading.Lock()
        self.seen: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw or b"{}")
                fake.seen.append({"path": self.path, "authorization": self.headers.get("Authorization"), "body": body})
                text = fake._next(body.get("messages") or [])
                out = json.dumps(
                    {
                        "id": f"fake-{len(fake.seen)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model", "fake"),
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, name="cellbox-fake-model", daemon=True).start()

    def _next(self, messages: list[dict]) -> str:
        if self._reply is not None:
            return self._reply(messages)
        with self._lock:
            return self._script.pop(0) if self._script else self._when_done

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "FakeModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
