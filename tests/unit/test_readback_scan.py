"""An engine-held run's read-back: its scan (kept in the run's folder) forgets what inspection
drops for carrying a secret, as the copy does (the state directory keeps no name holding one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from airlockd.staging import stagers, upperdump
from airlockd.staging.runbase import ManifestBase

TOKEN = "ghp" + "_" + "Xk9mQ2vR7tL4wP8sN1bY6cF3hJ5dG0aZ2eU7"


def test_a_name_dropped_for_a_secret_leaves_the_read_back_scan_too(tmp_path: Path) -> None:
    upper = tmp_path / "engine-upper"
    (upper / "src").mkdir(parents=True)
    (upper / "src" / f"{TOKEN}.txt").write_text("hi\n")
    (upper / "src" / "ok.py").write_text("OK = True\n")
    dump = subprocess.run(
        [sys.executable, "-I", "-c", upperdump.DUMP, str(upper), "user.overlay.opaque"], capture_output=True, check=True
    ).stdout
    run_dir = tmp_path / "run"
    (run_dir / "staging").mkdir(parents=True)
    stagers.read_back(run_dir, [dump], ManifestBase({}), None)
    after, _, _ = stagers.load_scan(run_dir)
    assert f"src/{TOKEN}.txt" in after  # as the engine gave it

    (run_dir / "staging" / "upper" / "src" / f"{TOKEN}.txt").unlink()  # inspection drops the node
    stagers.forget_scanned(run_dir, [f"src/{TOKEN}.txt"])
    after, _, _ = stagers.load_scan(run_dir)
    assert set(after) == {"src", "src/ok.py"}
    for p in run_dir.rglob("*"):
        assert TOKEN not in str(p)
        assert not p.is_file() or TOKEN.encode() not in p.read_bytes(), p
    stagers.forget_scanned(tmp_path / "no-such-run", ["x"])  # a run that was never read back: nothing
