"""Token usage read from the upstream's own responses, as they stream through the gateway.

Streamed (SSE): each event's `data:` JSON is looked at once, when its blank line arrives; the
Responses API reports usage in `response.completed` (`response.usage`), chat completions in a
final chunk's top-level `usage`. Non-streamed JSON: the body's `usage`. Never holds more than one
incomplete event (bounded); never changes the bytes that pass through.
"""

from __future__ import annotations

import json
from typing import Any

MAX_EVENT = 4 * 1024 * 1024  # an SSE event longer than this is skipped, not buffered further
MAX_JSON_BODY = 16 * 1024 * 1024


def usage_tokens(usage: Any) -> int:
    """total_tokens, else input + output (or prompt + completion); 0 when there is no usage."""
    if not isinstance(usage, dict):
        return 0
    total = usage.get("total_tokens")
    if isinstance(total, int) and not isinstance(total, bool):
        return max(0, total)
    keys = ("input_tokens", "output_tokens", "prompt_tokens", "completion_tokens")
    return sum(max(0, v) for k in keys if isinstance(v := usage.get(k), int) and not isinstance(v, bool))


def usage_of(doc: Any) -> int:
    """Tokens reported by one JSON document: an SSE event's data or a whole response body."""
    if not isinstance(doc, dict):
        return 0
    if "usage" in doc:
        return usage_tokens(doc["usage"])
    inner = doc.get("response")
    if isinstance(inner, dict) and "usage" in inner:  # response.completed / .incomplete / .failed
        return usage_tokens(inner["usage"])
    return 0


class SseUsage:
    """Feed it the raw bytes of an SSE stream in order; `feed` returns the tokens that chunk
    completed (usually 0, then the figure of `response.completed`)."""

    def __init__(self) -> None:
        self._buf = b""
        self._skipping = False
        self.tokens = 0

    def feed(self, chunk: bytes) -> int:
        self._buf += chunk
        found = 0
        while True:
            cut = _event_end(self._buf)
            if cut is None:
                break
            event, self._buf = self._buf[: cut[0]], self._buf[cut[1] :]
            if self._skipping:
                self._skipping = False
                continue
            found += _event_tokens(event)
        if len(self._buf) > MAX_EVENT:  # not an event we can read: drop it up to its end
            self._buf, self._skipping = b"", True
        self.tokens += found
        return found


def _event_end(buf: bytes) -> tuple[int, int] | None:
    """(end of the event, start of the next) for the first blank line, any line ending."""
    best: tuple[int, int] | None = None
    for sep in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        i = buf.find(sep)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, i + len(sep))
    return best


def _event_tokens(event: bytes) -> int:
    if b"usage" not in event:
        return 0
    data = [
        line[5:].removeprefix(b" ") for line in event.replace(b"\r\n", b"\n").split(b"\n") if line.startswith(b"data:")
    ]
    if not data:
        return 0
    try:
        doc = json.loads(b"\n".join(data))
    except ValueError:
        return 0
    return usage_of(doc)


class JsonUsage:
    """A non-streamed JSON body, kept (bounded) until it ends, then read for its usage."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> int:
        if self._size <= MAX_JSON_BODY:
            self._parts.append(chunk)
            self._size += len(chunk)
        return 0

    def finish(self) -> int:
        if self._size > MAX_JSON_BODY:
            return 0
        try:
            return usage_of(json.loads(b"".join(self._parts)))
        except ValueError:
            return 0
