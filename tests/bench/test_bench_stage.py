"""Benchmark: stage() against `cp -a`, inspect() against `sha256sum` of every file, same tree.

Run with `pytest tests/bench/test_bench_stage.py -s`. Figures are printed, never asserted
(targets: stage <= 1.5 x cp -a, inspect <= 1.2 x sha256sum); only sanity is asserted.

Method: one deterministic tree (tests/bench/treegen.py: 20,000 files, 210 MiB, nested), generated
once per session. Every contender runs once untimed first (warm page cache, warm code), then
ROUNDS timed runs, alternating ours and the baseline, each after an untimed `sync` so one run's
writeback does not land in the next one's time. Copies are removed only at the end. Reported:
min and median of each, ratio of mins. The tree and copies live under pytest's base temp dir,
or under $AIRLOCK_BENCH_DIR (e.g. /dev/shm to take the disk out of the comparison).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from treegen import Tree, big_tree

from airlockd.pipeline.manifest import ChangeKind
from airlockd.policy import Level, load_policy
from airlockd.staging.copy import stage
from airlockd.staging.readback import inspect
from airlockd.staging.records import StageResult

ROUNDS = 3
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def bench_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = os.environ.get("AIRLOCK_BENCH_DIR")
    if base:
        root = Path(base) / f"airlock-bench-{os.getpid()}"
        root.mkdir(parents=True, exist_ok=True)
        yield root
        shutil.rmtree(root, ignore_errors=True)
    else:
        yield tmp_path_factory.getbasetemp()


@pytest.fixture(scope="session")
def tree(bench_dir: Path) -> Tree:
    return big_tree(bench_dir)


def _timed(fn: Callable[[], object]) -> float:
    os.sync()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _line(name: str, times: list[float]) -> str:
    runs = " ".join(f"{t:.2f}" for t in times)
    return f"  {name:<10} min {min(times):6.2f} s   median {statistics.median(times):6.2f} s   runs {runs}"


def _ratio(ours: list[float], base: list[float], target: float) -> str:
    of_mins = min(ours) / min(base)
    of_medians = statistics.median(ours) / statistics.median(base)
    return f"  ratio      {of_mins:.2f} of mins, {of_medians:.2f} of medians   (target <= {target})"


def _fs_type(path: Path) -> str:
    out = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def test_stage_and_inspect_against_baselines(tree: Tree, bench_dir: Path) -> None:
    work = bench_dir / f"stage-bench-{time.time_ns()}"
    work.mkdir()
    policy = load_policy(tree.root).policy
    n = iter(range(1000))

    def cp() -> None:
        subprocess.run(["cp", "-a", str(tree.root), str(work / f"cp{next(n)}")], check=True)

    results: list[StageResult] = []

    def ours() -> None:
        results.append(stage(tree.root, work / f"st{next(n)}", policy, Level.INTERNAL))

    try:
        cp()  # untimed: warm cache and code
        ours()
        cp_times, st_times = [], []
        for _ in range(ROUNDS):
            cp_times.append(_timed(cp))
            st_times.append(_timed(ours))
        res = results[-1]
        assert res.files == tree.files and res.bytes == tree.bytes and not res.withheld and not res.skipped
        assert sum(1 for e in res.base.values() if e.kind == "file") == tree.files

        staged = work / f"st{next(n) - 1}"
        _change_ten_files(staged, tree)
        expected = {"modified": 4, "created": 3, "deleted": 2, "mode_changed": 1}

        def sha() -> None:
            subprocess.run(
                "find . -type f -print0 | xargs -0 sha256sum > /dev/null", shell=True, check=True, cwd=staged
            )

        changes = inspect(staged, res.base)  # untimed, like the baseline's first run
        sha()
        sha_times, in_times = [], []
        for _ in range(ROUNDS):
            sha_times.append(_timed(sha))
            in_times.append(_timed(lambda: inspect(staged, res.base)))
        got: dict[str, int] = {}
        for c in changes:
            got[c.change.value] = got.get(c.change.value, 0) + 1
        assert got == expected, got
        assert all(c.change is not ChangeKind.TYPE_CHANGED for c in changes)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mib = tree.bytes / 2**20
    print(
        f"\n=== staging benchmark: {tree.files} files, {tree.dirs} dirs, {mib:.1f} MiB on {_fs_type(tree.root)}"
        f" ({tree.root}); warm cache, {ROUNDS} timed runs after 1 untimed each, sync before each ==="
    )
    print("stage() vs cp -a")
    print(_line("cp -a", cp_times))
    print(_line("stage()", st_times))
    print(_ratio(st_times, cp_times, 1.5))
    print(f"inspect() with 10 changed files vs find | xargs sha256sum ({sum(expected.values())} changes found)")
    print(_line("sha256sum", sha_times))
    print(_line("inspect()", in_times))
    print(_ratio(in_times, sha_times, 1.2))


def _change_ten_files(root: Path, tree: Tree) -> None:
    """4 modified, 3 created, 2 deleted, 1 chmod: what an agent's small task leaves behind."""
    paths = [p for p in tree.paths if not p.startswith("assets/")]
    for rel in paths[0:4]:
        with open(root / rel, "ab") as fh:
            fh.write(b"# edited by the agent\n")
    for i in range(3):
        (root / paths[10]).with_name(f"new_{i}.py").write_text(f"x = {i}\n")
    for rel in paths[20:22]:
        (root / rel).unlink()
    os.chmod(root / paths[30], 0o700)
