"""Usage as each provider protocol reports it (OpenAI Responses and chat completions, Anthropic
Messages, Gemini), streamed or not, whatever the chunking; and through a real gateway socket against
a scripted upstream: Anthropic and Gemini streams counted and cut at the budget, and the run token
swapped for the real key where each client puts it (`x-api-key`, `x-goog-api-key`, `?key=`).

Then what a hostile agent tried to be counted less (attack review): streamed chat completions that
do not ask for usage, answers that report none (or too large to read), a client that hangs up
before the usage event, query parameters that trim the answer or bill elsewhere, `.` segments, and
too many requests in flight at once."""

from __future__ import annotations

import itertools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from airlockd.gateway import Gateway, Route, RunTokens
from airlockd.gateway import server as server_mod
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
    status: int = 200
    sleeps: dict[int, float] = field(default_factory=dict)  # seconds to wait before the chunk at that index
    broken: bool = False  # the connection drops after the chunks, without the chunked body's end


@dataclass
class Seen:
    target: str
    headers: dict[str, str]
    body: bytes = b""


@dataclass
class Upstream:
    """A scripted upstream: each POST takes the next answer (or asks `answer_for` with the
    request's body) and sends its chunks, each as one HTTP chunk, flushed."""

    answers: list[Answer] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    answer_for: Callable[[bytes], Answer] | None = None


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    up = Upstream()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            up.seen.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            if up.answer_for is not None:
                answer = up.answer_for(body)
            else:
                answer = up.answers.pop(0) if up.answers else Answer([sse((None, gemini_chunk("", 1, 1, 2)))])
            self.send_response(answer.status)
            self.send_header("content-type", answer.content_type)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            try:
                for i, chunk in enumerate(answer.chunks):
                    if answer.hold is not None and i == answer.hold_at:
                        answer.hold.wait(10)
                    time.sleep(answer.sleeps.get(i, 0))
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                if answer.broken:
                    self.close_connection = True
                    return
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:  # the gateway left (a test of that)
                self.close_connection = True

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
        self.sock = sock = d / "gateway.sock"
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


# -- counted less than it used: the attack review ----------------------------------------------------

CHAT = "/v1/chat/completions"
CHAT_USAGE = {"prompt_tokens": 700, "completion_tokens": 300, "total_tokens": 1000}


def wait_for(cond: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cond()


def raw_request(sock: Path, target: str, headers: dict[str, str], body: bytes = b"{}") -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(str(sock))
    head = "".join(f"{k}: {v}\r\n" for k, v in {"host": "gw", **headers, "content-length": str(len(body))}.items())
    s.sendall(f"POST {target} HTTP/1.1\r\n{head}\r\n".encode() + body)
    return s


def read_until(s: socket.socket, marker: bytes) -> bytes:
    got = b""
    while marker not in got:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_ask_for_usage_changes_only_streamed_chat_bodies_that_do_not_ask() -> None:
    ask = server_mod._ask_for_usage
    body = b' \n{"model":"m","stream":true,"messages":[{"role":"user","content":"h\\u00e9"}]}'
    assert ask(body) == body.replace(b"{", b'{"stream_options":{"include_usage":true},', 1)  # bytes kept
    present = json.dumps({"model": "m", "stream_options": {"include_usage": False, "x": 1}, "stream": True})
    doc = json.loads(ask(present.encode()))
    assert list(doc) == ["model", "stream_options", "stream"]  # the key order is kept
    assert doc["stream_options"] == {"include_usage": True, "x": 1}
    for odd in (b'{"stream":true,"stream_options":null}', b'{"stream":true,"stream\\u005foptions":"x"}'):
        assert json.loads(ask(odd))["stream_options"] == {"include_usage": True}  # as the upstream reads it
    dup = b'{"stream_options":{"include_usage":true},"stream":true,"stream_options":{}}'
    assert json.loads(ask(dup)) == {"stream_options": {"include_usage": True}, "stream": True}  # the last wins
    for same in [
        b'{"model":"m","messages":[]}',
        b'{"stream":false}',
        b'{"stream":1}',
        b'{"stream":true,"stream_options":{"include_usage":true}}',
        b'[{"stream":true}]',
        b"not json",
        b'{"stream":true,"temperature":NaN}',
        b'{"stream":true,"x":-Infinity}',
        b'{"stream":true,"stream_options":{},"x":1e999}',
        '{"stream":true}'.encode("utf-16"),
        b'\xef\xbb\xbf{"stream":true}',
        b'{"stream":true,"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ]:
        assert ask(same) == same


def chat_answer(body: bytes) -> Answer:
    """As the real API answers: a streamed chat completion has usage only when it asked for it."""
    req = json.loads(body)
    events = [(None, chat_chunk("he")), (None, chat_chunk("llo", finish="stop"))]
    if (req.get("stream_options") or {}).get("include_usage"):
        events.append((None, chat_chunk(None, CHAT_USAGE)))
    return Answer(one_chunk_per_event(sse(*events, (None, "[DONE]"))))


def test_streamed_chat_completion_is_made_to_ask_for_usage(
    gateway: Gateway, upstream: Upstream, tmp_path: Path
) -> None:
    run = Run(gateway, upstream, tmp_path, CHAT, "openai")
    upstream.answer_for = chat_answer
    headers = {"authorization": f"Bearer {run.token}"}
    sent = b'{"model":"gpt-5","stream":true,"messages":[]}'
    resp = run.client.post(CHAT, content=sent, headers={**headers, "content-type": "application/json"})
    assert resp.status_code == 200 and "[DONE]" in resp.text
    got = upstream.seen[-1]
    assert got.body == b'{"stream_options":{"include_usage":true},"model":"gpt-5","stream":true,"messages":[]}'
    assert got.headers["content-length"] == str(len(got.body))
    assert run.measured == [1000]
    body = {"model": "gpt-5", "stream": True, "stream_options": {"include_usage": False}, "messages": []}
    assert run.client.post(CHAT, json=body, headers=headers).status_code == 200
    got = upstream.seen[-1]
    assert json.loads(got.body)["stream_options"] == {"include_usage": True}
    assert got.headers["content-length"] == str(len(got.body))
    assert run.measured == [1000, 1000]
    big = {"model": "gpt-5", "stream": True, "messages": [{"role": "user", "content": "x" * 300_000}]}
    assert run.client.post(CHAT, json=big, headers=headers).status_code == 200  # parsed off the loop, sent in slices
    got = upstream.seen[-1]
    assert json.loads(got.body) == {"stream_options": {"include_usage": True}, **big}
    assert got.headers["content-length"] == str(len(got.body)) and "transfer-encoding" not in got.headers
    assert run.measured == [1000, 1000, 1000]
    assert not run.refused  # measured, not estimated


def test_an_answer_without_usage_is_charged_an_estimate_never_nothing(
    gateway: Gateway, upstream: Upstream, tmp_path: Path
) -> None:
    run = Run(gateway, upstream, tmp_path, GEMINI, "gemini")
    headers = {"x-goog-api-key": run.token}
    plain = json.dumps([{"candidates": [{"content": {"parts": [{"text": "a long answer " * 50}]}}]}]).encode()
    stream = sse((None, {"candidates": [{"content": {"parts": [{"text": "no usage here"}]}}]}))
    upstream.answers = [
        Answer([plain], content_type="application/json"),  # as `fields=candidates` would trim it
        Answer(one_chunk_per_event(stream)),
        Answer(one_chunk_per_event(stream), broken=True),  # the upstream drops the connection
        Answer([b'{"error": {"code": 400}}'], content_type="application/json", status=400),
    ]
    request = json.dumps({"contents": [{"parts": [{"text": "x" * 400}]}]}).encode()
    assert run.client.post(GEMINI, content=request, headers=headers).status_code == 200
    wait_for(lambda: len(run.measured) == 1)
    assert run.measured == [(len(request) + len(plain)) // 4]
    assert run.client.post(f"{GEMINI}?alt=sse", content=request, headers=headers).status_code == 200
    wait_for(lambda: len(run.measured) == 2)
    assert run.measured[1] == (len(request) + len(stream)) // 4
    with pytest.raises(httpx.TransportError):
        run.client.post(f"{GEMINI}?alt=sse", content=request, headers=headers)
    wait_for(lambda: len(run.measured) == 3)
    assert run.measured[2] == (len(request) + len(stream)) // 4
    assert run.client.post(GEMINI, content=request, headers=headers).status_code == 400  # an error costs nothing
    wait_for(lambda: len(run.refused) == 3)
    time.sleep(0.1)
    assert len(run.measured) == 3
    reasons = [reason for reason, _ in run.refused]
    assert all("usage not measured" in r and "estimate" in r for r in reasons), reasons
    assert [d["estimated_tokens"] for _, d in run.refused] == run.measured
    assert all(d["status"] == 200 and d["path"] == GEMINI for _, d in run.refused)
    assert gateway.gate("r1").tokens == sum(run.measured)  # type: ignore[union-attr]


def test_an_event_or_body_too_large_to_read_is_charged_an_estimate(
    gateway: Gateway, upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(usage_mod, "MAX_EVENT", 1024)
    monkeypatch.setattr(usage_mod, "MAX_JSON_BODY", 1024)
    run = Run(gateway, upstream, tmp_path, "/v1/responses", "openai")
    completed = {"type": "response.completed", "response": {"instructions": "x" * 4000, "usage": RESPONSES_USAGE}}
    stream = sse(("response.created", {"type": "response.created"}), ("response.completed", completed))
    plain = json.dumps({"instructions": "x" * 4000, "usage": {"total_tokens": 150}}).encode()
    upstream.answers = [Answer([stream[i : i + 500] for i in range(0, len(stream), 500)])]
    upstream.answers.append(Answer([plain], content_type="application/json"))
    headers = {"authorization": f"Bearer {run.token}"}
    assert run.client.post("/v1/responses", content=b"{}", headers=headers).status_code == 200
    assert run.client.post("/v1/responses", content=b"{}", headers=headers).status_code == 200
    wait_for(lambda: len(run.measured) == 2)
    assert run.measured == [(2 + len(stream)) // 4, (2 + len(plain)) // 4]
    wait_for(lambda: len(run.refused) == 2)
    assert all("could not be read" in r for r, _ in run.refused)


def test_meters_say_when_usage_could_not_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    m = SseUsage()
    m.feed(CHAT_SSE)
    assert m.tokens == 10 and not m.unreadable  # [DONE] is not JSON, and not about usage
    for bad in (b'data: {"usage": {"total_tokens": 5}\n\n', b'data: {"usage":' + b"[" * 100_000 + b"\n\n"):
        m = SseUsage()
        assert m.feed(bad) == 0 and m.unreadable
    monkeypatch.setattr(usage_mod, "MAX_JSON_BODY", 10)
    j = JsonUsage()
    j.feed(b'{"usage": {"total_tokens": 5}}')
    assert j.finish() == 0 and j.unreadable and not j._parts


def test_a_client_that_hangs_up_before_the_usage_is_counted_all_the_same(
    gateway: Gateway, upstream: Upstream, tmp_path: Path
) -> None:
    run = Run(gateway, upstream, tmp_path, "/v1/responses", "openai")
    left = threading.Event()
    text = [sse(("d", {"type": "response.output_text.delta", "delta": f"word{i} "})) for i in range(20)]
    done = sse(("response.output_text.done", {"type": "response.output_text.done"}))
    final = sse(("response.completed", {"type": "response.completed", "response": {"usage": RESPONSES_USAGE}}))
    # the text; the client leaves; then an event the gateway cannot deliver; the usage comes later
    upstream.answers = [Answer([*text, done, final], hold=left, hold_at=20, sleeps={21: 0.5})]
    s = raw_request(run.sock, "/v1/responses", {"authorization": f"Bearer {run.token}"})
    assert b"word19" in read_until(s, b"word19")
    s.close()
    left.set()
    wait_for(lambda: run.measured == [150])
    time.sleep(0.2)
    assert run.measured == [150] and not run.refused  # the usage itself, not an estimate


def test_a_client_gone_stops_the_reading_at_the_drain_bound_and_pays_an_estimate(
    gateway: Gateway, upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_mod, "DRAIN_S", 0.5, raising=False)
    run = Run(gateway, upstream, tmp_path, "/v1/responses", "openai")
    left = threading.Event()
    text = sse(("d", {"type": "response.output_text.delta", "delta": "word "}))
    final = sse(("response.completed", {"type": "response.completed", "response": {"usage": RESPONSES_USAGE}}))
    upstream.answers = [Answer([text, text, final], hold=left, hold_at=1, sleeps={2: 5})]
    s = raw_request(run.sock, "/v1/responses", {"authorization": f"Bearer {run.token}"})
    read_until(s, b"word")
    s.close()
    left.set()
    started = time.monotonic()
    wait_for(lambda: bool(run.measured), timeout=4)
    assert time.monotonic() - started < 3  # the gateway did not wait for the upstream's 5 s
    assert run.measured == [(2 + 2 * len(text)) // 4]
    wait_for(lambda: bool(run.refused))
    assert "not read to its end" in run.refused[0][0]


def test_gemini_gets_only_alt_sse_and_anthropic_only_beta_in_the_query(
    gateway: Gateway, upstream: Upstream, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="airlockd.gateway.server")
    run = Run(gateway, upstream, tmp_path, GEMINI, "gemini")
    tok = run.token
    trims = "$fields=candidates&fields=candidates&%24alt=json&alt=proto&userProject=other&%61lt=json"
    for query in (f"?{trims}&alt=sse&key={tok}", f"?alt=json&key={tok}", f"?alt=sse&alt=json&key={tok}&key=AIza-own"):
        s = raw_request(run.sock, GEMINI + query, {})
        assert read_until(s, b"\r\n").startswith(b"HTTP/1.1 200")
        s.close()
    wait_for(lambda: len(upstream.seen) == 3)
    assert [seen.target for seen in upstream.seen] == [f"{GEMINI}?alt=sse", GEMINI, f"{GEMINI}?alt=sse"]
    logged = caplog.text
    assert "'$fields'" in logged and "'userProject'" in logged and tok not in logged and "key=" not in logged
    assert server_mod._forwarded_query(f"{MESSAGES}?beta=true&x=1&key=k", "anthropic") == (
        f"{MESSAGES}?beta=true",
        ["'x'", "key"],
    )
    assert server_mod._forwarded_query("/v1/responses?a=1&key=k&%24b=2", "openai") == (
        "/v1/responses?a=1&%24b=2",
        ["key"],
    )
    assert server_mod._forwarded_query(f"{GEMINI}?{tok}=1", "gemini") == (GEMINI, ["<run token>"])


def test_a_path_with_a_dot_segment_is_refused_whatever_the_allow_list_says(
    gateway: Gateway, upstream: Upstream, tmp_path: Path
) -> None:
    route = Route(
        "https://g", frozenset({("GET", "/v1/files/*/content"), ("GET", "/v1/a/./b"), ("GET", "/v1/c/../d")}), "k"
    )
    assert route.allows("GET", "/v1/files/f.1-a_b/content")
    for path in ("/v1/files/./content", "/v1/files/../content", "/v1/files/.../content", "/v1/a/./b", "/v1/c/../d"):
        assert not route.allows("GET", path), path
    run = Run(gateway, upstream, tmp_path, "/v1/files/*/content", "openai")
    s = raw_request(run.sock, "/v1/files/./content", {"authorization": f"Bearer {run.token}"})
    assert read_until(s, b"\r\n").startswith(b"HTTP/1.1 403")  # httpx would have sent /v1/files/content
    s.close()
    assert not upstream.seen
    assert (
        run.client.post("/v1/files/f1/content", json={}, headers={"authorization": f"Bearer {run.token}"}).status_code
        == 200
    )
    assert [seen.target for seen in upstream.seen] == ["/v1/files/f1/content"]


def test_connections_over_the_cap_are_refused_with_429(
    gateway: Gateway, upstream: Upstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_mod, "MAX_CONNECTIONS", 2)
    run = Run(gateway, upstream, tmp_path, GEMINI, "gemini")
    gate = gateway.gate("r1")
    assert gate is not None
    # connections that never finish their headers hold no slot (h11 bounds what they cost)
    idle = [socket.socket(socket.AF_UNIX) for _ in range(3)]
    for s in idle:
        s.connect(str(run.sock))
        s.sendall(b"POST " + GEMINI.encode() + b" HTTP/1.1\r\nhost: gw\r\nx-slow: aaaa")
    assert run.client.post(GEMINI, json={}, headers={"x-goog-api-key": run.token}).status_code == 200
    upstream.seen.clear()
    # two admitted requests whose bodies are still coming: each holds a slot
    held = []
    for _ in range(2):
        h = socket.socket(socket.AF_UNIX)
        h.connect(str(run.sock))
        head = f"POST {GEMINI} HTTP/1.1\r\nhost: gw\r\nx-goog-api-key: {run.token}\r\ncontent-length: 1000\r\n\r\n"
        h.sendall(head.encode() + b"{")
        held.append(h)
    wait_for(lambda: gate.connections == 2)
    s = raw_request(run.sock, GEMINI, {"x-goog-api-key": run.token}, b"x" * 100_000)
    answer = read_until(s, b"}}")
    s.close()
    assert answer.startswith(b"HTTP/1.1 429") and b"too many requests" in answer
    wait_for(lambda: len(run.refused) == 1)
    reason, data = run.refused[0]
    assert "at most 2" in reason and data["status"] == 429 and data["path"] == GEMINI
    assert not upstream.seen and gate.connections == 2
    held.pop().close()
    wait_for(lambda: gate.connections == 1)
    assert run.client.post(GEMINI, json={}, headers={"x-goog-api-key": run.token}).status_code == 200
    for s in idle + held:
        s.close()
