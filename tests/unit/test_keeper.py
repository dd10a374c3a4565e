"""The mirror keeper: incremental refreshes from inotify must leave exactly what a walk would.

The reference for every check is independent of the keeper: a cold walk of the workspace into a
fresh mirror (pipeline/mirror.py) and `evidence.live_tree` over the live workspace.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from airlockd.evidence.document import live_tree
from airlockd.pipeline.manifest import scan
from airlockd.policy import Level, load_policy
from airlockd.redact import Redactor
from airlockd.staging.keeper import MirrorKeeper
from airlockd.staging.mirror import Mirror, mirror_for
from airlockd.staging.stagers import live_tree_of

SECRET = "AKIA" + "Q" * 16  # an AWS access key id shape: the default detectors withhold it


def _policy(ws: Path):
    return load_policy(ws).policy


def _reference(ws: Path, tmp: Path):
    ref = Mirror(tmp / f"ref{random.random()}")
    view = ref.refresh(ws, _policy(ws), Level.INTERNAL)
    return view


def _same_as_walk(keeper_view, ws: Path, tmp: Path) -> None:
    ref = _reference(ws, tmp)
    assert scan(keeper_view.tree) == scan(ref.tree)
    assert keeper_view.result.base == ref.result.base
    assert {(w.path, w.rule) for w in keeper_view.result.withheld} == {(w.path, w.rule) for w in ref.result.withheld}
    assert {s.path for s in keeper_view.result.skipped} == {s.path for s in ref.result.skipped}
    assert (keeper_view.result.files, keeper_view.result.bytes) == (ref.result.files, ref.result.bytes)
    live = live_tree(ws, [w.path for w in ref.result.withheld])
    mine = keeper_view.live_tree or live_tree_of(ws, keeper_view.result)  # a walk's view has none
    assert mine["sha256"] == live["sha256"]
    shutil.rmtree(ref.tree.parent, ignore_errors=True)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "src" / "pkg").mkdir(parents=True)
    (w / "docs").mkdir()
    for i in range(30):
        (w / "src" / "pkg" / f"m{i}.py").write_text(f"x = {i}\n")
    (w / "README.md").write_text("hello\n")
    (w / ".env").write_text("TOKEN=abc\n")
    return w


@pytest.fixture
def keeper(ws: Path, tmp_path: Path):
    k = MirrorKeeper(ws, tmp_path / "state")
    assert k.start() is None
    yield k
    k.close()


def test_first_refresh_walks_then_nothing_changed_reads_nothing(keeper: MirrorKeeper, ws: Path, tmp_path: Path) -> None:
    first = keeper.refresh(_policy(ws), Level.INTERNAL)
    assert first.stats.cold and first.stats.read == 31
    again = keeper.refresh(_policy(ws), Level.INTERNAL)
    assert not again.stats.cold and again.stats.read == 0 and again.generation == first.generation
    _same_as_walk(again, ws, tmp_path)


def test_an_edit_is_read_alone(keeper: MirrorKeeper, ws: Path, tmp_path: Path) -> None:
    keeper.refresh(_policy(ws), Level.INTERNAL)
    (ws / "src" / "pkg" / "m3.py").write_text("x = 'changed'\n")
    view = keeper.refresh(_policy(ws), Level.INTERNAL)
    assert not view.stats.cold and view.stats.read == 1 and view.stats.written == 1
    assert (view.tree / "src" / "pkg" / "m3.py").read_text() == "x = 'changed'\n"
    _same_as_walk(view, ws, tmp_path)


def test_secrets_never_enter_and_their_values_are_learned(keeper: MirrorKeeper, ws: Path, tmp_path: Path) -> None:
    red = Redactor()
    keeper.refresh(_policy(ws), Level.INTERNAL, redactor=red)
    (ws / "docs" / "notes.txt").write_text(f"key = {SECRET}\n")
    (ws / "src" / ".env.local").write_text("PASSWORD=hunter2-but-longer\n")
    view = keeper.refresh(_policy(ws), Level.INTERNAL, redactor=red)
    assert not (view.tree / "docs" / "notes.txt").exists()
    assert not (view.tree / "src" / ".env.local").exists()
    assert SECRET not in red.text(f"x {SECRET} y")
    _same_as_walk(view, ws, tmp_path)
    (ws / "docs" / "notes.txt").write_text("no secret now\n")  # the detector's verdict follows the content
    view = keeper.refresh(_policy(ws), Level.INTERNAL, redactor=red)
    assert (view.tree / "docs" / "notes.txt").read_text() == "no secret now\n"
    _same_as_walk(view, ws, tmp_path)


def test_a_generation_in_use_is_cloned_not_changed(keeper: MirrorKeeper, ws: Path, tmp_path: Path) -> None:
    used = keeper.refresh(_policy(ws), Level.INTERNAL, run_id="r1")
    before = (used.tree / "README.md").read_text()
    (ws / "README.md").write_text("edited while r1 runs\n")
    nxt = keeper.refresh(_policy(ws), Level.INTERNAL, run_id="r2", is_live=lambda r: True)
    assert nxt.generation != used.generation and nxt.stats.cloned
    assert (used.tree / "README.md").read_text() == before
    assert (nxt.tree / "README.md").read_text() == "edited while r1 runs\n"
    _same_as_walk(nxt, ws, tmp_path)


def test_another_process_refreshing_makes_the_keeper_walk(keeper: MirrorKeeper, ws: Path, tmp_path: Path) -> None:
    keeper.refresh(_policy(ws), Level.INTERNAL)
    (ws / "README.md").write_text("changed\n")
    mirror_for(tmp_path / "state", Level.INTERNAL).refresh(ws, _policy(ws), Level.INTERNAL)  # a CLI run
    (ws / "docs" / "b.txt").write_text("b\n")
    view = keeper.refresh(_policy(ws), Level.INTERNAL)
    assert view.stats.read >= 1  # it walked (the stat cache still spared the untouched files)
    _same_as_walk(view, ws, tmp_path)


def test_a_dead_refresh_makes_the_next_one_cold(keeper: MirrorKeeper, ws: Path, tmp_path: Path) -> None:
    keeper.refresh(_policy(ws), Level.INTERNAL)
    (ws / "README.md").write_text("changed\n")
    mirror = mirror_for(tmp_path / "state", Level.INTERNAL)
    (mirror.root / "refreshing").write_text("1")  # as a process killed mid-refresh leaves it
    view = keeper.refresh(_policy(ws), Level.INTERNAL)
    assert view.stats.cold
    _same_as_walk(view, ws, tmp_path)


def test_the_log_replays_into_a_later_walk(keeper: MirrorKeeper, ws: Path, tmp_path: Path) -> None:
    """A walk after the keeper's incremental refreshes (a CLI run, a restarted daemon) trusts
    the cache the keeper logged: it reads nothing that did not change."""
    keeper.refresh(_policy(ws), Level.INTERNAL)
    os.utime(ws / "src" / "pkg" / "m1.py", ns=(10**18, 10**18))  # far from the racy window
    (ws / "docs" / "new.txt").write_text("new\n")
    os.utime(ws / "docs" / "new.txt", ns=(10**18, 10**18))
    keeper.refresh(_policy(ws), Level.INTERNAL)
    mirror = mirror_for(tmp_path / "state", Level.INTERNAL)
    assert (mirror.root / "cache.log").stat().st_size > 0
    keeper.close()
    walked = mirror.refresh(ws, _policy(ws), Level.INTERNAL)
    assert walked.stats.read == 0 and not walked.stats.cold
    _same_as_walk(walked, ws, tmp_path)


OPS = (
    "write",
    "append",
    "delete",
    "chmod",
    "mkdir",
    "rmtree",
    "rename",
    "rename_dir",
    "secret",
    "dotenv",
    "link_in",
    "link_out",
    "file_to_dir",
    "dir_to_file",
    "fifo",
)


def _mutate(ws: Path, rng: random.Random) -> str:
    files = [p for p in ws.rglob("*") if p.is_file() and not p.is_symlink()]
    dirs = [ws, *(p for p in ws.rglob("*") if p.is_dir() and not p.is_symlink())]
    op = rng.choice(OPS)
    d = rng.choice(dirs)
    name = f"n{rng.randrange(1000)}"
    if op == "write" or (not files and op in ("append", "delete", "chmod", "rename", "file_to_dir")):
        (d / f"{name}.txt").write_text(f"{name}\n" * rng.randrange(1, 5))
    elif op == "append":
        with open(rng.choice(files), "a") as fh:
            fh.write("more\n")
    elif op == "delete":
        rng.choice(files).unlink()
    elif op == "chmod":
        rng.choice(files).chmod(rng.choice([0o600, 0o644, 0o755]))
    elif op == "mkdir":
        (d / name / "inner").mkdir(parents=True, exist_ok=True)
        (d / name / "inner" / "f.txt").write_text("inner\n")
    elif op == "rmtree" and d != ws:
        shutil.rmtree(d)
    elif op == "rename":
        src = rng.choice(files)
        src.rename(rng.choice(dirs) / f"{name}.moved")
    elif op == "rename_dir" and d != ws:
        target = ws / f"{name}_dir"
        if not target.exists() and not str(ws / name).startswith(str(d) + "/"):
            d.rename(target)
    elif op == "secret":
        (d / f"{name}.cfg").write_text(f"aws = {SECRET}\n")
    elif op == "dotenv":
        (d / ".env").write_text("A=1\n")
    elif op == "link_in":
        with_target = rng.choice(files) if files else ws / "README.md"
        os.symlink(os.path.relpath(with_target, d), d / f"{name}.lnk")
    elif op == "link_out":
        os.symlink("../" * (len(d.relative_to(ws).parts) + 1) + "etc/passwd", d / f"{name}.out")
    elif op == "file_to_dir":
        f = rng.choice(files)
        f.unlink()
        f.mkdir()
        (f / "now_a_dir.txt").write_text("x\n")
    elif op == "dir_to_file" and d != ws:
        shutil.rmtree(d)
        d.write_text("was a directory\n")
    elif op == "fifo":
        os.mkfifo(d / f"{name}.fifo")
    return op


@pytest.mark.parametrize("seed", range(6))
def test_random_edits_leave_what_a_walk_would(keeper: MirrorKeeper, ws: Path, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    red = Redactor()
    keeper.refresh(_policy(ws), Level.INTERNAL, redactor=red)
    for _ in range(8):
        done = [_mutate(ws, rng) for _ in range(rng.randrange(1, 6))]
        view = keeper.refresh(_policy(ws), Level.INTERNAL, redactor=red)
        assert not view.stats.cold, done
        _same_as_walk(view, ws, tmp_path)


def test_walks_in_another_process_are_loaded_as_they_were_left(
    ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's keeper walks in `python -m airlockd.runs.mirrors` and loads the dump it left; what it then
    knows (and refreshes incrementally from) equals a walk made here."""
    from airlockd.runs.mirrors import walk_elsewhere
    from airlockd.state import StateDir

    monkeypatch.setenv("AIRLOCK_STATE_DIR", str(tmp_path / "states"))
    state = StateDir.for_workspace(ws).ensure()
    (ws / "lnk").symlink_to("README.md")
    (ws / "esc").symlink_to("../../outside")
    os.mkfifo(ws / "pipe")
    calls: list[Level] = []
    walk = walk_elsewhere(ws)
    k = MirrorKeeper(ws.resolve(), state.root, walker=lambda lvl: (calls.append(lvl), walk(lvl))[1])
    assert k.start() is None
    try:
        first = k.refresh(_policy(ws), Level.INTERNAL, run_id="r1")
        assert calls == [Level.INTERNAL]
        assert (mirror_for(state.root, Level.INTERNAL).root / "refs" / f"g{first.generation}" / "r1").exists()
        _same_as_walk(first, ws, tmp_path)
        (ws / "docs" / "c.txt").write_text("c\n")
        nxt = k.refresh(_policy(ws), Level.INTERNAL)
        assert calls == [Level.INTERNAL] and nxt.stats.read == 1  # incremental from the loaded state
        _same_as_walk(nxt, ws, tmp_path)
    finally:
        k.close()


def test_a_failing_walker_falls_back_to_walking_here(keeper: MirrorKeeper, ws: Path, tmp_path: Path) -> None:
    def broken(level: Level) -> None:
        raise RuntimeError("no process for you")

    keeper.walker = broken
    view = keeper.refresh(_policy(ws), Level.INTERNAL)
    assert view.stats.cold
    _same_as_walk(view, ws, tmp_path)


def test_a_walk_can_be_asked_for_and_is_due_after_a_while(keeper: MirrorKeeper, ws: Path, tmp_path: Path) -> None:
    """The daemon's upkeep asks for the periodic walk between runs; a run finds it due only if
    the upkeep did not come."""
    walks: list[Level] = []

    def walker(level: Level) -> None:
        walks.append(level)
        mirror_for(tmp_path / "state", level).refresh(ws, _policy(ws), level, dump=True)

    keeper.walker = walker
    keeper.refresh(_policy(ws), Level.INTERNAL)
    keeper.refresh(_policy(ws), Level.INTERNAL)
    assert len(walks) == 1  # the second was incremental
    keeper.refresh(_policy(ws), Level.INTERNAL, walk=True)
    assert len(walks) == 2
    keeper.walk_every_s = 0.0
    view = keeper.refresh(_policy(ws), Level.INTERNAL)
    assert len(walks) == 3
    _same_as_walk(view, ws, tmp_path)


def test_a_changed_file_in_a_withheld_directory_is_learned_never_mirrored(
    keeper: MirrorKeeper, ws: Path, tmp_path: Path
) -> None:
    (ws / ".aws").mkdir()
    (ws / ".aws" / "credentials").write_text("aws_secret_access_key = first-value-000\n")
    red = Redactor()
    keeper.refresh(_policy(ws), Level.INTERNAL, redactor=red)
    assert "first-value-000" not in red.text("x first-value-000 y")
    (ws / ".aws" / "credentials").write_text("aws_secret_access_key = rotated-value-111\n")
    view = keeper.refresh(_policy(ws), Level.INTERNAL, redactor=red)
    assert not view.stats.cold
    assert "rotated-value-111" not in red.text("x rotated-value-111 y")
    assert not (view.tree / ".aws").exists()
    _same_as_walk(view, ws, tmp_path)
