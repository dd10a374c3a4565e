"""The store when things go wrong (the attack review of issue 13): a crash between the files of one
write, a run killed at admission, ids whose day is not their creation day, unreadable files, an
expired proposal that landed some changes, a commit left half done, hostile ids in a first-layout
store, a run admitted and never claimed, and retention's writes that tell followers nothing."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from fakesandbox import FakeSandbox, _unmount_staging, workspace  # noqa: F401

from airlockd import storefiles as store_module
from airlockd.errors import StateError
from airlockd.records import RunRecord, RunState
from airlockd.runs import recovery, retention
from airlockd.runs.service import Service
from airlockd.state import StateDir
from airlockd.store import Store


def _applied(tmp_path: Path, policy: str = "") -> tuple[Service, RunRecord]:
    """An applied run; each later run of the service's agent makes a file of its own."""
    made = iter(range(1000))

    def act(stage: Path) -> bytes:
        (stage / f"made{next(made)}.txt").write_text("made\n")
        return b"ok\n"

    svc = Service(workspace(tmp_path, policy), sandbox=FakeSandbox(act))
    rec = svc.execute(svc.submit("bot", "make a file").id)
    return svc, svc.review.approve(rec.id, actor="cli").run


def _crash_when_closing(monkeypatch: pytest.MonkeyPatch, folder: str) -> None:
    """The process dies as it would write a store file in `folder` (`.`: the index)."""
    real = store_module._SnapshotStorage.close

    def close(self: Any) -> None:
        name = self._path.parent.name if folder != "." else self._path.name
        if self._dirty and name == (folder if folder != "." else "index.json"):
            raise KeyboardInterrupt
        real(self)

    monkeypatch.setattr(store_module._SnapshotStorage, "close", close)


def test_a_crash_before_a_settled_runs_line_is_written_is_repaired_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, rec = _applied(tmp_path)
    _crash_when_closing(monkeypatch, "history")
    with pytest.raises(KeyboardInterrupt):  # undo's record is written, its day's line is not
        svc.store.update_run(rec.id, lambda r: setattr(r, "state", RunState.UNDONE))
    monkeypatch.undo()
    assert json.loads(svc.state.record(rec.id).read_text())["run"]["1"]["state"] == "undone"
    fresh = Store(svc.state)
    line = fresh.line(rec.id)
    assert line is not None and line.state is RunState.UNDONE
    assert [x.state for x in fresh.lines() if x.id == rec.id] == [RunState.UNDONE]
    meta = json.loads(fresh.state.index_file.read_text())["meta"]["1"]
    assert meta["pending"] == []  # nothing left to repair


def test_a_run_killed_at_admission_after_its_record_is_listed_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, first = _applied(tmp_path)  # the index exists: nothing is rebuilt from the records
    _crash_when_closing(monkeypatch, ".")
    with pytest.raises(KeyboardInterrupt):
        svc.submit("bot", "work")
    monkeypatch.undo()
    (rec_file,) = [p for p in svc.state.records.glob("r*.json") if first.id not in p.name]
    run_id = rec_file.name[: -len(".json")]
    fresh = Store(svc.state)
    assert [x.id for x in fresh.lines()] == [run_id, first.id]
    assert [r.id for r in fresh.open_runs()] == [run_id]  # so recovery and admission counts see it


def _line_run(store: Store, run_id: str, at: float, n: int) -> None:
    store.put_run(
        RunRecord(
            id=run_id,
            agent="bot",
            mode="review",
            state=RunState.REJECTED,
            prompt=f"t{n}",
            prompt_sha256="0" * 64,
            policy_revision="rev",
            created_at=at,
        )
    )


def test_paging_lists_every_run_once_when_an_ids_day_is_not_its_creation_day(tmp_path: Path) -> None:
    store = Store(StateDir.for_workspace(workspace(tmp_path)).ensure())
    base = time.time() - 5 * 86400
    ids = []
    for n in range(30):  # ids made in local time far east and far west of UTC: a day off either way
        at = base + n * 3 * 3600
        shift = (14 if n % 2 else -12) * 3600
        run_id = "r" + time.strftime("%y%m%d", time.gmtime(at + shift)) + f"{n:06x}"
        _line_run(store, run_id, at, n)
        ids.append((at, run_id))
    newest_first = [r for _, r in sorted(ids, reverse=True)]
    for limit in (1, 2, 5, 7):
        seen, before = [], None
        while page := store.lines(limit=limit, before=before):
            seen += [x.id for x in page]
            before = page[-1].id
        assert seen == newest_first, limit


def test_unreadable_files_are_named_and_the_index_comes_back_from_the_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from airlockd.cli import main

    svc, rec = _applied(tmp_path)
    other = svc.execute(svc.submit("bot", "another").id)
    ws = svc.workspace
    # one broken record: the other runs and every command still work
    good = svc.state.record(rec.id).read_bytes()
    svc.state.record(rec.id).write_text('{"run": {"1": {"id": "x"')
    Service(ws, sandbox=FakeSandbox())  # starting a service reads no record
    assert Store(svc.state).get_run(other.id).state is RunState.PROPOSED
    with pytest.raises(StateError) as err:
        Store(svc.state).get_run(rec.id)
    assert str(svc.state.record(rec.id)) in err.value.message
    assert "other runs are not affected" in (err.value.hint or "")
    svc.state.record(rec.id).write_bytes(good)
    # a truncated day file: named, with what to do
    day = next(svc.state.history.glob("*.json"))
    day_bytes = day.read_bytes()
    day.write_bytes(day_bytes[: len(day_bytes) // 2])
    capsys.readouterr()
    assert main(["--workspace", str(ws), "--no-daemon", "runs"]) == 1
    out = capsys.readouterr().err
    assert str(day) in out and "move it aside" in out
    shutil.move(day, tmp_path / "day.json.broken")  # as the hint says: gc writes its lines again
    assert main(["--workspace", str(ws), "--no-daemon", "--json", "gc", "--apply"]) == 0
    assert set(json.loads(capsys.readouterr().out)["relinked"]) == {rec.id}
    assert {x.id for x in Store(svc.state).lines()} == {rec.id, other.id}
    # a truncated index: named; moved aside, the next command rebuilds the lines from the records
    index = svc.state.index_file
    index.write_text(index.read_text()[:40])
    assert main(["--workspace", str(ws), "--no-daemon", "show", other.id]) == 1
    assert str(index) in capsys.readouterr().err
    shutil.move(index, tmp_path / "index.json.broken")
    assert main(["--workspace", str(ws), "--no-daemon", "--json", "runs"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {(x["id"], x["state"]) for x in listed} == {(rec.id, "applied"), (other.id, "proposed")}
    assert Store(svc.state).open_runs()[0].id == other.id


def test_an_expired_proposal_that_landed_some_changes_keeps_its_undo_window(tmp_path: Path) -> None:
    def act(stage: Path) -> bytes:
        (stage / "one.txt").write_text("1\n")
        (stage / "two.txt").write_text("2\n")
        return b"ok\n"

    svc = Service(
        workspace(tmp_path, "[defaults]\nproposal_ttl_s = 1\n[retention]\nkeep_runs = 1\n"), sandbox=FakeSandbox(act)
    )
    rec = svc.execute(svc.submit("bot", "two files").id)
    svc.review.approve(rec.id, paths=["one.txt"], actor="cli")
    expired = svc.lifecycle.expire_due(time.time() + 5)
    assert [e.id for e in expired] == [rec.id]
    newer = svc.execute(svc.submit("bot", "newer").id)  # so the expired one is not the newest finished
    svc.review.reject(newer.id, actor="cli")
    report = retention.collect(svc, apply=True)
    assert rec.id in {k["id"] for k in report["kept"]} and rec.id not in {r["id"] for r in report["runs"]}
    assert svc.review.undo(rec.id, actor="cli").id == rec.id
    assert not (svc.workspace / "one.txt").exists()


def test_gc_leaves_a_run_whose_commit_was_interrupted(tmp_path: Path) -> None:
    svc, rec = _applied(tmp_path, "[retention]\nkeep_runs = 1\nundo_days = 0.00001\n")
    newer = svc.execute(svc.submit("bot", "newer").id)
    svc.review.reject(newer.id, actor="cli")
    time.sleep(1)
    journal = svc.state.journal / f"{rec.id}-1-undo.json"
    journal.write_text("{}")  # as an undo killed half way leaves it (recovery's to finish)
    report = retention.collect(svc, apply=True, now=time.time() + 2 * 3600)
    assert {"id": rec.id, "why": "a commit of it was interrupted: recovery must finish it first"} in report["kept"]
    assert svc.state.record(rec.id).exists() and list(svc.state.backups.glob(f"{rec.id}-*"))


def test_a_first_layout_store_with_a_hostile_or_repeated_id_is_refused_and_left_alone(tmp_path: Path) -> None:
    state = StateDir.for_workspace(workspace(tmp_path)).ensure()
    fixture = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "store-v1.json").read_text())
    docs = list(fixture["runs"].values())
    for bad in ("../../escape", "a/b"):
        evil = {**fixture, "runs": {"1": {**docs[0], "id": bad}}}
        state.store.write_text(json.dumps(evil))
        with pytest.raises(StateError, match="is not a run id"):
            Store(state).lines()
        assert not list(state.root.parent.glob("escape*")) and not state.index_file.exists()
    state.store.write_text(json.dumps({**fixture, "runs": {"1": docs[0], "2": docs[0]}}))
    with pytest.raises(StateError, match="is there twice"):
        Store(state).lines()


def test_an_admitted_run_no_process_claimed_is_failed_and_frees_its_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def act(stage: Path) -> bytes:
        (stage / "next.txt").write_text("next\n")
        return b"ok\n"

    svc = Service(workspace(tmp_path, "[agents.bot.admission]\nmax_concurrent = 1\n"), sandbox=FakeSandbox(act))
    stuck = svc.submit("bot", "its process died before it claimed the run")
    monkeypatch.setattr(recovery, "UNCLAIMED_S", 0.0)
    recovery.reconcile(svc)
    assert svc.store.get_run(stuck.id).state is RunState.FAILED
    assert svc.execute(svc.submit("bot", "the next").id).state is RunState.PROPOSED


def test_compaction_moves_the_serial_and_tells_followers_nothing(tmp_path: Path) -> None:
    svc, _ = _applied(tmp_path)
    newer = svc.execute(svc.submit("bot", "newer").id)
    svc.review.reject(newer.id, actor="cli")
    serial, _ = svc.store.changes(0)
    svc.store.compact([newer.id], time.time())
    after, ids = svc.store.changes(serial)
    assert after == serial + 1 and ids == []
    line = svc.store.line(newer.id)
    assert line is not None and line.compacted


def test_a_long_lived_store_repairs_what_another_process_left_pending_before_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, rec = _applied(tmp_path)  # svc.store: a daemon's, prepared long ago
    other = Store(svc.state)  # a CLI process that dies inside its undo's write
    _crash_when_closing(monkeypatch, "history")
    with pytest.raises(KeyboardInterrupt):
        other.update_run(rec.id, lambda r: setattr(r, "state", RunState.UNDONE))
    monkeypatch.undo()
    svc.store.update_agent("bot", lambda u: setattr(u, "runs_used", u.runs_used + 1))  # the daemon's next write
    line = svc.store.line(rec.id)
    assert line is not None and line.state is RunState.UNDONE
    assert json.loads(svc.state.index_file.read_text())["meta"]["1"]["pending"] == []
