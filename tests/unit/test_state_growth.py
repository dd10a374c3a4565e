"""State that does not grow with history (issue 13): the store's layout by run, the conversion of
a first-layout store (tests/fixtures/store-v1.json, written by the code before it), paged
listing, live samples that touch only their own file, and retention (`airlockd gc`), with a
crash at every step of a compaction while runs are live, proposed and undoable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fakesandbox import FakeSandbox, _unmount_staging, workspace  # noqa: F401

from airlockd.cli import main
from airlockd.errors import StateError
from airlockd.records import RunRecord, RunState
from airlockd.runlines import day_of
from airlockd.runs.service import Service
from airlockd.state import StateDir
from airlockd.store import Store

REPO = Path(__file__).resolve().parents[2]
V1 = REPO / "tests" / "fixtures" / "store-v1.json"


def cli(ws: Path, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    capsys.readouterr()
    code = main(["--workspace", str(ws), "--no-daemon", "--json", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def _v1_workspace(tmp_path: Path, extra: str = "") -> tuple[Path, StateDir]:
    # the fixture's proposal was made when it was written: it must not expire as the calendar moves on
    ws = workspace(tmp_path, extra if "[defaults]" in extra else extra + "\n[defaults]\nproposal_ttl_s = 3e9\n")
    state = StateDir.for_workspace(ws).ensure()
    shutil.copy(V1, state.store)
    return ws, state


def _v1_runs() -> dict[str, RunRecord]:
    data = json.loads(V1.read_text())
    return {d["id"]: RunRecord.model_validate(d) for d in data["runs"].values()}


# -- conversion -----------------------------------------------------------------------------------


def test_a_first_layout_store_is_converted_on_first_use_and_every_run_reads_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, state = _v1_workspace(tmp_path)
    old = _v1_runs()
    code, listed = cli(ws, "runs", capsys=capsys)
    assert code == 0
    assert not state.store.exists() and state.index_file.exists()
    assert [r["id"] for r in listed] == [r.id for r in sorted(old.values(), key=lambda r: -r.created_at)]
    store = Store(state)
    for run_id, rec in old.items():
        assert store.get_run(run_id).model_dump() == rec.model_dump()
        line = store.line(run_id)
        assert line is not None and line.state is rec.state and line.files == len(rec.files)
    agents = json.loads(V1.read_text())["agents"]
    assert [a.model_dump() for a in store.list_agents()] == list(agents.values())
    # both doors go on from there: the proposed run is decided, a new run counts against the budget
    proposed = next(r for r in old.values() if r.state is RunState.PROPOSED)
    code, out = cli(ws, "reject", proposed.id, capsys=capsys)
    assert code == 0 and out["state"] == "rejected", out
    used = store.get_agent("bot").runs_used
    svc = Service(ws, sandbox=FakeSandbox(lambda stage: b"ok\n"))
    svc.execute(svc.submit("bot", "after the conversion").id)
    assert store.get_agent("bot").runs_used == used + 1
    assert len(store.lines()) == len(old) + 1


def test_a_crash_during_conversion_leaves_the_old_store_and_the_next_start_converts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airlockd import storemigrate

    _, state = _v1_workspace(tmp_path)
    real = storemigrate.put
    for n in range(1, 20):
        calls = {"n": 0}

        def crashing(path: Path, data: bytes, sync: bool = False, n: int = n, calls: dict[str, int] = calls) -> None:
            calls["n"] += 1
            if calls["n"] == n:
                raise KeyboardInterrupt  # the process dies here
            real(path, data, sync)

        monkeypatch.setattr(storemigrate, "put", crashing)
        try:
            lines = Store(state).lines()
        except KeyboardInterrupt:
            assert state.store.read_bytes() == V1.read_bytes() and not state.index_file.exists()
            continue
        break
    else:
        raise AssertionError("the conversion never got to the end")
    assert n > 5  # it was cut at each of its writes before
    assert {line.id for line in lines} == set(_v1_runs())
    assert not state.store.exists()


def test_a_store_converted_before_a_crash_that_kept_the_old_file_is_not_converted_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, state = _v1_workspace(tmp_path)
    proposed = next(r for r in _v1_runs().values() if r.state is RunState.PROPOSED)
    assert cli(ws, "reject", proposed.id, capsys=capsys)[0] == 0
    shutil.copy(V1, state.store)  # as if the crash came between the new index and removing the old file
    assert Store(state).get_run(proposed.id).state is RunState.REJECTED
    assert not state.store.exists()


def test_a_malformed_first_layout_store_is_a_clear_error_and_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, state = _v1_workspace(tmp_path)
    state.store.write_text('{"runs": {"1": {"id": "r1", "state": "no such state"}}}')
    before = state.store.read_bytes()
    with pytest.raises(StateError) as err:
        Store(state).lines()
    assert str(state.store) in err.value.message and "left as it was" in (err.value.hint or "")
    assert state.store.read_bytes() == before and not state.index_file.exists()


# -- listing ----------------------------------------------------------------------------------------


def _synthetic(store: Store, n: int, start: float) -> list[RunRecord]:
    """`n` finished runs a day apart from `start` (ids on their days), two agents, two states."""
    out = []
    for i in range(n):
        at = start + i * 3600 * 7
        run_id = "r" + time.strftime("%y%m%d", time.localtime(at)) + f"{i:06x}"
        rec = RunRecord(
            id=run_id,
            agent="bot" if i % 3 else "other",
            mode="review",
            state=RunState.APPLIED if i % 2 else RunState.REJECTED,
            prompt=f"task {i}",
            prompt_sha256="0" * 64,
            policy_revision="rev",
            created_at=at,
        )
        store.put_run(rec)
        out.append(rec)
    return out


def test_listing_pages_through_every_run_once_newest_first_with_filters(tmp_path: Path) -> None:
    state = StateDir.for_workspace(workspace(tmp_path)).ensure()
    store = Store(state)
    runs = _synthetic(store, 60, time.time() - 60 * 7 * 3600)
    newest_first = [r.id for r in sorted(runs, key=lambda r: (-r.created_at, r.id))]
    seen: list[str] = []
    before = None
    while page := store.lines(limit=7, before=before):
        seen += [line.id for line in page]
        before = page[-1].id
    assert seen == newest_first
    others = [r for r in newest_first if runs[int(r[7:], 16)].agent == "other"]
    assert [x.id for x in store.lines(agent="other")] == others
    applied = store.lines(states=frozenset({RunState.APPLIED}), limit=5)
    assert len(applied) == 5 and all(x.state is RunState.APPLIED for x in applied)
    since = runs[40].created_at
    assert {x.id for x in store.lines(since=since)} == {r.id for r in runs if r.created_at >= since}
    assert len({day_of(r.id) for r in runs}) > 10  # the runs span many days' files


def test_runs_cli_filters_and_says_how_to_page_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = workspace(tmp_path)
    store = Store(StateDir.for_workspace(ws).ensure())
    runs = _synthetic(store, 12, time.time() - 12 * 7 * 3600)
    capsys.readouterr()
    assert main(["--workspace", str(ws), "--no-daemon", "runs", "--limit", "5", "--agent", "bot"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 6 and out[-1].startswith("… older runs: airlockd runs --before r")
    code, listed = cli(ws, "runs", "--state", "applied,rejected", "--since", "2d", capsys=capsys)
    assert code == 0 and {x["id"] for x in listed} == {r.id for r in runs if r.created_at >= time.time() - 2 * 86400}
    assert main(["--workspace", str(ws), "--no-daemon", "runs", "--state", "nonsense"]) == 2
    assert "not a run state" in capsys.readouterr().err


# -- live samples -----------------------------------------------------------------------------------


def test_a_live_runs_samples_write_only_its_own_small_file(tmp_path: Path) -> None:
    fake = FakeSandbox()
    svc = Service(workspace(tmp_path), sandbox=fake)
    rec = svc.submit("bot", "work")
    fake.act = lambda ws: fake.block(rec.id) or b"working\n"
    carrier = threading.Thread(target=svc.execute, args=(rec.id,), daemon=True)
    carrier.start()
    deadline = time.monotonic() + 30
    while not svc.state.live_sample(rec.id).exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    watched = [svc.state.index_file, svc.state.record(rec.id)]
    before = [(p.stat().st_ino, p.stat().st_mtime_ns) for p in watched]
    sample = svc.state.live_sample(rec.id).stat()
    time.sleep(2.5)  # two samples more
    assert [(p.stat().st_ino, p.stat().st_mtime_ns) for p in watched] == before
    assert svc.state.live_sample(rec.id).stat().st_mtime_ns != sample.st_mtime_ns
    assert svc.state.live_sample(rec.id).stat().st_size < 512
    assert svc.store.get_run(rec.id).state is RunState.RUNNING
    svc.stop(rec.id)
    carrier.join(20)
    assert not svc.state.live_sample(rec.id).exists()  # the end wrote the figures to the record


def test_a_runs_final_figures_are_not_overwritten_by_its_last_live_sample(tmp_path: Path) -> None:
    """Found in CI under gVisor: a run that lived long enough to publish a sample ended with that
    sample's output count (what was delivered, at most the cap) instead of what the stream carried."""
    fake = FakeSandbox()
    svc = Service(workspace(tmp_path, "[agents.bot.limits]\noutput_bytes = 2048\n"), sandbox=fake)
    rec = svc.submit("bot", "work")

    def act(ws: Path) -> bytes:
        deadline = time.monotonic() + 30
        while not svc.state.live_sample(rec.id).exists():  # a sample taken while it ran
            assert time.monotonic() < deadline
            time.sleep(0.05)
        return b"y\n" * 6000

    fake.act = act
    svc.execute(rec.id)
    done = svc.store.get_run(rec.id)
    assert done.state is RunState.LIMIT_EXCEEDED and done.limit is not None
    assert done.limit.limit == "output" and done.limit.measured == 12000
    assert done.output_bytes == 12000
    assert not svc.state.live_sample(rec.id).exists()


# -- retention --------------------------------------------------------------------------------------


def _edit(n: int, *, shared: bool = True) -> Any:
    def act(stage: Path) -> bytes:
        if shared:
            (stage / "src" / "a.py").write_text(f"A = {n}\n")
        (stage / f"new{n}.txt").write_text(f"file {n}\n")
        return b"done\n"

    return act


def _history(tmp_path: Path, policy: str) -> tuple[Path, Service, dict[str, RunRecord]]:
    """Finished runs of every kind, then one applied (undoable) and one proposed."""
    ws = workspace(tmp_path, policy)
    fake = FakeSandbox()
    svc = Service(ws, sandbox=fake)
    runs = {}
    for n, how in enumerate(["reject", "approve+undo", "reject", "approve", "approve", "propose"], 1):
        fake.act = _edit(n, shared=how != "propose")  # the proposal stays clear of the others' file
        rec = svc.execute(svc.submit("bot", f"task {n}").id)
        if how == "reject":
            rec = svc.review.reject(rec.id, actor="cli")
        elif how.startswith("approve"):
            rec = svc.review.approve(rec.id, actor="cli").run
            if how.endswith("undo"):
                rec = svc.review.undo(rec.id, actor="cli")
        runs[f"{how}-{n}"] = rec
    return ws, svc, runs


def test_gc_compacts_finished_runs_past_the_policy_and_keeps_what_is_still_needed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, svc, runs = _history(tmp_path, "[retention]\nkeep_runs = 1\n")
    before = {p for p in svc.state.root.rglob("*")}
    code, dry = cli(ws, "gc", capsys=capsys)
    assert code == 0 and not dry["applied"]
    assert {p for p in svc.state.root.rglob("*")} == before  # a dry run changes nothing
    compacted = {r["id"] for r in dry["runs"]}
    # all but the newest finished run by the count; the older applied run kept by its undo window
    assert compacted == {runs["reject-1"].id, runs["approve+undo-2"].id, runs["reject-3"].id}
    assert {k["id"] for k in dry["kept"]} == {runs["approve-4"].id}
    code, done = cli(ws, "gc", "--apply", capsys=capsys)
    assert code == 0 and {r["id"] for r in done["runs"]} == compacted and done["bytes"] > 0
    for run_id in compacted:
        assert Store(svc.state).get_run(run_id).compacted_at and not svc.state.run_dir(run_id).exists()
        assert not [p for p in svc.state.backups.iterdir() if p.name.startswith(run_id)]
        code, shown = cli(ws, "show", run_id, capsys=capsys)  # the summary still holds the evidence
        assert code == 0 and shown["compacted_at"] and shown["evidence"]["run"] == run_id
        assert [t["state"] for t in shown["transitions"]][-1] in {"rejected", "undone"}
    code, err = cli(ws, "undo", runs["approve+undo-2"].id, capsys=capsys)
    assert code != 0 and "nothing applied to undo" in err["message"], err  # undone before it went
    code, _ = cli(ws, "undo", runs["approve-5"].id, capsys=capsys)  # inside its window: undone
    assert code == 0
    code, out = cli(ws, "approve", runs["propose-6"].id, capsys=capsys)
    assert code == 0 and out["run"]["state"] == "applied", out
    code, listed = cli(ws, "runs", capsys=capsys)
    assert sum(1 for x in listed if x["compacted"]) == 3
    again = cli(ws, "gc", "--apply", capsys=capsys)[1]  # the run undone since, no longer newest, goes
    assert [r["id"] for r in again["runs"]] == [runs["approve-5"].id]
    assert cli(ws, "gc", "--apply", capsys=capsys)[1]["runs"] == []  # and nothing more
    assert cli(ws, "audit", "--verify", capsys=capsys)[0] == 0
    kinds = [e["kind"] for e in svc.audit.events()]
    assert kinds.count("retention.compacting") == 2 and kinds.count("retention.compacted") == 2


def test_undo_is_refused_past_its_window_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = workspace(tmp_path, "[retention]\nundo_days = 0.00001\n")  # under a second
    svc = Service(ws, sandbox=FakeSandbox(_edit(1)))
    rec = svc.review.approve(svc.execute(svc.submit("bot", "t").id).id, actor="cli").run
    time.sleep(1.2)
    capsys.readouterr()
    assert main(["--workspace", str(ws), "--no-daemon", "undo", rec.id]) != 0
    assert "past the undo window" in capsys.readouterr().err
    assert (ws / "src" / "a.py").read_text() == "A = 1\n"


GC = """
import sys
from airlockd.cli import main
sys.exit(main(["--workspace", sys.argv[1], "--no-daemon", "--json", "gc", "--apply"]))
"""


def test_a_compaction_killed_at_every_step_loses_nothing_live_proposed_or_undoable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, svc, runs = _history(tmp_path, "[retention]\nkeep_runs = 1\n")
    fake = FakeSandbox()
    live_svc = Service(ws, sandbox=fake)
    live = live_svc.submit("bot", "still working")
    fake.act = lambda stage: fake.block(live.id) or _edit(9, shared=False)(stage)
    carrier = threading.Thread(target=live_svc.execute, args=(live.id,), daemon=True)
    carrier.start()
    deadline = time.monotonic() + 30
    while fake.stats(live.id) is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    expected = {runs["reject-1"].id, runs["approve+undo-2"].id, runs["reject-3"].id}  # approve-4/5: undoable
    snapshot = tmp_path / "snapshot"
    skip = {"mirror", "store.lock", "audit.jsonl.lock", live.id}  # the live run's folder is in use
    _copy_state(svc.state.root, snapshot, skip)
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def gc(**extra: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-c", GC, str(ws)]
        return subprocess.run(cmd, env={**env, **extra}, capture_output=True, text=True, timeout=60)

    for step in range(1, 200):
        _copy_state(snapshot, svc.state.root, skip)  # the state before the compaction, each time
        proc = gc(AIRLOCK_GC_CRASH_AT=str(step))
        assert proc.returncode in (0, -9), proc.stderr  # killed at the step, nothing else
        _holds(svc, runs, live.id)
        if proc.returncode == 0:
            break
        assert gc().returncode == 0  # the next gc finishes what the crash cut short
        _holds(svc, runs, live.id)
        store = Store(svc.state)
        for run_id in expected:
            assert not svc.state.run_dir(run_id).exists()
            assert store.get_run(run_id).compacted_at and store.line(run_id).compacted  # type: ignore[union-attr]
            assert not [p for p in svc.state.backups.iterdir() if p.name.startswith(run_id)]
    else:
        raise AssertionError("gc never finished")
    assert step > 10  # it was killed at each of its steps before (store writes, removals, sweeps)
    # and every kept run still works, by either door
    capsys.readouterr()
    assert cli(ws, "undo", runs["approve-5"].id, capsys=capsys)[0] == 0
    assert cli(ws, "approve", runs["propose-6"].id, capsys=capsys)[0] == 0
    live_svc.stop(live.id)
    carrier.join(20)
    assert Store(svc.state).get_run(live.id).state is RunState.STOPPED
    assert cli(ws, "audit", "--verify", capsys=capsys)[0] == 0


def _copy_state(src: Path, dst: Path, skip: set[str]) -> None:
    """`dst` made equal to `src`, but for the names in `skip` or starting with one of them (at
    any depth; a dot before is ignored), left as they are."""
    dst.mkdir(exist_ok=True)
    for child in list(dst.iterdir()):
        if child.name.lstrip(".").startswith(tuple(skip)):
            continue
        if child.is_dir() and not child.is_symlink():
            if child.name in ("runs", "backups"):  # gc only removes from these: put back what went
                _copy_state(src / child.name, child, skip | set(os.listdir(child)))
                continue
            if child.name == "records":
                _copy_state(src / child.name, child, skip)
                continue
            shutil.rmtree(child)
        else:
            child.unlink()
    for child in src.iterdir():
        if child.name.lstrip(".").startswith(tuple(skip)) or (dst / child.name).exists():
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.copytree(
                child,
                dst / child.name,
                symlinks=True,
                ignore=lambda d, names: [n for n in names if n.lstrip(".").startswith(tuple(skip))],
            )
        else:
            shutil.copy2(child, dst / child.name, follow_symlinks=False)


def _holds(svc: Service, runs: dict[str, RunRecord], live: str) -> None:
    """Every run reads, whole or as its summary; what is live, proposed or undoable is untouched;
    the audit chain holds."""
    store = Store(svc.state)
    for rec in runs.values():
        got = store.get_run(rec.id)
        assert got.state is rec.state or rec.state is RunState.PROPOSED
        assert got.compacted_at or got.files == rec.files or rec.state is RunState.PROPOSED
        gone = not svc.state.run_dir(rec.id).exists() or not list(svc.state.backups.glob(f"{rec.id}-*"))
        if gone and rec.applied:  # nothing goes before its record says so
            assert got.compacted_at, rec.id
    for key in ("approve-4", "approve-5", "propose-6"):
        assert svc.state.record(runs[key].id).exists() and svc.state.run_dir(runs[key].id).is_dir()
        assert store.get_run(runs[key].id).compacted_at is None
    for key in ("approve-4", "approve-5"):
        assert [p for p in svc.state.backups.iterdir() if p.name.startswith(runs[key].id)]
    assert store.get_run(live).state is RunState.RUNNING
    assert svc.audit.verify() is None


def test_the_listings_state_names_are_the_run_states() -> None:
    from airlockd import runlines
    from airlockd.records import LIVE_STATES

    assert tuple(s.value for s in RunState) == runlines.STATES
    assert set(runlines.LIVE) == {s.value for s in LIVE_STATES}
