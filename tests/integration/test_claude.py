"""The real Claude Code inside the runtime container, through the loopback forwarder and the run's
gateway socket, to a scripted Anthropic Messages model (streamed) on the host's 127.0.0.1: it
creates a file (Write), edits one it read (Read, Edit) and deletes one (Bash); the proposal lists
exactly those changes; the usage on the run is what the model sent; the real key is nowhere in the
container nor in the state dir; a second turn after a rejected run starts over, after an approved
one resumes the conversation; and a stream that would pass the token budget is cut."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from scripted_anthropic import Reply, ScriptedMessages, text, tool

from airlockd.records import RunState
from airlockd.runs.service import Service

pytestmark = [pytest.mark.docker, pytest.mark.slow]
AGENT_IMAGES = ("claude",)  # loaded into the other engines (tests/conftest.py)

KEY_ENV = "AIRLOCK_TEST_CLAUDE_UPSTREAM_KEY"
PROBE = "env; cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | sort -u"
WS = "/workspace"


@pytest.fixture(scope="module", autouse=True)
def claude_image() -> str:
    """The runtime image with Claude Code; `npm install @anthropic-ai/claude-code` runs here when
    it is missing."""
    from airlockd.sandbox.image import ensure_agent_image

    return ensure_agent_image(docker.from_env(), "claude")


@pytest.fixture
def real_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = "sk-ant-api03-" + secrets.token_hex(24)
    monkeypatch.setenv(KEY_ENV, key)
    return key


@pytest.fixture
def model() -> Iterator[ScriptedMessages]:
    with ScriptedMessages(fallback=lambda seen: Reply([text("nothing more")], 5, 1)) as m:
        yield m


def make_ws(tmp_path: Path, upstream: str, *, budget: int | None = None) -> Path:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "README.md").write_text("# project\n")
    (ws / "edit.txt").write_text("first line\n")
    (ws / "old.txt").write_text("to be deleted\n")
    admission = f"[agents.claude.admission]\nmax_tokens = {budget}\n" if budget else ""
    (ws / "policies.toml").write_text(
        '[agents.claude]\nadapter = "claude"\n'
        "[agents.claude.limits]\nwall_time_s = 120\nmemory_mb = 1024\n"
        f"{admission}"
        f'[gateway.providers.anthropic]\nupstream = "{upstream}"\nkey_env = "{KEY_ENV}"\n'
    )
    return ws


def changes(rec: Any) -> dict[str, str]:
    return {f.path: f.change for f in rec.files}


def sent_after(model: ScriptedMessages, first: int) -> str:
    return json.dumps([s.body for s in model.posts()[first:]])


def why(svc: Service, rec: Any) -> str:
    out = svc.state.run_dir(rec.id) / "output.log"
    return f"{rec.state} {rec.error} {rec.limit}\n{out.read_text()[-3000:] if out.exists() else ''}"


def test_claude_code_end_to_end_through_the_gateway(
    tmp_path: Path, model: ScriptedMessages, real_key: str, engine: str
) -> None:
    """On the first engine and on the second (a remote host: the gateway through its relay)."""
    model.replies = [
        Reply([tool("Write", file_path=f"{WS}/new.txt", content="created by claude\n")], 200, 20),
        Reply([tool("Read", file_path=f"{WS}/edit.txt")], 230, 15),
        Reply([tool("Edit", file_path=f"{WS}/edit.txt", old_string="first line", new_string="first\nsecond")], 240, 9),
        Reply([tool("Bash", command="rm old.txt", description="delete old.txt")], 250, 10),
        Reply([tool("Bash", command=PROBE, description="look around")], 260, 12),
        Reply([text("turn one done")], 300, 8),
    ]
    ws = make_ws(tmp_path, model.url)
    svc = Service(ws)
    rec = svc.execute(svc.submit("claude", "turn one: make the changes").id)
    assert rec.state is RunState.PROPOSED, why(svc, rec)
    assert changes(rec) == {"new.txt": "created", "edit.txt": "modified", "old.txt": "deleted"}, why(svc, rec)
    posts = model.posts()
    assert len(posts) == 6 and {s.path.partition("?")[0] for s in posts} == {"/v1/messages"}
    assert rec.tokens == model.sent_tokens == 1554 and rec.tokens_source == "gateway"
    assert {s.headers.get("x-api-key") for s in posts} == {real_key}
    assert not any("authorization" in s.headers for s in posts)  # the key in its header alone
    assert all(s.body.get("stream") is True for s in posts)

    results = model.tool_results()
    probe = results[-1]
    assert "ANTHROPIC_API_KEY=alrt_" in probe and "CLAUDE_CONFIG_DIR=/run/airlock/claude-home" in probe
    assert "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1" in probe
    assert real_key not in probe and real_key not in json.dumps(results)
    for f in svc.state.root.rglob("*"):  # store, audit, logs, agent home, its snapshot, staging
        if f.is_file() and not f.is_symlink():
            assert real_key.encode() not in f.read_bytes(), f
    session = json.loads((svc.state.run_dir(rec.id) / "agent-session.json").read_text())["session"]
    assert session and (svc.state.root / "agents" / "claude" / "home" / "projects").is_dir()

    # reject: the files are discarded and the conversation is rolled back
    svc.review.reject(rec.id)
    seen = len(model.posts())
    model.replies = [Reply([text("turn two done")], 50, 5)]
    rec2 = svc.execute(svc.submit("claude", "turn two: continue", follow_up=rec.id).id)
    assert rec2.state in (RunState.PROPOSED, RunState.APPLIED), why(svc, rec2)
    sent = sent_after(model, seen)
    assert "turn two: continue" in sent
    assert "turn one: make the changes" not in sent and "turn one done" not in sent
    assert not (ws / "new.txt").exists() and (ws / "old.txt").exists()

    # approve: the files land and a follow-up resumes the conversation
    seen = len(model.posts())
    model.replies = [
        Reply([tool("Write", file_path=f"{WS}/three.txt", content="three\n")], 60, 6),
        Reply([text("turn three done")], 70, 7),
    ]
    rec3 = svc.execute(svc.submit("claude", "turn three: write three.txt").id)
    assert changes(rec3) == {"three.txt": "created"}, why(svc, rec3)
    svc.review.approve(rec3.id)
    assert svc.store.get_run(rec3.id).state is RunState.APPLIED
    assert (ws / "three.txt").read_text() == "three\n"
    seen = len(model.posts())
    model.replies = [Reply([text("turn four done")], 80, 8)]
    rec4 = svc.execute(svc.submit("claude", "turn four: and now?", follow_up=rec3.id).id)
    assert rec4.state in (RunState.PROPOSED, RunState.APPLIED), why(svc, rec4)
    sent = sent_after(model, seen)
    assert "turn four: and now?" in sent
    assert "turn three: write three.txt" in sent and "turn three done" in sent
    follow = [json.loads(line) for line in svc.state.audit.read_text().splitlines() if "session.follow_up" in line]
    assert [e["data"]["resumed"] for e in follow] == [False, True], follow


def test_a_claude_stream_that_passes_the_budget_is_cut(tmp_path: Path, model: ScriptedMessages, real_key: str) -> None:
    model.replies = [
        Reply([tool("Write", file_path=f"{WS}/a.txt", content="a\n")], 400, 50),
        Reply([tool("Write", file_path=f"{WS}/b.txt", content="b\n")], 500, 60),  # passes 800
        Reply([text("never sent")], 10, 1),
    ]
    ws = make_ws(tmp_path, model.url, budget=800)
    svc = Service(ws)
    rec = svc.execute(svc.submit("claude", "write a and b").id)
    assert rec.state is RunState.LIMIT_EXCEEDED, why(svc, rec)
    assert rec.limit is not None and rec.limit.limit == "tokens" and "gateway" in rec.limit.source, rec.limit
    assert len(model.posts()) == 2  # nothing reached the model after the cut
    assert rec.tokens > 800 and rec.tokens_source == "gateway"  # the second stream was cut at its start
    closed = [json.loads(line) for line in svc.state.audit.read_text().splitlines() if "gateway.closed" in line]
    assert closed and '"budget_cut": true' in json.dumps(closed)
