"""Benchmark: what gVisor costs. A whole no-op run (admit -> stage -> container -> inspect ->
proposal) under runsc against the same under runc, and a 1,000-file write-and-read workload inside
the container (the workspace overlay and /tmp) under each, all in one session, interleaved so both
see the same machine load. Also a bare `docker run --rm IMAGE true` under each. Prints the
figures; never asserts on speed.

    .venv/bin/pytest -q -s tests/bench/test_bench_gvisor.py -p no:warnings
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

import docker
import pytest

from airlockd.runs.service import Service
from airlockd.sandbox import runtimes

pytestmark = pytest.mark.docker

ROUNDS = 5
# 1,000 files of 4 KiB written into the workspace and /tmp, then read back and hashed
WORKLOAD = (
    "python3 -c '\n"
    "import hashlib, os, time\n"
    "t = time.perf_counter()\n"
    'for root in ("/workspace/bench", "/tmp/bench"):\n'
    "    os.makedirs(root)\n"
    "    for i in range(500):\n"
    '        with open(f"{root}/f{i}", "wb") as f: f.write(os.urandom(4096))\n'
    "    h = hashlib.sha256()\n"
    "    for name in sorted(os.listdir(root)):\n"
    '        with open(f"{root}/{name}", "rb") as f: h.update(f.read())\n'
    'print("workload_s", time.perf_counter() - t)\''
)
POLICY = """
[agents.runc]
command = ["bash", "-c", "{prompt}"]
prompt = "argv"
runtime = "runc"
[agents.runsc]
command = ["bash", "-c", "{prompt}"]
prompt = "argv"
runtime = "runsc"
[agents.runc.limits]
workspace_growth_mb = 64
[agents.runsc.limits]
workspace_growth_mb = 64
"""


def test_runsc_against_runc(tmp_path: Path) -> None:
    from airlockd.sandbox.image import ensure_image

    client = docker.from_env()
    if why := runtimes.refusal(client.info().get("Runtimes"), "runsc", host_sockets=True):
        pytest.skip(why)
    tag = ensure_image(client)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# bench\n")
    (ws / "policies.toml").write_text(POLICY)
    svc = Service(ws)

    def run(agent: str, prompt: str) -> tuple[float, float | None]:
        t0 = time.perf_counter()
        rec = svc.execute(svc.submit(agent, prompt).id)
        took = time.perf_counter() - t0
        assert rec.state.value in {"proposed", "applied"}, (rec.state, rec.error)
        inner = None
        for line in (svc.state.run_dir(rec.id) / "output.log").read_text().splitlines():
            if line.startswith("workload_s "):
                inner = float(line.split()[1])
        if rec.state.value == "proposed":
            svc.review.reject(rec.id)
        return took, inner

    def bare(runtime: str) -> float:
        t0 = time.perf_counter()
        subprocess.run(["docker", "run", "--rm", "--runtime", runtime, tag, "true"], check=True, capture_output=True)
        return time.perf_counter() - t0

    for agent in ("runc", "runsc"):  # warm-up
        run(agent, "true")
        bare(agent)
    noop: dict[str, list[float]] = {"runc": [], "runsc": []}
    work: dict[str, list[float]] = {"runc": [], "runsc": []}
    inner: dict[str, list[float]] = {"runc": [], "runsc": []}
    bares: dict[str, list[float]] = {"runc": [], "runsc": []}
    for _ in range(ROUNDS):
        for agent in ("runc", "runsc"):
            noop[agent].append(run(agent, "true")[0])
            took, measured = run(agent, WORKLOAD)
            work[agent].append(took)
            assert measured is not None
            inner[agent].append(measured)
            bares[agent].append(bare(agent))
    series = (("noop", noop), ("work", work), ("inner", inner), ("bare", bares))
    med = {k: {a: statistics.median(v[a]) for a in v} for k, v in series}
    print(f"\n(median of {ROUNDS}, interleaved; image {tag})")
    for key, what in (
        ("bare", "bare docker run --rm IMAGE true"),
        ("noop", "no-op airlockd run"),
        ("work", "airlockd run of the 1,000-file workload"),
        ("inner", "the 1,000-file write-and-read inside the container"),
    ):
        rc, rs = med[key]["runc"], med[key]["runsc"]
        print(f"{what}: runc {rc:.3f} s, runsc {rs:.3f} s, runsc / runc {rs / rc:.2f}")
