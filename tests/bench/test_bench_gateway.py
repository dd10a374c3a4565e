"""Gateway latency overhead: p50 and p99 of a small streamed Responses request through the run's
gateway socket (token check, allow-list, key swap, usage read from the stream) divided by the same
request sent straight to the scripted model server, both measured in this run, interleaved."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import httpx
from scripted_model import Reply, ScriptedModel, message, usage  # tests/ is on sys.path (conftest)

from airlockd.gateway import Gateway, Route

N = int(os.environ.get("AIRLOCK_BENCH_GATEWAY_N", "400"))


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def test_bench_gateway_overhead(tmp_path: Path) -> None:
    body = {"model": "m", "stream": True, "input": [{"role": "user", "content": "hi"}]}
    with ScriptedModel(fallback=lambda seen: Reply([message("ok")], usage(3, 2))) as model:
        gw = Gateway().start()
        try:
            route = Route(model.url, frozenset({("POST", "/v1/responses")}), "sk-bench-key-000000000000")
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
            auth = {"authorization": f"Bearer {token}"}

            def once(client: httpx.Client) -> float:
                t0 = time.perf_counter()
                r = client.post("/v1/responses", json=body, headers=auth)
                assert r.status_code == 200 and "response.completed" in r.text
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
    assert sum(measured) == 5 * (N + 20)
    d50, d99, g50, g99 = _pct(d, 50), _pct(d, 99), _pct(g, 50), _pct(g, 99)
    print(
        f"\ngateway overhead, {N} small streamed requests each, interleaved:\n"
        f"  direct  p50 {d50 * 1e3:.2f} ms  p99 {d99 * 1e3:.2f} ms  (mean {statistics.mean(d) * 1e3:.2f})\n"
        f"  gateway p50 {g50 * 1e3:.2f} ms  p99 {g99 * 1e3:.2f} ms  (mean {statistics.mean(g) * 1e3:.2f})\n"
        f"  ratio   p50 {g50 / d50:.2f}x  p99 {g99 / d99:.2f}x"
    )
