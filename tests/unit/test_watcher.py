"""The inotify tree watcher: every change whose system call returned before drain() is in drain()'s
answer (no sleeps anywhere: that synchronous queueing is what the daemon relies on); new
directories are watched and reported as trees; removed ones lose their watches; symlinks are not
followed; overflow, the watch limit and a vanished root turn into "everything"."""

from __future__ import annotations

import errno
import os
import random
import shutil
import stat
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airlockd.staging import watcher
from airlockd.staging.watcher import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_ISDIR,
    IN_Q_OVERFLOW,
    Changes,
    Event,
    TreeWatcher,
    WatchUnavailable,
    parse_events,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="inotify is Linux only")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "README").write_text("hi\n")
    return root


@pytest.fixture
def w(ws: Path) -> Iterator[TreeWatcher]:
    with TreeWatcher(ws) as tw:
        assert not tw.drain()  # building the fixture is not a change
        yield tw


def watched(tw: TreeWatcher) -> set[str]:
    return set(tw._paths.values())


def event_bytes(wd: int, mask: int, cookie: int = 0, name: bytes = b"") -> bytes:
    padded = name + b"\0" * (16 - len(name) % 16) if name else b""
    return struct.pack("@iIII", wd, mask, cookie, len(padded)) + padded


# --- the basic changes, each seen by the very next drain ---


def test_create_modify_chmod_delete_are_each_reported_immediately(w: TreeWatcher, ws: Path) -> None:
    f = ws / "src" / "new.py"
    f.write_text("a\n")
    assert w.drain() == Changes(paths={"src/new.py"})

    with f.open("a") as fh:
        fh.write("b\n")
    assert w.drain() == Changes(paths={"src/new.py"})

    f.chmod(0o600)
    assert w.drain() == Changes(paths={"src/new.py"})

    f.unlink()
    assert w.drain() == Changes(paths={"src/new.py"})


def test_write_without_close_is_already_visible(w: TreeWatcher, ws: Path) -> None:
    with (ws / "README").open("a") as fh:
        fh.write("more\n")
        fh.flush()
        assert w.drain().paths == {"README"}  # IN_MODIFY, before any close
    assert w.drain().paths == {"README"}  # and the close


def test_drain_twice_is_empty_the_second_time(w: TreeWatcher, ws: Path) -> None:
    (ws / "a.txt").write_text("1")
    (ws / "src" / "pkg" / "mod.py").write_text("X = 2\n")
    first = w.drain()
    assert first.paths == {"a.txt", "src/pkg/mod.py"} and not first.trees
    second = w.drain()
    assert not second and second == Changes() and not second.everything


def test_rename_file_reports_both_names(w: TreeWatcher, ws: Path) -> None:
    os.rename(ws / "README", ws / "src" / "README.md")
    assert w.drain().paths == {"README", "src/README.md"}


def test_mkdir_with_files_made_at_once_is_a_tree_then_later_changes_are_paths(w: TreeWatcher, ws: Path) -> None:
    d = ws / "src" / "fresh"
    d.mkdir()
    (d / "early.py").write_text("made before any watch could exist\n")
    got = w.drain()
    assert "src/fresh" in got.trees and "src/fresh" in got.paths
    assert "src/fresh" in watched(w)

    (d / "early.py").write_text("changed\n")
    (d / "late.py").write_text("new\n")
    assert w.drain() == Changes(paths={"src/fresh/early.py", "src/fresh/late.py"})


def test_nested_mkdir_p_is_watched_all_the_way_down(w: TreeWatcher, ws: Path) -> None:
    (ws / "a" / "b" / "c").mkdir(parents=True)
    (ws / "a" / "b" / "c" / "f").write_text("x")
    got = w.drain()
    assert "a" in got.trees
    assert {"a", "a/b", "a/b/c"} <= watched(w)

    (ws / "a" / "b" / "c" / "g").write_text("y")
    assert w.drain() == Changes(paths={"a/b/c/g"})


def test_renamed_directory_old_path_gone_new_tree_later_writes_use_new_name(w: TreeWatcher, ws: Path) -> None:
    os.rename(ws / "src", ws / "lib")
    got = w.drain()
    assert "src" in got.paths and "lib" in got.trees
    assert not any(p == "src" or p.startswith("src/") for p in watched(w))
    assert {"lib", "lib/pkg"} <= watched(w)

    (ws / "lib" / "pkg" / "mod.py").write_text("X = 3\n")
    assert w.drain() == Changes(paths={"lib/pkg/mod.py"})


def test_directory_moved_into_a_new_directory_before_drain_keeps_its_watches(w: TreeWatcher, ws: Path) -> None:
    # No MOVED_TO is queued (the new parent is not watched yet): the walk of "new" meets src's
    # inode, which already has a watch; the watch must follow it, not be removed by "src moved away".
    (ws / "new").mkdir()
    os.rename(ws / "src", ws / "new" / "src")
    got = w.drain()
    assert "src" in got.paths and "new" in got.trees
    assert {"new", "new/src", "new/src/pkg"} <= watched(w)
    assert not any(p == "src" or p.startswith("src/") for p in watched(w))

    (ws / "new" / "src" / "pkg" / "mod.py").write_text("X = 4\n")
    assert w.drain() == Changes(paths={"new/src/pkg/mod.py"})


def test_watches_follow_a_moved_directory_even_for_children_moved_out_in_the_same_batch(
    w: TreeWatcher, ws: Path, tmp_path: Path
) -> None:
    (ws / "new").mkdir()
    os.rename(ws / "src", ws / "new" / "src")
    os.rename(ws / "new" / "src" / "pkg", tmp_path / "pkg")  # reported on src's watch, now new/src
    got = w.drain()
    assert {"src", "new/src/pkg"} <= got.paths and "new" in got.trees
    assert watched(w) == {"", "new", "new/src"}  # no stale "src/pkg" watch left behind
    (tmp_path / "pkg" / "mod.py").write_text("outside now\n")
    assert not w.drain()


def test_directory_moved_out_of_the_tree_is_no_longer_watched(w: TreeWatcher, ws: Path, tmp_path: Path) -> None:
    os.rename(ws / "src", tmp_path / "elsewhere")
    assert w.drain() == Changes(paths={"src"})
    assert watched(w) == {""}
    (tmp_path / "elsewhere" / "pkg" / "mod.py").write_text("outside now\n")
    assert not w.drain()


def test_deleted_tree_is_reported_and_its_watches_dropped(w: TreeWatcher, ws: Path) -> None:
    shutil.rmtree(ws / "src")
    got = w.drain()
    assert {"src", "src/pkg", "src/pkg/mod.py"} <= got.paths and not got.trees
    assert watched(w) == {""}
    assert not w.drain()

    (ws / "src").write_text("a file where the directory was\n")
    assert w.drain() == Changes(paths={"src"})


def test_symlink_to_outside_directory_is_not_followed(w: TreeWatcher, ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / "link").symlink_to(outside, target_is_directory=True)
    got = w.drain()
    assert got == Changes(paths={"link"})  # the link itself is a change; not a tree to rescan
    assert "link" not in watched(w)

    (outside / "secret").write_text("not in the workspace\n")
    assert not w.drain()


def test_symlinked_directory_present_at_start_is_not_followed(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (ws / "link").symlink_to(outside, target_is_directory=True)
    with TreeWatcher(ws) as tw:
        assert watched(tw) == {"", "src", "src/pkg"}
        (outside / "x").write_text("1")
        assert not tw.drain()


def test_hostile_names_round_trip(w: TreeWatcher, ws: Path) -> None:
    raw = b"bad\xff\nname \x1b[31m"
    name = os.fsdecode(raw)
    (ws / name).write_bytes(b"x")
    got = w.drain()
    assert got.paths == {name}
    assert os.fsencode(next(iter(got.paths))) == raw

    d = os.fsdecode(b"dir\n\xfe")
    (ws / d).mkdir()
    assert d in w.drain().trees
    (ws / d / name).write_bytes(b"y")
    (path,) = w.drain().paths
    assert os.fsencode(path) == os.fsencode(d) + b"/" + raw


# --- parsing ---


def test_parse_events_hand_built_buffer() -> None:
    buf = (
        event_bytes(1, IN_CREATE | IN_ISDIR, 0, b"newdir")
        + event_bytes(2, IN_CLOSE_WRITE, 0, b"\xffx")
        + event_bytes(-1, IN_Q_OVERFLOW)
        + event_bytes(3, watcher.IN_MOVED_FROM, 77, b"exactly16bytes!!")
    )
    assert parse_events(buf) == [
        Event(1, IN_CREATE | IN_ISDIR, 0, "newdir"),
        Event(2, IN_CLOSE_WRITE, 0, os.fsdecode(b"\xffx")),
        Event(-1, IN_Q_OVERFLOW, 0, ""),
        Event(3, watcher.IN_MOVED_FROM, 77, "exactly16bytes!!"),
    ]
    assert parse_events(b"") == []
    with pytest.raises(ValueError):
        parse_events(buf[:-3])
    with pytest.raises(ValueError):
        parse_events(buf[:10])


# --- when the watcher cannot be sure ---


def test_queue_overflow_reports_everything_and_rewatches_the_tree(
    w: TreeWatcher, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_read = watcher.inotify_read
    calls = 0

    def overflowed(fd: int, size: int) -> bytes:
        # What a real overflow looks like: the queued events are lost, one IN_Q_OVERFLOW remains.
        nonlocal calls
        calls += 1
        if calls > 1:
            return real_read(fd, size)
        while True:
            try:
                real_read(fd, size)
            except BlockingIOError:
                break
        return event_bytes(-1, IN_Q_OVERFLOW)

    (ws / "lost").mkdir()  # its IN_CREATE is dropped with the overflow
    monkeypatch.setattr(watcher, "inotify_read", overflowed)
    got = w.drain()
    assert got.everything and got
    assert w.broken is None
    assert "lost" in watched(w)  # the whole tree was watched again

    monkeypatch.setattr(watcher, "inotify_read", real_read)
    (ws / "lost" / "f").write_text("x")
    assert w.drain() == Changes(paths={"lost/f"})


def test_watch_limit_at_start_raises_watch_unavailable(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = watcher.inotify_add_watch
    count = 0

    def limited(fd: int, path: bytes, mask: int) -> int:
        nonlocal count
        count += 1
        if count > 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real(fd, path, mask)

    monkeypatch.setattr(watcher, "inotify_add_watch", limited)
    tw = TreeWatcher(ws)
    with pytest.raises(WatchUnavailable, match="max_user_watches"):
        tw.start()
    with pytest.raises(RuntimeError):
        tw.fileno()  # it cleaned up after itself


def test_watch_limit_during_drain_breaks_the_watcher(w: TreeWatcher, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, path: bytes, mask: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(watcher, "inotify_add_watch", full)
    (ws / "newdir").mkdir()
    assert w.drain().everything
    assert w.broken is not None and "max_user_watches" in w.broken
    assert w.drain().everything  # from then on, every time
    (ws / "README").write_text("x")
    assert w.drain().everything


def test_root_deleted_or_moved_breaks_the_watcher(ws: Path, tmp_path: Path) -> None:
    with TreeWatcher(ws) as tw:
        os.rename(ws, tmp_path / "moved")
        assert tw.drain().everything
        assert tw.broken is not None and "moved" in tw.broken
    with TreeWatcher(tmp_path / "moved") as tw:
        shutil.rmtree(tmp_path / "moved")
        assert tw.drain().everything
        assert tw.broken is not None
        assert tw.drain().everything


def test_unwatchable_directory_is_a_tree_every_drain_until_it_can_be_watched(
    ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (ws / "locked" / "sub").mkdir(parents=True)
    real = watcher.inotify_add_watch
    denied = True

    def maybe(fd: int, path: bytes, mask: int) -> int:
        if denied and path.endswith(b"/locked"):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real(fd, path, mask)

    monkeypatch.setattr(watcher, "inotify_add_watch", maybe)
    with TreeWatcher(ws) as tw:
        assert "locked" not in watched(tw)
        assert tw.drain().trees == {"locked"}
        assert tw.drain().trees == {"locked"}
        denied = False
        assert tw.drain().trees == {"locked"}  # watched now: rescanned one last time
        assert {"locked", "locked/sub"} <= watched(tw)
        assert not tw.drain()
        (ws / "locked" / "sub" / "f").write_text("x")
        assert tw.drain() == Changes(paths={"locked/sub/f"})


def test_missing_or_symlinked_root_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(WatchUnavailable, match="root"):
        TreeWatcher(tmp_path / "nope").start()
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    with pytest.raises(WatchUnavailable, match="symlink"):
        TreeWatcher(tmp_path / "alias").start()


# --- the data type and the life cycle ---


def test_changes_merge_everything_and_truth() -> None:
    a = Changes(paths={"x"})
    a.merge(Changes(paths={"y"}, trees={"d"}))
    assert a == Changes(paths={"x", "y"}, trees={"d"})
    assert a and not a.everything
    assert not Changes()
    a.merge(Changes(trees={""}))
    assert a.everything


def test_close_is_idempotent_and_releases_the_descriptor(ws: Path) -> None:
    tw = TreeWatcher(ws)
    tw.start()
    fd = tw.fileno()
    os.fstat(fd)
    tw.close()
    tw.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    with pytest.raises(RuntimeError, match="closed"):
        tw.drain()


def test_context_manager_starts_and_closes(ws: Path) -> None:
    with TreeWatcher(ws) as tw:
        assert tw.fileno() >= 0
        assert watched(tw) == {"", "src", "src/pkg"}
    with pytest.raises(RuntimeError):
        tw.fileno()


# --- never missing a change: random batches of operations against lstat snapshots ---

State = dict[str, tuple[int, int, int, int, bytes]]


def snapshot(root: Path) -> State:
    state: State = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, root)
            if stat.S_ISDIR(st.st_mode):  # its mtime and size follow its entries: their paths say that
                state[rel] = (st.st_mode, 0, 0, st.st_ino, b"")
            else:
                body = Path(full).read_bytes() if stat.S_ISREG(st.st_mode) else os.readlink(full).encode()
                state[rel] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino, body)
    return state


def covered(path: str, changes: Changes, gone: bool) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(len(parts) + 1)]  # "", a, a/b, ... path
    if path in changes.paths or any(p in changes.trees for p in prefixes):
        return True
    return gone and any(p in changes.paths for p in prefixes[1:])


def random_op(rng: random.Random, root: Path, outside: Path) -> None:
    entries = sorted(snapshot(root))
    dirs = [""] + [e for e in entries if (root / e).is_dir() and not (root / e).is_symlink()]
    files = [e for e in entries if (root / e).is_file() and not (root / e).is_symlink()]
    parent = root / rng.choice(dirs)
    name = f"n{rng.randrange(30)}"
    op = rng.choice(["create", "write", "chmod", "unlink", "mkdir", "mkdirs", "rmtree", "rename", "out_in", "link"])
    try:
        if op == "create" or (op == "write" and not files):
            (parent / name).write_text(str(rng.random()))
        elif op == "write":
            with (root / rng.choice(files)).open("a") as fh:
                fh.write("+")
        elif op == "chmod":
            (root / rng.choice(dirs + files)).chmod(rng.choice([0o755, 0o700, 0o750]))  # owner keeps rwx
        elif op == "unlink" and files:
            (root / rng.choice(files)).unlink()
        elif op == "mkdir":
            (parent / name).mkdir()
            (parent / name / "f").write_text("early")
        elif op == "mkdirs":
            (parent / name / "x" / "y").mkdir(parents=True)
            (parent / name / "x" / "y" / "f").write_text("deep")
        elif op == "rmtree" and len(dirs) > 1:
            shutil.rmtree(root / rng.choice(dirs[1:]))
        elif op == "rename" and entries:
            src = root / rng.choice(entries)
            dst = root / rng.choice(dirs) / name
            if not str(dst).startswith(str(src) + "/"):
                os.rename(src, dst)
        elif op == "out_in" and len(dirs) > 1:
            src = root / rng.choice(dirs[1:])
            os.rename(src, outside / "tmp")
            (outside / "tmp" / "while-out").write_text("x")
            os.rename(outside / "tmp", parent / name if parent.exists() else root / name)
        elif op == "link":
            (parent / name).symlink_to(outside)
    except OSError:
        pass  # a name taken, a directory not empty, a target below its source: try another op


@pytest.mark.parametrize("seed", range(6))
def test_random_batches_never_miss_a_change(tmp_path: Path, ws: Path, seed: int) -> None:
    rng = random.Random(seed)
    outside = tmp_path / "outside"
    outside.mkdir()
    with TreeWatcher(ws) as tw:
        before = snapshot(ws)
        for _ in range(60):
            for _ in range(rng.randint(1, 8)):
                random_op(rng, ws, outside)
            got = tw.drain()
            after = snapshot(ws)
            assert not got.everything and tw.broken is None
            for path in before.keys() | after.keys():
                if before.get(path) != after.get(path):
                    assert covered(path, got, gone=path not in after), (path, got)
            before = after
        assert watched(tw) == {""} | {p for p, v in before.items() if stat.S_ISDIR(v[0])}
