"""Usage as each provider protocol reports it (OpenAI Responses and chat completions, Anthropic
Messages, Gemini), streamed or not, whatever the chunking; and through a real gateway socket against
a scripted upstream: Anthropic and Gemini streams counted and cut at the budget, and the run token
swapped for the real key where each client puts it (`x-api-key`, `x-goog-api-key`, `?key=`)."""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from airlockd.gateway import Gateway, Route, RunTokens
from airlockd.gateway import usage as usage_mod
from airlockd.gateway.usage import JsonUsage, SseUsage, usage_of, usage_tokens

REAL_KEY = "sk-test-REALKEY-0123456789abcdefghijkl"
MESSAGES = "/v1/messages"
GEMINI = "/v1beta/models/m:streamGenerateContent"

# -- streams, as the providers send them -----------------------------------------------------------


def sse(*events: tuple[str | None, dict[str, Any] | str], nl: str = "\n") -> bytes:
    out = ""
    for name, data in events:
        if name is not None:
            out += f"event: {name}{nl}"
        out += f"data: {data if isinstance(data, str) else json.dumps(data)}{nl}{nl}"
    return out.encode()


ANTHROPIC_SKELETON = (  # the brief's skeleton, byte for byte
    b"\n".join(
        [
            b"event: message_start",
            b'data: {"type":"message_start","message":{"id":"msg_01","type":"message","role":"assistant",'
            b'"model":"m","content":[],"stop_reason":null,"stop_sequence":null,'
            b'"usage":{"input_tokens":10,"output_tokens":1}}}',
            b"",
            b"event: content_block_start",
            b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
            b"",
            b"event: content_block_delta",
            b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Done."}}',
            b"",
            b"event: content_block_stop",
            b'data: {"type":"content_block_stop","index":0}',
            b"",
            b"event: message_delta",
            b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
            b'"usage":{"output_tokens":5}}',
            b"",
            b"event: message_stop",
            b'data: {"type":"message_stop"}',
        ]
    )
    + b"\n\n"
)


def anthropic_events(
    inp: int, first_out: int, out: int, text: str = "Done.", *, repeat_input: bool = False, **cache: int
) -> list[tuple[str | None, dict[str, Any]]]:
    start_usage = {"input_tokens": inp, "output_tokens": first_out, **cache}
    delta_usage: dict[str, Any] = {"output_tokens": out}
    if repeat_input:  # newer API versions repeat the input figures in message_delta (cumulative too)
        delta_usage = {"input_tokens": inp, **cache, "output_tokens": out}
    message = {"id": "msg_01", "type": "message", "role": "assistant", "model": "m", "content": []}
    return [
        ("message_start", {"type": "message_start", "message": {**message, "usage": start_usage}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}),
        ("ping", {"type": "ping"}),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": delta_usage},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def gemini_chunk(text: str, prompt: int, cand: int, total: int | None = None, last: bool = False, **more: int) -> Any:
    cand_doc: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}}
    if last:
        cand_doc["finishReason"] = "STOP"
    meta = {"promptTokenCount": prompt, "candidatesTokenCount": cand, **more}
    if total is not None:
        meta["totalTokenCount"] = total
    return {"candidates": [cand_doc], "usageMetadata": meta, "modelVersion": "m"}


GEMINI_CHUNKS = [
    gemini_chunk("hi", 10, 2, 12),
    gemini_chunk(" there", 10, 5, 15),
    gemini_chunk("!", 10, 9, 23, last=True, thoughtsTokenCount=4),
]
GEMINI_SSE = sse(*[(None, c) for c in GEMINI_CHUNKS], nl="\r\n")


def chat_chunk(content: str | None, usage: dict[str, int] | None = None, finish: str | None = None) -> dict[str, Any]:
    choices = [] if content is None else [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]
    return {"id": "c1", "object": "chat.completion.chunk", "choices": choices, "usage": usage}


CHAT_SSE = sse(
    (None, chat_chunk("he")),
    (None, chat_chunk("llo", finish="stop")),
    (None, chat_chunk(None, {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})),
    (None, "[DONE]"),
)

RESPONSES_USAGE = {
    "input_tokens": 120,
    "input_tokens_details": {"cached_tokens": 100},
    "output_tokens": 30,
    "output_tokens_details": {"reasoning_tokens": 20},
    "total_tokens": 150,
}
RESPONSES_SSE = sse(
    ("response.created", {"type": "response.created", "response": {"id": "r", "usage": None}}),
    ("response.output_item.done", {"type": "response.output_item.done", "item": {"type": "message"}}),
    ("response.completed", {"type": "response.completed", "response": {"id": "r", "usage": RESPONSES_USAGE}}),
)

STREAMS: dict[str, tuple[bytes, int]] = {
    "anthropic": (ANTHROPIC_SKELETON, 15),
    "anthropic-crlf": (ANTHROPIC_SKELETON.replace(b"\n", b"\r\n"), 15),
    "anthropic-cr": (ANTHROPIC_SKELETON.replace(b"\n", b"\r"), 15),
    "anthropic-cache": (sse(*anthropic_events(10, 1, 5, cache_creation_input_tokens=100)), 115),
    "gemini": (GEMINI_SSE, 23),
    "chat-completions": (CHAT_SSE, 10),
    "responses": (RESPONSES_SSE, 150),
}


def meter(stream: bytes, cuts: list[int]) -> tuple[int, list[int]]:
    """Feed `stream` cut at those offsets: (the meter's total, the increments it returned)."""
    m = SseUsage()
    bounds = [0, *cuts, len(stream)]
    grown = [m.feed(stream[a:b]) for a, b in itertools.pairwise(bounds)]
    assert sum(grown) == m.tokens
    return m.tokens, grown


# -- the meters ----------------------------------------------------------------------------------


def test_anthropic_stream_counts_input_once_and_the_last_output() -> None:
    assert meter(ANTHROPIC_SKELETON, [])[0] == 15  # 10 input + 5 output: not 5 (delta only), not 16 (1 + 5)
    ends = [i + 2 for i in range(len(ANTHROPIC_SKELETON)) if ANTHROPIC_SKELETON.startswith(b"\n\n", i)]
    total, grown = meter(ANTHROPIC_SKELETON, ends[:-1])  # event by event, as it streams
    assert total == 15
    assert [g for g in grown if g] == [11, 4]  # the input is counted when message_start arrives


def test_anthropic_cache_figures_count_as_input_whether_or_not_message_delta_repeats_them() -> None:
    cache = {"cache_creation_input_tokens": 100, "cache_read_input_tokens": 2000}
    assert meter(sse(*anthropic_events(10, 1, 5, **cache)), [])[0] == 2115
    assert meter(sse(*anthropic_events(10, 1, 5, repeat_input=True, **cache)), [])[0] == 2115
    body = {
        "id": "msg_01",
        "type": "message",
        "content": [],
        "usage": {"input_tokens": 10, "output_tokens": 5, **cache},
    }
    plain = JsonUsage()
    plain.feed(json.dumps(body).encode())
    assert plain.finish() == 2115


def test_gemini_stream_counts_the_last_cumulative_usage_metadata() -> None:
    assert meter(GEMINI_SSE, [])[0] == 23  # the last chunk's total, not the sum of the three
    assert meter(sse(*[(None, c) for c in GEMINI_CHUNKS[:2]]), [])[0] == 15
    no_total = sse((None, gemini_chunk("a", 10, 2)), (None, gemini_chunk("b", 10, 6, thoughtsTokenCount=3)))
    assert meter(no_total, [])[0] == 19  # prompt + candidates + thoughts when totalTokenCount is missing


def test_gemini_generate_content_and_the_json_array_stream() -> None:
    for body, want in [(GEMINI_CHUNKS[2], 23), (GEMINI_CHUNKS, 23), ([GEMINI_CHUNKS[0]], 12)]:
        plain = JsonUsage()
        plain.feed(json.dumps(body).encode())
        assert plain.finish() == want


def test_openai_shapes_are_counted_as_before() -> None:
    assert meter(CHAT_SSE, [])[0] == 10  # chat completions: the final chunk's usage
    assert meter(RESPONSES_SSE, [])[0] == 150  # Responses: response.completed's usage, cached not twice
    assert usage_tokens(RESPONSES_USAGE) == 150
    assert usage_tokens({"prompt_tokens": 7, "completion_tokens": 3}) == 10
    assert usage_tokens(None) == usage_tokens({"total_tokens": True}) == 0
    assert usage_of({"type": "response.completed", "response": {"usage": RESPONSES_USAGE}}) == 150
    assert usage_of({"type": "response.created", "response": {"usage": None}}) == 0
    assert usage_of({"usage": {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}}) == 10


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_any_chunking_gives_the_same_total(name: str) -> None:
    stream, want = STREAMS[name]
    assert meter(stream, [])[0] == want
    assert meter(stream, list(range(1, len(stream))))[0] == want  # byte by byte
    for cut in range(1, len(stream)):  # split in two anywhere (inside an event, a \r\n, a blank line)
        assert meter(stream, [cut])[0] == want, cut


def test_an_event_too_long_is_skipped_and_the_buffer_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usage_mod, "MAX_EVENT", 256)
    big = sse((None, {"usage": {"total_tokens": 1000}, "pad": "x" * 1000}), nl="\r\n")
    m = SseUsage()
    for i in range(0, len(big), 7):
        assert m.feed(big[i : i + 7]) == 0
        assert len(m._buf) <= 256 + 7
    assert m.feed(GEMINI_SSE) == 23  # the next event is read again


# -- through the gateway ---------------------------------------------------------------------------


@dataclass
class Answer:
    chunks: list[bytes]
    content_type: str = "text/event-stream"
    hold: threading.Event | None = None  # waited for before the chunk at hold_at
    hold_at: int = 0


@dataclass
class Seen:
    target: str
    headers: dict[str, str]


@dataclass
class Upstream:
    """A scripted upstream: each POST takes the next answer and sends its chunks, each as one
    HTTP chunk, flushed."""

    answers: list[Answer] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            up.seen.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}))
            answer = up.answers.pop(0) if up.answers else Answer([sse((None, gemini_chunk("", 1, 1, 2)))])
            self.send_response(200)
            self.send_header("content-type", answer.content_type)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i, chunk in enumerate(answer.chunks):
                if answer.hold is not None and i == answer.hold_at:
                    answer.hold.wait(10)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    up.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield up
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    gw = Gateway(RunTokens()).start()
    yield gw
    gw.shutdown()


class Run:
    def __init__(self, gw: Gateway, up: Upstream, tmp: Path, path: str, provider: str, budget: int | None = None):
        self.measured: list[int] = []
        self.refused: list[tuple[str, dict[str, Any]]] = []
        self.budget = budget
        d = tmp / "r1"
        d.mkdir()
        sock = d / "gateway.sock"
        route = Route(up.url, frozenset({("POST", path)}), REAL_KEY, provider=provider)
        self.token = gw.open_run("r1", "agent", route, sock, ttl_s=60, on_usage=self._usage, on_refused=self._refused)
        self.client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://gw", timeout=10)

    def _usage(self, n: int) -> bool:
        self.measured.append(n)
        return self.budget is not None and sum(self.measured) >= self.budget

    def _refused(self, reason: str, data: dict[str, Any]) -> None:
        self.refused.append((reason, data))


def one_chunk_per_event(stream: bytes, sep: bytes = b"\n\n") -> list[bytes]:
    return [part + sep for part in stream.split(sep) if part]


def cut_stream(run: Run, target: str, headers: dict[str, str], hold: threading.Event, seen_text: str) -> str:
    """Read a stream the gateway cuts; release the upstream's held rest once `seen_text` came."""
    text = ""
    with (
        pytest.raises(httpx.TransportError),  # the stream ends without its last events
        run.client.stream("POST", target, json={"stream": True}, headers=headers) as resp,
    ):
        assert resp.status_code == 200
        for chunk in resp.iter_text():
            text += chunk
            if seen_text in text:
                hold.set()
    return text


def test_anthropic_stream_through_the_gateway_counts_and_cuts_at_the_budget(
    gateway: Gateway, upstream: Upstream, tmp_path: Path
) -> None:
    run = Run(gateway, upstream, tmp_path, MESSAGES, "anthropic", budget=100)
    hold = threading.Event()
    second = one_chunk_per_event(sse(*anthropic_events(30, 1, 20, text="partial")))
    upstream.answers = [
        Answer(one_chunk_per_event(ANTHROPIC_SKELETON)),
        Answer(one_chunk_per_event(sse(*anthropic_events(30, 1, 15)))),
        Answer(second, hold=hold, hold_at=5),  # message_delta (output 20) waits for the client to read "partial"
    ]
    headers = {"x-api-key": run.token, "anthropic-version": "2023-06-01"}
    resp = run.client.post(MESSAGES, json={"stream": True}, headers=headers)
    assert resp.status_code == 200 and resp.content == ANTHROPIC_SKELETON  # passed through unchanged
    assert sum(run.measured) == 15
    assert run.client.post(MESSAGES, json={"stream": True}, headers=headers).status_code == 200
    assert sum(run.measured) == 60
    text = cut_stream(run, MESSAGES, headers, hold, "partial")
    assert "content_block_delta" in text and "message_delta" not in text and "message_stop" not in text
    assert sum(run.measured) == 110 and gateway.gate("r1").cut  # type: ignore[union-attr]
    assert run.client.post(MESSAGES, json={"stream": True}, headers=headers).status_code == 429
    seen = upstream.seen[0].headers
    assert seen["x-api-key"] == REAL_KEY and seen["anthropic-version"] == "2023-06-01"
    assert all(run.token not in json.dumps(s.headers) + s.target for s in upstream.seen)


def test_gemini_stream_through_the_gateway_counts_and_cuts_at_the_budget(
    gateway: Gateway, upstream: Upstream, tmp_path: Path
) -> None:
    run = Run(gateway, upstream, tmp_path, GEMINI, "generic", budget=40)
    hold = threading.Event()
    second = [gemini_chunk("partial", 10, 2, 12), gemini_chunk(" late", 10, 10, 20, last=True)]
    upstream.answers = [
        Answer(one_chunk_per_event(GEMINI_SSE, b"\r\n\r\n")),
        Answer([sse((None, c), nl="\r\n") for c in second], hold=hold, hold_at=1),
    ]
    headers = {"x-goog-api-key": run.token}
    resp = run.client.post(f"{GEMINI}?alt=sse", json={}, headers=headers)
    assert resp.status_code == 200 and resp.content == GEMINI_SSE
    assert sum(run.measured) == 23
    text = cut_stream(run, f"{GEMINI}?alt=sse", headers, hold, "partial")
    assert "partial" in text and "late" not in text
    assert sum(run.measured) == 43 and gateway.gate("r1").cut  # type: ignore[union-attr]
    assert run.client.post(f"{GEMINI}?alt=sse", json={}, headers=headers).status_code == 429


def test_gemini_plain_answer_through_the_gateway_is_counted(
    gateway: Gateway, upstream: Upstream, tmp_path: Path
) -> None:
    path = "/v1beta/models/m:generateContent"
    run = Run(gateway, upstream, tmp_path, path, "generic")
    upstream.answers = [Answer([json.dumps(GEMINI_CHUNKS[2]).encode()], content_type="application/json")]
    assert run.client.post(path, json={}, headers={"x-goog-api-key": run.token}).status_code == 200
    assert run.measured == [23]


def test_run_token_in_x_goog_api_key_or_key_param_goes_upstream_as_the_real_key(
    gateway: Gateway, upstream: Upstream, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    run = Run(gateway, upstream, tmp_path, GEMINI, "generic")
    tok = run.token
    assert run.client.post(f"{GEMINI}?alt=sse", json={}, headers={"X-Goog-Api-Key": tok}).status_code == 200
    assert run.client.post(f"{GEMINI}?alt=sse&key={tok}", json={}).status_code == 200
    assert run.client.post(f"{GEMINI}?key={tok}", json={}).status_code == 200
    # a key of the agent's own in the query never passes either
    assert (
        run.client.post(f"{GEMINI}?key=AIza-agents-own&alt=sse", json={}, headers={"x-goog-api-key": tok}).status_code
        == 200
    )
    targets = [s.target for s in upstream.seen]
    assert targets == [f"{GEMINI}?alt=sse", f"{GEMINI}?alt=sse", GEMINI, f"{GEMINI}?alt=sse"]
    for s in upstream.seen:
        assert s.headers["x-goog-api-key"] == REAL_KEY
        assert "authorization" not in s.headers  # Google reads a bearer as an OAuth token
        assert tok not in json.dumps(s.headers)
    for wrong in ("alrt_forged.x", RunTokens().mint("r1", "agent", 60)):
        assert run.client.post(f"{GEMINI}?alt=sse&key={wrong}", json={}).status_code == 401
        assert run.client.post(GEMINI, json={}, headers={"x-goog-api-key": wrong}).status_code == 401
    assert run.client.post(f"{GEMINI}?key=AIza-agents-own", json={}).status_code == 401  # not a run token
    assert len(upstream.seen) == 4
    deadline = time.monotonic() + 5  # refusals are audited after the answer goes out
    while len(run.refused) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(run.refused) == 5
    assert REAL_KEY not in caplog.text
    gateways = [r.getMessage() for r in caplog.records if "http://gw/" not in r.getMessage()]  # not the test's
    assert any(upstream.url in m for m in gateways)  # the gateway's upstream requests are logged, URL and all
    assert not [m for m in gateways if tok in m or "key=" in m]
    assert all(tok not in json.dumps(d) and "key=" not in json.dumps(d) for _, d in run.refused)


def test_run_token_in_x_api_key_goes_upstream_as_the_real_key(
    gateway: Gateway, upstream: Upstream, tmp_path: Path
) -> None:
    run = Run(gateway, upstream, tmp_path, MESSAGES, "anthropic")
    upstream.answers = [Answer(one_chunk_per_event(ANTHROPIC_SKELETON))]
    assert run.client.post(MESSAGES, json={}, headers={"X-Api-Key": run.token}).status_code == 200
    seen = upstream.seen[0]
    assert seen.headers["x-api-key"] == REAL_KEY and "x-goog-api-key" not in seen.headers
    assert "authorization" not in seen.headers  # a bearer at Anthropic is an OAuth token, not the key
    assert run.token not in json.dumps(seen.headers)
    assert run.client.post(MESSAGES, json={}, headers={"x-api-key": "sk-ant-own"}).status_code == 401
    assert len(upstream.seen) == 1
