"""The stat-cache mirror: refreshes read only what changed, racy entries are re-read, generations
keep a referenced mirror immutable, withheld files never enter, a crashed refresh rebuilds."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from merged import inspect_merged, stage_merged, unmount_merged

from airlockd.pipeline.manifest import ChangeKind, scan
from airlockd.policy import Level, Policy, load_policy
from airlockd.staging import overlay
from airlockd.staging.mirror import Mirror

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the mirror gives its files to the agent's uid")

OWNER = (1000, 1000)


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    return load_policy(tmp_path / "no-workspace").policy


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    for i in range(50):
        (root / "src" / f"d{i % 5}").mkdir(parents=True, exist_ok=True)
        (root / "src" / f"d{i % 5}" / f"f{i}.py").write_text(f"X = {i}\n")
    (root / ".env").write_text("TOKEN=never-in-the-mirror\n")
    return root


def settle() -> None:
    """Let the coarse filesystem clock move on, so what was just written is no longer racy."""
    time.sleep(0.02)


def refresh(m: Mirror, ws: Path, policy: Policy, **kw: object):  # type: ignore[no-untyped-def]
    return m.refresh(ws, policy, Level.INTERNAL, owner=OWNER, **kw)  # type: ignore[arg-type]


def test_warm_refresh_reads_nothing_and_base_is_the_mirror(tmp_path: Path, ws: Path, policy: Policy) -> None:
    m = Mirror(tmp_path / "mirror")
    v = refresh(m, ws, policy)
    assert v.stats.cold and v.stats.read == 50
    assert ".env" not in v.result.base and not (v.tree / ".env").exists()
    settle()
    refresh(m, ws, policy)  # the racy entries of the cold build are re-read once
    settle()
    v = refresh(m, ws, policy)
    assert (v.stats.read, v.stats.written, v.stats.removed) == (0, 0, 0)
    assert v.result.base == scan(v.tree)
    assert v.result.files == 50


def test_changes_are_copied_by_new_inode_and_deletions_removed(tmp_path: Path, ws: Path, policy: Policy) -> None:
    m = Mirror(tmp_path / "mirror")
    v = refresh(m, ws, policy)
    settle()
    refresh(m, ws, policy)
    ino = os.lstat(v.tree / "src/d1/f1.py").st_ino
    (ws / "src/d1/f1.py").write_text("X = 'changed'\n")
    (ws / "src/d2/f2.py").unlink()
    (ws / "src/d3").rename(ws / "src/moved")
    os.chmod(ws / "src/d4/f4.py", 0o755)
    (ws / "src/d0/f0.py").unlink()
    (ws / "src/d0/f0.py").mkdir()  # a file became a directory
    settle()
    v = refresh(m, ws, policy)
    assert (v.tree / "src/d1/f1.py").read_text() == "X = 'changed'\n"
    assert os.lstat(v.tree / "src/d1/f1.py").st_ino != ino  # never written in place
    assert not (v.tree / "src/d2/f2.py").exists() and not (v.tree / "src/d3").exists()
    assert (v.tree / "src/moved/f3.py").read_text() == "X = 3\n"
    assert v.result.base["src/d4/f4.py"].mode == 0o755
    assert (v.tree / "src/d0/f0.py").is_dir()
    assert v.stats.read == 1 + 10 + 1  # the edited file, the moved directory's files, the chmod
    assert v.result.base == scan(v.tree)
    assert all(os.lstat(p).st_uid == OWNER[0] for p in v.tree.rglob("*"))


def test_racy_entries_are_reread(tmp_path: Path, ws: Path, policy: Policy) -> None:
    """A write in the same clock tick as the refresh that cached a file leaves its stat data
    unchanged; the cache's stamp makes that entry racy, so the next refresh reads it anyway."""
    m = Mirror(tmp_path / "mirror")
    refresh(m, ws, policy)
    settle()
    refresh(m, ws, policy)
    f = ws / "src/d1/f1.py"
    st = os.lstat(f)
    cache_file = tmp_path / "mirror/cache.json"
    cache = json.loads(cache_file.read_bytes())
    f.write_text("X = 9\n")  # same size
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = os.lstat(f)
    # what a same-tick write looks like: the cache holds exactly today's stat data ...
    cache["files"]["src/d1/f1.py"][:5] = [now.st_size, now.st_mtime_ns, now.st_ctime_ns, now.st_ino, now.st_mode]
    cache["stamp"] = max(now.st_mtime_ns, now.st_ctime_ns)  # ... and was written in that tick
    cache_file.write_text(json.dumps(cache))
    v = refresh(m, ws, policy)
    assert (v.tree / "src/d1/f1.py").read_text() == "X = 9\n" and v.stats.read == 1
    # the same cache line, stamped a tick later, is trusted: the racy rule is what caught it
    f.write_text("X = 8\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = os.lstat(f)
    cache = json.loads(cache_file.read_bytes())
    cache["files"]["src/d1/f1.py"][:5] = [now.st_size, now.st_mtime_ns, now.st_ctime_ns, now.st_ino, now.st_mode]
    cache["stamp"] = max(now.st_mtime_ns, now.st_ctime_ns) + 1
    cache_file.write_text(json.dumps(cache))
    v = refresh(m, ws, policy)
    assert v.stats.read == 0 and (v.tree / "src/d1/f1.py").read_text() == "X = 9\n"


def test_a_file_that_gains_a_secret_leaves_the_mirror(tmp_path: Path, ws: Path, policy: Policy) -> None:
    m = Mirror(tmp_path / "mirror")
    refresh(m, ws, policy)
    (ws / "src/d1/f1.py").write_text("key = AKIA" + "IOSFODNN7EXAMPLE\n")
    v = refresh(m, ws, policy)
    assert not (v.tree / "src/d1/f1.py").exists()
    assert ("src/d1/f1.py", "detector:aws-access-key") in {(w.path, w.rule) for w in v.result.withheld}
    settle()
    v = refresh(m, ws, policy)  # from the cache: still withheld, still absent, not re-read
    assert not (v.tree / "src/d1/f1.py").exists() and "src/d1/f1.py" in {w.path for w in v.result.withheld}


def test_referenced_generation_is_never_mutated(tmp_path: Path, ws: Path, policy: Policy) -> None:
    m = Mirror(tmp_path / "mirror")
    live = {"r1"}
    v1 = refresh(m, ws, policy, run_id="r1", is_live=lambda r: r in live)
    (ws / "src/d1/f1.py").write_text("X = 'new'\n")
    (ws / "src/d2/f2.py").unlink()
    v2 = refresh(m, ws, policy, run_id="r2", is_live=lambda r: r in live | {"r2"})
    assert v2.generation == v1.generation + 1 and v2.stats.cloned
    assert (v1.tree / "src/d1/f1.py").read_text() == "X = 1\n" and (v1.tree / "src/d2/f2.py").exists()
    assert (v2.tree / "src/d1/f1.py").read_text() == "X = 'new'\n"
    live.clear()
    m.release("r1", is_live=lambda r: r == "r2")
    assert m.generations() == [v2.generation]


def test_unreferenced_generation_is_refreshed_in_place(tmp_path: Path, ws: Path, policy: Policy) -> None:
    m = Mirror(tmp_path / "mirror")
    v1 = refresh(m, ws, policy, run_id="r1", is_live=lambda r: False)
    (ws / "src/d1/f1.py").write_text("X = 'new'\n")
    v2 = refresh(m, ws, policy, run_id="r2", is_live=lambda r: False)  # r1 ended without release
    assert v2.generation == v1.generation and not v2.stats.cloned


def test_a_crashed_refresh_rebuilds_cold(
    tmp_path: Path, ws: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = Mirror(tmp_path / "mirror")
    v1 = refresh(m, ws, policy)
    (ws / "src/d1/f1.py").write_text("X = 'half'\n")
    real = os.rename

    def dies(*a: object, **kw: object) -> None:
        raise KeyboardInterrupt  # the process dies mid-refresh

    monkeypatch.setattr(os, "rename", dies)
    with pytest.raises(KeyboardInterrupt):
        refresh(m, ws, policy)
    monkeypatch.setattr(os, "rename", real)
    v = refresh(m, ws, policy)
    assert v.stats.cold and v.generation == v1.generation + 1 and m.generations() == [v.generation]
    assert v.result.base == scan(v.tree) and (v.tree / "src/d1/f1.py").read_text() == "X = 'half'\n"


def test_policy_change_rebuilds(tmp_path: Path, ws: Path, policy: Policy) -> None:
    m = Mirror(tmp_path / "mirror")
    refresh(m, ws, policy)
    (ws / "policies.toml").write_text('[withhold]\npatterns = ["src/d1/"]\n')
    v = refresh(m, ws, load_policy(ws).policy)
    assert v.stats.cold and not (v.tree / "src/d1").exists()


def test_upper_inspection_matches_a_full_diff(tmp_path: Path, ws: Path, policy: Policy) -> None:
    """Opaque directory, renamed directory, deleted directory, write-back identical, mode change,
    file over directory: the upper layer's change set equals diff(base, merged view)."""
    if why := overlay.unavailable(tmp_path):
        pytest.skip(why)
    from airlockd.pipeline.manifest import diff

    merged = tmp_path / "merged"
    res = stage_merged(ws, merged, policy, Level.INTERNAL, owner=OWNER)
    try:
        import shutil
        import subprocess

        script = (
            "set -e; mv src/d1 src/renamed; rm -rf src/d2; rm -rf src/d3; mkdir src/d3; echo n > src/d3/new;"
            " cat src/d4/f4.py > t; cat t > src/d4/f4.py; rm t; touch src/d0/f0.py; chmod 700 src/d0/f5.py;"
            " rm -rf src/d4/f9.py; rm src/d4/f14.py; mkdir src/d4/f14.py"
        )
        subprocess.run(["sh", "-c", script], cwd=merged, check=True)
        got = inspect_merged(merged, res.base)
        assert [(c.path, c.change) for c in got] == [(c.path, c.change) for c in diff(res.base, scan(merged))]
        kinds = {c.path: c.change for c in got}
        assert kinds["src/d3/f3.py"] == ChangeKind.DELETED and kinds["src/d3/new"] == ChangeKind.CREATED
        assert kinds["src/renamed/f1.py"] == ChangeKind.CREATED and kinds["src/d1"] == ChangeKind.DELETED
        assert kinds["src/d0/f5.py"] == ChangeKind.MODE_CHANGED and kinds["src/d4/f14.py"] == ChangeKind.TYPE_CHANGED
        assert "src/d4/f4.py" not in kinds and "src/d0/f0.py" not in kinds
        assert shutil.which("sh")
    finally:
        unmount_merged(merged)


def test_live_tree_from_the_refresh_equals_a_full_scan(tmp_path: Path, ws: Path, policy: Policy) -> None:
    from airlockd.evidence.document import live_tree
    from airlockd.staging.stagers import live_tree_of

    os.mkfifo(ws / "src/pipe")
    (ws / "src/link").symlink_to("d1/f1.py")
    (ws / "src/out").symlink_to("/etc/passwd")  # escapes: withheld
    (ws / "src/d2/f2.py").write_text("key = AKIA" + "IOSFODNN7EXAMPLE\n")  # withheld by content
    os.chmod(ws / "src/d3/f3.py", 0o711)
    m = Mirror(tmp_path / "mirror")
    for _ in range(2):  # cold, then from the cache
        res = refresh(m, ws, policy).result
        want = live_tree(ws, [w.path for w in res.withheld])
        got = live_tree_of(ws, res)
        assert (got["sha256"], got["entries"]) == (want["sha256"], want["entries"])
        settle()
