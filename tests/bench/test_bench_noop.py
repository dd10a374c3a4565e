"""Benchmark: the overhead of a whole no-op run (admit -> stage -> container start -> exit -> inspect
-> proposal) on an empty workspace, against a bare `docker run --rm IMAGE true` measured in the
same session. Prints the figures; never asserts on speed.

    .venv/bin/pytest -q -s tests/bench/test_bench_noop.py -p no:warnings
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

import docker
import pytest

from airlockd.runs.service import Service

pytestmark = pytest.mark.docker

ROUNDS = 5


def test_noop_run_vs_bare_docker_run(tmp_path: Path) -> None:
    from airlockd.sandbox.image import ensure_image

    tag = ensure_image(docker.from_env())
    ws = tmp_path / "empty"
    ws.mkdir()
    svc = Service(ws)  # one service for every round, as a daemon would be

    def noop_run() -> tuple[float, str]:
        t0 = time.perf_counter()
        rec = svc.submit("shell", "true")  # the default policy's `shell` agent: bash -c PROMPT
        rec = svc.execute(rec.id)
        return time.perf_counter() - t0, rec.state.value

    def bare_run() -> float:
        t0 = time.perf_counter()
        subprocess.run(["docker", "run", "--rm", tag, "true"], check=True, capture_output=True)
        return time.perf_counter() - t0

    noop_run()  # warm-up: engine connection, page cache
    bare_run()
    runs: list[float] = []
    bares: list[float] = []
    states: set[str] = set()
    for _ in range(ROUNDS):  # interleaved, so both see the same machine load
        took, state = noop_run()
        runs.append(took)
        states.add(state)
        bares.append(bare_run())
    run_s, bare_s = statistics.median(runs), statistics.median(bares)
    print(
        f"\nno-op run: {run_s:.3f} s; bare docker run: {bare_s:.3f} s; ratio {run_s / bare_s:.2f}"
        f"  (median of {ROUNDS}; image {tag}; end states {sorted(states)}; target ratio <= 1.5)"
    )
    assert states <= {"proposed", "applied", "rejected"}, states  # it ran to its end, not failed
