"""Benchmark (prints, never fails on speed): a no-op run typed at the command line on a 20,000-file
tree (treegen), as a person runs it — `airlockd run --agent bot --wait true`, a new process each
time — against a bare `docker run --rm IMAGE true` measured in the same run, interleaved.

- through the daemon: the first command starts one in the background (it builds the mirror, once);
  the next ones reach it on its control socket, and it stages in proportion to what changed.
  Target (issue 14): <= 1.2 x bare `docker run`.
- alone (`--no-daemon`): the command walks the tree for its own mirror refresh, as before.

    .venv/bin/pytest tests/bench/test_bench_cli.py -s -q
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from treegen import big_tree

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROUNDS = 11
POLICY = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    """
)


def _timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def test_bench_cli_noop_run(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    import docker

    from airlockd.sandbox.image import ensure_image

    tag = ensure_image(docker.from_env())
    base = os.environ.get("AIRLOCK_BENCH_DIR")
    tree = big_tree(Path(base) if base else tmp_path_factory.getbasetemp())
    ws = tmp_path / "ws"
    subprocess.run(["cp", "-al", str(tree.root), str(ws)], check=True)  # shared tree: link, never modify
    (ws / "policies.toml").write_text(POLICY)
    env = {**os.environ, "AIRLOCK_DAEMON": "auto"}  # the state dir is this test's: its daemon ends with it
    exe = str(Path(sys.executable).with_name("airlockd"))
    run = [exe, "--workspace", str(ws), "run", "--agent", "bot", "--wait", "true"]
    bare = ["docker", "run", "--rm", tag, "true"]
    try:
        first = _timed(run, env)  # starts the daemon, which builds the mirror
        _timed(bare, env)
        daemon, alone, bares = [], [], []
        for _ in range(ROUNDS):
            daemon.append(_timed(run, env))
            bares.append(_timed(bare, env))
        for _ in range(3):
            alone.append(_timed([*run[:3], "--no-daemon", *run[3:]], env))
        d, b, a = statistics.median(daemon), statistics.median(bares), statistics.median(alone)
        print(
            f"\nCLI no-op run on {tree.files} files: through the daemon {d:.3f} s = {d / b:.2f} x bare docker run"
            f" ({b:.3f} s; median of {ROUNDS}, min {min(daemon):.3f} s; target <= 1.2);"
            f" alone (--no-daemon) {a:.3f} s = {a / b:.2f} x; the first command (starts the daemon,"
            f" builds the mirror) {first:.2f} s"
        )
    finally:
        shutil.rmtree(ws, ignore_errors=True)
