"""The cgroup counter reader on a made-up cgroup tree (v1 and v2 layouts): where it looks, what it
parses, that it keeps the highest figures seen, and that it says why when it finds nothing. The
real kernel's files are read in tests/contract (a fork bomb under the engine)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from airlockd.sandbox import cgroups
from airlockd.sandbox.cgroups import CgroupWatch, locate

CID = "ab" * 32


def v1(root: Path, pids_events: str = "max 0\n", peak: str = "3\n") -> Path:
    d = root / "pids" / "docker" / CID
    d.mkdir(parents=True)
    (d / "pids.events").write_text(pids_events)
    (d / "pids.peak").write_text(peak)
    (d / "pids.current").write_text("2\n")
    m = root / "memory" / "docker" / CID
    m.mkdir(parents=True)
    (m / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    return d


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    return tmp_path


def test_locate_v1_and_v2_layouts(root: Path) -> None:
    assert locate(CID) == {}
    d = v1(root)
    assert locate(CID) == {"pids": d, "memory": root / "memory" / "docker" / CID}
    assert locate("cd" * 32) == {}  # only a directory named after the container


def test_locate_v2_systemd_scope(root: Path) -> None:
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    scope = root / "system.slice" / f"docker-{CID}.scope"
    scope.mkdir(parents=True)
    assert locate(CID) == {"pids": scope, "memory": scope}


def test_the_highest_figures_seen_are_kept(root: Path) -> None:
    d = v1(root)
    watch = CgroupWatch(CID).start()
    time.sleep(0.1)
    (d / "pids.events").write_text("max 2\n")
    (d / "pids.peak").write_text("64\n")
    time.sleep(0.1)
    (d / "pids.peak").write_text("1\n")  # a lower figure later never lowers what was seen
    (root / "memory" / "docker" / CID / "memory.oom_control").write_text("oom_kill 1\n")
    time.sleep(0.1)
    c = watch.finish()
    assert (c.pids_refused, c.pids_peak, c.oom_kills) == (2, 64, 1)
    assert c.source.startswith("cgroup v1 pids.events, pids.peak") and "memory.oom_control" in c.source


def test_a_cgroup_that_appears_after_the_start_is_found(root: Path) -> None:
    watch = CgroupWatch(CID).start()
    time.sleep(0.05)
    v1(root, pids_events="max 5\n")
    time.sleep(0.1)
    assert watch.finish().pids_refused == 5


def test_nothing_found_says_why(root: Path) -> None:
    asked: list[str] = []

    def engine_pid() -> int:
        asked.append("pid")
        return 1  # a running process whose cgroup is not the container's

    watch = CgroupWatch(CID, engine_pid).start()
    time.sleep(cgroups.POLL_S * cgroups.FIND_TRIES_BEFORE_ASKING * 3)
    c = watch.finish()
    assert asked == ["pid"]  # asked once, then gave up instead of polling for nothing
    assert (c.pids_refused, c.source) == (0, "") and "not visible" in c.unavailable
