"""Filesystem discipline shared by every writer: temp file -> fsync -> os.replace -> fsync dir."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def syncfs(path: str | os.PathLike[str]) -> None:
    """Flush the whole filesystem holding `path` in one call (one barrier for many files)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` so that readers see the old or the new content, never a mix."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


# The state's file locks are held for a few milliseconds at a time (by runs, the daemon, the CLI): a
# waiter looks again every 2 ms, not filelock's default 50 ms, which a run paid several times over
# whenever a daemon read the store meanwhile.
LOCK_POLL_S = 0.002


def remove_tree(path: Path) -> None:
    """Remove `path` and everything below it, however deep, never following a link: `rm -rf`
    (Python 3.11's `shutil.rmtree` recurses once a level and dies past about 1,000; a tree an
    agent made may be deeper). Never raises; what cannot be removed stays."""
    import subprocess

    if os.path.lexists(path):
        subprocess.run(["rm", "-rf", "--", str(path)], capture_output=True, check=False)


def tree_bytes(path: Path) -> int:
    """Bytes under `path` by allocated blocks, links not followed, without recursion."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0
    total = st.st_blocks * 512
    stack = [str(path)] if stat.S_ISDIR(st.st_mode) else []
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for de in it:
                    try:
                        sub = de.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue
                    total += sub.st_blocks * 512
                    if stat.S_ISDIR(sub.st_mode):
                        stack.append(de.path)
        except (FileNotFoundError, NotADirectoryError):
            continue
    return total
