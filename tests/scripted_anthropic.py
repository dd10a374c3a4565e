"""A scripted model server speaking the Anthropic Messages API (streamed SSE or plain JSON) on
127.0.0.1, for Claude Code's end-to-end test and the gateway's Messages tests.

Each POST to /v1/messages takes the next `Reply` from the script: content blocks (`tool_use`,
`text`) and a usage block, streamed as Claude Code gets them from the real API (`message_start`
with the input tokens, a `content_block_start` / `_delta` / `_stop` per block, `message_delta`
with the stop reason and the output tokens, `message_stop`). Every request is kept (path, headers,
JSON body) for the test to read; anything else (a `HEAD` probe) gets 404.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ids = itertools.count(1)


def tool(name: str, **arguments: Any) -> dict[str, Any]:
    """A `tool_use` block: Claude Code runs its tool `name` (Write, Read, Edit, Bash) with these."""
    return {"type": "tool_use", "id": f"toolu_{next(_ids):04d}", "name": name, "input": arguments}


def text(words: str) -> dict[str, Any]:
    return {"type": "text", "text": words}


@dataclass
class Reply:
    blocks: list[dict[str, Any]]
    input_tokens: int = 10
    output_tokens: int = 5

    @property
    def stop_reason(self) -> str:
        return "tool_use" if any(b["type"] == "tool_use" for b in self.blocks) else "end_turn"

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any = field(default=None)


class ScriptedMessages:
    """`replies` is consumed one per POST; when it runs out, `fallback(request)` answers."""

    def __init__(self, replies: list[Reply] | None = None, fallback: Callable[[Seen], Reply] | None = None) -> None:
        self.replies = list(replies or [])
        self.fallback = fallback or (lambda seen: Reply([text("done")]))
        self.seen: list[Seen] = []
        self.sent_tokens = 0
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                model._keep(Seen("HEAD", self.path, {k.lower(): v for k, v in self.headers.items()}))
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                self._plain(404, {"type": "error", "error": {"type": "not_found_error", "message": "not here"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                seen = Seen("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                with model._lock:
                    model.seen.append(seen)
                    reply = model.replies.pop(0) if model.replies else model.fallback(seen)
                    model.sent_tokens += reply.tokens
                if isinstance(body, dict) and body.get("stream"):
                    self._sse(reply)
                else:
                    self._plain(200, _message(reply, whole=True))

            def _plain(self, status: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _sse(self, reply: Reply) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                self._event("message_start", {"message": _message(reply, whole=False)})
                for i, block in enumerate(reply.blocks):
                    if block["type"] == "tool_use":
                        start = {**block, "input": {}}
                        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                    else:
                        start = {"type": "text", "text": ""}
                        delta = {"type": "text_delta", "text": block["text"]}
                    self._event("content_block_start", {"index": i, "content_block": start})
                    self._event("content_block_delta", {"index": i, "delta": delta})
                    self._event("content_block_stop", {"index": i})
                self._event(
                    "message_delta",
                    {
                        "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None},
                        "usage": {"output_tokens": reply.output_tokens},
                    },
                )
                self._event("message_stop", {})
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _event(self, kind: str, data: dict[str, Any]) -> None:
                payload = f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _keep(self, seen: Seen) -> None:
        with self._lock:
            self.seen.append(seen)

    def __enter__(self) -> ScriptedMessages:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def posts(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "POST"]

    def tool_results(self) -> list[str]:
        """The content of every tool_result the client sent back, in order, each once (by its
        tool_use_id: a request carries the whole conversation so far)."""
        outs: dict[str, str] = {}
        for s in self.posts():
            messages = (s.body or {}).get("messages", []) if isinstance(s.body, dict) else []
            for m in messages:
                content = m.get("content") if isinstance(m, dict) else None
                for block in content if isinstance(content, list) else []:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        inner = block.get("content")
                        if isinstance(inner, list):
                            inner = "".join(str(c.get("text", "")) for c in inner if isinstance(c, dict))
                        outs.setdefault(str(block.get("tool_use_id")), str(inner))
        return list(outs.values())


def _message(reply: Reply, *, whole: bool) -> dict[str, Any]:
    return {
        "id": f"msg_{id(reply):x}",
        "type": "message",
        "role": "assistant",
        "model": "scripted",
        "content": reply.blocks if whole else [],
        "stop_reason": reply.stop_reason if whole else None,
        "stop_sequence": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens if whole else 1},
    }
