"""airlockd's own Python children never import code from the current directory (attack review:
`python -m` put the workspace first on `sys.path`, and a workspace shipping an `airlockd/`
package had it run, as root, by the cold build's packer)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from githistory import git

import airlockd
from airlockd.interpreter import module_command
from airlockd.policy import Level, load_policy
from airlockd.runs.mirrors import walk_elsewhere
from airlockd.staging.mirror import Mirror

DECOY = """import pathlib
pathlib.Path({marker!r}).write_text("code from the workspace ran")
"""


def _decoy_workspace(tmp_path: Path) -> tuple[Path, Path]:
    """A repository whose tree holds a package named `airlockd` (and `airlockd.staging.packer`,
    `airlockd.runs.mirrors`) that leaves a marker when imported."""
    ws = tmp_path / "ws"
    marker = tmp_path / "marker"
    for rel in ("airlockd/__init__.py", "airlockd/staging/__init__.py", "airlockd/runs/__init__.py"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(DECOY.format(marker=str(marker)))
    (ws / "airlockd/staging/packer.py").write_text("raise SystemExit(0)\n")
    (ws / "airlockd/runs/mirrors.py").write_text("raise SystemExit(0)\n")
    (ws / "README.md").write_text("# a project\n")
    git(ws.parent, "init", "-q", "-b", "main", str(ws))
    git(ws, "add", "-A")
    git(ws, "commit", "-q", "-m", "first")
    return ws, marker


def test_the_cold_builds_packer_ignores_a_package_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ws, marker = _decoy_workspace(tmp_path)
    monkeypatch.chdir(ws)  # as `cd project && airlockd run ...` leaves the process
    with caplog.at_level(logging.WARNING, logger="airlockd.staging.packer"):
        view = Mirror(tmp_path / "mirror").refresh(ws, load_policy(ws).policy, Level.INTERNAL)
    assert not marker.exists()
    assert "packs in this process" not in caplog.text  # the real packer ran, and did the packing
    assert git(view.tree, "ls-tree", "-r", "--name-only", "HEAD").split() == [
        "README.md",
        "airlockd/__init__.py",
        "airlockd/runs/__init__.py",
        "airlockd/runs/mirrors.py",
        "airlockd/staging/__init__.py",
        "airlockd/staging/packer.py",
    ]


def test_the_daemons_walk_in_another_process_ignores_a_package_in_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, marker = _decoy_workspace(tmp_path)
    monkeypatch.chdir(ws)
    walk_elsewhere(ws)(Level.INTERNAL)  # raises if the walk did not happen
    assert not marker.exists()


def test_every_python_child_is_started_through_module_command() -> None:
    """No other place names the interpreter: a new child cannot forget `-P`."""
    root = Path(airlockd.__file__).parent
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "interpreter.py" and re.search(r"\bsys\.executable\b", p.read_text())
    ]
    assert offenders == []
    assert module_command("airlockd.x", "a")[1:] == ["-P", "-m", "airlockd.x", "a"]
