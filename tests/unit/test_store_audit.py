from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from airlockd.errors import NotFoundError, UsageError
from airlockd.evidence.audit import AuditLog
from airlockd.records import RunRecord, RunState
from airlockd.redact import MASK, Redactor
from airlockd.state import StateDir
from airlockd.store import Store


def _run(run_id: str) -> RunRecord:
    return RunRecord(
        id=run_id, agent="a", mode="review", state=RunState.ADMITTED, prompt="p", prompt_sha256="0", policy_revision="x"
    )


def test_store_round_trip_and_prefix(tmp_path: Path) -> None:
    store = Store(StateDir.for_workspace(tmp_path).ensure())
    store.put_run(_run("r1aaa"))
    store.put_run(_run("r1abb"))
    assert store.get_run("r1aaa").id == "r1aaa"
    assert store.get_run("r1ab").id == "r1abb"
    with pytest.raises(UsageError, match="ambiguous"):
        store.get_run("r1a")
    with pytest.raises(NotFoundError):
        store.get_run("nope")


def _bump(state_root: str, ws: str, n: int) -> None:
    import os

    os.environ["AIRLOCK_STATE_DIR"] = state_root
    store = Store(StateDir.for_workspace(Path(ws)))
    for _ in range(n):
        store.update_agent("a", lambda u: setattr(u, "runs_used", u.runs_used + 1))


def test_store_is_safe_across_processes(tmp_path: Path, _state_dir: Path) -> None:
    StateDir.for_workspace(tmp_path).ensure()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_bump, args=(str(_state_dir), str(tmp_path), 25)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert Store(StateDir.for_workspace(tmp_path)).get_agent("a").runs_used == 100


def test_an_agent_change_that_changes_nothing_writes_nothing(tmp_path: Path) -> None:
    """A run's end resets the agent's consecutive violations: when they are 0 already the index
    is not written again."""
    state = StateDir.for_workspace(tmp_path).ensure()
    store = Store(state)
    store.update_agent("a", lambda u: setattr(u, "runs_used", 1))
    before = state.index_file.stat()
    assert store.update_agent("a", lambda u: setattr(u, "consecutive_violations", 0)).runs_used == 1
    after = state.index_file.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    store.update_agent("a", lambda u: setattr(u, "consecutive_violations", 2))
    assert state.index_file.stat().st_ino != before.st_ino  # replaced: written atomically
    assert Store(state).get_agent("a").consecutive_violations == 2


def test_audit_chain_detects_each_tamper_kind(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", Redactor(), fsync=False)
    for i in range(5):
        log.append("event", run="r", n=i)
    assert log.verify() is None
    original = (tmp_path / "audit.jsonl").read_text().splitlines(keepends=True)

    def tampered(lines: list[str]) -> int | None:
        (tmp_path / "audit.jsonl").write_text("".join(lines))
        brk = log.verify()
        return brk.line if brk else None

    edited = json.loads(original[2])
    edited["data"]["n"] = 99
    assert tampered([*original[:2], json.dumps(edited) + "\n", *original[3:]]) == 3
    assert tampered([*original[:1], *original[2:]]) == 2  # deleted
    assert tampered([original[0], original[2], original[1], *original[3:]]) == 2  # reordered
    assert tampered([*original[:2], original[1], *original[2:]]) == 3  # inserted (a copy)
    assert tampered(original) is None


def test_audit_redacts_before_writing(tmp_path: Path) -> None:
    red = Redactor(["hunter2-very-secret"])
    log = AuditLog(tmp_path / "audit.jsonl", red, fsync=False)
    log.append("x", detail="password is hunter2-very-secret", key="AKIAABCDEFGHIJKLMNOP")
    text = (tmp_path / "audit.jsonl").read_text()
    assert "hunter2-very-secret" not in text and "AKIAABCDEFGHIJKLMNOP" not in text and MASK in text
