"""The model gateway on a real Unix socket, against a scripted Responses server on 127.0.0.1:
tokens (wrong, expired, another run's, revoked), the allow-list, the key swap, streaming that
passes through incrementally, usage measured from the stream and a budget cut mid-stream."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from scripted_model import Reply, ScriptedModel, exec_call, message, usage

from airlockd.errors import PolicyError
from airlockd.gateway import Gateway, Route, RunTokens
from airlockd.policy import Gateway as GatewayPolicy

REAL_KEY = "sk-test-REALKEY-0123456789abcdefghijkl"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel() as m:
        yield m


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def gateway(clock: Clock) -> Iterator[Gateway]:
    gw = Gateway(RunTokens(clock=clock)).start()
    yield gw
    gw.shutdown()


class Run:
    def __init__(
        self, gw: Gateway, model: ScriptedModel, tmp: Path, run_id: str, budget: int | None = None, **route: Any
    ) -> None:
        self.refused: list[tuple[str, dict[str, Any]]] = []
        self.measured: list[int] = []
        self.budget = budget
        d = tmp / run_id
        d.mkdir()
        self.sock = d / "gateway.sock"
        self.token = gw.open_run(
            run_id,
            "codex",
            Route(model.url, frozenset({("POST", "/v1/responses")}), REAL_KEY, **route),
            self.sock,
            ttl_s=60,
            on_usage=self._usage,
            on_refused=self._refused,
        )
        self.client = httpx.Client(transport=httpx.HTTPTransport(uds=str(self.sock)), base_url="http://gw", timeout=10)
        self.done = threading.Event()

    def _usage(self, n: int) -> bool:
        self.measured.append(n)
        return self.budget is not None and sum(self.measured) >= self.budget

    def _refused(self, reason: str, data: dict[str, Any]) -> None:
        self.refused.append((reason, data))
        self.done.set()

    def post(self, path: str = "/v1/responses", token: str | None = None, stream: bool = True) -> httpx.Response:
        tok = self.token if token is None else token
        return self.client.post(path, json={"model": "m", "stream": stream, "input": []}, headers=_auth(tok))


def _auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_allowed_streamed_request_swaps_the_token_for_the_key_and_counts_usage(
    gateway: Gateway, model: ScriptedModel, tmp_path: Path
) -> None:
    run = Run(gateway, model, tmp_path, "r1")
    model.replies = [Reply([exec_call("ls")], usage(120, 30))]
    resp = run.post()
    assert resp.status_code == 200
    kinds = [e["type"] for e in _events(resp.text)]
    assert kinds == ["response.created", "response.output_item.done", "response.completed"]
    seen = model.seen[-1]
    assert seen.headers["authorization"] == f"Bearer {REAL_KEY}"
    assert run.token not in json.dumps(seen.headers)
    assert run.measured == [150] and gateway.gate("r1").tokens == 150  # type: ignore[union-attr]
    assert stat_mode(run.sock) & 0o777 == 0o666


def stat_mode(p: Path) -> int:
    return p.stat().st_mode


def test_non_streamed_json_usage_is_counted(gateway: Gateway, model: ScriptedModel, tmp_path: Path) -> None:
    run = Run(gateway, model, tmp_path, "r1")
    model.replies = [Reply([message("hi")], usage(7, 3))]
    resp = run.post(stream=False)
    assert resp.status_code == 200 and resp.json()["usage"]["total_tokens"] == 10
    deadline = time.monotonic() + 5  # a whole body is read for its usage once it has passed
    while not run.measured and time.monotonic() < deadline:
        time.sleep(0.01)
    assert run.measured == [10]


def test_wrong_expired_revoked_and_other_runs_tokens_are_refused(
    gateway: Gateway, model: ScriptedModel, tmp_path: Path, clock: Clock
) -> None:
    a = Run(gateway, model, tmp_path, "ra")
    b = Run(gateway, model, tmp_path, "rb")
    stranger = RunTokens(clock=clock).mint("ra", "codex", 60)  # right shape, another key
    forged = a.token[:-4] + ("AAAA" if not a.token.endswith("AAAA") else "BBBB")
    for token, why in [
        ("", "no run token"),
        ("sk-whatever-0123456789", "not a run token"),
        (stranger, "bad signature"),
        (forged, "bad signature"),
        (b.token, "token of another run"),
    ]:
        resp = a.post(token=token)
        assert resp.status_code == 401, token
        assert why in resp.json()["error"]["message"]
    assert not model.seen  # nothing reached the upstream
    clock.now += 61
    resp = b.post()
    assert resp.status_code == 401 and "expired" in resp.json()["error"]["message"]
    clock.now -= 61
    assert a.post().status_code == 200
    gateway.revoke("ra")  # the run was stopped
    resp = a.post()
    assert resp.status_code == 401 and "run is over" in resp.json()["error"]["message"]
    a.done.wait(5)
    assert any("run token refused" in r for r, _ in a.refused)
    assert all(a.token not in json.dumps(d) for _, d in a.refused)


def test_token_stops_with_the_run_and_socket_goes(gateway: Gateway, model: ScriptedModel, tmp_path: Path) -> None:
    run = Run(gateway, model, tmp_path, "r1")
    assert run.post().status_code == 200
    gateway.close_run("r1")
    assert not run.sock.exists()
    with pytest.raises(httpx.TransportError):
        run.post()
    assert not gateway.tokens.live("r1")


def test_paths_and_methods_outside_the_allow_list_are_refused(
    gateway: Gateway, model: ScriptedModel, tmp_path: Path
) -> None:
    run = Run(gateway, model, tmp_path, "r1")
    assert run.post("/v1/chat/completions").status_code == 404
    assert run.post("/v1/responses/../files").status_code in (403, 404)
    assert run.post("/v1/%72esponses").status_code == 403
    resp = run.client.get("/v1/responses", headers=_auth(run.token))
    assert resp.status_code == 405
    resp = run.client.get("/v1/models", headers=_auth(run.token))
    assert resp.status_code == 404
    assert not model.seen
    deadline = time.monotonic() + 5  # refusals are audited after the answer goes out
    while len(run.refused) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    statuses = sorted(d["status"] for _, d in run.refused)
    assert len(statuses) == 5 and 404 in statuses and 405 in statuses, statuses


def test_streaming_passes_through_before_the_upstream_finishes(
    gateway: Gateway, model: ScriptedModel, tmp_path: Path
) -> None:
    run = Run(gateway, model, tmp_path, "r1")
    hold = threading.Event()
    model.replies = [Reply([message("late")], usage(1, 1), hold=hold)]
    body = {"model": "m", "stream": True, "input": []}
    with run.client.stream("POST", "/v1/responses", json=body, headers=_auth(run.token)) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["type"] == "response.created"
        assert not hold.is_set()  # the upstream is still holding the rest of its answer
        hold.set()
        rest = [json.loads(line[6:])["type"] for line in lines if line.startswith("data: ")]
    assert rest == ["response.output_item.done", "response.completed"]


def test_budget_spent_mid_stream_cuts_the_stream_and_refuses_more(
    gateway: Gateway, model: ScriptedModel, tmp_path: Path
) -> None:
    run = Run(gateway, model, tmp_path, "r1", budget=100)
    model.replies = [Reply([message("a")], usage(40, 20)), Reply([message("b")], usage(40, 20))]
    assert run.post().status_code == 200
    text = ""
    body = {"stream": True, "input": []}
    with (
        pytest.raises(httpx.TransportError),  # the stream ends without its last chunk
        run.client.stream("POST", "/v1/responses", json=body, headers=_auth(run.token)) as resp,
    ):
        for chunk in resp.iter_text():
            text += chunk
    assert "response.completed" not in text and "response.created" in text
    resp = run.post()
    assert resp.status_code == 429
    assert sum(run.measured) == 120


def test_route_reads_the_key_from_env_or_file_and_says_when_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIRLOCK_TEST_KEY", raising=False)
    pol = GatewayPolicy(upstream="http://127.0.0.1:9/", key_env="AIRLOCK_TEST_KEY")
    with pytest.raises(PolicyError, match="AIRLOCK_TEST_KEY is not set"):
        Route.from_policy(pol)
    monkeypatch.setenv("AIRLOCK_TEST_KEY", "k-env")
    assert Route.from_policy(pol).key == "k-env"
    f = tmp_path / "key"
    f.write_text("k-file\n")
    pol = GatewayPolicy(key_env=None, key_file=str(f), allowed=["post /v1/responses"])
    route = Route.from_policy(pol)
    assert route.key == "k-file" and route.allowed == {("POST", "/v1/responses")}
    assert "k-file" not in repr(route)
    with pytest.raises(PolicyError, match="METHOD /path"):
        Route.from_policy(GatewayPolicy(allowed=["/v1/responses"], key_file=str(f), key_env=None))


def test_only_the_providers_headers_pass_and_the_policy_sets_the_account(
    gateway: Gateway, model: ScriptedModel, tmp_path: Path
) -> None:
    run = Run(gateway, model, tmp_path, "r1", set_headers=(("openai-organization", "org-from-policy"),))
    model.replies = [Reply([message("hi")], usage(1, 1))]
    sent = {
        **_auth(run.token),
        "OpenAI-Organization": "org-of-someone-else",
        "OpenAI-Project": "proj-other",
        "OpenAI-Beta": "responses=v1",
        "X-Stainless-OS": "Linux",
        "Cookie": "session=stolen",
        "X-Forwarded-For": "10.0.0.1",
        "X-Goog-Api-Key": "AIza-something",
        "anthropic-version": "2023-06-01",
    }
    resp = run.client.post("/v1/responses", json={"model": "m", "input": []}, headers=sent)
    assert resp.status_code == 200
    got = model.seen[-1].headers
    assert got["openai-organization"] == "org-from-policy"
    assert got["openai-beta"] == "responses=v1" and got["x-stainless-os"] == "Linux"
    for dropped in ("openai-project", "cookie", "x-forwarded-for", "x-goog-api-key", "anthropic-version"):
        assert dropped not in got, dropped
    assert got["authorization"] == f"Bearer {REAL_KEY}"


def test_policy_headers_are_validated() -> None:
    assert GatewayPolicy(provider="anthropic", headers={"anthropic-version": "2023-06-01"}).provider == "anthropic"
    for bad in ({"Authorization": "x"}, {"bad name": "x"}, {"OpenAI-Project": "a\r\nInjected: 1"}):
        with pytest.raises(ValueError):
            GatewayPolicy(headers=bad)


def _raw(sock: Path, head: bytes, timeout: float = 5) -> bytes:
    import socket as socketlib

    with socketlib.socket(socketlib.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        s.sendall(head)  # the body is never sent: an answer must not wait for it
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


def test_refusals_come_before_the_body_is_read(gateway: Gateway, model: ScriptedModel, tmp_path: Path) -> None:
    run = Run(gateway, model, tmp_path, "r1")
    big = 30 * 1024 * 1024
    no_token = b"POST /v1/responses HTTP/1.1\r\nHost: gw\r\nContent-Length: %d\r\n\r\n" % big
    assert _raw(run.sock, no_token).startswith(b"HTTP/1.1 401")
    wrong_path = b"POST /v1/files HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" % (
        run.token.encode(),
        big,
    )
    assert _raw(run.sock, wrong_path).startswith(b"HTTP/1.1 404")
    too_big = b"POST /v1/responses HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" % (
        run.token.encode(),
        64 * 1024 * 1024,
    )
    assert _raw(run.sock, too_big).startswith(b"HTTP/1.1 413")
    assert not model.seen
