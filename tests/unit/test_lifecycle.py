"""The run lifecycle and the review rules, through the CLI (in-process) on real files, with a fake
sandbox: per-hunk decisions from any door, conflicts that clear when their cause does, one
expiry, and a Service whose construction touches nothing."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from fakesandbox import FakeSandbox, _unmount_staging, kinds, workspace  # noqa: F401

from airlockd.cli import main
from airlockd.errors import ConflictError, StateError
from airlockd.pipeline.commit import FileOp, commit
from airlockd.pipeline.hunks import apply_hunks
from airlockd.pipeline.manifest import Entry, Kind, entry_for
from airlockd.records import FileState, RunRecord, RunState
from airlockd.runs.lifecycle import RunLifecycle
from airlockd.runs.service import Service

BIG = "".join(f"line {i}\n" for i in range(1, 41))
PROPOSED = BIG.replace("line 3\n", "line three\n").replace("line 30\n", "line thirty\n")


def _agent(ws: Path) -> bytes:
    (ws / "src" / "big.py").write_text(PROPOSED)
    (ws / "src" / "a.py").write_text("A = 2\n")
    return b"done\n"


def _proposed(tmp_path: Path, extra_policy: str = "") -> tuple[Path, Service, RunRecord]:
    ws = workspace(tmp_path, extra_policy)
    (ws / "src" / "big.py").write_text(BIG)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    rec = svc.execute(svc.submit("bot", "edit big").id)
    assert rec.state is RunState.PROPOSED
    return ws, svc, rec


def _hunk_ids(svc: Service, run_id: str, path: str = "src/big.py") -> list[str]:
    rec = svc.store.get_run(run_id)
    f = rec.file(path)
    assert f is not None
    return [h.id for h, _ in svc.content.hunk_states(rec, f) or []]


def cli(ws: Path, *argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    capsys.readouterr()
    code = main(["--workspace", str(ws), "--json", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


def state_of(svc: Service, run_id: str, path: str) -> FileState:
    f = svc.store.get_run(run_id).file(path)
    assert f is not None
    return f.state


# -- the per-hunk rule, whichever door ---------------------------------------------------------------


def test_approve_path_after_a_rejected_hunk_lands_only_the_other_hunks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, svc, rec = _proposed(tmp_path)
    first, second = _hunk_ids(svc, rec.id)
    svc.review.reject(rec.id, hunks={"src/big.py": [second]}, actor="lsp")  # as the editor does
    code, out = cli(ws, "approve", rec.id, "--path", "src/big.py", capsys=capsys)
    assert code == 0, out
    assert (ws / "src/big.py").read_text() == apply_hunks(BIG, PROPOSED, {first})  # hunk 2 never lands
    assert out["applied"] == ["src/big.py"]
    f = svc.store.get_run(rec.id).file("src/big.py")
    assert f is not None and f.state is FileState.ACCEPTED and f.hunks == {first: "accepted", second: "rejected"}
    assert (ws / "src/a.py").read_text() == "A = 1\n"  # not chosen: still pending
    assert svc.store.get_run(rec.id).state is RunState.PROPOSED


def test_reject_path_after_an_accepted_hunk_keeps_what_landed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, svc, rec = _proposed(tmp_path)
    first, second = _hunk_ids(svc, rec.id)
    svc.review.approve(rec.id, hunks={"src/big.py": [first]}, actor="lsp")
    code, _ = cli(ws, "reject", rec.id, "--path", "src/big.py", capsys=capsys)
    assert code == 0
    f = svc.store.get_run(rec.id).file("src/big.py")
    assert f is not None and f.state is FileState.ACCEPTED and f.hunks == {first: "accepted", second: "rejected"}
    assert (ws / "src/big.py").read_text() == apply_hunks(BIG, PROPOSED, {first})


def test_approve_and_reject_hunks_from_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws, svc, rec = _proposed(tmp_path)
    first, second = _hunk_ids(svc, rec.id)
    code, shown = cli(ws, "show", rec.id, capsys=capsys)
    assert [h["id"] for h in shown["hunks"]["src/big.py"]] == [first, second]
    code, out = cli(ws, "approve", rec.id, "--hunk", f"src/big.py:{second}", capsys=capsys)
    assert code == 0 and out["applied"] == ["src/big.py"]
    assert (ws / "src/big.py").read_text() == apply_hunks(BIG, PROPOSED, {second})
    code, out = cli(ws, "reject", rec.id, "--hunk", f"src/big.py:{first}", capsys=capsys)
    assert code == 0
    assert state_of(svc, rec.id, "src/big.py") is FileState.ACCEPTED
    code, out = cli(ws, "approve", rec.id, "--hunk", f"src/big.py:{first}", capsys=capsys)
    assert code == 1 and "only pending hunks" in out["message"]
    code, out = cli(ws, "approve", rec.id, "--hunk", "src/big.py", capsys=capsys)
    assert code == 2 and "PATH:ID" in out["message"]
    code, out = cli(ws, "approve", rec.id, capsys=capsys)  # the rest
    assert code == 0 and out["run"]["state"] == "applied"
    assert (ws / "src/big.py").read_text() == apply_hunks(BIG, PROPOSED, {second})
    assert (ws / "src/a.py").read_text() == "A = 2\n"


# -- conflicts clear when their cause does -----------------------------------------------------------


def test_an_unsaved_buffer_conflict_clears_once_the_buffer_matches_the_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, svc, rec = _proposed(tmp_path)
    first, _ = _hunk_ids(svc, rec.id)
    with pytest.raises(ConflictError) as err:
        svc.review.approve(rec.id, hunks={"src/big.py": [first]}, actor="lsp", dirty={"src/big.py"})
    assert err.value.hint and "save or revert" in err.value.hint
    assert state_of(svc, rec.id, "src/big.py") is FileState.CONFLICTED
    assert (ws / "src/big.py").read_text() == BIG
    # the editor still holds the unsaved buffer: the conflict stays
    with pytest.raises(ConflictError):
        svc.review.approve(rec.id, hunks={"src/big.py": [first]}, actor="lsp", dirty={"src/big.py"})
    # the buffer was saved back to what is on disk: the next decision finds the cause gone
    code, out = cli(ws, "approve", rec.id, "--hunk", f"src/big.py:{first}", capsys=capsys)
    assert code == 0, out
    assert (ws / "src/big.py").read_text() == apply_hunks(BIG, PROPOSED, {first})
    cleared = [e for e in svc.audit.events(run=rec.id) if e["kind"] == "review.conflict_cleared"]
    assert cleared and cleared[0]["data"]["paths"] == ["src/big.py"] and cleared[0]["data"]["causes"] == ["unsaved"]


def test_a_live_edit_conflict_clears_when_the_file_is_put_back(tmp_path: Path) -> None:
    ws, svc, rec = _proposed(tmp_path)
    (ws / "src/big.py").write_text(BIG + "# a person's edit\n")
    [(_, moved, cleared)] = svc.lifecycle.on_disk_change(["src/big.py"])  # what the daemon's watch calls
    assert (moved, cleared) == (["src/big.py"], [])
    assert state_of(svc, rec.id, "src/big.py") is FileState.CONFLICTED
    (ws / "src/big.py").write_text(BIG)  # put back
    # still dirty in the editor: stays conflicted
    assert svc.lifecycle.on_disk_change(["src/big.py"], dirty={"src/big.py"}) == []
    [(_, moved, cleared)] = svc.lifecycle.on_disk_change(["src/big.py"])
    assert (moved, cleared) == ([], ["src/big.py"])
    assert state_of(svc, rec.id, "src/big.py") is FileState.PENDING
    svc.review.approve(rec.id, ["src/big.py"])
    assert (ws / "src/big.py").read_text() == PROPOSED


def test_a_live_edit_conflict_clears_on_the_next_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws, svc, rec = _proposed(tmp_path)
    (ws / "src/big.py").write_text("changed\n")
    code, out = cli(ws, "approve", rec.id, "--path", "src/big.py", capsys=capsys)  # the commit finds it moved
    assert code == 5 and out["paths"] == ["src/big.py"]
    assert state_of(svc, rec.id, "src/big.py") is FileState.CONFLICTED
    (ws / "src/big.py").write_text(BIG)
    code, out = cli(ws, "approve", rec.id, "--path", "src/big.py", capsys=capsys)
    assert code == 0, out
    assert (ws / "src/big.py").read_text() == PROPOSED


def test_a_real_disk_change_stays_conflicted_with_a_way_forward(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, svc, rec = _proposed(tmp_path)
    first, _ = _hunk_ids(svc, rec.id)
    (ws / "src/big.py").write_text(BIG.replace("line 20\n", "line twenty, by a person\n"))
    svc.lifecycle.on_disk_change(["src/big.py"])
    for argv in (["--path", "src/big.py"], ["--hunk", f"src/big.py:{first}"]):
        code, out = cli(ws, "approve", rec.id, *argv, capsys=capsys)
        assert code == 5 and out["error"] == "conflict" and out["paths"] == ["src/big.py"]
        assert f"--follow-up {rec.id}" in out["hint"] and "airlockd run --agent bot" in out["hint"]
        assert f"airlockd reject {rec.id} --path src/big.py" in out["hint"]
    assert state_of(svc, rec.id, "src/big.py") is FileState.CONFLICTED
    assert "line twenty, by a person" in (ws / "src/big.py").read_text()
    code, _ = cli(ws, "reject", rec.id, "--path", "src/big.py", capsys=capsys)
    assert code == 0 and state_of(svc, rec.id, "src/big.py") is FileState.REJECTED


def test_a_file_moved_before_inspection_clears_when_put_back_and_gets_its_hunks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = workspace(tmp_path)
    (ws / "src" / "big.py").write_text(BIG)

    def agent(staged: Path) -> bytes:
        (ws / "src/big.py").write_text("moved meanwhile\n")  # a person, while the agent works
        return _agent(staged)

    svc = Service(ws, sandbox=FakeSandbox(agent))
    rec = svc.execute(svc.submit("bot", "edit big").id)
    f = rec.file("src/big.py")
    assert f is not None and f.state is FileState.CONFLICTED and f.conflict == "moved" and f.base_blob is None
    (ws / "src/big.py").write_text(BIG)
    assert svc.lifecycle.clear_conflicts(rec.id) == ["src/big.py"]
    _, second = _hunk_ids(svc, rec.id)  # its base is kept now: hunks and diffs work
    code, _ = cli(ws, "approve", rec.id, "--hunk", f"src/big.py:{second}", capsys=capsys)
    assert code == 0 and (ws / "src/big.py").read_text() == apply_hunks(BIG, PROPOSED, {second})


# -- expiry: one implementation for the decision path and the daemon's clock -------------------------


def test_expiry_through_the_decision_path_and_the_clock_is_one_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ws, svc, a = _proposed(tmp_path, "[defaults]\nproposal_ttl_s = 1\n")
    b = svc.execute(svc.submit("bot", "edit big again").id)
    calls: list[str] = []
    original = RunLifecycle.expire_if_due

    def spy(self: RunLifecycle, rec: RunRecord, now: float | None = None) -> RunRecord | None:
        calls.append(rec.id)
        return original(self, rec, now)

    monkeypatch.setattr(RunLifecycle, "expire_if_due", spy)
    time.sleep(1.1)
    code, out = cli(ws, "approve", a.id, capsys=capsys)  # the decision path
    assert code == 1 and "expired" in out["message"]
    assert [r.id for r in svc.lifecycle.expire_due()] == [b.id]  # the daemon's clock
    assert a.id in calls and b.id in calls
    for run in (a, b):
        got = svc.store.get_run(run.id)
        assert got.state is RunState.EXPIRED and got.transitions[-1].detail == "not decided within 1 s"
        assert not (svc.state.run_dir(run.id) / "staging").exists()
    assert (ws / "src/big.py").read_text() == BIG
    with pytest.raises(StateError, match="only a proposed run"):
        svc.review.reject(a.id)


# -- constructing the Service has no side effects -------------------------------------------------------


def test_a_service_touches_nothing_until_recover(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    target = ws / "src/a.py"
    new = tmp_path / "new-a"
    new.write_text("A = 99\n")
    op = FileOp("src/a.py", entry_for(target), Entry(Kind.FILE, 0o644, *_size_sha(new)), new)

    def crash(label: str) -> None:
        if label == "committed":
            raise RuntimeError("the process died here")

    with pytest.raises(RuntimeError):
        commit(ws, svc.state.journal, svc.state.backups, "tx-crash", [op], checkpoint=crash)
    half = svc.submit("bot", "work")
    svc.store.update_run(half.id, lambda r: (setattr(r, "state", RunState.RUNNING), setattr(r, "owner_pid", 2**22 + 7)))
    journal = sorted(p.name for p in svc.state.journal.iterdir())
    assert journal == ["tx-crash.json"]
    events = len(list(svc.audit.events()))

    fresh = Service(ws, sandbox=FakeSandbox(_agent))  # what `airlockd runs` / `show` / `diff` build
    assert sorted(p.name for p in svc.state.journal.iterdir()) == journal
    assert fresh.store.get_run(half.id).state is RunState.RUNNING
    assert len(list(fresh.audit.events())) == events

    fresh.recover()
    assert list(svc.state.journal.iterdir()) == []
    assert target.read_text() == "A = 99\n"
    assert fresh.store.get_run(half.id).state is RunState.FAILED
    assert {"commit.recovered", "recovery.reconciled"} <= set(kinds(list(fresh.audit.events())))


def _size_sha(path: Path) -> tuple[int, str]:
    e = entry_for(path)
    assert e.sha256 is not None
    return e.size, e.sha256


# -- the one transition function --------------------------------------------------------------------


def test_a_transition_is_persisted_before_it_is_announced_and_checked(tmp_path: Path) -> None:
    _, svc, rec = _proposed(tmp_path)
    seen: list[tuple[str, str]] = []
    svc.subscribe(lambda event, payload: seen.append((payload["state"], svc.store.get_run(rec.id).state.value)))
    with pytest.raises(StateError, match="cannot become running"):
        svc.lifecycle.transition(rec, RunState.RUNNING)
    assert svc.store.get_run(rec.id).state is RunState.PROPOSED and seen == []
    svc.review.reject(rec.id)
    assert seen == [("rejected", "rejected")]  # announced once, after the store held it
    got = svc.store.get_run(rec.id)
    assert got.transitions[-1].state is RunState.REJECTED and got.transitions[-1].detail == "2 rejected"
    assert kinds(list(svc.audit.events(run=rec.id)))[-1] == "run.rejected"
    assert not (svc.state.run_dir(rec.id) / "staging").exists()  # settled: its staging released


def test_a_run_is_claimed_as_it_starts_staging_and_stages_only_once_ready(tmp_path: Path) -> None:
    """`execute` claims the admitted run and moves it to staging in one write, then waits for
    `ready` (a daemon's run process: what the daemon prepares meanwhile) before it stages; a second
    process cannot claim it again, and a `ready` that fails fails the run, saying why."""
    import os

    ws = workspace(tmp_path)
    staged: list[bool] = []

    def agent(s: Path) -> bytes:
        staged.append(True)
        (s / "src" / "a.py").write_text("A = 2\n")
        return b"done\n"

    svc = Service(ws, sandbox=FakeSandbox(agent))
    run_id = svc.submit("bot", "edit").id
    writes = len(svc.store.get_run(run_id).transitions)
    seen: list[RunRecord] = []

    def ready() -> None:
        seen.append(svc.store.get_run(run_id))
        assert not staged and not (svc.state.run_dir(run_id) / "staging").exists()

    rec = svc.execute(run_id, ready=ready)
    assert rec.state is RunState.PROPOSED and staged == [True]
    (at_ready,) = seen
    assert at_ready.state is RunState.STAGING and at_ready.owner_pid == os.getpid()
    assert len(at_ready.transitions) == writes + 1  # admitted -> staging, nothing between
    with pytest.raises(StateError, match="not admitted"):
        svc.execute(run_id)

    def broken() -> None:
        raise ValueError("the daemon's last line is not JSON")

    other = svc.submit("bot", "again").id
    failed = svc.execute(other, ready=broken)
    assert failed.state is RunState.FAILED and "not JSON" in (failed.error or "")
    assert not (svc.state.run_dir(other) / "prompt.raw").exists()  # the unredacted prompt goes with it
    assert staged == [True]


@pytest.mark.parametrize("kill", [False, True])
def test_a_stop_asked_while_the_daemon_prepares_ends_the_run_before_it_stages(tmp_path: Path, kill: bool) -> None:
    """A stop (or kill) that comes while the run's process, which claimed the run, waits for what
    the daemon prepares: the stopper cannot end it itself any more (it is claimed), so the
    process ends it as soon as it may go on, with nothing staged and no container."""
    ws = workspace(tmp_path)
    ran: list[bool] = []
    svc = Service(ws, sandbox=FakeSandbox(lambda s: ran.append(True) or b""))
    run_id = svc.submit("bot", "edit").id
    asked: list[RunRecord] = []

    def ready() -> None:  # the person's stop arrives from another door meanwhile
        other = Service(ws, sandbox=FakeSandbox(lambda s: b""))
        asked.append(other.stop(run_id, kill=kill, wait=False))

    rec = svc.execute(run_id, ready=ready)
    assert asked[0].state is RunState.STAGING and asked[0].stop_kind == ("kill" if kill else "stop")
    assert rec.state is (RunState.KILLED if kill else RunState.STOPPED) and not ran
    assert not (svc.state.run_dir(run_id) / "staging").exists()
    assert not (svc.state.run_dir(run_id) / "prompt.raw").exists()


def _restructure(s: Path) -> bytes:
    """An agent that turns a file into a directory (a type change: two transactions) and edits one."""
    (s / "notes.txt").unlink()
    (s / "notes.txt").mkdir()
    (s / "notes.txt" / "index.md").write_text("# notes\n")
    (s / "src" / "a.py").write_text("A = 2\n")
    return b"done\n"


def test_a_decision_whose_second_transaction_fails_is_reversed_whole_and_can_be_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A path that changes type lands in two transactions (the old node goes, then the new one
    comes). When the second fails (rolled back by the engine), the first is reversed too: the
    workspace is exactly as before, the files are still pending, the failure is audited, and the
    same decision then lands."""
    import airlockd.runs.review as review_mod
    from airlockd.errors import CommitError

    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_restructure))
    rec = svc.execute(svc.submit("bot", "restructure").id)
    assert rec.state is RunState.PROPOSED
    before = {p.relative_to(ws).as_posix(): p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    real_commit, calls = review_mod.commit, []

    def second_fails(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[3])
        if len(calls) == 2:
            raise CommitError("commit tx failed (OSError: [Errno 28] No space left on device)")
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(review_mod, "commit", second_fails)
    with pytest.raises(CommitError, match="No space left"):
        svc.review.approve(rec.id)
    after = {p.relative_to(ws).as_posix(): p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    assert after == before and (ws / "notes.txt").is_file()
    assert {f.path: f.state for f in svc.store.get_run(rec.id).files if f.path in ("notes.txt", "src/a.py")} == {
        "notes.txt": FileState.PENDING,
        "src/a.py": FileState.PENDING,
    }
    failed = [e for e in svc.audit.events(rec.id) if e["kind"] == "review.commit_failed"]
    assert failed and failed[-1]["data"]["reversed"] and not failed[-1]["data"]["kept"]
    monkeypatch.setattr(review_mod, "commit", real_commit)
    got = svc.review.approve(rec.id)
    assert "src/a.py" in got.applied and (ws / "notes.txt" / "index.md").read_text() == "# notes\n"


def test_a_conflict_in_a_decisions_second_transaction_leaves_nothing_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same two transactions, the second refused by a conflict (the live workspace moved):
    the first is reversed, so "nothing was written" is true, the type change is not taken for
    landed, and once the conflict is gone the decision lands whole."""
    import airlockd.runs.review as review_mod
    from airlockd.errors import ConflictError

    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_restructure))
    rec = svc.execute(svc.submit("bot", "restructure").id)
    before = {p.relative_to(ws).as_posix(): p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    real_commit, calls = review_mod.commit, []

    def second_conflicts(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[3])
        if len(calls) == 2:
            raise ConflictError("conflict: src/a.py", paths=["src/a.py"])
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(review_mod, "commit", second_conflicts)
    with pytest.raises(ConflictError, match="nothing was written"):
        svc.review.approve(rec.id)
    after = {p.relative_to(ws).as_posix(): p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    assert after == before and (ws / "notes.txt").is_file()
    states = {f.path: f.state for f in svc.store.get_run(rec.id).files}
    assert states["notes.txt"] is not FileState.ACCEPTED and states["src/a.py"] is FileState.CONFLICTED
    assert not svc.store.get_run(rec.id).applied  # nothing recorded as landed, nothing to undo
    monkeypatch.setattr(review_mod, "commit", real_commit)
    got = svc.review.approve(rec.id, ["notes.txt", "notes.txt/index.md"])
    assert (ws / "notes.txt" / "index.md").read_text() == "# notes\n" and "notes.txt" in got.applied


def test_a_run_process_whose_daemon_left_before_its_word_learns_the_withheld_values_itself(tmp_path: Path) -> None:
    """The carrier's fallback (`until_ready` False): told nothing, or only part of what the
    daemon knew, it reads the workspace's withheld values afresh before it stages."""
    ws = workspace(tmp_path)
    told_nothing = Service(ws, sandbox=FakeSandbox(), known_values=[])
    assert "Zq8-withheld-value-xK31" in told_nothing.redactor.text("Zq8-withheld-value-xK31")
    told_nothing.learn_withheld_again()
    assert "Zq8-withheld-value-xK31" not in told_nothing.redactor.text("Zq8-withheld-value-xK31")
