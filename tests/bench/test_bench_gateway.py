"""Gateway latency overhead, per protocol: p50 and p99 of a small streamed request through the run's
gateway socket (token check, allow-list, key swap, usage read from the stream) divided by the same
request sent straight to the scripted model server, both measured in this run, interleaved: the
Responses API (Codex), Anthropic Messages (Claude Code), the Gemini API (Gemini CLI) and chat
completions (opencode, Aider)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import scripted_anthropic
import scripted_chat
import scripted_gemini
import scripted_model  # tests/ is on sys.path (conftest)

from airlockd.gateway import Gateway, Route

N = int(os.environ.get("AIRLOCK_BENCH_GATEWAY_N", "400"))
USER = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True)
class Protocol:
    server: Callable[[], AbstractContextManager[Any]]  # a scripted model answering 3 + 2 tokens
    path: str
    allowed: str  # the allow-list entry
    provider: str
    token_header: Callable[[str], dict[str, str]]
    body: dict[str, Any]
    marker: str  # in every whole answer


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


PROTOCOLS = {
    "responses": Protocol(
        lambda: scripted_model.ScriptedModel(
            fallback=lambda seen: scripted_model.Reply([scripted_model.message("ok")], scripted_model.usage(3, 2))
        ),
        "/v1/responses",
        "/v1/responses",
        "openai",
        _bearer,
        {"model": "m", "stream": True, "input": USER},
        "response.completed",
    ),
    "messages": Protocol(
        lambda: scripted_anthropic.ScriptedMessages(
            fallback=lambda seen: scripted_anthropic.Reply([scripted_anthropic.text("ok")], 3, 2)
        ),
        "/v1/messages?beta=true",
        "/v1/messages",
        "anthropic",
        lambda token: {"x-api-key": token, "anthropic-version": "2023-06-01"},
        {"model": "m", "stream": True, "max_tokens": 16, "messages": USER},
        "message_stop",
    ),
    "gemini": Protocol(
        lambda: scripted_gemini.ScriptedGemini(
            untooled=lambda seen: scripted_gemini.Reply(text="ok", prompt_tokens=3, candidate_tokens=2)
        ),
        "/v1beta/models/m:streamGenerateContent?alt=sse",
        "/v1beta/models/*:streamGenerateContent",
        "gemini",
        lambda token: {"x-goog-api-key": token},
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        "usageMetadata",
    ),
    "chat": Protocol(
        lambda: scripted_chat.ScriptedChat(
            untooled=lambda seen: scripted_chat.Reply(text="ok", prompt_tokens=3, completion_tokens=2)
        ),
        "/v1/chat/completions",
        "/v1/chat/completions",
        "openai",
        _bearer,
        {"model": "m", "stream": True, "messages": USER},
        "[DONE]",
    ),
}


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_bench_gateway_overhead(tmp_path: Path, name: str) -> None:
    proto = PROTOCOLS[name]
    with proto.server() as model:
        gw = Gateway().start()
        try:
            route = Route(
                model.url, frozenset({("POST", proto.allowed)}), "sk-bench-key-000000000000", provider=proto.provider
            )
            measured: list[int] = []
            token = gw.open_run(
                "rbench",
                "bench",
                route,
                tmp_path / "gateway.sock",
                ttl_s=600,
                on_usage=lambda n: measured.append(n) is None and False,
                on_refused=lambda reason, data: None,
            )
            direct = httpx.Client(base_url=model.url, timeout=10)
            via = httpx.Client(
                transport=httpx.HTTPTransport(uds=str(tmp_path / "gateway.sock")), base_url="http://gw", timeout=10
            )
            auth = proto.token_header(token)

            def once(client: httpx.Client) -> float:
                t0 = time.perf_counter()
                r = client.post(proto.path, json=proto.body, headers=auth)
                assert r.status_code == 200 and proto.marker in r.text, r.text[:300]
                return time.perf_counter() - t0

            for _ in range(20):  # warm both paths' connections
                once(direct), once(via)
            d: list[float] = []
            g: list[float] = []
            for _ in range(N):
                d.append(once(direct))
                g.append(once(via))
            direct.close()
            via.close()
        finally:
            gw.shutdown()
    assert sum(measured) == 5 * (N + 20)  # usage read from every answer through the gateway
    d50, d99, g50, g99 = _pct(d, 50), _pct(d, 99), _pct(g, 50), _pct(g, 99)
    print(
        f"\ngateway overhead ({name}), {N} small streamed requests each, interleaved:\n"
        f"  direct  p50 {d50 * 1e3:.2f} ms  p99 {d99 * 1e3:.2f} ms  (mean {statistics.mean(d) * 1e3:.2f})\n"
        f"  gateway p50 {g50 * 1e3:.2f} ms  p99 {g99 * 1e3:.2f} ms  (mean {statistics.mean(g) * 1e3:.2f})\n"
        f"  ratio   p50 {g50 / d50:.2f}x  p99 {g99 / d99:.2f}x"
    )
