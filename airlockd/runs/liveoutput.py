"""The agent's own account, live: what its container prints, as a person may watch it (the editor's
output view, `airlockd run --follow`), never as evidence (the proposal is what the staging
filesystem holds, whatever the agent says).

The agent decides these bytes, so before they reach a person they are:

- cut into whole lines, each redacted whole before anything else (a value split across two
  sends would pass in halves); of a line longer than LINE_BYTES, its first LINE_BYTES are
  redacted and only the first SHOWN of them shown (a secret that starts there and goes on past
  the window is never shown in part, up to LINE_BYTES - SHOWN long), the rest counted as dropped;
- then written with every hidden character escaped (`names.escape`: terminal escapes, bidi
  controls, carriage returns that would overwrite a line), so output cannot drive the viewer's
  terminal or hide a line (escaping after redacting: an escape never splits a secret the
  redactor would have folded whole);
- sent at most RATE bytes a second on average (bursts of BURST), in batches at most every
  INTERVAL_S: an agent flooding its output costs the daemon and the editor that much, and what
  is dropped is counted (`dropped`, bytes) and said in the next batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from airlockd.names import escape

LINE_BYTES = 4096
SHOWN = 3072  # characters shown of a line longer than LINE_BYTES
RATE = 64 * 1024  # bytes a second, on average
BURST = 256 * 1024
INTERVAL_S = 0.1
BATCH_BYTES = 16 * 1024  # a batch this large goes at once

Send = Callable[[str, int], None]  # (text of whole lines, bytes dropped since the last send)


class LiveOutput:
    """Feed it the container's output chunks (any thread); it calls `send` with batches of lines.
    `close` sends what is left (a last line without its newline included)."""

    def __init__(
        self, send: Send, *, redact: Callable[[str], str] = str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._send, self._redact, self._clock = send, redact, clock
        self._skipping = False  # in the rest of a line too long to show
        self._lock = threading.Lock()
        self._partial = b""
        self._lines: list[str] = []
        self._pending = 0
        self._dropped = 0
        self._tokens = float(BURST)
        self._at = clock()
        self._last_send = 0.0
        self._timer: threading.Timer | None = None  # sends lines that wait for no more output
        self._closed = False
        self._ready: list[tuple[str, int]] = []  # full batches taken while a chunk was cut into lines

    def feed(self, chunk: bytes) -> None:
        with self._lock:
            data = self._partial + chunk
            start = 0
            while start < len(data):
                nl = data.find(b"\n", start)
                if self._skipping:  # the rest of a line too long: counted, not shown
                    end = len(data) if nl < 0 else nl + 1
                    self._dropped += end - start
                    start, self._skipping = end, nl < 0
                elif nl >= 0 and nl - start <= LINE_BYTES:
                    self._line(data[start:nl])
                    start = nl + 1
                elif len(data) - start > LINE_BYTES:
                    self._line(data[start : start + LINE_BYTES], cut=True)
                    start, self._skipping = start + LINE_BYTES, True
                else:
                    break
            self._partial = data[start:]
            batch = self._due()
            if batch is None and self._lines and self._timer is None and not self._closed:
                self._timer = threading.Timer(INTERVAL_S, self._flush)
                self._timer.daemon = True
                self._timer.start()
            batches, self._ready = [*self._ready, *([batch] if batch else [])], []
        for b in batches:
            self._send(*b)

    def _flush(self) -> None:
        with self._lock:
            self._timer = None
            batch = self._take() if self._lines and not self._closed else None
        if batch is not None:
            self._send(*batch)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._partial:
                self._line(self._partial)
                self._partial = b""
            batch = self._take() if self._lines or self._dropped else None
            batches, self._ready = [*self._ready, *([batch] if batch else [])], []
        for b in batches:
            self._send(*b)

    def _line(self, raw: bytes, *, cut: bool = False) -> None:
        text = self._redact(raw.decode("utf-8", "replace").removesuffix("\r"))
        if cut:
            text = text[:SHOWN] + " [… the rest of this long line is not shown]"
        shown = escape(text)
        now = self._clock()
        self._tokens = min(float(BURST), self._tokens + (now - self._at) * RATE)
        self._at = now
        size = len(shown) + 1
        if self._tokens < size:
            self._dropped += len(raw) + 1
            return
        self._tokens -= size
        self._lines.append(shown)
        self._pending += size
        if self._pending >= BATCH_BYTES:  # no batch grows past this, however much one chunk held
            self._ready.append(self._take())

    def _due(self) -> tuple[str, int] | None:
        if not self._lines:
            return None
        if self._pending < BATCH_BYTES and self._clock() - self._last_send < INTERVAL_S:
            return None
        return self._take()

    def _take(self) -> tuple[str, int]:
        text = "".join(line + "\n" for line in self._lines)
        dropped = self._dropped
        self._lines, self._pending, self._dropped = [], 0, 0
        self._last_send = self._clock()
        return text, dropped
