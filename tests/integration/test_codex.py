"""The real Codex CLI inside the runtime container, through the loopback forwarder and the run's
gateway socket, to a scripted Responses-API model on the host's 127.0.0.1: it creates, edits and
deletes files with `exec_command`; the proposal lists exactly those changes; the usage on the run is
what the model sent; the real key is nowhere in the container nor in the state dir; and a second
turn after a rejected run starts over, after an approved one carries the conversation forward."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from scripted_model import Reply, ScriptedModel, exec_call, message, usage

from airlockd.records import RunState
from airlockd.runs.service import Service

pytestmark = [pytest.mark.docker, pytest.mark.slow]
AGENT_IMAGES = ("codex",)  # loaded into the other engines (tests/conftest.py)

KEY_ENV = "AIRLOCK_TEST_CODEX_UPSTREAM_KEY"
WALL_S = 60  # a turn takes 3 s under runc and 10 s under runsc; a stalled one costs no more than this
# Under this machine's gVisor (Debian's runsc, release 2022-12-19) Codex now and then stops after a
# command of its own has exited: the command is left a zombie, Codex's runtime goes on waking and
# asks the model nothing more, until airlockd ends the run at its wall time (docs/containment.md,
# "Codex under runsc"). 4 of 46 runs of the test below did so here; no CI run saw it under runc.
# Such a failure, and only it, runs the test again (tests/conftest.py); any other failure fails.
STALL = "Codex went quiet until its wall time"
KNOWN_STALL = ("runsc", STALL, 2)
PROBE = "env; cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | sort -u"


@pytest.fixture(scope="module", autouse=True)
def codex_image() -> str:
    """The runtime image with Codex; `npm install @openai/codex` runs here when it is missing."""
    from airlockd.sandbox.image import ensure_codex_image

    return ensure_codex_image(docker.from_env())


@pytest.fixture
def real_key(monkeypatch: pytest.MonkeyPatch) -> str:
    key = "sk-proj-" + secrets.token_hex(20)
    monkeypatch.setenv(KEY_ENV, key)
    return key


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel(fallback=lambda seen: Reply([message("nothing more")], usage(5, 1))) as m:
        yield m


def make_ws(tmp_path: Path, upstream: str, runtime: str = "runc") -> Path:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "README.md").write_text("# project\n")
    (ws / "edit.txt").write_text("first line\n")
    (ws / "old.txt").write_text("to be deleted\n")
    (ws / "policies.toml").write_text(
        f'[agents.codex]\nadapter = "codex"\nnetwork = "gateway"\nruntime = "{runtime}"\n'
        f"[agents.codex.limits]\nwall_time_s = {WALL_S}\nmemory_mb = 1024\n"
        f'[gateway]\nupstream = "{upstream}"\nkey_env = "{KEY_ENV}"\nkey_file = ""\n'
        'allowed = ["POST /v1/responses"]\n'
    )
    return ws


def inputs_text(model: ScriptedModel, first: int) -> str:
    """Everything Codex sent the model from request `first` on, as text."""
    return json.dumps([s.body for s in model.seen[first:]])


def changes(rec: Any) -> dict[str, str]:
    return {f.path: f.change for f in rec.files}


def settled(svc: Service, rec: Any) -> Any:
    """`rec`, once it is sure Codex did not stall (STALL: ended at its wall time), with the end of
    what it printed when it did."""
    if rec.state is RunState.LIMIT_EXCEEDED and rec.limit is not None and rec.limit.limit == "wall_time":
        tail = (svc.state.run_dir(rec.id) / "output.log").read_text(errors="replace")[-1500:]
        pytest.fail(f"{STALL} ({rec.limit.measured} s); it printed last:\n{tail}")
    return rec


def test_codex_end_to_end_through_the_gateway(
    tmp_path: Path, model: ScriptedModel, real_key: str, runtime: str
) -> None:
    """Under runc and under runsc (gVisor: the gateway's socket through its host-uds option)."""
    model.replies = [
        Reply([exec_call("echo created by codex > new.txt")], usage(200, 20)),
        Reply([exec_call("echo second line >> edit.txt")], usage(230, 15)),
        Reply([exec_call("rm old.txt")], usage(250, 10)),
        Reply([exec_call(PROBE)], usage(260, 12)),
        Reply([message("turn one done")], usage(300, 8)),
    ]
    ws = make_ws(tmp_path, model.url, runtime)
    svc = Service(ws)
    rec = settled(svc, svc.execute(svc.submit("codex", "turn one: make the changes").id))
    assert rec.container.get("runtime") == runtime, rec.container
    assert rec.state is RunState.PROPOSED, (
        rec.state,
        rec.error,
        rec.limit,
        (svc.state.run_dir(rec.id) / "output.log").read_text()[-2000:],
    )
    assert changes(rec) == {"new.txt": "created", "edit.txt": "modified", "old.txt": "deleted"}
    assert rec.tokens == model.sent_tokens == 1305 and rec.tokens_source == "gateway"
    assert len(model.seen) == 5 and all(s.path == "/v1/responses" for s in model.seen)
    assert {s.headers["authorization"] for s in model.seen} == {f"Bearer {real_key}"}

    outputs = model.tool_outputs()
    probe = outputs[-1]
    assert "AIRLOCK_RUN_TOKEN=alrt_" in probe and "CODEX_HOME=/run/airlock/codex-home" in probe
    assert "codex" in probe and "exec" in probe  # process arguments were read
    assert real_key not in probe and real_key not in json.dumps(outputs)
    for f in svc.state.root.rglob("*"):  # store, audit, logs, agent home, its snapshot, staging
        if f.is_file() and not f.is_symlink():
            assert real_key.encode() not in f.read_bytes(), f

    # reject: the files are discarded and the conversation is rolled back
    svc.review.reject(rec.id)
    assert svc.store.get_run(rec.id).state is RunState.REJECTED
    seen = len(model.seen)
    model.replies = [Reply([message("turn two done")], usage(50, 5))]
    rec2 = settled(svc, svc.execute(svc.submit("codex", "turn two: continue", follow_up=rec.id).id))
    assert rec2.state in (RunState.PROPOSED, RunState.APPLIED), rec2.error
    sent = inputs_text(model, seen)
    assert "turn two: continue" in sent
    assert "turn one: make the changes" not in sent and "turn one done" not in sent
    assert not (ws / "new.txt").exists() and (ws / "old.txt").exists()

    # approve: the files land and the next turn carries the conversation forward
    seen = len(model.seen)
    model.replies = [
        Reply([exec_call("echo three > three.txt")], usage(60, 6)),
        Reply([message("turn three done")], usage(70, 7)),
    ]
    rec3 = settled(svc, svc.execute(svc.submit("codex", "turn three: write three.txt").id))
    assert changes(rec3) == {"three.txt": "created"}, (
        rec3.state,
        rec3.error,
        (svc.state.run_dir(rec3.id) / "output.log").read_text()[-3000:],
    )
    svc.review.approve(rec3.id)
    assert svc.store.get_run(rec3.id).state is RunState.APPLIED
    assert (ws / "three.txt").read_text() == "three\n"
    seen = len(model.seen)
    model.replies = [Reply([message("turn four done")], usage(80, 8))]
    rec4 = settled(svc, svc.execute(svc.submit("codex", "turn four: and now?", follow_up=rec3.id).id))
    assert rec4.state in (RunState.PROPOSED, RunState.APPLIED), rec4.error
    sent = inputs_text(model, seen)
    assert "turn four: and now?" in sent
    assert "turn three: write three.txt" in sent and "turn three done" in sent
    audit = svc.state.audit.read_text()
    assert "session.rolled_back" in audit and "session.committed" in audit
    assert real_key not in audit


def test_the_agents_home_is_capped_like_its_workspace(
    tmp_path: Path, model: ScriptedModel, real_key: str, runtime: str
) -> None:
    """The home is a capped copy for the run (never the state directory's own folder): Codex told
    to write 300 MB into $CODEX_HOME with workspace_growth_mb = 32 stops at the cap, and the run
    is over its growth limit; the host's disk got at most the cap, and the rejected run's copy
    does not come back into the home (its conversation is rolled back)."""
    fill = "dd if=/dev/zero of=$CODEX_HOME/fill bs=1M count=300 2>&1 | head -n 1; df -k $CODEX_HOME | tail -n 1"
    model.replies = [Reply([exec_call(fill)], usage(10, 1)), Reply([message("filled")], usage(10, 1))]
    ws = make_ws(tmp_path, model.url, runtime)
    policy = ws / "policies.toml"
    policy.write_text(policy.read_text().replace("memory_mb = 1024\n", "memory_mb = 1024\nworkspace_growth_mb = 32\n"))
    svc = Service(ws)
    home = svc.state.root / "agents" / "codex" / "home"
    rec = settled(svc, svc.execute(svc.submit("codex", "fill your home").id))
    out = model.tool_outputs()[0]
    assert "No space left on device" in out, out
    assert rec.state is RunState.LIMIT_EXCEEDED and rec.limit is not None, (rec.state, rec.error)
    assert rec.limit.limit == "workspace_growth", rec.limit
    assert home.is_dir() and not (home / "fill").exists()  # rolled back with the run
    run_dir = svc.state.run_dir(rec.id)
    assert not (run_dir / "agent-home").exists() and not (run_dir / "staging" / "home").exists()
    # a run within the cap keeps what it wrote in its home
    model.replies = [
        Reply([exec_call("echo kept > $CODEX_HOME/note.txt; echo x > x.txt")], usage(5, 1)),
        Reply([message("noted")], usage(5, 1)),
    ]
    rec2 = settled(svc, svc.execute(svc.submit("codex", "write a note").id))
    assert rec2.state is RunState.PROPOSED, (rec2.state, rec2.error, rec2.limit)
    svc.review.approve(rec2.id)
    assert (home / "note.txt").read_text() == "kept\n"


def test_a_link_the_agent_leaves_for_its_config_is_never_followed(
    tmp_path: Path, model: ScriptedModel, real_key: str
) -> None:
    """Codex makes $CODEX_HOME/config.toml a link to a host file (attack review: the next run's
    config write replaced that file); the next run writes its config afresh, the file stays."""
    victim = tmp_path / "victim.txt"
    victim.write_text("host content\n")
    victim.chmod(0o666)  # writable by anyone: only the link could protect it
    model.replies = [
        Reply([exec_call(f"ln -sfn {victim} $CODEX_HOME/config.toml; echo x > x.txt")], usage(5, 1)),
        Reply([message("linked")], usage(5, 1)),
    ]
    ws = make_ws(tmp_path, model.url)
    svc = Service(ws)
    rec = settled(svc, svc.execute(svc.submit("codex", "link your config").id))
    assert rec.state is RunState.PROPOSED, (rec.state, rec.error)
    svc.review.approve(rec.id)
    model.replies = [Reply([exec_call("echo y > y.txt")], usage(5, 1)), Reply([message("ok")], usage(5, 1))]
    rec2 = settled(svc, svc.execute(svc.submit("codex", "again").id))
    assert victim.read_text() == "host content\n"
    assert rec2.state is RunState.PROPOSED, (rec2.state, rec2.error, rec2.limit)
    home = svc.state.root / "agents" / "codex" / "home"
    assert not (home / "config.toml").is_symlink()
