"""Crash consistency: kill the committing process at every checkpoint, recover, compare trees.

A subprocess runs commit() with AIRLOCK_CRASH_AT=k for k = 1, 2, ... until one run completes.
After each SIGKILL, recover() must leave the workspace exactly equal (paths, types, modes,
hashes) to the old tree or to the new tree, with no journal and no temp file left behind.
"""

from __future__ import annotations

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

from airlockd.pipeline.commit import FileOp, commit, recover, undo_ops
from airlockd.pipeline.manifest import Manifest, diff, scan

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
