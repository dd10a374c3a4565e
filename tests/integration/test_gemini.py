"""The real Gemini CLI inside the runtime container (its bundle on node 24), through the loopback
forwarder and the run's gateway socket, to a scripted Gemini API (`streamGenerateContent?alt=sse`)
on the host's 127.0.0.1: it creates a file (write_file), edits one it read (read_file, replace)
and deletes one (run_shell_command); the proposal lists exactly those changes; the usage on the
run is what the model sent; the real key went upstream as `x-goog-api-key` and is nowhere in the
container nor in the state dir; a second turn after a rejected run starts over, after an approved
one resumes the session; and a stream that would pass the token budget is cut."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from scripted_gemini import Reply, ScriptedGemini, call

from airlockd.records import RunState
from airlockd.runs.service import Service

pytestmark = [pytest.mark.docker, pytest.mark.slow]
AGENT_IMAGES = ("gemini",)  # loaded into the other engines (tests/conftest.py)

KEY_ENV = "AIRLOCK_TEST_GEMINI_UPSTREAM_KEY"
PROBE = "env; cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | sort -u"
WS = "/workspace"


@pytest.fixture(scope="module", autouse=True)
def gemini_image() -> str:
    """The runtime image with Gemini CLI; `npm install @google/gemini-cli node@24` runs here when it
    is missing."""
    from airlockd.sandbox.image import ensure_agent_image

    return ensure_agent_image(docker.from_env(), "gemini")


@pytest.fixture
def real_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = "AIza" + secrets.token_hex(18)
    monkeypatch.setenv(KEY_ENV, key)
    return key


@pytest.fixture
def model() -> Iterator[ScriptedGemini]:
    with ScriptedGemini(fallback=lambda seen: Reply(text="nothing more", prompt_tokens=5, candidate_tokens=1)) as m:
        yield m


def make_ws(tmp_path: Path, upstream: str, *, budget: int | None = None) -> Path:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "README.md").write_text("# project\n")
    (ws / "edit.txt").write_text("first line\n")
    (ws / "old.txt").write_text("to be deleted\n")
    admission = f"[agents.gm.admission]\nmax_tokens = {budget}\n" if budget else ""
    (ws / "policies.toml").write_text(
        '[agents.gm]\nadapter = "gemini"\n'
        "[agents.gm.limits]\nwall_time_s = 120\nmemory_mb = 1024\n"
        f"{admission}"
        f'[gateway.providers.gemini]\nupstream = "{upstream}"\nkey_env = "{KEY_ENV}"\n'
    )
    return ws


def changes(rec: Any) -> dict[str, str]:
    return {f.path: f.change for f in rec.files}


def sent_after(model: ScriptedGemini, first: int) -> str:
    return json.dumps([s.body for s in model.seen[first:]])


def why(svc: Service, rec: Any) -> str:
    out = svc.state.run_dir(rec.id) / "output.log"
    return f"{rec.state} {rec.error} {rec.limit}\n{out.read_text()[-3000:] if out.exists() else ''}"


def test_gemini_cli_end_to_end_through_the_gateway(tmp_path: Path, model: ScriptedGemini, real_key: str) -> None:
    """On the first engine (the relay to a remote engine's container is the same for every protocol:
    test_claude.py and test_codex.py run there)."""
    model.replies = [
        Reply([call("write_file", file_path=f"{WS}/new.txt", content="created by gemini\n")], "", 200, 20),
        Reply([call("read_file", file_path=f"{WS}/edit.txt")], "", 230, 15),
        Reply(
            [
                call(
                    "replace",
                    file_path=f"{WS}/edit.txt",
                    instruction="split the line",
                    old_string="first line",
                    new_string="first\nsecond",
                )
            ],
            "",
            240,
            9,
        ),
        Reply([call("run_shell_command", command="rm old.txt", description="delete old.txt")], "", 250, 10),
        Reply([call("run_shell_command", command=PROBE, description="look around")], "", 260, 12),
        Reply([], "turn one done", 300, 8),
    ]
    ws = make_ws(tmp_path, model.url)
    svc = Service(ws)
    rec = svc.execute(svc.submit("gm", "turn one: make the changes").id)
    assert rec.state is RunState.PROPOSED, why(svc, rec)
    assert changes(rec) == {"new.txt": "created", "edit.txt": "modified", "old.txt": "deleted"}, why(svc, rec)
    assert (svc.state.run_dir(rec.id) / "output.log").exists()
    assert {s.path for s in model.seen} == {"/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"}
    assert len(model.tooled()) == 6
    assert rec.tokens == model.sent_tokens and rec.tokens >= 1554 and rec.tokens_source == "gateway"
    assert {s.headers.get("x-goog-api-key") for s in model.seen} == {real_key}
    assert not any("authorization" in s.headers or "key=" in s.path for s in model.seen)

    results = model.tool_results()
    probe = results[-1]
    assert "GEMINI_API_KEY=alrt_" in probe and "HOME=/run/airlock/gemini-home" in probe
    assert real_key not in probe and real_key not in json.dumps(results)
    for f in svc.state.root.rglob("*"):  # store, audit, logs, agent home, its snapshot, staging
        if f.is_file() and not f.is_symlink():
            assert real_key.encode() not in f.read_bytes(), f
    session = json.loads((svc.state.run_dir(rec.id) / "agent-session.json").read_text())["session"]
    assert session and len(session) == 36

    # reject: the files are discarded and the conversation is rolled back
    svc.review.reject(rec.id)
    seen = len(model.seen)
    model.replies = [Reply([], "turn two done", 50, 5)]
    rec2 = svc.execute(svc.submit("gm", "turn two: continue", follow_up=rec.id).id)
    assert rec2.state in (RunState.PROPOSED, RunState.APPLIED), why(svc, rec2)
    sent = sent_after(model, seen)
    assert "turn two: continue" in sent
    assert "turn one: make the changes" not in sent and "turn one done" not in sent
    assert not (ws / "new.txt").exists() and (ws / "old.txt").exists()

    # approve: the files land and a follow-up resumes the session
    model.replies = [
        Reply([call("write_file", file_path=f"{WS}/three.txt", content="three\n")], "", 60, 6),
        Reply([], "turn three done", 70, 7),
    ]
    rec3 = svc.execute(svc.submit("gm", "turn three: write three.txt").id)
    assert changes(rec3) == {"three.txt": "created"}, why(svc, rec3)
    svc.review.approve(rec3.id)
    assert svc.store.get_run(rec3.id).state is RunState.APPLIED
    assert (ws / "three.txt").read_text() == "three\n"
    seen = len(model.seen)
    model.replies = [Reply([], "turn four done", 80, 8)]
    rec4 = svc.execute(svc.submit("gm", "turn four: and now?", follow_up=rec3.id).id)
    assert rec4.state in (RunState.PROPOSED, RunState.APPLIED), why(svc, rec4)
    sent = sent_after(model, seen)
    assert "turn four: and now?" in sent
    assert "turn three: write three.txt" in sent and "turn three done" in sent
    follow = [json.loads(line) for line in svc.state.audit.read_text().splitlines() if "session.follow_up" in line]
    assert [e["data"]["resumed"] for e in follow] == [False, True], follow


def test_a_gemini_stream_that_passes_the_budget_is_cut(tmp_path: Path, model: ScriptedGemini, real_key: str) -> None:
    model.replies = [
        Reply([call("write_file", file_path=f"{WS}/a.txt", content="a\n")], "", 400, 50),
        Reply([call("write_file", file_path=f"{WS}/b.txt", content="b\n")], "", 500, 60),  # passes 800
        Reply([], "never sent", 10, 1),
    ]
    ws = make_ws(tmp_path, model.url, budget=800)
    svc = Service(ws)
    rec = svc.execute(svc.submit("gm", "write a and b").id)
    assert rec.state is RunState.LIMIT_EXCEEDED, why(svc, rec)
    assert rec.limit is not None and rec.limit.limit == "tokens" and "gateway" in rec.limit.source, rec.limit
    assert len(model.tooled()) == 2  # nothing reached the model after the cut
    assert rec.tokens > 800 and rec.tokens_source == "gateway"
    closed = [json.loads(line) for line in svc.state.audit.read_text().splitlines() if "gateway.closed" in line]
    assert closed and '"budget_cut": true' in json.dumps(closed)
