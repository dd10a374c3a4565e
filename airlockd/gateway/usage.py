"""Token usage read from the upstream's own responses, as they stream through the gateway.

Where each protocol reports usage (the figures named are the ones counted):

- OpenAI Responses API: `response.completed` (and `.incomplete` / `.failed`) carries
  `response.usage` {input_tokens, output_tokens, total_tokens}; a plain JSON answer, its `usage`.
- OpenAI chat completions: a final chunk's top-level `usage` {prompt_tokens, completion_tokens,
  total_tokens} (the other chunks have none or null); a plain JSON answer, its `usage`.
- Anthropic Messages: `message_start` carries `message.usage` {input_tokens,
  cache_creation_input_tokens, cache_read_input_tokens, output_tokens (a first few)};
  `message_delta` carries top-level `usage` {output_tokens}, cumulative for the message (newer API
  versions repeat the input and cache figures there, cumulative too); a plain JSON answer, its
  `usage`. The cache figures count as input (Anthropic's input_tokens leaves them out).
- Gemini `streamGenerateContent?alt=sse` and `generateContent`: each chunk (or the body) may carry
  `usageMetadata` {promptTokenCount, toolUsePromptTokenCount, candidatesTokenCount,
  thoughtsTokenCount, totalTokenCount}, cumulative over the chunks of a response
  (cachedContentTokenCount is part of promptTokenCount). `streamGenerateContent` without `alt=sse`
  answers one JSON array of those chunks, read as a plain JSON answer.

Because some figures are cumulative, one response's usage (`Usage`) keeps the largest value seen
per field, never a sum: its tokens are max(total, input + output), each of those read from the
fields above. A stream's meter (`SseUsage`) reads each event's `data:` JSON once, when its blank line
arrives (any line ending; a chunk may end anywhere), and `feed` returns how much the response's
tokens grew since it last answered, so the budget hook gets increments as they come and can cut
the stream as soon as the budget is passed. A plain JSON answer (`JsonUsage`) is read when it ends.

Bounded: a meter never holds more than one incomplete event (an event longer than MAX_EVENT is
skipped) or a JSON body past MAX_JSON_BODY (not read then). Such an event or body, or one that
mentions usage and cannot be parsed, is marked (`unreadable`): its usage is unknown, and the gateway
charges that response an estimate rather than nothing. The bytes
that pass are never changed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

MAX_EVENT = 4 * 1024 * 1024  # an SSE event longer than this is skipped, not buffered further
MAX_JSON_BODY = 16 * 1024 * 1024

# The fields read, by what they count. Within `_INPUT` (or `_OUTPUT`, `_TOTAL`) the names are one
# figure spelled by different protocols (the largest is taken); `_INPUT_MORE` and `_OUTPUT_MORE`
# are counted on top of it.
_INPUT = ("input_tokens", "prompt_tokens", "promptTokenCount")
_INPUT_MORE = ("cache_creation_input_tokens", "cache_read_input_tokens", "toolUsePromptTokenCount")
_OUTPUT = ("output_tokens", "completion_tokens", "candidatesTokenCount")
_OUTPUT_MORE = ("thoughtsTokenCount",)  # Gemini's thinking is not in candidatesTokenCount
_TOTAL = ("total_tokens", "totalTokenCount")
_FIELDS = _INPUT + _INPUT_MORE + _OUTPUT + _OUTPUT_MORE + _TOTAL

# A blank line: two line endings, each CRLF, LF or a lone CR. A CR at the very end of the buffer
# is taken as a line ending: whatever follows it (LF or not), the blank line is there.
_BLANK_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
_LINE_END = re.compile(rb"\r\n|\r|\n")
_LONGEST_BLANK = 4  # len(b"\r\n\r\n"): a blank line may start this far back in what was scanned


class Usage:
    """One response's usage: the largest value seen per field, whatever the protocol."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def add(self, usage: Any) -> None:
        """Fold in one usage block (`usage`, `usageMetadata`); anything else is ignored."""
        if not isinstance(usage, dict):
            return
        for name in _FIELDS:
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > self.seen.get(name, 0):
                self.seen[name] = value

    def add_doc(self, doc: Any) -> None:
        """Fold in every usage block of a JSON document: an SSE event's data or a whole body."""
        for block in _blocks(doc):
            self.add(block)

    @property
    def tokens(self) -> int:
        seen = self.seen
        inp = max(seen.get(k, 0) for k in _INPUT) + sum(seen.get(k, 0) for k in _INPUT_MORE)
        out = max(seen.get(k, 0) for k in _OUTPUT) + sum(seen.get(k, 0) for k in _OUTPUT_MORE)
        return max(max(seen.get(k, 0) for k in _TOTAL), inp + out)


def _blocks(doc: Any) -> Iterator[Any]:
    if isinstance(doc, list):  # Gemini's streamGenerateContent without alt=sse: an array of chunks
        for item in doc:
            if isinstance(item, dict):
                yield from _blocks(item)
        return
    if not isinstance(doc, dict):
        return
    yield doc.get("usage")  # chat completions, Anthropic's message_delta, any plain JSON answer
    yield doc.get("usageMetadata")  # Gemini
    for inner in ("response", "message"):  # Responses API events; Anthropic's message_start
        sub = doc.get(inner)
        if isinstance(sub, dict):
            yield sub.get("usage")


def usage_tokens(usage: Any) -> int:
    """Tokens of one usage block: max(total, input + output); 0 when there is no usage."""
    one = Usage()
    one.add(usage)
    return one.tokens


def usage_of(doc: Any) -> int:
    """Tokens reported by one JSON document: an SSE event's data or a whole response body."""
    one = Usage()
    one.add_doc(doc)
    return one.tokens


class SseUsage:
    """Feed it the raw bytes of one SSE response in order; `feed` returns how many tokens the
    response's usage grew by with that chunk (0 while nothing new is reported)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._scanned = 0  # no blank line starts before this offset of the buffer
        self._skipping = False  # the buffer holds the rest of an event too long to read
        self.usage = Usage()
        self.tokens = 0  # what feed has reported in all
        self.unreadable = False  # an event about usage could not be read: its usage is unknown

    def feed(self, chunk: bytes) -> int:
        self._buf += chunk
        while (end := _BLANK_LINE.search(self._buf, self._scanned)) is not None:
            event = bytes(self._buf[: end.start()])
            del self._buf[: end.end()]
            self._scanned = 0
            if self._skipping:
                self._skipping = False
                continue
            try:
                self.usage.add_doc(_event_doc(event))
            except ValueError:
                self.unreadable = True
        self._scanned = max(0, len(self._buf) - _LONGEST_BLANK)
        if len(self._buf) > MAX_EVENT:  # not an event we can read: drop it up to its end
            del self._buf[:-_LONGEST_BLANK]  # its last bytes may begin the blank line that ends it
            self._scanned, self._skipping, self.unreadable = 0, True, True
        grown = self.usage.tokens - self.tokens  # never negative: every figure only grows
        self.tokens += grown
        return grown


def _event_doc(event: bytes) -> Any:
    if b"usage" not in event:  # also in "usageMetadata"
        return None
    data = [line[5:].removeprefix(b" ") for line in _LINE_END.split(event) if line.startswith(b"data:")]
    if not data:
        return None
    try:
        return json.loads(b"\n".join(data))  # ValueError: the caller marks the event unreadable
    except RecursionError:  # nested deeper than the parser goes
        raise ValueError("nested too deep") from None


class JsonUsage:
    """A non-streamed JSON body, kept (bounded) until it ends, then read for its usage."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self.tokens = 0  # what finish reported
        self.unreadable = False  # the body passed MAX_JSON_BODY: its usage is unknown

    def feed(self, chunk: bytes) -> int:
        self._size += len(chunk)
        if self._size > MAX_JSON_BODY:
            self._parts.clear()  # not read: let it go
            self.unreadable = True
        else:
            self._parts.append(chunk)
        return 0

    def finish(self) -> int:
        """The body's tokens, once it has ended (0 when it was too large or is not JSON)."""
        if self.unreadable:
            return 0
        try:
            self.tokens = usage_of(json.loads(b"".join(self._parts)))
        except (ValueError, RecursionError):
            self.tokens = 0
        self._parts.clear()
        return self.tokens
