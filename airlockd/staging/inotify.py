"""The kernel's inotify interface, through ctypes: constants, event parsing, and the calls.

The calls are module-level functions so tests can replace them where they are used
(pipeline/watcher.py imports them by name).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import struct
import termios
from pathlib import Path
from typing import NamedTuple

# <sys/inotify.h>
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

EVENTS = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_MOVE_SELF
)
WATCH_MASK = EVENTS | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK

READ_SIZE = 64 * 1024  # far above one event's largest size (16 + NAME_MAX + 1, padded)
# Once everything queued when drain() began is read, read on at most this much more: a busy
# writer must not keep drain() from returning (the rest is the next drain's).
EXTRA_READ = 1024 * 1024
_HEADER = struct.Struct("@iIII")  # struct inotify_event: int wd; uint32 mask, cookie, len
GONE = (errno.ENOENT, errno.ENOTDIR)  # vanished, or replaced by a file or a symlink
EXHAUSTED = (errno.ENOSPC, errno.ENOMEM)


class WatchUnavailable(Exception):
    """The watcher cannot be used; the message says why and what to do about it."""


class Event(NamedTuple):
    wd: int  # -1 for IN_Q_OVERFLOW
    mask: int
    cookie: int
    name: str  # "" when the event is about the watched directory itself


def parse_events(buf: bytes) -> list[Event]:
    """Split what a read of an inotify descriptor returned into events (the kernel's
    `struct inotify_event`, native byte order; the name NUL-padded to `len` bytes, decoded with
    `os.fsdecode` so any byte string round-trips through `os.fsencode`). Raises ValueError on a
    truncated buffer (the kernel only ever returns whole events)."""
    events: list[Event] = []
    offset = 0
    end = len(buf)
    while offset < end:
        if end - offset < _HEADER.size:
            raise ValueError(f"truncated inotify event header at byte {offset}")
        wd, mask, cookie, length = _HEADER.unpack_from(buf, offset)
        offset += _HEADER.size
        if end - offset < length:
            raise ValueError(f"truncated inotify event name at byte {offset}")
        raw = buf[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        events.append(Event(wd, mask, cookie, os.fsdecode(raw) if raw else ""))
    return events


# --- libc, through ctypes. Module-level functions so tests can replace them. ---


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_init1.restype = ctypes.c_int
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_add_watch.restype = ctypes.c_int
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.inotify_rm_watch.restype = ctypes.c_int
    except AttributeError as e:
        raise WatchUnavailable(f"this C library has no inotify ({e}); the watcher needs Linux") from e
    return libc


def _oserror(filename: bytes | None = None) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, os.strerror(err), filename)


def inotify_init(flags: int) -> int:
    fd: int = _libc().inotify_init1(flags)
    if fd < 0:
        raise _oserror()
    return fd


def inotify_add_watch(fd: int, path: bytes, mask: int) -> int:
    """The watch descriptor of the directory at `path` (the same one again for an inode already
    watched). Raises OSError with the kernel's errno."""
    wd: int = _libc().inotify_add_watch(fd, path, mask)
    if wd < 0:
        raise _oserror(path)
    return wd


def inotify_rm_watch(fd: int, wd: int) -> None:
    if _libc().inotify_rm_watch(fd, wd) < 0:
        raise _oserror()


def inotify_read(fd: int, size: int) -> bytes:
    """One read of the non-blocking descriptor; BlockingIOError when nothing is queued."""
    return os.read(fd, size)


def pending_bytes(fd: int) -> int:
    """Bytes of events queued right now (FIONREAD)."""
    buf = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, buf, True)
    return int(struct.unpack("@i", buf)[0])


def sysctl(name: str) -> str:
    try:
        return Path("/proc/sys/fs/inotify", name).read_text().strip()
    except OSError:
        return "?"
