"""Crash consistency: kill the committing process at every checkpoint, recover, compare trees.

A subprocess runs commit() with AIRLOCK_CRASH_AT=k for k = 1, 2, ... until one run completes.
After each SIGKILL, recover() must leave the workspace exactly equal (paths, types, modes,
hashes) to the old tree or to the new tree, with no journal and no temp file left behind.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from commitops import ops_from_changes

from airlockd.errors import CommitError, ConflictError
from airlockd.pipeline.commit import FileOp, commit, recover, undo, undo_ops
from airlockd.pipeline.manifest import Entry, Kind, Manifest, diff, scan

REPO = Path(__file__).resolve().parents[2]
RUNNER = """
import pickle, sys
from airlockd.pipeline.commit import commit
ws, journal, backups, txid, ops = pickle.loads(open(sys.argv[1], "rb").read())
commit(ws, journal, backups, txid, ops)
"""


def old_tree(root: Path) -> Path:
    files = {
        "keep.txt": b"keep\n",
        "src/app.py": b"print('v1')\n",
        "src/util/helpers.py": b"def f(): pass\n",
        "src/util/old.py": b"old\n",
        "docs/guide/intro.md": b"# intro\n",
        "docs/guide/deeper/more.md": b"# more\n",
        "docs/readme.md": b"readme\n",
        "sp ace/ü.txt": b"unicode\n",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "keep.txt").chmod(0o640)
    return root


def agent_edit(s: Path) -> None:
    (s / "src/app.py").write_bytes(b"print('v2')\n")
    (s / "src/util/helpers.py").write_bytes(b"def f(): return 1\n")
    (s / "src/util/helpers.py").chmod(0o755)
    (s / "src/util/old.py").unlink()
    shutil.rmtree(s / "docs/guide")  # a whole directory, with a subdirectory, goes
    (s / "new/deep/er").mkdir(parents=True)  # a new nested directory comes
    (s / "new").chmod(0o750)
    (s / "new/deep/er/file.txt").write_bytes(b"fresh\n")
    (s / "src/new.py").write_bytes(b"x = 1\n")
    (s / "sp ace/ü.txt").write_bytes(b"unicode v2\n")


def crash_loop(
    tmp: Path, prepare: Callable[[Path, Path, Path], tuple[str, list[FileOp]]], old: Manifest, new: Manifest
) -> tuple[int, int, int]:
    """Kill at k = 1, 2, ... until a run completes; returns (kill points, recovered old, recovered new)."""
    olds = news = 0  # every run before the completing one was killed: k - 1 kill points
    for k in range(1, 500):
        round_dir = tmp / f"k{k}"
        ws, journal, backups = round_dir / "ws", round_dir / "journal", round_dir / "backups"
        txid, ops = prepare(ws, journal, backups)
        job = round_dir / "job.pickle"
        job.write_bytes(pickle.dumps((ws, journal, backups, txid, ops)))
        env = {**os.environ, "AIRLOCK_CRASH_AT": str(k), "PYTHONPATH": str(REPO)}
        proc = subprocess.run([sys.executable, "-c", RUNNER, str(job)], env=env, capture_output=True, timeout=60)
        if proc.returncode == 0:
            assert scan(ws) == new
            assert recover(ws, journal, backups) == []  # a completed run leaves nothing to recover
            assert scan(ws) == new and list(journal.iterdir()) == []
            return k - 1, olds, news
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
        recoveries = recover(ws, journal, backups)
        assert all(r.verified for r in recoveries), recoveries
        got = scan(ws)
        assert got in (old, new), f"kill point {k}: workspace is neither the old nor the new tree"
        olds, news = olds + (got == old), news + (got == new)
        assert list(journal.iterdir()) == [], f"kill point {k}: journal left behind"
        shutil.rmtree(round_dir)
    pytest.fail("the commit never completed")


def test_a_commit_killed_at_any_point_recovers_to_old_or_new(tmp_path: Path) -> None:
    old_ws = old_tree(tmp_path / "old")
    staging = tmp_path / "staging"
    shutil.copytree(old_ws, staging)
    agent_edit(staging)
    old, new = scan(old_ws), scan(staging)
    ops = ops_from_changes(diff(old, new), staging)

    def prepare(ws: Path, journal: Path, backups: Path) -> tuple[str, list[FileOp]]:
        shutil.copytree(old_ws, ws)
        return "tx1", ops

    kills, olds, news = crash_loop(tmp_path, prepare, old, new)
    assert kills > len(ops) and olds and news
    print(f"\ncrash test: {kills} kill points, all recovered ({olds} to the old tree, {news} to the new)")


def test_an_undo_killed_at_any_point_recovers_to_old_or_new(tmp_path: Path) -> None:
    old_ws = old_tree(tmp_path / "old")
    staging = tmp_path / "staging"
    shutil.copytree(old_ws, staging)
    agent_edit(staging)
    old, new = scan(old_ws), scan(staging)
    ops = ops_from_changes(diff(old, new), staging)

    def prepare(ws: Path, journal: Path, backups: Path) -> tuple[str, list[FileOp]]:
        shutil.copytree(old_ws, ws)
        commit(ws, journal, backups, "tx1", ops)
        return "tx1-undo", undo_ops(ws, backups, "tx1")

    # for the undo, the tree before it is the committed one and the tree after it the old one
    kills, olds, news = crash_loop(tmp_path, prepare, new, old)
    assert kills > len(ops) and olds and news
    print(f"\ncrash test (undo): {kills} kill points, all recovered ({olds} committed tree, {news} undone)")


@pytest.mark.parametrize("err", [errno.ENAMETOOLONG, errno.EACCES, errno.ENOSPC, errno.EXDEV])
def test_a_step_failing_at_any_position_rolls_back_and_the_change_can_be_committed_again(
    tmp_path: Path, err: int
) -> None:
    """The step at position k (backup, mkdir, write, replace, delete, rmdir, chmod, journal)
    fails with `err`, for every k: the commit raises CommitError naming the cause, the workspace is
    exactly the old tree, no journal, backup or temp file is left, and the same change then
    commits (the run is decidable again)."""
    old_ws = old_tree(tmp_path / "old")
    staging = tmp_path / "staging"
    shutil.copytree(old_ws, staging)
    agent_edit(staging)
    old, new = scan(old_ws), scan(staging)
    ops = ops_from_changes(diff(old, new), staging)
    positions = 0
    for k in range(1, 500):
        ws, journal, backups = tmp_path / f"ws{k}", tmp_path / f"j{k}", tmp_path / f"b{k}"
        shutil.copytree(old_ws, ws)
        seen: list[str] = []

        def fail_at(label: str, k: int = k, seen: list[str] = seen) -> None:
            seen.append(label)
            if len(seen) == k and label not in ("committed", "recorded"):
                raise OSError(err, os.strerror(err), label)

        try:
            commit(ws, journal, backups, "tx1", ops, checkpoint=fail_at)
        except CommitError as exc:
            assert os.strerror(err) in exc.message and "restored and verified" in exc.message
            assert scan(ws) == old, f"step {k} ({seen[-1]}): the workspace is not the old tree"
            assert not list(journal.iterdir()) and not (backups / "tx1").exists()
            assert not [p for p in ws.rglob("*") if p.name.startswith(".airlock-")], "temp files left"
            commit(ws, journal, backups, "tx1", ops)  # decidable again: the same change lands
            assert scan(ws) == new
            positions += 1
            shutil.rmtree(ws)
            continue
        assert scan(ws) == new  # k is past the last step that can fail
        break
    assert positions > len(ops), positions
    print(f"\nfailing-step test ({errno.errorcode[err]}): {positions} positions, all rolled back")


def test_names_the_filesystem_cannot_hold_are_refused_before_any_write(tmp_path: Path) -> None:
    ws = old_tree(tmp_path / "ws")
    before = scan(ws)
    src = tmp_path / "src"
    src.write_bytes(b"x\n")
    new = Entry(Kind.FILE, 0o644, 2, hashlib.sha256(b"x\n").hexdigest())
    too_long_name = FileOp("src/" + "n" * 256, None, new, src)
    deep = "/".join(["d" * 200] * 21) + "/f.txt"  # each part fits, the whole does not
    too_long_path = FileOp(deep, None, new, src)
    ok = FileOp("src/fine.txt", None, new, src)
    for bad in (too_long_name, too_long_path):
        with pytest.raises(CommitError, match="refused to commit, nothing was written") as info:
            commit(ws, tmp_path / "journal", tmp_path / "backups", "tx1", [ok, bad])
        assert "bytes" in info.value.message
        assert scan(ws) == before
        assert not (tmp_path / "journal").exists() or not list((tmp_path / "journal").iterdir())


_SYSCALLS = ("open", "write", "link", "replace", "mkdir", "unlink", "rmdir", "chmod", "fchmod")


@pytest.mark.parametrize("err", [errno.ENAMETOOLONG, errno.EACCES, errno.ENOSPC, errno.EXDEV])
def test_a_system_call_failing_inside_any_step_rolls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    """The k-th file-system call the commit engine makes (open, write, link, replace, mkdir,
    unlink, rmdir, chmod, fchmod: in the middle of a backup, a temp file's write, a rename...)
    fails with `err`, for every k: the workspace is the old tree, nothing is left behind, and
    the change commits afterwards."""
    import types

    from airlockd.pipeline import commit as commit_mod
    from airlockd.pipeline import journal as journal_mod

    old_ws = old_tree(tmp_path / "old")
    staging = tmp_path / "staging"
    shutil.copytree(old_ws, staging)
    agent_edit(staging)
    old, new = scan(old_ws), scan(staging)
    ops = ops_from_changes(diff(old, new), staging)
    calls = {"n": 0, "fail_at": 0}

    def failing(name: str) -> Callable[..., object]:
        real = getattr(os, name)

        def call(*args: object, **kwargs: object) -> object:
            calls["n"] += 1
            if calls["n"] == calls["fail_at"]:
                raise OSError(err, os.strerror(err), f"{name} (injected)")
            return real(*args, **kwargs)

        return call

    proxy = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
    for name in _SYSCALLS:
        setattr(proxy, name, failing(name))
    monkeypatch.setattr(commit_mod, "os", proxy)
    monkeypatch.setattr(journal_mod, "os", proxy)
    positions = absorbed = 0
    for k in range(1, 2000):
        ws, journal, backups = tmp_path / f"ws{k}", tmp_path / f"j{k}", tmp_path / f"b{k}"
        shutil.copytree(old_ws, ws)
        calls.update(n=0, fail_at=k)
        try:
            commit(ws, journal, backups, "tx1", ops)
        except (CommitError, ConflictError) as exc:
            # before the first write: refused as it stands (a file that cannot be read to compare
            # it is a conflict that says so); after it: rolled back
            assert "restored and verified" in exc.message or "nothing was written" in exc.message, exc.message
            calls["fail_at"] = 0
            assert scan(ws) == old, f"call {k}: the workspace is not the old tree"
            assert not journal.exists() or not list(journal.iterdir())
            assert not (backups / "tx1").exists()
            assert not [p for p in ws.rglob("*") if p.name.startswith(".airlock-")], "temp files left"
            commit(ws, journal, backups, "tx1", ops)
            assert scan(ws) == new
            positions += 1
            shutil.rmtree(ws)
            continue
        calls["fail_at"] = 0
        assert scan(ws) == new
        if calls["n"] < k:  # every call of a whole commit went through: no position left
            break
        recover(ws, journal, backups)  # files an undo record a failure left unfiled (else a no-op)
        # the failure was one the engine has a way around (a backup's hard link falls back to a
        # copy): the commit is whole, and its backups still undo it exactly
        undo(ws, journal, backups, "tx1")
        assert scan(ws) == old
        absorbed += 1
        shutil.rmtree(ws)
    assert positions > len(ops)
    print(f"\nfailing-call test ({errno.errorcode[err]}): {positions} positions rolled back, {absorbed} worked around")
