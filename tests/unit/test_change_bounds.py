"""Inspection stops at the policy's bounds on the change set (entries, depth of new paths, bytes
by allocated blocks), before the excess is read, with both stagers' scans; what the base already
holds never counts against the agent."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest

from airlockd.pipeline.manifest import Manifest
from airlockd.staging.bounds import ChangeBounds, ChangeSetTooLarge
from airlockd.staging.overlay import inspect_upper
from airlockd.staging.readback import inspect, scan_tree
from airlockd.staging.runbase import ManifestBase

BOUNDS = ChangeBounds(entries=100, depth=20, bytes=1 << 20)


def _flood(root: Path, n: int) -> None:
    (root / "flood").mkdir(parents=True)
    for i in range(n):
        (root / "flood" / f"f{i}").write_bytes(b"x")


def _deep(root: Path, levels: int) -> Path:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    return root


def _remove_deep(top: Path) -> None:
    """Remove a `_deep` chain without recursion (shutil.rmtree, and pytest's clean-up of old
    temporary folders, would exceed Python's recursion limit on it): pull each level up."""
    d, nxt = top / "d", top / ".next"
    while d.is_dir() and not d.is_symlink():
        if (d / "d").is_dir():
            os.rename(d / "d", nxt)
        for name in os.listdir(d):
            os.unlink(d / name)
        os.rmdir(d)
        if nxt.exists():
            os.rename(nxt, d)


def _upper(tmp_path: Path) -> Path:
    upper = tmp_path / "upper"
    upper.mkdir()
    return upper


def test_a_flood_of_files_stops_at_the_entry_bound(tmp_path: Path) -> None:
    upper = _upper(tmp_path)
    _flood(upper, 5_000)
    with pytest.raises(ChangeSetTooLarge) as exc:
        inspect_upper(upper, ManifestBase({}), BOUNDS)
    assert (exc.value.limit, exc.value.measured, exc.value.allowed) == ("changed_files", 101, 100)
    assert "changed_files" in str(exc.value) and exc.value.kind == "limit_exceeded"


def test_a_deep_tree_stops_at_the_depth_bound_without_entering_it(tmp_path: Path) -> None:
    upper = _deep(_upper(tmp_path), 3_000)  # deeper than PATH_MAX allows as one path
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    started = time.monotonic()
    try:
        with pytest.raises(ChangeSetTooLarge) as exc:
            inspect_upper(upper, ManifestBase({}), ChangeBounds(entries=100_000, depth=20, bytes=1 << 30))
    finally:
        _remove_deep(upper)
    assert (exc.value.limit, exc.value.measured, exc.value.allowed) == ("change_depth", 21, 20)
    assert time.monotonic() - started < 5
    assert len(os.listdir("/proc/self/fd")) < soft  # no descriptor left behind


def test_bytes_are_counted_by_allocation_not_by_claim(tmp_path: Path) -> None:
    upper = _upper(tmp_path)
    with (upper / "holes.bin").open("wb") as fh:
        fh.truncate(1 << 40)  # a terabyte of holes: a stat, never a read, never counted
    (upper / "small.txt").write_bytes(b"y" * 1000)
    changes = inspect_upper(upper, ManifestBase({}), BOUNDS)
    assert {c.path for c in changes} == {"holes.bin", "small.txt"}
    (upper / "big.bin").write_bytes(os.urandom(2 << 20))
    with pytest.raises(ChangeSetTooLarge) as exc:
        inspect_upper(upper, ManifestBase({}), BOUNDS)
    assert exc.value.limit == "changed_mb" and exc.value.allowed == 1 << 20


def test_the_copy_stager_counts_only_what_the_agent_added(tmp_path: Path) -> None:
    ws = tmp_path / "copy"
    _flood(ws, 300)  # the workspace itself: 301 entries, more than the agent's allowance
    _deep(ws / "flood", 30)  # and deeper than the depth bound
    base: Manifest = scan_tree(ws)
    assert list(inspect(ws, base, BOUNDS)) == []
    for i in range(100):
        (ws / f"new{i}").write_bytes(b"z")
    assert len(inspect(ws, base, BOUNDS)) == 100
    (ws / "one-more").write_bytes(b"z")
    with pytest.raises(ChangeSetTooLarge) as exc:
        inspect(ws, base, BOUNDS)
    assert (exc.value.limit, exc.value.measured) == ("changed_files", 101)


def test_a_deep_path_the_base_has_is_not_the_agents(tmp_path: Path) -> None:
    upper = _upper(tmp_path)
    _deep(upper, 25)  # the agent wrote only the leaf; the directories are copied-up parents
    base = ManifestBase(scan_tree(upper))
    leaf = "/".join(["d"] * 25) + "/leaf"
    del base.manifest[leaf]
    (c,) = inspect_upper(upper, base, BOUNDS)  # the leaf is 26 deep, under known directories
    assert c.path == leaf or pytest.fail("the leaf is the one change")
