"""Staging against the real engine, once per stager (tests/conftest.py parametrises this module):
the agent works on a snapshot that live edits do not reach, and the change set it proposes is
exactly what it did — opaque, renamed and deleted directories, files written back identical."""

from __future__ import annotations

import json
import textwrap
import threading
import time
from pathlib import Path

import pytest

from airlockd.cli import main
from airlockd.errors import EXIT_CONFLICT
from airlockd.records import RunState
from airlockd.runs.service import Service
from airlockd.staging.stagers import proposed_path

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

POLICY = textwrap.dedent(
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
    for d in ("keep", "gone", "moved", "redo"):
        (ws / "src" / d).mkdir(parents=True)
        (ws / "src" / d / "a.py").write_text(f"# {d}\n")
        (ws / "src" / d / "b.py").write_text(f"B = '{d}'\n")
    (ws / "same.txt").write_text("unchanged\n")
    (ws / "live.txt").write_text("as staged\n")
    (ws / "tool.sh").write_text("#!/bin/sh\n")
    (ws / ".env").write_text("TOKEN=withheld-value-123\n")
    (ws / "policies.toml").write_text(POLICY)
    return ws


def test_directory_changes_and_identical_write_back(ws: Path, stager: str) -> None:
    svc = Service(ws)
    script = (
        "set -e; test ! -e .env; mv src/moved src/renamed; rm -rf src/gone; rm -rf src/redo; mkdir src/redo;"
        " echo new > src/redo/c.py; cat same.txt > /tmp/s; cat /tmp/s > same.txt; touch src/keep/a.py;"
        " chmod 755 tool.sh; echo more >> src/keep/b.py"
    )
    rec = svc.execute(svc.submit("bot", script).id)
    assert rec.state is RunState.PROPOSED, rec.transitions[-1]
    assert rec.stager == stager
    got = {f.path: f.change for f in rec.files}
    assert got == {
        "src/gone": "deleted",
        "src/gone/a.py": "deleted",
        "src/gone/b.py": "deleted",
        "src/moved": "deleted",
        "src/moved/a.py": "deleted",
        "src/moved/b.py": "deleted",
        "src/renamed": "created",
        "src/renamed/a.py": "created",
        "src/renamed/b.py": "created",
        "src/redo/a.py": "deleted",
        "src/redo/b.py": "deleted",
        "src/redo/c.py": "created",
        "tool.sh": "mode_changed",
        "src/keep/b.py": "modified",
    }
    run_dir = svc.state.run_dir(rec.id)
    assert proposed_path(run_dir, "src/keep/b.py").read_text() == "B = 'keep'\nmore\n"
    assert proposed_path(run_dir, "src/renamed/a.py").read_text() == "# moved\n"
    events = [json.loads(line) for line in svc.state.audit.read_text().splitlines()]
    done = [e for e in events if e["kind"] == "stage.done" and e["run"] == rec.id]
    assert done and stager in json.dumps(done[0])
    svc.review.approve(rec.id)
    assert not (ws / "src/moved").exists() and (ws / "src/renamed/b.py").read_text() == "B = 'moved'\n"
    assert (ws / "src/redo/c.py").exists() and not (ws / "src/redo/a.py").exists()
    assert (ws / "tool.sh").stat().st_mode & 0o777 == 0o755


def test_live_edit_during_a_run_is_not_seen_and_conflicts_at_approval(
    ws: Path, stager: str, capsys: pytest.CaptureFixture[str]
) -> None:
    svc = Service(ws)
    script = "sleep 3; cat live.txt > seen.txt; echo 'agent line' >> live.txt"
    rec = svc.submit("bot", script)
    done: list[object] = []
    t = threading.Thread(target=lambda: done.append(svc.execute(rec.id)))
    t.start()
    deadline = time.monotonic() + 30
    while svc.store.get_run(rec.id).state is not RunState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    (ws / "live.txt").write_text("edited live by a person\n")
    t.join(60)
    rec = svc.store.get_run(rec.id)
    assert rec.state is RunState.PROPOSED, rec.transitions[-1]
    run_dir = svc.state.run_dir(rec.id)
    assert proposed_path(run_dir, "seen.txt").read_text() == "as staged\n"  # the snapshot, not the edit
    assert rec.file("live.txt") is not None
    capsys.readouterr()
    assert rec.file("live.txt").state.value == "conflicted"  # type: ignore[union-attr]
    code = main(["--workspace", str(ws), "--json", "approve", rec.id, "--path", "live.txt"])
    out = json.loads(capsys.readouterr().out)
    assert code == EXIT_CONFLICT and out["error"] == "conflict" and out["paths"] == ["live.txt"], out
    assert (ws / "live.txt").read_text() == "edited live by a person\n"  # nothing was written
    assert not (ws / "seen.txt").exists()
    result = svc.review.approve(rec.id)  # the rest lands; the conflicted file never does
    assert result.applied == ["seen.txt"] and (ws / "live.txt").read_text() == "edited live by a person\n"
