"""The real Aider inside the runtime container (its own tree on the image's Python), through the
loopback forwarder and the run's gateway socket, to a scripted chat-completions model (streamed)
on the host's 127.0.0.1. Aider edits by text: one answer writes a new file and edits one (its
SEARCH/REPLACE blocks); the proposal lists exactly those changes; the usage on the run is what the
model sent; a second turn after a rejected run starts over, after an approved one restores the
session. Aider never runs a shell command the model suggests without a person's explicit yes (no
switch gives it), so a file is deleted, and the container's environment read, by a person's
`/run` in the prompt; the real key is nowhere in the container nor in the state dir. A stream
that would pass the token budget is cut."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from scripted_chat import Reply, ScriptedChat

from airlockd.records import RunState
from airlockd.runs.service import Service

pytestmark = [pytest.mark.docker, pytest.mark.slow]
AGENT_IMAGES = ("aider",)  # loaded into the other engines (tests/conftest.py)

KEY_ENV = "AIRLOCK_TEST_AIDER_UPSTREAM_KEY"
# what the container's processes hold, with the run token masked (a proposal carrying it is denied)
PROBE = (
    "(env; cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ) 2>/dev/null | tr '\\0' '\\n'"
    " | sed 's/alrt_[A-Za-z0-9._-]*/RUN-TOKEN/g' > probe.txt"
)
FENCE = "```"


def block(path: str, search: str, replace: str) -> str:
    """An edit block of Aider's `diff` format (an empty search: a new file)."""
    return f"{path}\n{FENCE}\n<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n{FENCE}\n\n"


@pytest.fixture(scope="module", autouse=True)
def aider_image() -> str:
    """The runtime image with Aider; `pip install --target … aider-chat` runs here when it is
    missing (wheels for the image's Python 3.11)."""
    from airlockd.sandbox.image import ensure_agent_image

    return ensure_agent_image(docker.from_env(), "aider")


@pytest.fixture
def real_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = "sk-proj-" + secrets.token_hex(20)
    monkeypatch.setenv(KEY_ENV, key)
    return key


@pytest.fixture
def model() -> Iterator[ScriptedChat]:
    with ScriptedChat(
        fallback=lambda seen: Reply(text="Nothing more.", prompt_tokens=5, completion_tokens=1), every=True
    ) as m:
        yield m


def make_ws(tmp_path: Path, upstream: str, *, budget: int | None = None) -> Path:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "README.md").write_text("# project\n")
    (ws / "edit.txt").write_text("first line\n")
    (ws / "old.txt").write_text("to be deleted\n")
    admission = f"[agents.ai.admission]\nmax_tokens = {budget}\n" if budget else ""
    (ws / "policies.toml").write_text(
        '[agents.ai]\nadapter = "aider"\ncommand = ["--model", "mock-model", "--edit-format", "diff"]\n'
        "[agents.ai.limits]\nwall_time_s = 120\nmemory_mb = 1024\n"
        f"{admission}"
        f'[gateway]\nupstream = "{upstream}"\nkey_env = "{KEY_ENV}"\nkey_file = ""\n'
        'allowed = ["POST /v1/chat/completions"]\n'
    )
    return ws


def changes(rec: Any) -> dict[str, str]:
    return {f.path: f.change for f in rec.files}


def sent_after(model: ScriptedChat, first: int) -> str:
    return json.dumps([s.body for s in model.seen[first:]])


def why(svc: Service, rec: Any) -> str:
    out = svc.state.run_dir(rec.id) / "output.log"
    return f"{rec.state} {rec.error} {rec.limit}\n{out.read_text()[-3000:] if out.exists() else ''}"


def test_aider_end_to_end_through_the_gateway(tmp_path: Path, model: ScriptedChat, real_key: str) -> None:
    """On the first engine (the relay to a remote engine's container is the same for every protocol:
    test_claude.py and test_codex.py run there)."""
    answer = block("new.txt", "", "created by aider\n") + block("edit.txt", "first line\n", "first\nsecond\n")
    model.replies = [Reply(text=answer + "turn one done", prompt_tokens=200, completion_tokens=20)]
    ws = make_ws(tmp_path, model.url)
    svc = Service(ws)
    rec = svc.execute(svc.submit("ai", "turn one: make the changes").id)
    assert rec.state is RunState.PROPOSED, why(svc, rec)
    assert changes(rec) == {"new.txt": "created", "edit.txt": "modified"}, why(svc, rec)
    assert {s.path for s in model.seen} == {"/v1/chat/completions"}
    assert rec.tokens == model.sent_tokens and rec.tokens >= 220 and rec.tokens_source == "gateway"
    assert {s.headers.get("authorization") for s in model.seen} == {f"Bearer {real_key}"}
    assert all(s.body.get("stream") is True for s in model.seen if isinstance(s.body, dict))
    session = json.loads((svc.state.run_dir(rec.id) / "agent-session.json").read_text())["session"]
    assert session and len(session) == 32

    # reject: the files are discarded and the conversation is rolled back
    svc.review.reject(rec.id)
    seen = len(model.seen)
    model.replies = [Reply(text="turn two done", prompt_tokens=50, completion_tokens=5)]
    rec2 = svc.execute(svc.submit("ai", "turn two: continue", follow_up=rec.id).id)
    assert rec2.state in (RunState.PROPOSED, RunState.APPLIED), why(svc, rec2)
    sent = sent_after(model, seen)
    assert "turn two: continue" in sent
    assert "turn one: make the changes" not in sent and "turn one done" not in sent
    assert not (ws / "new.txt").exists()

    # approve: the files land and a follow-up restores the session
    model.replies = [
        Reply(text=block("three.txt", "", "three\n") + "turn three done", prompt_tokens=60, completion_tokens=6)
    ]
    rec3 = svc.execute(svc.submit("ai", "turn three: write three.txt").id)
    assert changes(rec3) == {"three.txt": "created"}, why(svc, rec3)
    svc.review.approve(rec3.id)
    assert svc.store.get_run(rec3.id).state is RunState.APPLIED
    assert (ws / "three.txt").read_text() == "three\n"
    seen = len(model.seen)
    model.replies = [Reply(text="turn four done", prompt_tokens=80, completion_tokens=8)]
    rec4 = svc.execute(svc.submit("ai", "turn four: and now?", follow_up=rec3.id).id)
    assert rec4.state in (RunState.PROPOSED, RunState.APPLIED), why(svc, rec4)
    sent = sent_after(model, seen)
    assert "turn four: and now?" in sent
    assert "turn three: write three.txt" in sent and "turn three done" in sent
    follow = [json.loads(line) for line in svc.state.audit.read_text().splitlines() if "session.follow_up" in line]
    assert [e["data"]["resumed"] for e in follow] == [False, True], follow

    # a person's /run: a file deleted, and what the container's processes hold written down
    seen = len(model.seen)
    rec5 = svc.execute(svc.submit("ai", f"/run rm old.txt; {PROBE}").id)
    assert changes(rec5) == {"old.txt": "deleted", "probe.txt": "created"}, why(svc, rec5)
    assert len(model.seen) == seen  # no model was asked
    staged = svc.content.diff(rec5.id, "probe.txt")
    assert "+OPENAI_API_KEY=RUN-TOKEN" in staged and "+HOME=/run/airlock/aider-home" in staged, staged[:2000]
    assert "python3" in staged and "/opt/airlockd/aider" in staged  # process arguments were read
    assert "PYTHONPATH" not in staged  # the agent's commands see none of Aider's own packages
    for f in svc.state.root.rglob("*"):  # store, audit, logs, agent home, its snapshot, staging
        if f.is_file() and not f.is_symlink():
            assert real_key.encode() not in f.read_bytes(), f


def test_an_aider_stream_that_passes_the_budget_is_cut(tmp_path: Path, model: ScriptedChat, real_key: str) -> None:
    model.replies = [Reply(text=block("a.txt", "", "a\n"), prompt_tokens=900, completion_tokens=50)]
    ws = make_ws(tmp_path, model.url, budget=800)
    svc = Service(ws)
    rec = svc.execute(svc.submit("ai", "write a").id)
    assert rec.state is RunState.LIMIT_EXCEEDED, why(svc, rec)
    assert rec.limit is not None and rec.limit.limit == "tokens" and "gateway" in rec.limit.source, rec.limit
    assert rec.tokens > 800 and rec.tokens_source == "gateway"
    assert not changes(rec)  # the answer was cut: nothing of it was applied in the container
    closed = [json.loads(line) for line in svc.state.audit.read_text().splitlines() if "gateway.closed" in line]
    assert closed and '"budget_cut": true' in json.dumps(closed)
