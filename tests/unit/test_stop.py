"""`Service.stop` returns when the run has ended, watching the store (whoever carries the run),
bounded by the grace and a margin; with `wait=False` at once. The fake sandbox plays the engine;
tests/integration/test_containment.py does the same against the real one and the CLI."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fakesandbox import FakeSandbox, _unmount_staging, workspace  # noqa: F401
from pygls.exceptions import JsonRpcInvalidParams

from airlockd.errors import StillEnding
from airlockd.lsp.args import parse
from airlockd.protocol import StopArgs
from airlockd.records import RunRecord, RunState
from airlockd.runs import service as service_module
from airlockd.runs import stopping
from airlockd.runs.service import Service


def carried(tmp_path: Path, grace: float = 2) -> tuple[Service, FakeSandbox, RunRecord, threading.Thread]:
    """A run carried by another thread, whose agent runs until it is stopped or killed."""
    fake = FakeSandbox()
    svc = Service(workspace(tmp_path, f"[agents.bot.limits]\ngrace_s = {grace}\n"), sandbox=fake)
    rec = svc.submit("bot", "work")
    fake.act = lambda ws: fake.block(rec.id) or b"working\n"
    carrier = threading.Thread(target=svc.execute, args=(rec.id,), daemon=True)
    carrier.start()
    deadline = time.monotonic() + 30
    while fake.stats(rec.id) is None:  # the agent is running
        assert time.monotonic() < deadline, svc.store.get_run(rec.id).state
        time.sleep(0.02)
    return svc, fake, rec, carrier


@pytest.mark.parametrize("kill", [False, True])
def test_stop_returns_the_final_record(tmp_path: Path, kill: bool) -> None:
    svc, _, rec, carrier = carried(tmp_path)
    ended = svc.stop(rec.id, kill=kill)
    assert ended.state is (RunState.KILLED if kill else RunState.STOPPED)
    assert ended.stop_kind == ("kill" if kill else "stop") and ended.stopped_by == "cli"
    assert svc.store.get_run(rec.id).state is ended.state  # what it returned is what is stored
    carrier.join(10)
    assert not carrier.is_alive()


def test_no_wait_returns_without_waiting_for_the_carrier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc, _, rec, carrier = carried(tmp_path)
    gate = threading.Event()
    ending = service_module.execution.ending

    def slow_ending(*args: object, **kw: object) -> object:  # the carrier takes its time to record the end
        gate.wait(10)
        return ending(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(service_module.execution, "ending", slow_ending)
    now = svc.stop(rec.id, wait=False)
    assert now.state is RunState.RUNNING and now.stop_kind == "stop"
    gate.set()
    carrier.join(10)
    assert svc.store.get_run(rec.id).state is RunState.STOPPED


def test_stop_of_a_run_no_process_carries_yet_ends_it_at_once(tmp_path: Path) -> None:
    svc = Service(workspace(tmp_path), sandbox=FakeSandbox())
    rec = svc.submit("bot", "work")
    ended = svc.stop(rec.id, kill=True)
    assert ended.state is RunState.KILLED and "before the run started" in ended.transitions[-1].detail
    assert not (svc.state.run_dir(rec.id) / "prompt.raw").exists()  # the unredacted prompt goes with it


def test_a_stop_recorded_while_staging_is_honoured_before_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airlockd.runs import execution

    fake = FakeSandbox(act=lambda ws: (ws / "ran").write_text("x") and None)
    svc = Service(workspace(tmp_path), sandbox=fake)
    rec = svc.submit("bot", "work")
    stage = execution.stage

    def staged_then_stopped(*args: Any) -> Any:
        staged = stage(*args)
        # as another process's `stop --no-wait` leaves it: recorded, but no container to reach yet
        svc.store.update_run(rec.id, lambda r: setattr(r, "stop_kind", "stop"))
        return staged

    monkeypatch.setattr(execution, "stage", staged_then_stopped)
    ended = svc.execute(rec.id)
    assert ended.state is RunState.STOPPED
    assert fake.seen and ended.container["exit_code"] is None  # created, never started


def test_a_stop_recorded_before_staging_ends_the_run_with_nothing_staged(tmp_path: Path) -> None:
    fake = FakeSandbox(act=lambda ws: (ws / "ran").write_text("x") and None)
    svc = Service(workspace(tmp_path), sandbox=fake)
    rec = svc.submit("bot", "work")
    svc.store.update_run(rec.id, lambda r: setattr(r, "stop_kind", "kill"))  # while its process started
    ended = svc.execute(rec.id)
    assert ended.state is RunState.KILLED and not fake.seen
    assert not (svc.state.run_dir(rec.id) / "staging").exists()


def _stuck(tmp_path: Path, pid: int) -> tuple[Service, RunRecord]:
    svc = Service(workspace(tmp_path), sandbox=FakeSandbox())
    rec = svc.submit("bot", "work")
    start = service_module.recovery.process_start(pid)

    def running(r: RunRecord) -> None:
        r.state, r.owner_pid, r.owner_start = RunState.RUNNING, pid, start

    return svc, svc.store.update_run(rec.id, running)


def test_past_grace_and_margin_it_says_the_run_is_still_ending(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc, rec = _stuck(tmp_path, os.getpid())  # a live carrier that never records the end
    monkeypatch.setattr(stopping, "STOP_MARGIN_S", 0.5)
    t0 = time.monotonic()
    with pytest.raises(StillEnding) as err:
        svc.stop(rec.id, kill=True)
    assert 0.5 <= time.monotonic() - t0 < 5
    assert "still ending" in err.value.message and f"airlockd show {rec.id}" in (err.value.hint or "")
    assert err.value.exit_code == 1 and err.value.to_json()["state"] == "running"


def test_a_run_whose_carrier_died_is_not_waited_for(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    svc, rec = _stuck(tmp_path, dead.pid)
    t0 = time.monotonic()
    with pytest.raises(StillEnding, match="process carrying it is gone"):
        svc.stop(rec.id)
    assert time.monotonic() - t0 < 5


def test_stop_arguments() -> None:
    assert parse(StopArgs, ({"runId": "r1"},)).wait is True
    assert parse(StopArgs, ({"runId": "r1", "wait": False},)).wait is False
    with pytest.raises(JsonRpcInvalidParams, match="`wait`"):
        parse(StopArgs, ({"runId": "r1", "wait": "later"},))
