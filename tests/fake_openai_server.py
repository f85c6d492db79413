"""A scripted OpenAI-style completions server on 127.0.0.1 that records every request.

It stands in for the reflection server only in tests of the code around it (the client, the
run's handling of a server that fails); the real vLLM server has its own integration tests.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "reflector"


@dataclass
class FakeServer:
    """An OpenAI-ish completions endpoint; `plan` scripts the next responses."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Each entry: "ok", an HTTP status int, ("sleep", seconds), or ("drop_index", i).
    plan: list[Any] = field(default_factory=list)
    chat_text: str = "A reflection."  # what /v1/chat/completions answers
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_action(self) -> Any:
        with self.lock:
            return self.plan.pop(0) if self.plan else "ok"

    @property
    def completions(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests if r["path"] == "/v1/completions"]


def _completion(prompts: list[str], drop: int | None = None) -> dict[str, Any]:
    # Reversed on purpose: clients must map choices back by `index`, not by position.
    choices = [
        {"index": i, "text": f"  about {p!s}  \n", "finish_reason": "stop"}
        for i, p in reversed(list(enumerate(prompts)))
        if i != drop
    ]
    return {"choices": choices, "usage": {"completion_tokens": 3 * len(choices)}}


def _make_handler(state: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            # A client that timed out has hung up already: that is the test, not an error.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        def do_GET(self) -> None:
            with state.lock:
                state.requests.append({"path": self.path, "body": None})
            if self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": MODEL}]})
            else:
                self._send(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with state.lock:
                state.requests.append({"path": self.path, "body": body})
            action = state.next_action()
            if self.path == "/v1/chat/completions":
                message = {"role": "assistant", "content": state.chat_text}
                self._send(200, {"choices": [{"index": 0, "message": message}]})
                return
            prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
            if isinstance(action, int):
                self._send(action, {"error": {"message": f"scripted failure {action}"}})
            elif isinstance(action, tuple) and action[0] == "sleep":
                time.sleep(action[1])
                self._send(200, _completion(prompts))
            elif isinstance(action, tuple) and action[0] == "drop_index":
                self._send(200, _completion(prompts, drop=action[1]))
            else:
                self._send(200, _completion(prompts))

    return Handler


@contextlib.contextmanager
def running_server() -> Iterator[FakeServer]:
    state = FakeServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(state))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
