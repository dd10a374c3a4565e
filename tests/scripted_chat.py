"""A scripted model server speaking OpenAI chat completions (streamed SSE or plain JSON) on
127.0.0.1, for the end-to-end tests of the agents that use it (opencode, Aider).

Each POST to .../chat/completions takes the next `Reply` from the script: tool calls and/or text,
and a usage block, streamed as the real API does with `stream_options.include_usage` (a chunk per
tool call, a chunk with the finish reason, a last chunk with `usage` and no choices, `[DONE]`).
A request without tools (a title or summary request) is answered by `untooled` and does not take
a scripted reply, unless `every` (an agent that never sends tools: Aider).
 Every request is kept (path, headers, JSON body) for the test to read.
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


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """A tool call: the agent runs its tool `name` with these arguments."""
    return {
        "id": f"call_{next(_ids):04d}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


@dataclass
class Reply:
    calls: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 10
    completion_tokens: int = 5

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


class ScriptedChat:
    """`replies` is consumed one per tooled POST; when it runs out, `fallback(request)` answers."""

    def __init__(
        self,
        replies: list[Reply] | None = None,
        fallback: Callable[[Seen], Reply] | None = None,
        untooled: Callable[[Seen], Reply] | None = None,
        *,
        every: bool = False,
    ) -> None:
        self.replies = list(replies or [])
        self.fallback = fallback or (lambda seen: Reply(text="done"))
        self.untooled = untooled or (lambda seen: Reply(text="a title", prompt_tokens=3, completion_tokens=2))
        self.seen: list[Seen] = []
        self.every = every
        self.sent_tokens = 0
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._plain(404, {"error": {"message": "not here"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                seen = Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                tooled = every or (isinstance(body, dict) and bool(body.get("tools")))
                with model._lock:
                    model.seen.append(seen)
                    if not tooled:
                        reply = model.untooled(seen)
                    else:
                        reply = model.replies.pop(0) if model.replies else model.fallback(seen)
                    model.sent_tokens += reply.tokens
                if isinstance(body, dict) and body.get("stream"):
                    self._sse(reply)
                else:
                    self._plain(200, _completion(reply))

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
                head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "scripted"}
                if reply.text:
                    delta = {"role": "assistant", "content": reply.text}
                    self._data({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                for i, c in enumerate(reply.calls):
                    delta = {"role": "assistant", "content": None, "tool_calls": [{"index": i, **c}]}
                    self._data({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
                finish = "tool_calls" if reply.calls else "stop"
                self._data({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
                usage = {
                    "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                    "total_tokens": reply.tokens,
                }
                self._data({**head, "choices": [], "usage": usage})
                self._chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _data(self, doc: dict[str, Any]) -> None:
                self._chunk(f"data: {json.dumps(doc)}\n\n".encode())

            def _chunk(self, payload: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedChat:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def tooled(self) -> list[Seen]:
        return [s for s in self.seen if isinstance(s.body, dict) and (self.every or s.body.get("tools"))]

    def tool_results(self) -> list[str]:
        """The content of every tool message the client sent back, in order, each once."""
        outs: dict[str, str] = {}
        for s in self.seen:
            for m in (s.body or {}).get("messages", []) if isinstance(s.body, dict) else []:
                if isinstance(m, dict) and m.get("role") == "tool":
                    content = m.get("content")
                    if isinstance(content, list):
                        content = "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
                    outs.setdefault(str(m.get("tool_call_id")), str(content))
        return list(outs.values())


def _completion(reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.calls:
        message["tool_calls"] = reply.calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if reply.calls else "stop"}],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.tokens,
        },
    }
