"""A recursive inotify watcher of a workspace tree (Linux): "what changed since I last asked?".

The daemon keeps a mirror of the workspace up to date. Rather than walking every file before each
run, it asks a `TreeWatcher` what changed since the previous `drain()`. The answer may be larger
than the truth (extra paths are harmless: the mirror re-stats them and finds nothing new) but must
never be smaller for a change inotify can see; when the watcher cannot be sure (queue overflow,
watch limit reached, root moved or deleted) it answers "everything" (`""` in `Changes.trees`).

Design. One inotify instance (`inotify_init1(IN_NONBLOCK|IN_CLOEXEC)`, through ctypes on libc)
and one watch per directory under the root, added by a walk that never follows symlinks
(`os.scandir`, `is_dir(follow_symlinks=False)`, and `IN_ONLYDIR|IN_DONT_FOLLOW` on every watch;
`IN_EXCL_UNLINK` so writes through a descriptor of an unlinked file are not reported). The watcher
keeps `wd -> relative directory` and the reverse. An event named N in directory D reports `D/N`.
A directory created or moved in is walked (watches added) and reported in `trees`: files may
have been created in it before its watch existed, so the consumer rescans that whole subtree. A
directory deleted or moved away loses its watches and those of every watched directory below it;
its old path is reported. A move inside the tree is thus a removal plus an addition; cookies are
never used to re-map paths. The only re-mapping is by identity: when a walk meets an inode that
already has a watch (the kernel returns the same wd for the same inode), that directory was moved
and the map renames it (and everything mapped below it) to where it is now.

Ordering guarantee. The kernel queues an inotify event before the system call that caused it
returns. So every change under the root whose system call completed before `drain()` was called
is in the result of that call (or of an earlier one): no sleeping or settling is needed. For a
directory reported in `trees`, its watches are in place before `drain()` returns, and each
directory is watched before it is listed; a scan of that subtree started after `drain()` returns
sees everything done before the watches existed, and everything after is queued for the next
`drain()`. The consumer's protocol is therefore: `start()`, then a full scan as the baseline; then
repeatedly `drain()` and rescan what it reports. A change made while the consumer rescans is
reported again next time (harmless).

Limits (caught by the daemon's periodic full walks elsewhere):

- a write through a shared `mmap` produces no event unless a later write, close or utime does;
- a file hard-linked from outside the tree and modified through that outside path produces no
  event here; a directory visible at two places in the tree (a bind mount) is reported under one;
- changes made by another machine on a network filesystem (NFS, some FUSE) are not seen;
- a directory that cannot be watched (no read permission, a path longer than PATH_MAX) is not
  watched; it is reported in `trees` on every `drain()` and retried each time, so the consumer
  rescans it until a watch succeeds (for a consumer running as the same user it is as unreadable);
- attribute changes of the root directory itself are not reported (`""` is never a path);
- `fs.inotify.max_user_watches` bounds the number of directories (one watch each);
  `fs.inotify.max_user_instances` the number of watchers; `fs.inotify.max_queued_events` how much
  can happen between two drains before the queue overflows (which costs a full rescan, not
  correctness);
- removing a directory costs a scan of the watch map (O(watched directories)).

Not thread-safe: one owner calls `start`, `drain` and `close`.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from airlockd.names import under
from airlockd.staging.inotify import (
    EVENTS,
    EXHAUSTED,
    EXTRA_READ,
    GONE,
    IN_ATTRIB,
    IN_CLOEXEC,
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_DONT_FOLLOW,
    IN_EXCL_UNLINK,
    IN_IGNORED,
    IN_ISDIR,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_NONBLOCK,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    IN_UNMOUNT,
    READ_SIZE,
    WATCH_MASK,
    Event,
    WatchUnavailable,
    inotify_add_watch,
    inotify_init,
    inotify_read,
    inotify_rm_watch,
    parse_events,
    pending_bytes,
    sysctl,
)

__all__ = [
    "EVENTS",
    "IN_ATTRIB",
    "IN_CLOEXEC",
    "IN_CLOSE_WRITE",
    "IN_CREATE",
    "IN_DELETE",
    "IN_DELETE_SELF",
    "IN_DONT_FOLLOW",
    "IN_EXCL_UNLINK",
    "IN_IGNORED",
    "IN_ISDIR",
    "IN_MODIFY",
    "IN_MOVED_FROM",
    "IN_MOVED_TO",
    "IN_MOVE_SELF",
    "IN_NONBLOCK",
    "IN_ONLYDIR",
    "IN_Q_OVERFLOW",
    "IN_UNMOUNT",
    "READ_SIZE",
    "WATCH_MASK",
    "Changes",
    "Event",
    "TreeWatcher",
    "WatchUnavailable",
    "parse_events",
]


class _Exhausted(Exception):
    """A watch could not be added for lack of kernel resources (the watch limit, memory)."""


@dataclass
class Changes:
    """What may have changed. Always a superset of what did change (for what inotify can see).

    `paths`: workspace-relative POSIX paths (no leading "/"; "" is never one) of nodes that may have
    been created, modified, had their attributes changed, been deleted, or been moved away or in.
    `trees`: relative directories whose whole subtree must be rescanned (created or moved in, so
    files may have been made in them before their watch existed; or unwatchable). `""` means the
    whole workspace: the watcher could not be sure of anything. A directory whose entries changed
    (so its own mtime and size did) is implied by those entries' paths, not listed itself.
    """

    paths: set[str] = field(default_factory=set)
    trees: set[str] = field(default_factory=set)

    def merge(self, other: Changes) -> None:
        """Add what `other` reports to this one."""
        self.paths |= other.paths
        self.trees |= other.trees

    @property
    def everything(self) -> bool:
        """The whole workspace must be rescanned."""
        return "" in self.trees

    def __bool__(self) -> bool:
        return bool(self.paths or self.trees)


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


class TreeWatcher:
    """Watches every directory under `root` and reports what changed between two `drain()` calls.

    `broken` is None while the watcher can vouch for its answers; once set (the root was moved,
    deleted or unmounted; a watch could not be added for lack of kernel resources) it says why, and
    every `drain()` from then on reports everything. A new watcher (after raising the limit, or
    for the new root) is the way back.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._root_b = os.fsencode(self.root)
        self.broken: str | None = None
        self._fd: int | None = None
        self._closed = False
        self._root_wd: int | None = None
        self._paths: dict[int, str] = {}  # wd -> relative directory ("" for the root)
        self._wds: dict[str, int] = {}  # relative directory -> wd (the reverse)
        self._unwatchable: set[str] = set()  # directories a watch or a listing was refused for

    # --- life cycle ---

    def start(self) -> None:
        """Create the inotify instance and watch every directory under the root.

        Raises WatchUnavailable (with the kernel's reason and what to do) when inotify cannot be
        used: no inotify in this kernel (ENOSYS), too many instances (EMFILE:
        `fs.inotify.max_user_instances`), the watch limit (ENOSPC: `fs.inotify.max_user_watches`),
        or a root that is missing, not a directory, a symlink or unreadable. Subdirectories that
        vanish during the walk are skipped (their removal is an event); ones that cannot be watched
        are reported by every `drain()` until they can be.
        """
        if self._fd is not None or self._closed:
            raise RuntimeError("a TreeWatcher can be started once")
        try:
            self._fd = inotify_init(IN_NONBLOCK | IN_CLOEXEC)
        except OSError as e:
            raise WatchUnavailable(self._init_reason(e)) from e
        try:
            try:
                self._root_wd = inotify_add_watch(self._fd, self._root_b, WATCH_MASK)
            except OSError as e:
                if e.errno in EXHAUSTED:
                    raise _Exhausted(self._limit_reason(e)) from e
                raise WatchUnavailable(
                    f"cannot watch the workspace root {self.root}: {e.strerror} (it must be an existing, "
                    "readable directory and not a symlink: pass the resolved path)"
                ) from e
            self._watch_tree("")
        except _Exhausted as e:
            self.close()
            raise WatchUnavailable(str(e)) from e
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the inotify instance (and with it every watch). Idempotent."""
        self._closed = True
        fd, self._fd = self._fd, None
        self._paths.clear()
        self._wds.clear()
        self._unwatchable.clear()
        if fd is not None:
            os.close(fd)

    @property
    def watching(self) -> int:
        """How many directories are watched now."""
        return len(self._paths)

    def fileno(self) -> int:
        """The inotify descriptor: readable (for select/poll) when events are queued."""
        return self._require_fd()

    def __enter__(self) -> TreeWatcher:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- the question ---

    def drain(self) -> Changes:
        """Everything that may have changed since the previous drain (or since `start()`).

        Never blocks: reads every event queued when it was called (and at most a bounded amount
        queued meanwhile), in the kernel's order. Every change whose system call completed before
        this call is in the result. Directories created or moved in are watched before this
        returns and are listed in `trees`. After a queue overflow the result is everything and the
        whole tree is watched again; once `broken` is set, every result is everything.
        """
        fd = self._require_fd()
        out = Changes()
        target = pending_bytes(fd) + EXTRA_READ
        consumed = 0
        while consumed < target:
            try:
                buf = inotify_read(fd, READ_SIZE)
            except BlockingIOError:
                break
            if not buf:
                break
            consumed += len(buf)
            if self.broken is not None:
                continue  # empty the queue; the answer is already everything
            try:
                for event in parse_events(buf):
                    self._handle(event, out)
                    if self.broken is not None:
                        break
            except _Exhausted as e:
                self.broken = str(e)
        if self.broken is None:
            try:
                self._retry_unwatchable(out)
            except _Exhausted as e:
                self.broken = str(e)
        if self.broken is not None:
            out.trees.add("")
        return out

    # --- events ---

    def _handle(self, event: Event, out: Changes) -> None:
        mask = event.mask
        if event.wd == -1:
            if mask & IN_Q_OVERFLOW:
                out.trees.add("")
                self._rewatch_all()
            return
        if mask & IN_UNMOUNT:
            self._break(out, f"a filesystem under the workspace {self.root} was unmounted")
            return
        if mask & IN_IGNORED:
            if event.wd == self._root_wd:
                self._break(out, f"the watch on the workspace root {self.root} was removed")
            else:
                self._unmap(event.wd)
            return
        parent = self._paths.get(event.wd)
        if parent is None:
            return  # a watch already removed; its directory's fate was reported
        if not event.name:
            if event.wd == self._root_wd and mask & (IN_DELETE_SELF | IN_MOVE_SELF):
                what = "deleted" if mask & IN_DELETE_SELF else "moved"
                self._break(out, f"the workspace root {self.root} was {what}")
            elif parent:
                out.paths.add(parent)  # the directory itself (attributes, deleted, moved)
            return
        path = _join(parent, event.name)
        out.paths.add(path)
        if mask & IN_ISDIR:
            if mask & (IN_CREATE | IN_MOVED_TO):
                self._watch_tree(path)
                out.trees.add(path)
            elif mask & (IN_DELETE | IN_MOVED_FROM):
                self._forget(path)

    def _break(self, out: Changes, reason: str) -> None:
        self.broken = reason
        out.trees.add("")

    # --- the watch map ---

    def _abs(self, rel: str) -> bytes:
        return self._root_b + b"/" + os.fsencode(rel) if rel else self._root_b

    def _watch_tree(self, top: str) -> None:
        """Watch `top` and every directory below it, each before listing it. Idempotent (the
        kernel returns the existing wd for a watched inode). Raises _Exhausted on ENOSPC/ENOMEM."""
        fd = self._require_fd()
        seen: set[int] = set()
        stack = [top]
        while stack:
            rel = stack.pop()
            path = self._abs(rel)
            try:
                wd = inotify_add_watch(fd, path, WATCH_MASK)
            except OSError as e:
                if e.errno in EXHAUSTED:
                    raise _Exhausted(self._limit_reason(e)) from e
                if e.errno not in GONE:
                    self._unwatchable.add(rel)  # EACCES, ENAMETOOLONG, ELOOP...: rescanned each drain
                continue
            old = self._paths.get(wd)
            if wd in seen or (old is not None and rel and (old == "" or rel.startswith(old + "/"))):
                continue  # the same directory again below itself (a bind mount): a loop
            seen.add(wd)
            self._map(wd, rel)
            try:
                with os.scandir(path) as entries:
                    for entry in entries:
                        try:
                            is_dir = entry.is_dir(follow_symlinks=False)
                        except OSError:
                            continue  # gone, or unstatable: its own event or its parent's covers it
                        if is_dir:
                            stack.append(_join(rel, os.fsdecode(entry.name)))
            except OSError as e:
                if e.errno not in GONE:
                    self._unwatchable.add(rel)  # watched but not listable: walk it again later
                continue
            self._unwatchable.discard(rel)

    def _map(self, wd: int, rel: str) -> None:
        old = self._paths.get(wd)
        if old is not None and old != rel:
            # The kernel gave back a watched inode's wd: that directory moved from `old` to `rel`,
            # and the directories watched below it moved with it.
            for other, path in list(self._paths.items()):
                if under(path, old):
                    moved = rel + path[len(old) :]
                    self._paths[other] = moved
                    if self._wds.get(path) == other:
                        del self._wds[path]
                    self._wds[moved] = other
        self._paths[wd] = rel
        self._wds[rel] = wd

    def _unmap(self, wd: int) -> None:
        rel = self._paths.pop(wd, None)
        if rel is not None and self._wds.get(rel) == wd:
            del self._wds[rel]

    def _forget(self, top: str) -> None:
        """`top` was deleted or moved away: stop watching it and every watched directory below."""
        fd = self._require_fd()
        for wd, path in list(self._paths.items()):
            if under(path, top):
                self._unmap(wd)
                try:
                    inotify_rm_watch(fd, wd)
                except OSError as e:
                    if e.errno != errno.EINVAL:  # EINVAL: the kernel already dropped it
                        raise
        self._unwatchable = {rel for rel in self._unwatchable if not under(rel, top)}

    def _rewatch_all(self) -> None:
        """After an overflow: watch the whole tree again from scratch, drop watches on directories
        no longer in it."""
        fd = self._require_fd()
        before = set(self._paths)
        self._paths.clear()
        self._wds.clear()
        self._unwatchable.clear()
        self._watch_tree("")
        if self._wds.get("") != self._root_wd:
            self.broken = f"the workspace root {self.root} was replaced or removed"
            return
        for wd in before - set(self._paths):
            try:
                inotify_rm_watch(fd, wd)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise

    def _retry_unwatchable(self, out: Changes) -> None:
        for rel in sorted(self._unwatchable):
            if rel not in self._unwatchable:
                continue  # watched by the walk of a directory above it, earlier in this loop
            self._unwatchable.discard(rel)
            self._watch_tree(rel)
            out.trees.add(rel)  # newly watched (rescan once) or still not (rescan every time)

    # --- helpers ---

    def _require_fd(self) -> int:
        if self._fd is None:
            raise RuntimeError("the watcher is closed" if self._closed else "the watcher is not started")
        return self._fd

    def _limit_reason(self, e: OSError) -> str:
        if e.errno == errno.ENOSPC:
            return (
                f"inotify watch limit reached ({e.strerror}) after {len(self._paths)} directories under "
                f"{self.root}: raise fs.inotify.max_user_watches (now {sysctl('max_user_watches')}), "
                "e.g. `sysctl fs.inotify.max_user_watches=524288`, or close other watchers"
            )
        return f"the kernel could not add an inotify watch under {self.root}: {e.strerror}"

    def _init_reason(self, e: OSError) -> str:
        if e.errno == errno.EMFILE:
            return (
                f"too many inotify instances ({e.strerror}): raise fs.inotify.max_user_instances "
                f"(now {sysctl('max_user_instances')}) or close other watchers"
            )
        if e.errno == errno.ENFILE:
            return f"the system's open-file limit is reached ({e.strerror}): raise fs.file-max"
        if e.errno == errno.ENOSYS:
            return "this kernel has no inotify (ENOSYS): the watcher needs Linux with CONFIG_INOTIFY_USER"
        return f"inotify_init1 failed: {e.strerror}"
