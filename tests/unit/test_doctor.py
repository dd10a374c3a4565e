"""`airlockd doctor` reports whether the daemon can follow file events in the workspace."""

from __future__ import annotations

from pathlib import Path

import pytest

from airlockd.runs import doctor


def test_file_events_are_reported_with_the_directories_watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRLOCK_STATE_DIR", str(tmp_path / "state"))
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "c").mkdir()
    checks = {c["name"]: c for c in doctor.run_checks(ws)}
    events = checks["file events"]
    assert events["ok"], events
    assert events["detail"].startswith("inotify: 4 directories watched")
    assert "max_user_watches" in events["detail"]


def test_an_exhausted_watch_limit_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from airlockd.staging import watcher

    def full(fd: int, path: bytes, mask: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(watcher, "inotify_add_watch", full)
    monkeypatch.setenv("AIRLOCK_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "ws").mkdir()
    events = next(c for c in doctor.run_checks(tmp_path / "ws") if c["name"] == "file events")
    assert not events["ok"]
    assert "max_user_watches" in events["detail"] + events["fix"]


def test_the_detectors_prefilter_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Hyperscan is a dependency (x86-64), its absence is a broken install and a failure;
    elsewhere `re` alone is the way it works, and is said."""
    import platform

    from airlockd.staging import prefilter

    monkeypatch.setenv("AIRLOCK_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "ws").mkdir()

    def check() -> dict[str, object]:
        return next(c for c in doctor.run_checks(tmp_path / "ws") if c["name"] == "secret detectors")

    if platform.machine() == "x86_64":
        assert check()["ok"] and "Hyperscan" in str(check()["detail"])
    monkeypatch.setattr(prefilter, "_HS", False)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    missing = check()
    assert not missing["ok"] and "make setup" in str(missing["fix"])
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    assert check()["ok"] and "riscv64" in str(check()["detail"])
