"""The mirror's stat cache and the stager that refreshes a mirror by it (pipeline/mirror.py).

`MirrorStager` is `copy.StagingWalk` writing into an existing mirror: it `lstat`s each file and,
when the cache vouches for it (same size, mtime_ns, ctime_ns, inode and mode; never a racy line),
takes the cached SHA-256, withheld verdict and (for an archive) member hashes without opening it
(a verdict that rests on other files, a copy or hard link of a withheld file, is never taken from
the cache: such a file is read again and judged on the walk's own withheld files). Otherwise it
reads, scans and hashes the file once and writes it under a temporary name renamed over the mirror's (a new inode,
never a write in place). `dump`, `log_line` and `load` are the cache on disk: a whole dump plus
one line per incremental refresh, each with the stamp that decides which of its lines are racy.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airlockd.pipeline.manifest import Entry, Kind, Manifest
from airlockd.staging.copy import READ_WHOLE, StagingWalk
from airlockd.staging.fdtree import CHUNK, O_DIR, O_SRC, read_all, write_all
from airlockd.staging.records import StageResult, StagingError, is_identity_rule, os_rule

FORMAT = 7  # bump when the cache layout or a staging decision changes: every mirror is rebuilt
_O_TMP = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
TMP = ".airlockd-mirror-tmp"

Key = tuple[int, int, int, int, int]  # size, mtime_ns, ctime_ns, inode, st_mode


def _key(st: os.stat_result) -> Key:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode)


@dataclass
class Cached:
    """One file's cache line: the stat key it was read with, its content verdict."""

    key: Key
    entry: Entry | None  # the mirror's entry; None when withheld by its content (or a copy of one)
    rule: str | None = None  # "detector:...", "archive:...", "copy-of-withheld"... when withheld
    members: dict[str, str] | None = None  # an archive's member sha256 -> member path

    def row(self) -> list[Any]:
        e = self.entry
        row = [*self.key, e.mode if e else None, e.size if e else None, e.sha256 if e else None, self.rule]
        return [*row, self.members] if self.members else row

    @classmethod
    def from_row(cls, row: list[Any], stamp: int) -> Cached:
        """A cache line as stored; racy when not older than the `stamp` it was stored with (its
        size is then made impossible, so the next look at the file reads it again)."""
        size, mt, ct, ino, mode, emode, esize, sha, rule = row[:9]
        members = row[9] if len(row) > 9 else None
        entry = Entry(Kind.FILE, emode, esize, sha) if sha is not None else None
        if max(mt, ct) >= stamp:
            size = -1
        return cls((size, mt, ct, ino, mode), entry, rule, members)


@dataclass
class RefreshStats:
    generation: int = 0
    cold: bool = False
    cloned: bool = False
    read: int = 0  # files read, scanned and hashed
    written: int = 0  # files (re)written into the mirror
    removed: int = 0
    seconds: float = 0.0


class MirrorStager(StagingWalk):
    """`StagingWalk` writing into an existing mirror, skipping what the stat cache vouches for."""

    def __init__(self, *args: Any, cache: dict[str, Cached]) -> None:
        super().__init__(*args)
        self.old = cache
        self.new: dict[str, Cached] = {}
        self.stats = RefreshStats()
        self.tmp = -1  # directory fd for temporary names, beside the generations (same filesystem)
        # a cold build's: each file's path once it is in place (staging/packer.py packs it, in
        # a process of its own, for the mirror's repository, which then need not read it again)
        self.placed: Callable[[str], None] | None = None
        self.rewritten: list[str] = []  # paths given a new node (the repository's index must look again)

    # -- directories ----------------------------------------------------------------------------

    def _enter(self, src: int, dst: int, rel: str) -> tuple[int, int] | None:
        name = rel.rpartition("/")[2]
        try:
            st = os.lstat(name, dir_fd=dst)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=dst)  # was a file or a link: the directory replaces it
        except FileNotFoundError:
            pass
        with suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=dst)
        return self._enter_existing(src, dst, rel, name)

    def _enter_existing(self, src: int, dst: int, rel: str, name: str) -> tuple[int, int] | None:
        try:
            child_src = os.open(name, O_DIR, dir_fd=src)
        except OSError as exc:
            self._skip(rel, os_rule(exc))
            return None
        try:
            st = os.fstat(child_src)
            child_dst = os.open(name, O_DIR, dir_fd=dst)
        except BaseException:
            os.close(child_src)
            raise
        self.result.base[rel] = Entry(Kind.DIR, stat.S_IMODE(st.st_mode))
        self.dirs[rel] = st
        return child_src, child_dst

    # -- files and links ------------------------------------------------------------------------

    def _fresh(self, rel: str, st: os.stat_result) -> Cached | None:
        old = self.old.get(rel)
        if old is None or old.key != _key(st) or is_identity_rule(old.rule):
            return None  # racy lines never match; nor do verdicts that rest on other files
        return old

    def _copy_file(self, src: int, dst: int, name: str, rel: str) -> None:
        st = os.lstat(name, dir_fd=src)
        hit = self._fresh(rel, st) if stat.S_ISREG(st.st_mode) else None
        if hit is not None:
            self.new[rel] = hit
            if hit.entry is None:
                self._withhold(rel, hit.rule or "detector:?", self._peek(src, name))
                self._drop(dst, name)
            else:
                self.note_node(rel, st)
                if hit.members:
                    self.members[rel] = hit.members
                self.result.base[rel] = hit.entry
                self._count(hit.entry.size)
            return
        try:
            fd = os.open(name, O_SRC, dir_fd=src)
        except OSError as exc:
            self._skip(rel, os_rule(exc))
            return
        try:
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    self._skip(rel, "raced" if stat.S_ISDIR(st.st_mode) else f"special-file:{_kind(st)}")
                    return
                self.stats.read += 1
                entry, rule, data = self._read_scan(fd, st, rel)
            except OSError as exc:
                if isinstance(exc, _WriteError):
                    raise exc.__cause__ or exc from None
                self._skip(rel, os_rule(exc))
                return
        finally:
            os.close(fd)
        old = self.old.get(rel)
        if entry is None:
            self.new[rel] = Cached(_key(st), None, rule)
            unlink_quietly(self.tmp, TMP)
            self._withhold(rel, rule or "detector:?", data)
            self._drop(dst, name)
            return
        if old is not None and old.entry is not None and old.entry == entry and self._same_node(dst, name, st):
            unlink_quietly(self.tmp, TMP)  # same bytes and mode: keep the mirror's inode
        else:
            self._replace(dst, name)
            self.stats.written += 1
            self.rewritten.append(rel)
            if self.placed is not None:
                self.placed(rel)
        self.new[rel] = Cached(_key(st), entry, members=self.members.get(rel))
        self.note_node(rel, st)
        self.result.base[rel] = entry
        self._count(entry.size)

    def _same_node(self, dst: int, name: str, st: os.stat_result) -> bool:
        try:
            have = os.lstat(name, dir_fd=dst)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(have.st_mode) and have.st_mtime_ns == st.st_mtime_ns

    def _read_scan(self, fd: int, st: os.stat_result, rel: str) -> tuple[Entry | None, str | None, bytes | None]:
        """Read, scan and hash one file into the temporary name (one buffer, or streamed for big
        files; an archive is judged on the buffer, or on the temporary copy read back).
        (entry, None, None) when it may enter; (None, rule, data) when withheld."""
        unlink_quietly(self.tmp, TMP)
        h = hashlib.sha256()
        size = 0
        try:
            out = os.open(TMP, _O_TMP, 0o600, dir_fd=self.tmp)
        except OSError as exc:
            raise _WriteError() from exc
        try:
            if st.st_size <= READ_WHOLE:
                data = read_all(fd, st.st_size)
                hit = self.scanner.first_hit(data)
                if hit is not None:
                    return None, f"detector:{hit}", data
                verdict = self.archive_verdict(rel, data)
                if verdict is not None:
                    return None, verdict, None
                h.update(data)
                size = len(data)
                self._write(out, data)
            else:
                tail = b""
                while chunk := os.read(fd, CHUNK):
                    window = tail + chunk
                    hit = self.scanner.first_hit(window)
                    if hit is not None:
                        return None, f"detector:{hit}", window
                    h.update(chunk)
                    self._write(out, chunk)
                    size += len(chunk)
                    tail = window[-self.scanner.overlap :]
                verdict = self.archive_verdict_fd(rel, out)
                if verdict is not None:
                    return None, verdict, None
            try:
                self._settle(out, st)
            except OSError as exc:
                raise _WriteError() from exc
        finally:
            os.close(out)
        return Entry(Kind.FILE, stat.S_IMODE(st.st_mode), size, h.hexdigest()), None, None

    @staticmethod
    def _write(out: int, data: bytes) -> None:
        try:
            write_all(out, data)
        except OSError as exc:
            raise _WriteError() from exc

    def _copy_link(self, src: int, dst: int, name: str, rel: str) -> None:
        st = os.lstat(name, dir_fd=src)
        target = os.readlink(name, dir_fd=src)
        entry = Entry(Kind.SYMLINK, stat.S_IMODE(st.st_mode), 0, None, target)
        try:
            have = os.readlink(name, dir_fd=dst)
        except OSError:
            have = None
        if have != target:
            unlink_quietly(self.tmp, TMP)
            os.symlink(target, TMP, dir_fd=self.tmp)
            if self.owner is not None:
                os.chown(TMP, *self.owner, dir_fd=self.tmp, follow_symlinks=False)
            os.utime(TMP, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=self.tmp, follow_symlinks=False)
            self._replace(dst, name)
            self.stats.written += 1
            self.rewritten.append(rel)
        self.result.base[rel] = entry

    # -- removal --------------------------------------------------------------------------------

    def unstage(self, dst_root: int, rel: str, rule: str) -> None:
        """As the walk's, and the cache line says withheld (judged again at the next walk)."""
        super().unstage(dst_root, rel, rule)
        self.stats.removed += 1
        old = self.new.get(rel)
        if old is not None:
            self.new[rel] = Cached(old.key, None, rule)

    def forget(self, rel: str) -> None:
        self.new.pop(rel, None)

    def _replace(self, dst: int, name: str) -> None:
        """Move the temporary node over `name` in `dst`: a new inode, never an in-place write."""
        try:
            os.rename(TMP, name, src_dir_fd=self.tmp, dst_dir_fd=dst)
        except OSError as exc:
            if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise
            shutil.rmtree(name, dir_fd=dst)  # a directory was here: the file replaces it
            os.rename(TMP, name, src_dir_fd=self.tmp, dst_dir_fd=dst)

    def _drop(self, dst: int, name: str) -> None:
        """Remove `name` from the mirror directory `dst`, whatever it is; quiet if absent."""
        try:
            st = os.lstat(name, dir_fd=dst)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=dst)
        else:
            os.unlink(name, dir_fd=dst)
        self.stats.removed += 1

    def remove_stale(self, dst_root: int, old_paths: Iterator[str]) -> None:
        """Drop from the mirror what it held before and no longer should: deepest first, through
        directory descriptors opened without following links; a parent already gone is fine."""
        for rel in sorted(old_paths, key=lambda p: p.count("/"), reverse=True):
            if rel in self.result.base:
                continue
            parent = rel.rpartition("/")[0]
            if parent and parent not in self.result.base:
                continue  # its parent goes too (or is a file now): removed with it
            self.drop_at(dst_root, rel)

    def drop_at(self, dst_root: int, rel: str) -> bool:
        """Remove `rel` (whatever it is) from the mirror rooted at `dst_root`, through directory
        descriptors opened without following links; False when its parent cannot be opened."""
        parent, _, name = rel.rpartition("/")
        try:
            fd = _open_rel(dst_root, parent)
        except OSError:
            return False
        try:
            self._drop(fd, name)
        finally:
            os.close(fd)
        return True


def refresh_failed(tree: Path, exc: OSError) -> StagingError:
    """The error of a refresh that could not write the mirror `tree` (never a per-file skip)."""
    return StagingError(
        f"refreshing the mirror {tree} failed: {exc}",
        hint="check free space and permissions of the state directory",
    )


class _WriteError(OSError):
    """Writing the mirror failed: abort the refresh (never a per-file skip)."""


def _kind(st: os.stat_result) -> str:
    from airlockd.pipeline.manifest import kind_of

    return kind_of(st.st_mode).value


def unlink_quietly(dir_fd: int, name: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def _open_rel(root: int, rel: str) -> int:
    fd = os.dup(root)
    for part in filter(None, rel.split("/")):
        try:
            nxt = os.open(part, O_DIR, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


# -- the cache on disk ----------------------------------------------------------------------------


def dump(cache: dict[str, Cached], base: Manifest, digest: str, stamp: int, result: StageResult | None = None) -> bytes:
    """The whole cache; with `result`, also its withheld and skipped records, so a process that
    did not walk can take the mirror's state as the walk left it (`Mirror.load_state`)."""
    files = {rel: c.row() for rel, c in cache.items()}
    others = {rel: [e.kind.value, e.mode, e.target] for rel, e in base.items() if e.kind is not Kind.FILE}
    doc: dict[str, Any] = {"format": FORMAT, "policy": digest, "stamp": stamp, "files": files, "others": others}
    if result is not None:
        doc["withheld"] = [[w.path, w.rule] for w in result.withheld]
        doc["skipped"] = [[w.path, w.rule] for w in result.skipped]
        doc["ids"] = [i.row() for i in result.ids]
    return json.dumps(doc).encode()


def log_line(digest: str, stamp: int, files: dict[str, Cached | None], others: dict[str, Entry | None]) -> bytes:
    """One incremental refresh's changes to the cache, as a `cache.log` line."""
    doc = {
        "policy": digest,
        "stamp": stamp,
        "files": {rel: c.row() if c else None for rel, c in files.items()},
        "others": {rel: [e.kind.value, e.mode, e.target] if e else None for rel, e in others.items()},
    }
    return json.dumps(doc).encode() + b"\n"


def load(raw: bytes, digest: str, log: bytes = b"") -> tuple[dict[str, Cached], set[str]] | None:
    """(stat cache, paths of the mirror's directories and links) from a dump and its log; None
    when the cache is unusable (another format or policy, damaged)."""
    try:
        d = json.loads(raw)
        if d.get("format") != FORMAT or d.get("policy") != digest:
            return None
        stamp = int(d["stamp"])
        cache = {rel: Cached.from_row(row, stamp) for rel, row in d["files"].items()}
        others = set(d["others"])
        for line in log.splitlines():
            e = json.loads(line)
            if e.get("policy") != digest:
                return None
            for rel, row in e["files"].items():
                if row is None:
                    cache.pop(rel, None)
                else:
                    cache[rel] = Cached.from_row(row, int(e["stamp"]))
            for rel, row in e["others"].items():
                (others.discard if row is None else others.add)(rel)
        return cache, others
    except (ValueError, KeyError, TypeError):
        return None
