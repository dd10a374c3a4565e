"""Benchmark: the first run after the daemon's periodic walk ÷ any other run, in one run.

    .venv/bin/pytest tests/bench/test_bench_after_walk.py -s -q

The daemon walks each mirror every few minutes in another process (`python -m
airlockd.runs.mirrors`, the keeper's `walker`), so in real use most runs (minutes apart) come
right after one. That process once rewrote the mirror's fresh repository, the keeper's state of
it stopped vouching for it, and the next refresh rescanned the whole tree for the repository.
Measured here, on treegen's `big_tree` made a git repository (20,000 files, 210 MiB), with a
keeper whose walker is the daemon's (`walk_elsewhere`): after the cold build, ROUNDS times: 10
files edited, a refresh (timed: "any other run"); a walk in the other process (untimed); 10 files
edited, a refresh (timed: "the first after a walk"). Printed: min and median of each and their
ratio (target: about 1); never asserted but for sanity (the refreshes were incremental: no
rescan of the whole tree after the first).

Knobs: AIRLOCK_BENCH_DIR (e.g. /dev/shm), AIRLOCK_BENCH_FILES (a smaller tree).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from treegen import big_tree, spec_from_env

ROUNDS = 5
EDITS = 10
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
    "GIT_CONFIG_COUNT": "1",  # as root the walk's process hands the mirror to the agent's uid
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
}


@pytest.fixture
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = os.environ.get("AIRLOCK_BENCH_DIR")
    root = Path(base) / f"airlock-bench-after-walk-{os.getpid()}" if base else tmp_path_factory.mktemp("after-walk")
    root.mkdir(parents=True, exist_ok=True)
    yield root
    if base:
        shutil.rmtree(root, ignore_errors=True)


def test_the_first_run_after_a_periodic_walk(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airlockd.policy import Level, load_policy
    from airlockd.redact import Redactor
    from airlockd.runs.execution import mirror_owner
    from airlockd.runs.mirrors import walk_elsewhere
    from airlockd.staging import gitcopy
    from airlockd.staging.keeper import MirrorKeeper
    from airlockd.state import StateDir

    tree = big_tree(work / "trees", spec_from_env())
    ws = work / "ws"
    shutil.copytree(tree.root, ws, symlinks=True)
    for key, value in _GIT_ENV.items():
        monkeypatch.setenv(key, value)
    env = {**os.environ, "HOME": str(work)}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "the tree"]):
        subprocess.run(["git", "-c", "gc.auto=0", *args], cwd=ws, env=env, check=True, capture_output=True)
    monkeypatch.setenv("AIRLOCK_STATE_DIR", str(work / "state"))
    state = StateDir.for_workspace(ws).ensure()
    policy = load_policy(ws).policy
    scans: list[int] = []
    real_scan = gitcopy.Repo._scan
    monkeypatch.setattr(gitcopy.Repo, "_scan", lambda self, *a, **k: scans.append(1) or real_scan(self, *a, **k))
    keeper = MirrorKeeper(ws, state.root, walker=walk_elsewhere(ws))
    why = keeper.start()
    if why is not None:
        pytest.skip(f"the keeper cannot watch here: {why}")
    editable = [p for p in tree.paths if not p.startswith("assets/")]
    step = iter(range(0, len(editable) - EDITS, EDITS))
    red = Redactor()

    def refresh(walk: bool = False) -> float:
        t0 = time.perf_counter()
        keeper.refresh(policy, Level.INTERNAL, owner=mirror_owner(), redactor=red, walk=walk)
        return time.perf_counter() - t0

    def edit() -> None:
        k = next(step)
        for rel in editable[k : k + EDITS]:
            with open(ws / rel, "ab") as fh:
                fh.write(b"# edited\n")
        keeper.drain()

    other: list[float] = []
    after: list[float] = []
    try:
        cold = refresh()  # the cold build, in the walk's process, then the keeper's one rescan
        rescans = len(scans)
        edit()
        refresh()  # untimed warm-up
        for _ in range(ROUNDS):
            edit()
            os.sync()
            other.append(refresh())
            refresh(walk=True)
            edit()
            os.sync()
            after.append(refresh())
    finally:
        keeper.close()
    assert len(scans) == rescans, "a refresh rescanned the whole tree for the repository"

    def span(xs: list[float]) -> str:
        return f"min {min(xs) * 1e3:7.2f} ms, median {statistics.median(xs) * 1e3:7.2f} ms"

    print(f"\n=== the first run after a periodic walk: {tree.files} files, {tree.bytes / 2**20:.0f} MiB ===")
    print(f"  cold build (the walk's process, then the keeper's rescan): {cold:.2f} s")
    print(f"  refresh, any other run:        {span(other)}")
    print(f"  refresh, the first after walk: {span(after)}")
    print(
        f"  after ÷ other: {min(after) / min(other):.2f} of mins,"
        f" {statistics.median(after) / statistics.median(other):.2f} of medians   (target about 1)"
    )
