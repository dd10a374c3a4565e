"""A scripted model server speaking the Gemini API (`streamGenerateContent?alt=sse` and
`generateContent`) on 127.0.0.1, for Gemini CLI's end-to-end test.

Each POST of a request with tools takes the next `Reply` from the script: function calls and/or
text, and usage, streamed as one SSE event with `usageMetadata` (the real API's last chunk carries
the whole figures). A request without tools (a router or summary call) is answered by `untooled`
and takes no scripted reply. Every request is kept (path, headers, JSON body).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def call(name: str, **args: Any) -> dict[str, Any]:
    """A function call: Gemini CLI runs its tool `name` with these arguments."""
    return {"functionCall": {"name": name, "args": args}}


@dataclass
class Reply:
    calls: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    prompt_tokens: int = 10
    candidate_tokens: int = 5

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.candidate_tokens


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


class ScriptedGemini:
    """`replies` is consumed one per tooled POST; when it runs out, `fallback(request)` answers."""

    def __init__(
        self,
        replies: list[Reply] | None = None,
        fallback: Callable[[Seen], Reply] | None = None,
        untooled: Callable[[Seen], Reply] | None = None,
    ) -> None:
        self.replies = list(replies or [])
        self.fallback = fallback or (lambda seen: Reply(text="done"))
        self.untooled = untooled or (lambda seen: Reply(text='{"complexity_reasoning": "x", "complexity_score": 10}'))
        self.seen: list[Seen] = []
        self.sent_tokens = 0
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._plain(404, {"error": {"code": 404, "message": "not here", "status": "NOT_FOUND"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                seen = Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                tooled = isinstance(body, dict) and bool(body.get("tools"))
                with model._lock:
                    model.seen.append(seen)
                    if not tooled:
                        reply = model.untooled(seen)
                    else:
                        reply = model.replies.pop(0) if model.replies else model.fallback(seen)
                    model.sent_tokens += reply.tokens
                if ":streamGenerateContent" in self.path:
                    self._sse(reply)
                else:
                    self._plain(200, _response(reply))

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
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                payload = f"data: {json.dumps(_response(reply))}\r\n\r\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedGemini:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def tooled(self) -> list[Seen]:
        return [s for s in self.seen if isinstance(s.body, dict) and s.body.get("tools")]

    def tool_results(self) -> list[str]:
        """The output of every functionResponse the client sent back, in order, each once."""
        outs: dict[str, str] = {}
        for s in self.seen:
            for content in (s.body or {}).get("contents", []) if isinstance(s.body, dict) else []:
                for part in content.get("parts", []) if isinstance(content, dict) else []:
                    resp = part.get("functionResponse") if isinstance(part, dict) else None
                    if isinstance(resp, dict):
                        key = str(resp.get("id") or f"{resp.get('name')}-{len(outs)}")
                        outs.setdefault(key, json.dumps(resp.get("response")))
        return list(outs.values())


def _response(reply: Reply) -> dict[str, Any]:
    parts = [*reply.calls, *([{"text": reply.text}] if reply.text else [])]
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {
            "promptTokenCount": reply.prompt_tokens,
            "candidatesTokenCount": reply.candidate_tokens,
            "totalTokenCount": reply.tokens,
        },
        "modelVersion": "scripted",
        "responseId": "r1",
    }
