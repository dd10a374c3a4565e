"""A scripted model server speaking the OpenAI Responses API (streamed SSE or plain JSON) on
127.0.0.1, for the gateway's tests, its benchmark and the Codex end-to-end test.

Each POST takes the next `Reply` from the script: output items (tool calls, messages) and a usage
block, sent as `response.created`, one `response.output_item.done` per item and `response.completed`.
A reply may hold the stream open after its first event until the test releases it. Every request is
kept (path, headers, JSON body) for the test to read.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ids = itertools.count(1)


def exec_call(cmd: str) -> dict[str, Any]:
    """A `function_call` item asking Codex to run `cmd` through its exec_command tool."""
    n = next(_ids)
    return {
        "type": "function_call",
        "id": f"fc_{n}",
        "call_id": f"call_{n}",
        "name": "exec_command",
        "arguments": json.dumps({"cmd": cmd}),
        "status": "completed",
    }


def message(text: str) -> dict[str, Any]:
    n = next(_ids)
    return {
        "type": "message",
        "id": f"msg_{n}",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def usage(inp: int, out: int) -> dict[str, Any]:
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": inp + out,
    }


@dataclass
class Reply:
    items: list[dict[str, Any]]
    usage: dict[str, Any] = field(default_factory=lambda: usage(10, 5))
    hold: threading.Event | None = None  # when set: wait for it after the first event
    stream: bool | None = None  # None: as the request asks


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


class ScriptedModel:
    """`replies` is consumed one per POST; when it runs out, `fallback(request)` answers."""

    def __init__(self, replies: list[Reply] | None = None, fallback: Callable[[Seen], Reply] | None = None) -> None:
        self.replies = list(replies or [])
        self.fallback = fallback or (lambda seen: Reply([message("done")]))
        self.seen: list[Seen] = []
        self.sent_tokens = 0
        self._lock = threading.Lock()
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # each SSE event leaves at once, as a real server's would

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
                with model._lock:
                    model.seen.append(seen)
                    reply = model.replies.pop(0) if model.replies else model.fallback(seen)
                    model.sent_tokens += int(reply.usage.get("total_tokens", 0))
                wants_stream = isinstance(body, dict) and bool(body.get("stream"))
                stream = wants_stream if reply.stream is None else reply.stream
                if stream:
                    self._sse(reply)
                else:
                    self._plain(200, _response(reply, "completed"))

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
                seq = itertools.count()
                resp = _response(reply, "in_progress")
                self._event("response.created", {"response": resp, "sequence_number": next(seq)})
                if reply.hold is not None:
                    reply.hold.wait(30)
                for i, item in enumerate(reply.items):
                    self._event(
                        "response.output_item.done", {"output_index": i, "item": item, "sequence_number": next(seq)}
                    )
                done = _response(reply, "completed")
                self._event("response.completed", {"response": done, "sequence_number": next(seq)})
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

    def __enter__(self) -> ScriptedModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def tool_outputs(self) -> list[str]:
        """Every function_call_output the client sent back, in order."""
        outs = []
        for s in self.seen:
            for item in (s.body or {}).get("input", []) if isinstance(s.body, dict) else []:
                if isinstance(item, dict) and item.get("type") == "function_call_output":
                    out = item.get("output")
                    outs.append(out if isinstance(out, str) else json.dumps(out))
        return outs


def _response(reply: Reply, status: str) -> dict[str, Any]:
    done = status == "completed"
    return {
        "id": f"resp_{id(reply):x}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": "scripted",
        "output": reply.items if done else [],
        "usage": reply.usage if done else None,
    }
