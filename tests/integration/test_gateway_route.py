"""No route but the model: from inside a real `--network none` container, the host's loopback and
name resolution are out of reach, while the loopback forwarder reaches the model through the run's
gateway socket, with the run token swapped for the real key, usage measured at the gateway and a
token budget that cuts the run off."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scripted_model import Reply, ScriptedModel, message, usage

from airlockd.records import RunState
from airlockd.runs.service import Service

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

REAL_KEY = "sk-proj-GATEWAYTEST0123456789abcdefXYZ"
KEY_ENV = "AIRLOCK_TEST_UPSTREAM_KEY"

AGENT = r"""
import json, os, socket, sys, urllib.request, urllib.error
host_port = int(sys.argv[1])
out = {}
try:
    socket.create_connection(("127.0.0.1", host_port), timeout=2).close()
    out["host_loopback"] = "reached"
except OSError as exc:
    out["host_loopback"] = type(exc).__name__
try:
    socket.create_connection(("172.17.0.1", host_port), timeout=2).close()
    out["bridge"] = "reached"
except OSError as exc:
    out["bridge"] = type(exc).__name__
try:
    socket.getaddrinfo("example.com", 443)
    out["dns"] = "resolved"
except OSError as exc:
    out["dns"] = "failed"
base, token = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
auth = {"authorization": "Bearer " + token, "content-type": "application/json"}
for i in range(int(sys.argv[2])):
    body = json.dumps({"model": "m", "stream": True, "input": [{"role": "user", "content": str(i)}]}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(base + "/responses", body, auth), timeout=20) as r:
            text = r.read().decode()
        out.setdefault("events", []).append(
            [json.loads(l[6:])["type"] for l in text.splitlines() if l.startswith("data: ")]
        )
    except (urllib.error.URLError, OSError) as exc:
        out.setdefault("events", []).append(repr(exc)[:80])
try:
    urllib.request.urlopen(urllib.request.Request(base + "/files", None, auth), timeout=5)
except urllib.error.HTTPError as exc:
    out["files"] = exc.code
env = json.dumps(dict(os.environ))
cmdlines = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmdlines.append(open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"))
        except OSError:
            pass
# Scrambled by a key only this test knows: the run's output is redacted of the run token in every
# encoding the redactor knows (hex among them), and this report must carry it back unmasked.
out["seen_xor"] = bytes(b ^ 0x5A for b in (env + "\n".join(cmdlines)).encode()).hex()
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.fixture
def host_server() -> Iterator[int]:
    """A TCP server on the host's loopback that the container must not reach."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    hits: list[Any] = []

    def accept() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            hits.append(c)
            c.close()

    threading.Thread(target=accept, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()
    assert not hits, "a container reached the host's loopback"


def make_ws(tmp_path: Path, upstream: str, admission: str = "") -> Path:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "agent.py").write_text(AGENT)
    (ws / "policies.toml").write_text(
        '[agents.bot]\ncommand = ["bash", "-c", "{prompt}"]\nprompt = "argv"\nnetwork = "gateway"\n'
        f"[agents.bot.admission]\n{admission}\n"
        f'[gateway]\nupstream = "{upstream}"\nkey_env = "{KEY_ENV}"\nallowed = ["POST /v1/responses"]\n'
    )
    return ws


def result(svc: Service, run_id: str) -> dict[str, Any]:
    text = (svc.state.run_dir(run_id) / "output.log").read_text()
    line = next(line for line in text.splitlines() if line.startswith("RESULT "))
    return json.loads(line[7:])


def test_container_reaches_the_model_through_the_gateway_and_nothing_else(
    tmp_path: Path, host_server: int, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    """On the second engine too (a remote host: the gateway's socket reached through the relay
    over the engine's connection, docs/engines.md)."""
    monkeypatch.setenv(KEY_ENV, REAL_KEY)
    with ScriptedModel(fallback=lambda seen: Reply([message("ok")], usage(30, 12))) as model:
        ws = make_ws(tmp_path, model.url)
        svc = Service(ws)
        rec = svc.submit("bot", f"python3 agent.py {host_server} 2")
        rec = svc.execute(rec.id)
        out = result(svc, rec.id)
    assert rec.state in (RunState.PROPOSED, RunState.APPLIED), rec.error
    assert out["host_loopback"] == "ConnectionRefusedError"  # its own loopback, not the host's
    assert out["bridge"] in ("OSError", "TimeoutError")  # "Network is unreachable"
    assert out["dns"] == "failed"
    assert out["events"] == [["response.created", "response.output_item.done", "response.completed"]] * 2
    assert out["files"] == 404
    seen = bytes(b ^ 0x5A for b in bytes.fromhex(out["seen_xor"])).decode()
    assert REAL_KEY not in seen and "alrt_" in seen  # the container holds the run token only
    assert [s.headers["authorization"] for s in model.seen] == [f"Bearer {REAL_KEY}"] * 2
    assert rec.tokens == model.sent_tokens == 84 and rec.tokens_source == "gateway"
    events = [json.loads(line) for line in svc.state.audit.read_text().splitlines()]
    kinds = [e.get("kind") or e.get("event") for e in events]
    assert "gateway.opened" in json.dumps(kinds) and "gateway.closed" in json.dumps(kinds)
    refused = [e for e in events if "gateway.refused" in json.dumps(e)]
    assert refused and "/v1/files" in json.dumps(refused)
    for f in svc.state.root.rglob("*"):
        if f.is_file():
            assert REAL_KEY.encode() not in f.read_bytes(), f
    assert not (svc.state.run_dir(rec.id) / "gw" / "gateway.sock").exists()


def test_budget_spent_at_the_gateway_stops_the_run(
    tmp_path: Path, host_server: int, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    monkeypatch.setenv(KEY_ENV, REAL_KEY)
    with ScriptedModel(fallback=lambda seen: Reply([message("ok")], usage(60, 20))) as model:
        ws = make_ws(tmp_path, model.url, admission="max_tokens = 100")
        svc = Service(ws)
        rec = svc.submit("bot", f"python3 agent.py {host_server} 5; sleep 30")
        rec = svc.execute(rec.id)
    assert rec.state is RunState.LIMIT_EXCEEDED
    assert rec.limit is not None and rec.limit.limit == "tokens" and "gateway" in rec.limit.source
    # the first answer (80) passed whole; the second reached 160 and was cut before it ended
    assert rec.tokens == 160 and rec.tokens_source == "gateway"
    assert len(model.seen) == 2
    closed = [json.loads(line) for line in svc.state.audit.read_text().splitlines() if "gateway.closed" in line]
    assert closed and '"budget_cut": true' in json.dumps(closed)


HOSTILE = r"""
import json, os, socket, sys, time, urllib.request, urllib.error
base, token = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
host, port = base.split("//")[1].split("/")[0].split(":")
out = {}
body = json.dumps({"model": "m", "input": "hi"}).encode()
hdrs = {"authorization": "Bearer " + token, "content-type": "application/json",
        "OpenAI-Organization": "org-the-agents-choice", "OpenAI-Project": "proj-the-agents-choice",
        "X-Forwarded-For": "10.0.0.1", "Cookie": "session=stolen", "X-Api-Key": "sk-other-key"}
with urllib.request.urlopen(urllib.request.Request(base + "/responses", body, hdrs), timeout=20) as r:
    out["status"] = r.status
# a body claimed huge: refused on the headers, before a byte of it is read
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(("POST /v1/responses HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + token +
           "\r\nContent-Length: 99999999999\r\n\r\n").encode())
out["huge"] = s.recv(200).split(b"\r\n")[0].decode(); s.close()
# no token at all, with a body that never comes: refused at once, not waited for
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
out["untokened"] = s.recv(200).split(b"\r\n")[0].decode(); s.close()
# connections held open with headers that never end
held = []
for _ in range(30):
    c = socket.create_connection((host, int(port)), timeout=10)
    c.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000)
    held.append(c)
time.sleep(2)
with urllib.request.urlopen(urllib.request.Request(base + "/responses", body, hdrs), timeout=20) as r:
    out["while_held"] = r.status
print("RESULT " + json.dumps(out), flush=True)
"""


def test_an_agent_cannot_choose_the_account_nor_exhaust_the_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import resource

    monkeypatch.setenv(KEY_ENV, REAL_KEY)
    with ScriptedModel(fallback=lambda seen: Reply([message("ok")], usage(3, 1))) as model:
        ws = make_ws(tmp_path, model.url)
        with (ws / "policies.toml").open("a") as fh:
            fh.write('headers = {"OpenAI-Organization" = "org-from-the-policy"}\n')
        (ws / "hostile.py").write_text(HOSTILE)
        svc = Service(ws)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        rec = svc.execute(svc.submit("bot", "python3 hostile.py").id)
        out = result(svc, rec.id)
    assert rec.state in (RunState.PROPOSED, RunState.APPLIED), rec.error
    assert out["status"] == 200 and out["while_held"] == 200
    assert out["huge"].startswith("HTTP/1.1 413"), out
    assert out["untokened"].startswith("HTTP/1.1 401") or out["untokened"].startswith("HTTP/1.1 403"), out
    assert len(model.seen) == 2  # only the two real requests reached the upstream
    for seen in model.seen:
        assert seen.headers["openai-organization"] == "org-from-the-policy"
        assert "openai-project" not in seen.headers and "cookie" not in seen.headers
        assert "x-forwarded-for" not in seen.headers, seen.headers
        assert seen.headers.get("x-api-key") in (None, REAL_KEY)  # where a client puts its key: the real one
        assert seen.headers["authorization"] == f"Bearer {REAL_KEY}", seen.headers
    # 30 held connections and a claimed 100 GB body cost this process next to nothing
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 64 * 1024  # KiB
    events = [json.loads(line) for line in svc.state.audit.read_text().splitlines()]
    refused = [e for e in events if e.get("kind") == "gateway.refused"]
    assert any("too large" in json.dumps(e) for e in refused), refused
