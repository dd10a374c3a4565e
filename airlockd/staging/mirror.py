"""The pristine mirror: one per workspace and clearance level, refreshed in proportion to what changed.

A mirror is a tree in the state directory holding exactly what a run at that clearance may see
(withheld files never enter it), plus a *stat cache*: for each node the `lstat` data it was copied
with (size, mtime_ns, ctime_ns, inode, mode), its SHA-256 and its withheld verdict. A refresh
walks the workspace with the copy stager's own decisions (`copy.StagingWalk`: the same withhold
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

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from airlockd.fsutil import atomic_write_bytes
from airlockd.pipeline.manifest import Entry, Kind
from airlockd.policy import Level, Policy
from airlockd.redact import Redactor
from airlockd.staging import mirrorrepo
from airlockd.staging.fdtree import O_DIR
from airlockd.staging.mirrorstager import (
    FORMAT,
    TMP,
    Cached,
    MirrorStager,
    RefreshStats,
    refresh_failed,
    unlink_quietly,
)
from airlockd.staging.mirrorstager import dump as dump_cache
from airlockd.staging.mirrorstager import load as load_cache_bytes
from airlockd.staging.records import Ident, StageResult, StagingError, Withheld

LEFT = "left-to-keeper.json"  # a walk that left the repository to the keeper: the nodes it renewed

__all__ = ["Cached", "Mirror", "MirrorView", "RefreshStats", "mirror_for", "policy_digest"]


def policy_digest(policy: Policy, clearance: Level) -> str:
    """What the mirror's verdicts depend on; a different one means a cold rebuild."""
    data = {
        "format": FORMAT,
        "patterns": policy.withhold.patterns,
        "detectors": policy.withhold.detectors,
        "custom": [d.model_dump(mode="json") for d in policy.withhold.custom],
        "archives": [policy.withhold.archive_scan_mb, policy.withhold.archive_max_members],
        "labels": {p: lvl.value for p, lvl in policy.labels.items()},
        "clearance": clearance.value,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class MirrorView:
    """A refreshed generation a run may use as its read-only lower layer."""

    generation: int
    tree: Path
    result: StageResult
    stats: RefreshStats = field(default_factory=RefreshStats)
    cache: dict[str, Cached] = field(default_factory=dict)  # the stat cache as this refresh left it
    serial: int | None = None  # the mirror's serial as this view found it (None: not known)
    live_tree: dict[str, object] | None = None  # the live-tree digest, when the refresh knows it


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
        repo: bool = True,
    ) -> MirrorView:
        """Bring the mirror up to date with `workspace` by a walk and return the generation to
        use; with `run_id`, that generation is referenced by the run until `release(run_id)`.
        Without `repo`, a generation that has its repository already keeps it as it was: the
        keeper that asked for this walk (from another process) brings it up to date itself, with
        the state it keeps of it (keeper.py, `_walk`); a cold build still builds it here.
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
            stager = MirrorStager(policy, clearance, owner, redactor, progress, cache=cache)
            packer = mirrorrepo.cold_packer(self.tree(gen), workspace, owner)
            stager.placed = packer.add if packer is not None else None
            try:
                self._walk(workspace, self.tree(gen), stager, cache.keys() | others)
                left = not repo and packer is None and (self.tree(gen) / ".git").is_dir()
                if not left:
                    mirrorrepo.MIRRORS.refresh(
                        self.root, self.tree(gen), workspace, owner, stager.result.base, purge=True, packer=packer
                    )
            except BaseException:
                if packer is not None:
                    packer.abandon()  # stopped, what it wrote removed
                raise
            st = stager.stats
            kept = {p for p, e in stager.result.base.items() if e.kind is not Kind.FILE}
            changed = bool(st.read or st.written or st.removed or stager.new.keys() != cache.keys() or kept != others)
            if not cache or changed or dump:
                self.write_cache(dump_cache(stager.new, stager.result.base, digest, stamp, stager.result))
            serial = self.end(gen, changed or not cache or cloned, run_id, is_live)
            self._left_to_keeper(gen, serial, stager.rewritten if left else None)
        stats = stager.stats
        stats.generation, stats.cold, stats.cloned = gen, not cache, cloned
        stats.seconds = time.monotonic() - t0
        return MirrorView(gen, self.tree(gen), stager.result, stats, stager.new, serial)

    # -- the steps of a refresh, for the walk above and the keeper's incremental one -------------

    def _left_to_keeper(self, gen: int, serial: int, rewritten: list[str] | None) -> None:
        """Record the nodes a walk that left the repository alone gave new inodes (same content
        and mode, new mtime: no manifest difference shows them), for the keeper that updates the
        repository (`left_to_keeper`); removed after any walk that updated it itself."""
        path = self.root / LEFT
        if rewritten is None:
            path.unlink(missing_ok=True)
            return
        atomic_write_bytes(path, json.dumps({"generation": gen, "serial": serial, "rewritten": rewritten}).encode())

    def left_to_keeper(self, gen: int) -> list[str] | None:
        """What the last walk recorded with `_left_to_keeper`, if it was of `gen` and is the
        mirror's latest (under the lock); None otherwise."""
        try:
            doc = json.loads((self.root / LEFT).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("generation") != gen or doc.get("serial") != self.serial():
            return None
        paths = doc.get("rewritten")
        return [p for p in paths if isinstance(p, str)] if isinstance(paths, list) else None

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
        return load_cache_bytes(raw, digest, log)

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
            result.ids = [Ident.from_row(row) for row in doc["ids"]]
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
        atomic_write_bytes(self.root / "current", str(gen).encode())
        serial = self.serial() + (1 if changed else 0)
        if changed:  # whole or not at all: a serial read as 0 would name older content
            atomic_write_bytes(self.root / "serial", str(serial).encode())
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
    def _walk(workspace: Path, tree: Path, stager: MirrorStager, old_paths: set[str]) -> None:
        try:
            src_root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise StagingError(f"cannot open workspace {workspace}: {exc.strerror}") from None
        try:
            tree.mkdir(mode=0o700, exist_ok=True)
            (tree.parent / "tmp").mkdir(mode=0o700, exist_ok=True)
            stager.tmp = os.open(tree.parent / "tmp", O_DIR)
            dst_root = os.open(tree, O_DIR)
            try:
                stager.run(src_root, dst_root)
                stager.remove_stale(dst_root, iter(old_paths))
                unlink_quietly(stager.tmp, TMP)
                stager._settle(dst_root, os.fstat(src_root))
            finally:
                os.close(dst_root)
                os.close(stager.tmp)
        except OSError as exc:
            raise refresh_failed(tree, exc) from None
        finally:
            os.close(src_root)


def mirror_for(state_root: Path, clearance: Level) -> Mirror:
    return Mirror(state_root / "mirror" / clearance.value)
