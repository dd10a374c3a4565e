"""The daemon's mirror keeper against the real engine: a run's mounted generation stays put."""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path

import pytest

from airlockd.records import RunState
from airlockd.runs.service import Service
from airlockd.staging.stagers import proposed_path

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

POLICY = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    """
)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "project"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("A = 1\n")
    (ws / "live.txt").write_text("as staged\n")
    (ws / "policies.toml").write_text(POLICY)
    return ws


def test_the_daemons_keeper_never_changes_a_mounted_generation(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the daemon's keeper (inotify), a live edit during a run reaches the next refresh
    (a clone of the generation the run has mounted), never the running agent's view."""
    from nonroot import overlay_unavailable

    from airlockd.runs.execution import mirror_owner

    if why := overlay_unavailable(ws.parent):
        pytest.skip(f"overlay staging unavailable: {why}")
    monkeypatch.setenv("AIRLOCK_STAGER", "overlay")

    svc = Service(ws)
    assert svc.keep_mirrors() is None
    assert svc.keeper is not None
    script = "sleep 3; cat live.txt > seen.txt"
    rec = svc.submit("bot", script)
    done: list[object] = []
    t = threading.Thread(target=lambda: done.append(svc.execute(rec.id)))
    t.start()
    try:
        deadline = time.monotonic() + 30
        while svc.store.get_run(rec.id).state is not RunState.RUNNING and time.monotonic() < deadline:
            time.sleep(0.05)
        (ws / "live.txt").write_text("edited live by a person\n")
        level = svc.policy.clearance_for("bot")
        nxt = svc.keeper.refresh(svc.policy, level, owner=mirror_owner())  # as the next run's would
        assert nxt.stats.cloned and nxt.stats.read == 1
        assert (nxt.tree / "live.txt").read_text() == "edited live by a person\n"
    finally:
        t.join(60)
        svc.close()
    rec = svc.store.get_run(rec.id)
    assert rec.state is RunState.PROPOSED, rec.transitions[-1]
    assert proposed_path(svc.state.run_dir(rec.id), "seen.txt").read_text() == "as staged\n"
