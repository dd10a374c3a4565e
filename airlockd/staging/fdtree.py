"""Reading and writing trees through directory file descriptors: `openat` and friends with
`O_NOFOLLOW` everywhere, so a symlink is never followed, a directory swapped for a link mid-walk
is never entered, and path length never limits depth. The stagers (pipeline/staging.py,
mirrorstager.py) and inspection build on these."""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator

from airlockd.pipeline.manifest import Entry, Kind, kind_of

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a fifo swapped in for a file between listing and opening never blocks the walk.
O_SRC = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_DST = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20
# A file whose allocated blocks fall this far short of its size is sparse: its holes read as zeros
# at the cost of its full size, so it is never read (an agent's 1 TB sparse file costs a stat).
SPARSE_SLACK = 1 << 20


def is_sparse(st: os.stat_result) -> bool:
    return st.st_blocks * 512 + SPARSE_SLACK < st.st_size


MAX_READ = 0x7FFFF000  # the most one read(2) returns on Linux, whatever was asked


def read_all(fd: int, size: int) -> bytes:
    """The whole regular file open as `fd`, `size` bytes expected (more are read if it grew)."""
    data = os.read(fd, size + 1)  # a short read of a regular file is its end, unless read(2)'s own cap
    if len(data) <= size and len(data) < MAX_READ:
        return data
    parts = [data]
    while chunk := os.read(fd, CHUNK):
        parts.append(chunk)
    return b"".join(parts)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def walk_fds(root_fd: int) -> Iterator[tuple[int, str, os.DirEntry[str]]]:
    """(fd of its directory, relative path, entry) for every node under `root_fd`, depth first
    and sorted, never following a link, holding one descriptor per level (never one per
    directory). A directory that vanishes before it is entered is passed over; other errors
    raise OSError."""
    stack: list[tuple[int, str, list[str]]] = []
    try:
        fd, prefix = os.dup(root_fd), ""
        while True:
            subdirs: list[str] = []
            stack.append((fd, prefix, subdirs))
            with os.scandir(fd) as it:
                entries = sorted(it, key=lambda de: de.name)
            for de in entries:
                yield fd, prefix + de.name, de
                if de.is_dir(follow_symlinks=False):
                    subdirs.append(de.name)
            subdirs.reverse()
            while stack:
                parent, parent_prefix, pending = stack[-1]
                if not pending:
                    os.close(stack.pop()[0])
                    continue
                name = pending.pop()
                try:
                    fd = os.open(name, O_DIR, dir_fd=parent)
                except FileNotFoundError:
                    continue
                prefix = f"{parent_prefix}{name}/"
                break
            else:
                return
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def open_dir(root_fd: int, rel: str) -> int:
    """A descriptor of directory `rel` under `root_fd`, opened one component at a time without
    following links (so depth is never limited by PATH_MAX); the caller closes it."""
    fd = os.dup(root_fd)
    for part in filter(None, rel.split("/")):
        try:
            nxt = os.open(part, O_DIR, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def entry_at(dir_fd: int, name: str, st: os.stat_result) -> Entry:
    """The manifest entry of one node, hashing a file through an fd opened without following
    links and checked to be the node that was listed. A sparse file (`is_sparse`) is not read:
    its entry has its size and no SHA-256, which no commit accepts."""
    kind = kind_of(st.st_mode)
    mode = stat.S_IMODE(st.st_mode)
    if kind is Kind.SYMLINK:
        return Entry(kind, mode, 0, None, os.readlink(name, dir_fd=dir_fd))
    if kind is not Kind.FILE:
        return Entry(kind, mode)
    fd = os.open(name, O_SRC, dir_fd=dir_fd)
    try:
        now = os.fstat(fd)
        if (now.st_ino, now.st_dev) != (st.st_ino, st.st_dev):
            raise FileNotFoundError(errno.ENOENT, "replaced while scanning", name)
        if is_sparse(now):  # judged from the inode, never read: no hash (classify denies it)
            return Entry(kind, stat.S_IMODE(now.st_mode), now.st_size, None)
        h = hashlib.sha256()
        size = 0
        while chunk := os.read(fd, CHUNK):
            h.update(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    return Entry(kind, stat.S_IMODE(now.st_mode), size, h.hexdigest())
