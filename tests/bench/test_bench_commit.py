"""Benchmark (prints, never fails on speed): commit() of 1,000 changed files against `cp -a`.

commit() does much more than cp: it hashes every base file (conflict check), journals, hard-links
backups, hashes every new file while copying it, and makes everything durable with two syncfs
barriers. The baseline is `cp -a` of the same 1,000 files into a fresh copy of the tree, measured
in the same run. Target: ratio <= 3.

For context it also times `cp -a` into an empty directory: an atomic commit must create a new
inode per file (the old one is kept as the backup), which `cp -a` over existing files never does,
and on some disks (a VM's ext4 here) inode creation alone dominates.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from pathlib import Path

from commitops import ops_from_changes

from airlockd.pipeline.commit import commit
from airlockd.pipeline.manifest import diff, scan

FILES, DIRS, SIZE, ROUNDS = 1000, 20, 10 * 1024, 3


def make_trees(root: Path) -> tuple[Path, Path]:
    rnd = random.Random(1000)
    base, staging = root / "base", root / "staging"
    for d in range(DIRS):
        for tree in (base, staging):
            (tree / f"pkg{d:02d}" / "mod").mkdir(parents=True)
    for i in range(FILES):
        rel = f"pkg{i % DIRS:02d}/mod/f{i:04d}.py"
        (base / rel).write_bytes(rnd.randbytes(SIZE))
        (staging / rel).write_bytes(rnd.randbytes(SIZE))
    return base, staging


def test_bench_commit_1000_files(tmp_path: Path) -> None:
    base, staging = make_trees(tmp_path)
    before, after = scan(base), scan(staging)
    ops = ops_from_changes(diff(before, after), staging)
    assert len(ops) == FILES
    commit_s, cp_s, cp_new_s = [], [], []
    for r in range(ROUNDS):
        ws, baseline, empty = tmp_path / f"ws{r}", tmp_path / f"cp{r}", tmp_path / f"empty{r}"
        shutil.copytree(base, ws)
        shutil.copytree(base, baseline)
        empty.mkdir()
        state = tmp_path / f"state{r}"
        os.sync()  # the setup's dirty pages are not the commit's to flush

        t0 = time.perf_counter()
        commit(ws, state / "journal", state / "backups", f"bench{r}", ops)
        commit_s.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        subprocess.run(["cp", "-a", f"{staging}/.", str(baseline)], check=True)
        cp_s.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        subprocess.run(["cp", "-a", f"{staging}/.", str(empty)], check=True)
        cp_new_s.append(time.perf_counter() - t0)

        assert scan(ws) == after
    x, y = min(commit_s), min(cp_s)  # best of the rounds: the least disturbed by other work
    print(f"\ncommit {FILES} files: {x:.3f} s; cp: {y:.3f} s; ratio {x / y:.2f}")
    print(f"(context: cp -a into an empty dir, new inodes like commit's: {min(cp_new_s):.3f} s)")
