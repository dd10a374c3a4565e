"""The pristine mirror: one per workspace and clearance level, refreshed in proportion to what changed.

A mirror is a tree in the state directory holding exactly what a run at that clearance may see
(withheld files never enter it), plus a *stat cache*: for each node the `lstat` data it was copied
with (size, mtime_ns, ctime_ns, inode, mode), its SHA-256 and its withheld verdict. A refresh
walks the workspace with the copy stager's own decisions (`staging._Stager`: the same withhold
patterns, labels, content detectors, symlink and special-file rules) but reads, scans, hashes and
writes a file only when its stat data differs from the cache. As in git's index, an entry whose
mtime or ctime is not older than the stamp taken when it was cached is "racy": loading the cache
invalidates it, so it is re-read next time and a write in the same clock tick as our read is
never missed. The cache is `cache.json` (a full dump, written by a walk) plus `cache.log` (one
JSON line per incremental refresh the daemon's keeper made, pipeline/keeper.py); loading replays
the log over the dump, each line with its own stamp. `serial` counts refreshes that changed the
mirror, so a keeper holding the cache in memory knows when another process refreshed it.

Generations keep the mirror immutable under live runs (overlay lower layers must not change while
mounted). A refresh never writes a file in place: a changed file is written under a temporary
name and renamed over the old one (a new inode). When the current generation is referenced by a
live run, the refresh first clones it with hard links (`cp -al`) into a new generation and
refreshes that; otherwise it refreshes the current generation itself (no run mounts it).
Generations no live run references are removed. A refresh that dies half way leaves a marker;
the next one throws that generation's cache away and rebuilds (cold) into a new generation.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airlockd.fsutil import atomic_write_bytes
from airlockd.pipeline.manifest import Entry, Kind, Manifest
from airlockd.pipeline.staging import (
    _O_DIR,
    _O_SRC,
    CHUNK,
    READ_WHOLE,
    StageResult,
    StagingError,
    Withheld,
    _os_rule,
    _read_all,
    _Stager,
    _write_all,
)
from airlockd.policy import Level, Policy
from airlockd.redact import Redactor

FORMAT = 1  # bump when the cache layout or a staging decision changes: every mirror is rebuilt
_O_TMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TMP = ".airlockd-mirror-tmp"

Key = tuple[int, int, int, int, int]  # size, mtime_ns, ctime_ns, inode, st_mode


def _key(st: os.stat_result) -> Key:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode)


def policy_digest(policy: Policy, clearance: Level) -> str:
    """What the mirror's verdicts depend on; a different one means a cold rebuild."""
    data = {
        "format": FORMAT,
        "patterns": policy.withhold.patterns,
        "detectors": policy.withhold.detectors,
        "labels": {p: lvl.value for p, lvl in policy.labels.items()},
        "clearance": clearance.value,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Cached:
    """One file's cache line: the stat key it was read with, its content verdict."""

    key: Key
    entry: Entry | None  # the mirror's entry; None when withheld by a content detector
    rule: str | None = None  # "detector:..." when withheld

    def row(self) -> list[Any]:
        e = self.entry
        return [*self.key, e.mode if e else None, e.size if e else None, e.sha256 if e else None, self.rule]

    @classmethod
    def from_row(cls, row: list[Any], stamp: int) -> Cached:
        """A cache line as stored; racy when not older than the `stamp` it was stored with (its
        size is then made impossible, so the next look at the file reads it again)."""
        size, mt, ct, ino, mode, emode, esize, sha, rule = row
        entry = Entry(Kind.FILE, emode, esize, sha) if sha is not None else None
        if max(mt, ct) >= stamp:
            size = -1
        return cls((size, mt, ct, ino, mode), entry, rule)


@dataclass
class RefreshStats:
    generation: int = 0
    cold: bool = False
    cloned: bool = False
    read: int = 0  # files read, scanned and hashed
    written: int = 0  # files (re)written into the mirror
    removed: int = 0
    seconds: float = 0.0


@dataclass
class MirrorView:
    """A refreshed generation a run may use as its read-only lower layer."""

    generation: int
    tree: Path
    result: StageResult
    stats: RefreshStats = field(default_factory=RefreshStats)
    cache: dict[str, Cached] = field(default_factory=dict)  # the stat cache as this refresh left it
    serial: int = 0
    live_tree: dict[str, object] | None = None  # the live-tree digest, when the refresh knows it


class _MirrorStager(_Stager):
    """`_Stager` writing into an existing mirror, skipping what the stat cache vouches for."""

    def __init__(self, *args: Any, cache: dict[str, Cached]) -> None:
        super().__init__(*args)
        self.old = cache
        self.new: dict[str, Cached] = {}
        self.stats = RefreshStats()
        self.tmp = -1  # directory fd for temporary names, beside the generations (same filesystem)

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
            child_src = os.open(name, _O_DIR, dir_fd=src)
        except OSError as exc:
            self._skip(rel, _os_rule(exc))
            return None
        try:
            st = os.fstat(child_src)
            child_dst = os.open(name, _O_DIR, dir_fd=dst)
        except BaseException:
            os.close(child_src)
            raise
        self.result.base[rel] = Entry(Kind.DIR, stat.S_IMODE(st.st_mode))
        self.dirs[rel] = st
        return child_src, child_dst

    # -- files and links ------------------------------------------------------------------------

    def _fresh(self, rel: str, st: os.stat_result) -> Cached | None:
        old = self.old.get(rel)
        return old if old is not None and old.key == _key(st) else None  # racy lines never match

    def _copy_file(self, src: int, dst: int, name: str, rel: str) -> None:
        st = os.lstat(name, dir_fd=src)
        hit = self._fresh(rel, st) if stat.S_ISREG(st.st_mode) else None
        if hit is not None:
            self.new[rel] = hit
            if hit.entry is None:
                self._withhold(rel, hit.rule or "detector:?", self._peek(src, name))
                self._drop(dst, name)
            else:
                self.result.base[rel] = hit.entry
                self._count(hit.entry.size)
            return
        try:
            fd = os.open(name, _O_SRC, dir_fd=src)
        except OSError as exc:
            self._skip(rel, _os_rule(exc))
            return
        try:
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    self._skip(rel, "raced" if stat.S_ISDIR(st.st_mode) else f"special-file:{_kind(st)}")
                    return
                self.stats.read += 1
                entry, rule, data = self._read_scan(fd, dst, st)
            except OSError as exc:
                if isinstance(exc, _WriteError):
                    raise exc.__cause__ or exc from None
                self._skip(rel, _os_rule(exc))
                return
        finally:
            os.close(fd)
        old = self.old.get(rel)
        if entry is None:
            self.new[rel] = Cached(_key(st), None, rule)
            _unlink_quietly(self.tmp, _TMP)
            self._withhold(rel, rule or "detector:?", data)
            self._drop(dst, name)
            return
        if old is not None and old.entry is not None and old.entry == entry and self._same_node(dst, name, st):
            _unlink_quietly(self.tmp, _TMP)  # same bytes and mode: keep the mirror's inode
        else:
            self._replace(dst, name)
            self.stats.written += 1
        self.new[rel] = Cached(_key(st), entry)
        self.result.base[rel] = entry
        self._count(entry.size)

    def _same_node(self, dst: int, name: str, st: os.stat_result) -> bool:
        try:
            have = os.lstat(name, dir_fd=dst)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(have.st_mode) and have.st_mtime_ns == st.st_mtime_ns

    def _read_scan(self, fd: int, dst: int, st: os.stat_result) -> tuple[Entry | None, str | None, bytes | None]:
        """Read, scan and hash one file into the temporary name in `dst` (one buffer, or streamed
        for big files). (entry, None, None) when it may enter; (None, rule, data) when withheld."""
        _unlink_quietly(self.tmp, _TMP)
        h = hashlib.sha256()
        size = 0
        try:
            out = os.open(_TMP, _O_TMP, 0o600, dir_fd=self.tmp)
        except OSError as exc:
            raise _WriteError() from exc
        try:
            if st.st_size <= READ_WHOLE:
                data = _read_all(fd, st.st_size)
                hit = self.scanner.first_hit(data)
                if hit is not None:
                    return None, f"detector:{hit}", data
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
            _write_all(out, data)
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
            _unlink_quietly(self.tmp, _TMP)
            os.symlink(target, _TMP, dir_fd=self.tmp)
            if self.owner is not None:
                os.chown(_TMP, *self.owner, dir_fd=self.tmp, follow_symlinks=False)
            os.utime(_TMP, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=self.tmp, follow_symlinks=False)
            self._replace(dst, name)
            self.stats.written += 1
        self.result.base[rel] = entry

    # -- removal --------------------------------------------------------------------------------

    def _replace(self, dst: int, name: str) -> None:
        """Move the temporary node over `name` in `dst`: a new inode, never an in-place write."""
        try:
            os.rename(_TMP, name, src_dir_fd=self.tmp, dst_dir_fd=dst)
        except OSError as exc:
            if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise
            shutil.rmtree(name, dir_fd=dst)  # a directory was here: the file replaces it
            os.rename(_TMP, name, src_dir_fd=self.tmp, dst_dir_fd=dst)

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
            parent, _, name = rel.rpartition("/")
            if parent and parent not in self.result.base:
                continue  # its parent goes too (or is a file now): removed with it
            try:
                fd = _open_rel(dst_root, parent)
            except OSError:
                continue
            try:
                self._drop(fd, name)
            finally:
                os.close(fd)


class _WriteError(OSError):
    """Writing the mirror failed: abort the refresh (never a per-file skip)."""


def _kind(st: os.stat_result) -> str:
    from airlockd.pipeline.manifest import kind_of

    return kind_of(st.st_mode).value


def _unlink_quietly(dir_fd: int, name: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def _open_rel(root: int, rel: str) -> int:
    fd = os.dup(root)
    for part in filter(None, rel.split("/")):
        try:
            nxt = os.open(part, _O_DIR, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


# -- the cache on disk ----------------------------------------------------------------------------


def _dump(
    cache: dict[str, Cached], base: Manifest, digest: str, stamp: int, result: StageResult | None = None
) -> bytes:
    """The whole cache; with `result`, also its withheld and skipped records, so a process that
    did not walk can take the mirror's state as the walk left it (`Mirror.load_state`)."""
    files = {rel: c.row() for rel, c in cache.items()}
    others = {rel: [e.kind.value, e.mode, e.target] for rel, e in base.items() if e.kind is not Kind.FILE}
    doc: dict[str, Any] = {"format": FORMAT, "policy": digest, "stamp": stamp, "files": files, "others": others}
    if result is not None:
        doc["withheld"] = [[w.path, w.rule] for w in result.withheld]
        doc["skipped"] = [[w.path, w.rule] for w in result.skipped]
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


def _load(raw: bytes, digest: str, log: bytes = b"") -> tuple[dict[str, Cached], set[str]] | None:
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


# -- generations ----------------------------------------------------------------------------------


class Mirror:
    """The mirror of one workspace at one clearance, under `root` (in the state directory)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def tree(self, generation: int) -> Path:
        return self.root / f"g{generation}"

    def _refs(self, generation: int) -> Path:
        return self.root / "refs" / f"g{generation}"

    @contextmanager
    def locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.root / "lock", "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def current(self) -> int | None:
        try:
            return int((self.root / "current").read_text())
        except (OSError, ValueError):
            return None

    def generations(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(p.name[1:]) for p in self.root.iterdir() if p.name[:1] == "g" and p.name[1:].isdigit())

    def _live_refs(self, generation: int, is_live: Callable[[str], bool]) -> list[str]:
        refs = self._refs(generation)
        if not refs.is_dir():
            return []
        live = []
        for ref in refs.iterdir():
            if is_live(ref.name):
                live.append(ref.name)
            else:
                ref.unlink(missing_ok=True)  # a run that ended without releasing (a crash)
        return live

    def refresh(
        self,
        workspace: Path,
        policy: Policy,
        clearance: Level,
        *,
        owner: tuple[int, int] | None = None,
        redactor: Redactor | None = None,
        progress: Callable[[int, int], None] | None = None,
        run_id: str | None = None,
        is_live: Callable[[str], bool] = lambda run_id: True,
        dump: bool = False,
    ) -> MirrorView:
        """Bring the mirror up to date with `workspace` by a walk and return the generation to
        use; with `run_id`, that generation is referenced by the run until `release(run_id)`.
        With `dump`, the whole state is written (for `load_state`) even when nothing changed."""
        t0 = time.monotonic()
        digest = policy_digest(policy, clearance)
        with self.locked():
            cur = self.current()
            loaded = self.load_cache(digest) if cur is not None else None
            cloned = False
            if loaded is None or cur is None:
                gen = max(self.generations(), default=0) + 1
                cache: dict[str, Cached] = {}
                others: set[str] = set()
                shutil.rmtree(self.tree(gen), ignore_errors=True)
            else:
                cache, others = loaded
                gen, cloned = self.writable(cur, is_live)
            self.begin(gen)
            stamp = self.stamp()
            stager = _MirrorStager(policy, clearance, owner, redactor, progress, cache=cache)
            self._walk(workspace, self.tree(gen), stager, cache.keys() | others)
            st = stager.stats
            kept = {p for p, e in stager.result.base.items() if e.kind is not Kind.FILE}
            changed = bool(st.read or st.written or st.removed or stager.new.keys() != cache.keys() or kept != others)
            if not cache or changed or dump:
                self.write_cache(_dump(stager.new, stager.result.base, digest, stamp, stager.result))
            serial = self.end(gen, changed or not cache or cloned, run_id, is_live)
        stats = stager.stats
        stats.generation, stats.cold, stats.cloned = gen, not cache, cloned
        stats.seconds = time.monotonic() - t0
        return MirrorView(gen, self.tree(gen), stager.result, stats, stager.new, serial)

    # -- the steps of a refresh, for the walk above and the keeper's incremental one -------------

    def load_cache(self, digest: str) -> tuple[dict[str, Cached], set[str]] | None:
        """The stat cache of the current generation; None when there is none to trust (none yet,
        another policy, or a refresh died half way)."""
        cur = self.current()
        if cur is None or (self.root / "refreshing").exists() or not self.tree(cur).is_dir():
            return None
        try:
            raw = (self.root / "cache.json").read_bytes()
        except OSError:
            return None
        try:
            log = (self.root / "cache.log").read_bytes()
        except FileNotFoundError:
            log = b""
        return _load(raw, digest, log)

    def load_state(self, digest: str) -> tuple[dict[str, Cached], StageResult] | None:
        """(stat cache, result) of the current generation as its last walk dumped them; None
        unless a whole dump (with `dump=True`) is all there is (no log after it, no refresh
        under way)."""
        if (self.root / "cache.log").exists():
            return None
        loaded = self.load_cache(digest)
        if loaded is None:
            return None
        try:
            doc = json.loads((self.root / "cache.json").read_bytes())
            result = StageResult(base={})
            for rel, c in loaded[0].items():
                if c.entry is not None:
                    result.base[rel] = c.entry
                    result.files += 1
                    result.bytes += c.entry.size
            for rel, (kind, mode, target) in doc["others"].items():
                result.base[rel] = Entry(Kind(kind), mode, 0, None, target)
            result.withheld = [Withheld(p, r) for p, r in doc["withheld"]]
            result.skipped = [Withheld(p, r) for p, r in doc["skipped"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return loaded[0], result

    def writable(self, cur: int, is_live: Callable[[str], bool]) -> tuple[int, bool]:
        """(generation to refresh, cloned): the current one, or a hard-link clone of it when a
        live run has it mounted (a lower layer must not change under a mounted overlay)."""
        if not self._live_refs(cur, is_live):
            return cur, False
        gen = max(self.generations()) + 1
        self._clone(cur, gen)
        return gen, True

    def begin(self, gen: int) -> None:
        """Mark a refresh of `gen` under way: a crash before `end` makes the next one cold."""
        (self.root / "refreshing").write_bytes(str(gen).encode())

    def write_cache(self, dump: bytes) -> None:
        atomic_write_bytes(self.root / "cache.json", dump)
        (self.root / "cache.log").unlink(missing_ok=True)

    def append_cache(self, line: bytes) -> int:
        """Add one incremental refresh's line to `cache.log`; its size after."""
        with open(self.root / "cache.log", "ab") as fh:
            fh.write(line)
            return fh.tell()

    def end(self, gen: int, changed: bool, run_id: str | None, is_live: Callable[[str], bool]) -> int:
        """Finish a refresh of `gen`: make it current, reference it for `run_id`, collect the
        generations nobody uses. Returns the serial (bumped when the mirror changed)."""
        (self.root / "current").write_text(str(gen))
        serial = self.serial() + (1 if changed else 0)
        if changed:
            (self.root / "serial").write_text(str(serial))
        (self.root / "refreshing").unlink()
        if run_id is not None:
            self.reference(gen, run_id)
        self._collect(gen, is_live)
        return serial

    def serial(self) -> int:
        try:
            return int((self.root / "serial").read_text())
        except (OSError, ValueError):
            return 0

    def reference(self, gen: int, run_id: str) -> None:
        """Reference `gen` for `run_id` (under the lock) without a refresh."""
        self._refs(gen).mkdir(parents=True, exist_ok=True)
        (self._refs(gen) / run_id).touch()

    def release(self, run_id: str, is_live: Callable[[str], bool] = lambda run_id: True) -> None:
        """The run no longer uses its generation (its overlay is unmounted); collect old ones."""
        with self.locked():
            refs = self.root / "refs"
            if refs.is_dir():
                for d in refs.iterdir():
                    (d / run_id).unlink(missing_ok=True)
            cur = self.current()
            if cur is not None:
                self._collect(cur, lambda r: r != run_id and is_live(r))

    def _collect(self, keep: int, is_live: Callable[[str], bool]) -> None:
        for gen in self.generations():
            if gen != keep and not self._live_refs(gen, is_live):
                shutil.rmtree(self.tree(gen), ignore_errors=True)
                shutil.rmtree(self._refs(gen), ignore_errors=True)

    def _clone(self, old: int, new: int) -> None:
        dst = self.tree(new)
        shutil.rmtree(dst, ignore_errors=True)
        proc = subprocess.run(["cp", "-al", str(self.tree(old)), str(dst)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise StagingError(f"cannot clone mirror generation {old}: {proc.stderr.strip()}")

    def stamp(self) -> int:
        """The filesystem clock now (coarse, like the timestamps it is compared with)."""
        p = self.root / "stamp"
        with open(p, "wb") as fh:
            fh.write(b"")
        return os.stat(p).st_mtime_ns

    @staticmethod
    def _walk(workspace: Path, tree: Path, stager: _MirrorStager, old_paths: set[str]) -> None:
        try:
            src_root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise StagingError(f"cannot open workspace {workspace}: {exc.strerror}") from None
        try:
            tree.mkdir(mode=0o700, exist_ok=True)
            (tree.parent / "tmp").mkdir(mode=0o700, exist_ok=True)
            stager.tmp = os.open(tree.parent / "tmp", _O_DIR)
            dst_root = os.open(tree, _O_DIR)
            try:
                stager.run(src_root, dst_root)
                stager.remove_stale(dst_root, iter(old_paths))
                _unlink_quietly(stager.tmp, _TMP)
                stager._settle(dst_root, os.fstat(src_root))
            finally:
                os.close(dst_root)
                os.close(stager.tmp)
        except OSError as exc:
            raise StagingError(
                f"refreshing the mirror {tree} failed: {exc}",
                hint="check free space and permissions of the state directory",
            ) from None
        finally:
            os.close(src_root)


def mirror_for(state_root: Path, clearance: Level) -> Mirror:
    return Mirror(state_root / "mirror" / clearance.value)
