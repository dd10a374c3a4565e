"""Benchmark: a user who is not root (in the `docker` group), on the 20,000-file tree, with the
overlay staged through the engine (docs/engines.md): a no-op run through the daemon `airlockd
run` starts (tests/bench/daemonrun.py: its keeper refreshes the mirror from file events, each run
is carried by a process of its own) against a bare `docker run --rm IMAGE true`, and that run's
staging (mirror refresh + the engine-held capped upper layer + the overlay volume) against `cp
-a` of the tree, all as that user, interleaved in one run. Prints, never asserts speed (issue
12's targets: no-op run / bare docker run <= 1.2, staging / cp -a <= 0.05).

    .venv/bin/pytest -q -s tests/bench/test_bench_nonroot.py -p no:warnings
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import textwrap
from pathlib import Path

import docker
import pytest
from nonroot import as_user, ensure_tester, home_for, interpreter_for
from treegen import big_tree, spec_from_env

pytestmark = [pytest.mark.slow, pytest.mark.docker]

ROUNDS = 5
SCRIPT = textwrap.dedent(
    """
    import json, os, statistics, subprocess, sys, time
    from pathlib import Path

    tree, work, rounds, image, bench = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    sys.path.insert(0, bench)
    import daemonrun

    def timed(fn):
        os.sync()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    ws = work / "project"
    subprocess.run(["cp", "-a", str(tree), str(ws)], check=True)
    (ws / "policies.toml").write_text('[agents.noop]\\ncommand = ["true"]\\n')
    daemon = daemonrun.start(ws)  # as `airlockd run` starts it: the user's own, in the background
    try:
        cold, first = daemonrun.run(daemon, ws, "noop")
        runs, stagings, bares, copies, states, stagers = [], [], [], [], set(), set()
        for i in range(rounds):  # interleaved: every contender sees the same machine load
            took, rec = daemonrun.run(daemon, ws, "noop")
            runs.append(took)
            at = {t.state.value: t.at for t in rec.transitions}
            stagings.append(at["running"] - at["staging"])
            states.add(rec.state.value)
            stagers.add(rec.stager)
            bare = ["docker", "run", "--rm", image, "true"]
            bares.append(timed(lambda: subprocess.run(bare, check=True, capture_output=True)))
            dst = work / f"copy-{i}"
            copies.append(timed(lambda: subprocess.run(["cp", "-a", str(tree), str(dst)], check=True)))
            subprocess.run(["rm", "-rf", str(dst)], check=True)
    finally:
        daemonrun.stop(daemon, ws)  # its spare holders go with it
    med = statistics.median
    print(json.dumps({
        "uid": os.getuid(), "cold_s": cold, "first_state": first.state.value, "run_s": med(runs),
        "staging_s": med(stagings), "bare_s": med(bares), "cp_s": med(copies), "states": sorted(states),
        "stagers": sorted(stagers), "runs": runs, "bares": bares, "stagings": stagings, "copies": copies,
    }))
    """
)


def test_nonroot_noop_run_and_staging_against_baselines() -> None:
    from airlockd.sandbox.image import ensure_image

    image = ensure_image(docker.from_env())
    uid = ensure_tester()
    work = home_for(uid)  # the user's own folder: the tree, the workspace and the copies
    gid = pwd.getpwuid(uid).pw_gid
    try:
        tree = big_tree(work, spec_from_env())
        for dirpath, dirs, files in os.walk(work):
            for name in [*dirs, *files]:
                os.lchown(os.path.join(dirpath, name), uid, gid)
        with interpreter_for(uid) as prefix:
            env = {"HOME": str(work), "PATH": "/usr/bin:/bin"}
            proc = subprocess.run(
                as_user(uid, [str(prefix / "bin" / "python"), "-P", "-c", SCRIPT, str(tree.root), str(work),
                              str(ROUNDS), image, str(Path(__file__).parent)]),
                capture_output=True, text=True, env=env, cwd="/", timeout=1800,
            )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert out["uid"] != 0 and out["stagers"] == ["overlay"], out
    assert set(out["states"]) <= {"proposed", "applied", "rejected"}, out
    print(
        f"\nnot root (uid {out['uid']}), {tree.files} files / {tree.bytes / 2**20:.0f} MiB, median of {ROUNDS}:"
        f"\n  no-op run (through the daemon) {out['run_s']:.3f} s ÷ bare docker run {out['bare_s']:.3f} s"
        f" = {out['run_s'] / out['bare_s']:.2f} (target <= 1.2)"
        f"\n  its staging {out['staging_s']:.3f} s ÷ cp -a {out['cp_s']:.3f} s = {out['staging_s'] / out['cp_s']:.3f}"
        f" (target <= 0.05)\n  first run (cold mirror build) {out['cold_s']:.2f} s"
    )
