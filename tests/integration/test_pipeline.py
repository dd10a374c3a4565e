"""The headless pipeline end to end, through the CLI, against the real Docker engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from airlockd.cli import main

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

AGENT = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    [agents.bot.limits]
    wall_time_s = 60
    """
)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "project"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "pkg" / "mod.py").write_text("A = 1\nB = 2\n")
    (ws / "docs").mkdir()
    (ws / "docs" / "old.md").write_text("old\n")
    (ws / "README.md").write_text("# project\n")
    (ws / "AGENTS.md").write_text("be nice\n")
    (ws / ".env").write_text("SECRET_TOKEN=s3cr3t-value-that-must-not-leak\n")
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "policies.toml").write_text(AGENT)
    return ws


def cli(ws: Path, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, object]:
    capsys.readouterr()
    code = main(["--workspace", str(ws), "--json", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def _recover(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A command that may write recovers first (`show` and `runs` never do): `undo` of a run that
    does not exist recovers and changes nothing else."""
    code, _ = cli(ws, "undo", "rnosuchrun", capsys=capsys)
    assert code == 1


def test_run_approve_undo(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = (
        "set -e; test ! -e .env; echo 'C = 3' >> src/pkg/mod.py; mkdir -p src/new; echo x > src/new/f.py;"
        " rm docs/old.md; echo hacked >> AGENTS.md; ln -s /etc/passwd link; echo hook > .git_hook_attempt;"
        " mkdir -p .git/hooks; echo evil > .git/hooks/pre-commit; chmod 644 run.sh;"
        " echo 'I changed nothing at all'"
    )
    code, run = cli(ws, "run", "--agent", "bot", "--wait", script, capsys=capsys)
    assert code == 0, run
    assert isinstance(run, dict)
    assert run["state"] == "proposed"
    files = {f["path"]: f for f in run["files"]}
    assert files["src/pkg/mod.py"]["change"] == "modified"
    assert files["src/new/f.py"]["change"] == "created"
    assert files["docs/old.md"]["change"] == "deleted"
    assert files["run.sh"]["change"] == "mode_changed"
    for denied in ("AGENTS.md", "link", ".git/hooks/pre-commit"):
        assert files[denied]["decision"] == "deny", denied
        assert files[denied]["rule"].startswith("invariant:"), files[denied]
    assert [w["path"] for w in run["withheld"]] == [".env"]
    run_id = run["id"]

    code, diff = cli(ws, "diff", run_id, capsys=capsys)
    assert code == 0 and isinstance(diff, dict)
    assert "+C = 3" in diff["diff"]

    code, out = cli(ws, "approve", run_id, capsys=capsys)
    assert code == 0, out
    assert isinstance(out, dict) and out["run"]["state"] == "applied"
    assert (ws / "src/pkg/mod.py").read_text() == "A = 1\nB = 2\nC = 3\n"
    assert (ws / "src/new/f.py").read_text() == "x\n"
    assert not (ws / "docs/old.md").exists()
    assert (ws / "AGENTS.md").read_text() == "be nice\n"
    assert not (ws / "link").is_symlink() and not (ws / ".git").exists()
    assert (ws / "run.sh").stat().st_mode & 0o777 == 0o644
    assert (ws / ".env").read_text().startswith("SECRET_TOKEN=")

    code, out = cli(ws, "undo", run_id, capsys=capsys)
    assert code == 0, out
    assert (ws / "src/pkg/mod.py").read_text() == "A = 1\nB = 2\n"
    assert not (ws / "src/new").exists()
    assert (ws / "docs/old.md").read_text() == "old\n"
    assert (ws / "run.sh").stat().st_mode & 0o777 == 0o755

    code, out = cli(ws, "audit", "--verify", capsys=capsys)
    assert code == 0 and out["ok"] is True and out["events"] > 0  # type: ignore[index]


def test_partial_approve_and_reject(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, run = cli(ws, "run", "--agent", "bot", "--wait", "echo a > a.txt; echo b > b.txt", capsys=capsys)
    assert code == 0 and isinstance(run, dict)
    code, out = cli(ws, "approve", run["id"], "--path", "a.txt", capsys=capsys)
    assert code == 0 and isinstance(out, dict)
    assert out["applied"] == ["a.txt"] and out["run"]["state"] == "proposed"
    assert (ws / "a.txt").exists() and not (ws / "b.txt").exists()
    code, out = cli(ws, "reject", run["id"], capsys=capsys)
    assert code == 0 and isinstance(out, dict) and out["state"] == "applied"
    assert not (ws / "b.txt").exists()


def test_conflict_writes_nothing(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, run = cli(ws, "run", "--agent", "bot", "--wait", "echo new > README.md; echo z > z.txt", capsys=capsys)
    assert code == 0 and isinstance(run, dict)
    (ws / "README.md").write_text("# edited by a person meanwhile\n")
    code, out = cli(ws, "approve", run["id"], capsys=capsys)
    assert code == 5, out
    assert isinstance(out, dict) and out["error"] == "conflict" and out["paths"] == ["README.md"]
    assert (ws / "README.md").read_text() == "# edited by a person meanwhile\n"
    assert not (ws / "z.txt").exists()


def test_policy_typo_is_a_clear_error(ws: Path) -> None:
    (ws / "policies.toml").write_text(AGENT + "\n[defaults]\nmdoe = 'auto'\n")
    proc = subprocess.run(
        [sys.executable, "-m", "airlockd", "--workspace", str(ws), "run", "--agent", "bot", "--wait", "true"],
        capture_output=True,
        text=True,
        env=os.environ,
    )
    assert proc.returncode == 1
    assert "defaults.mdoe" in proc.stderr and str(ws / "policies.toml") in proc.stderr
    assert "Traceback" not in proc.stderr


def test_wall_time_limit(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (ws / "policies.toml").write_text(AGENT.replace("wall_time_s = 60", "wall_time_s = 2"))
    code, run = cli(ws, "run", "--agent", "bot", "--wait", "sleep 30", capsys=capsys)
    assert code == 4 and isinstance(run, dict)
    assert run["state"] == "limit_exceeded" and run["limit"]["limit"] == "wall_time"


def test_demo_ends_with_an_approved_proposal(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "airlockd", "demo", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ws = tmp_path / "sample-project"
    assert "farewell" in (ws / "src/greet.py").read_text()
    assert not (ws / "notes/obsolete.txt").exists()
    assert not (ws / "shadow-link").is_symlink()
    assert "audit chain intact" in proc.stdout
    assert "correct-horse-battery-staple" not in proc.stdout + proc.stderr


def _wait_state(
    ws: Path, run_id: str, states: set[str], capsys: pytest.CaptureFixture[str], timeout: float = 60
) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, run = cli(ws, "show", run_id, capsys=capsys)
        assert isinstance(run, dict)
        if run["state"] in states:
            return run
        time.sleep(0.3)
    raise AssertionError(f"run {run_id} never reached {states}; last {run['state']}")


@pytest.mark.parametrize(("verb", "state"), [("stop", "stopped"), ("kill", "killed")])
def test_background_run_then_stop_or_kill_from_another_process(
    ws: Path, capsys: pytest.CaptureFixture[str], verb: str, state: str
) -> None:
    code, run = cli(ws, "run", "--agent", "bot", "trap '' TERM; echo started > started.txt; sleep 60", capsys=capsys)
    assert code == 0 and isinstance(run, dict) and run["state"] == "admitted"
    _wait_state(ws, run["id"], {"running"}, capsys)
    code, final = cli(ws, verb, run["id"], capsys=capsys)  # returns once the run has ended
    assert isinstance(final, dict) and final["state"] == state and code == 4, final
    assert final["stopped_by"] == "cli"
    import docker

    left = docker.from_env().containers.list(all=True, filters={"label": f"airlockd.run={run['id']}"})
    assert left == []
    code, _ = cli(ws, "approve", run["id"], capsys=capsys)
    assert code == 1  # a stopped run has nothing to approve


@pytest.mark.parametrize("agent_s", [4, 1])
def test_a_run_whose_process_dies_is_reattached(
    ws: Path, capsys: pytest.CaptureFixture[str], agent_s: int, runtime: str
) -> None:
    """The executing process dies while the agent runs: the next command hands the container to a
    new process that keeps enforcing its limits (or, when the agent has finished meanwhile, reads
    how it ended) and proposes the result. Under runc and under runsc."""
    import signal
    import time

    import docker

    policy = ws / "policies.toml"
    policy.write_text(policy.read_text().replace('prompt = "argv"\n', f'prompt = "argv"\nruntime = "{runtime}"\n'))

    code, run = cli(ws, "run", "--agent", "bot", f"sleep {agent_s}; echo done > done.txt", capsys=capsys)
    assert code == 0 and isinstance(run, dict)
    running = _wait_state(ws, run["id"], {"running"}, capsys)
    client = docker.from_env()
    deadline = time.monotonic() + 30  # `running` is recorded just before the container is created
    while not client.containers.list(filters={"label": f"airlockd.run={run['id']}", "status": "running"}):
        assert time.monotonic() < deadline, "the run's container never started"
        time.sleep(0.1)
    os.kill(running["owner_pid"], signal.SIGKILL)  # dies without cleaning up
    time.sleep(0.5 if agent_s > 1 else 3)  # the short agent has exited by the time anyone looks
    _recover(ws, capsys)
    final = _wait_state(ws, run["id"], {"proposed", "failed"}, capsys)
    assert final["state"] == "proposed", final.get("error")
    assert [f["path"] for f in final["files"]] == ["done.txt"]
    assert final["owner_pid"] != running["owner_pid"]
    kinds = [e["kind"] for e in final["timeline"]]
    assert "recovery.reattached" in kinds
    assert final["container"]["runtime"] == runtime, final["container"]


def test_a_run_whose_container_is_gone_is_reconciled(
    ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process carrying a run dies and its container goes: reading commands leave the run as it
    is, the next command that may write fails it. Without a daemon: a daemon whose child carrying
    the run dies reconciles it itself, at once (then which account of the end is recorded depends on
    whether the engine still lists the container: the clean-clone CI saw both)."""
    import signal
    import time

    import docker

    monkeypatch.setenv("AIRLOCK_DAEMON", "off")
    code, run = cli(ws, "run", "--agent", "bot", "sleep 60", capsys=capsys)
    assert code == 0 and isinstance(run, dict)
    running = _wait_state(ws, run["id"], {"running"}, capsys)
    label = {"label": f"airlockd.run={run['id']}"}
    deadline = time.monotonic() + 30  # "running" is recorded just before the container is created
    while not docker.from_env().containers.list(filters=label) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(running["owner_pid"], signal.SIGKILL)
    for c in docker.from_env().containers.list(all=True, filters=label):
        c.remove(force=True)  # and its container with it
    time.sleep(0.5)
    assert _wait_state(ws, run["id"], {"running"}, capsys)  # reading commands reconcile nothing
    _recover(ws, capsys)
    final = _wait_state(ws, run["id"], {"failed"}, capsys)
    assert "ended while it was running" in final["error"]
    assert docker.from_env().containers.list(all=True, filters=label) == []


def test_a_container_created_but_never_started_is_not_taken_for_a_run(
    ws: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A process that dies between creating its container and starting it leaves a container in
    "created": no agent ran, so re-attaching must not read it as an agent that exited cleanly
    (and propose "no changes"): the run fails and the container goes."""
    import docker

    from airlockd.records import RunState
    from airlockd.runs.service import Service
    from airlockd.sandbox.image import image_tag

    svc = Service(ws)
    rec = svc.submit("bot", "echo never")
    dead = subprocess.Popen(["true"])
    dead.wait()

    def running(r: Any) -> None:
        r.state, r.owner_pid, r.owner_start = RunState.RUNNING, dead.pid, None

    svc.store.update_run(rec.id, running)
    labels = {"airlockd": "1", "airlockd.run": rec.id, "airlockd.workspace": str(svc.workspace)}
    docker.from_env().containers.create(image_tag(), ["true"], labels=labels)
    _recover(ws, capsys)
    final = _wait_state(ws, rec.id, {"failed", "applied", "proposed"}, capsys)
    assert final["state"] == "failed", final
    assert "gone" in final["error"]
    assert docker.from_env().containers.list(all=True, filters={"label": f"airlockd.run={rec.id}"}) == []


def test_sweep_reaps_orphans(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import docker

    from airlockd.runs.service import Service
    from airlockd.sandbox.image import image_tag

    svc = Service(ws)
    client = docker.from_env()
    labels = {"airlockd": "1", "airlockd.run": "rorphan", "airlockd.workspace": str(svc.workspace)}
    client.containers.create(image_tag(), ["true"], labels=labels)  # left by a process long gone
    stray = svc.state.runs / "rstray"
    (stray / "staging").mkdir(parents=True)
    code, run = cli(ws, "run", "--agent", "bot", "--wait", "echo x > x.txt", capsys=capsys)
    assert code == 0 and isinstance(run, dict)
    cli(ws, "reject", run["id"], capsys=capsys)
    (svc.state.run_dir(run["id"]) / "staging").mkdir(exist_ok=True)  # as if cleanup had been interrupted
    assert client.containers.list(all=True, filters={"label": "airlockd.run=rorphan"}) == []  # `run` swept it
    swept = svc.sweep()  # the stray folder: by the daemon the run started, or by now (a run alone sweeps containers)
    assert swept["containers"] == 0 and swept["staging_copies"] == 1, swept
    assert not stray.exists()
