"""The mirror keeper: a long-lived process's mirrors, refreshed in proportion to what changed.

A walk of the workspace (pipeline/mirror.py) costs an `lstat` per file even when nothing changed:
0.3 s on 20,000 files, before each run. A process that lives across runs (the daemon, `airlockd
serve`) keeps a `MirrorKeeper`: an inotify watcher on the workspace (pipeline/watcher.py) and, per
clearance level, the mirror's stat cache, manifest, withheld and skipped records and Merkle
digest in memory. A refresh then drains the watcher and re-lists only the directories whose
entries changed (the stat cache still vouches for untouched siblings), rescans whole only the
directories that appeared, and writes one line to the mirror's `cache.log`; nothing else is read.

Why it misses nothing it could know: inotify queues an event when the modifying system call
completes, and `drain()` reads the queue without blocking, so every change made before a refresh
began is in the set that refresh applies; a change made during it is drained by the next one.
The stager's decisions are the walk's own (`_MirrorStager`: withhold patterns, labels, content
detectors, symlink and special-file rules), and escaping links are judged again over the whole
manifest after each refresh. When the watcher cannot vouch (queue overflow, a watch limit, the
workspace root moved), when another process refreshed the mirror (its `serial` moved), when the
policy changed, and at least every `walk_every_s`, the keeper walks instead: the walk is the
ground truth, the watcher only a way to skip it. What inotify cannot see (a write through a
shared `mmap` with no later `write`/`close`; a hard link changed from outside the workspace)
reaches the mirror at the next walk; it can only make the agent's copy older, never leak a
withheld file, and the approval's conflict check compares against the live file either way.

Generations are as for the walk: a generation a live run has mounted is cloned before it changes.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from airlockd.pipeline.manifest import Entry, Kind, Manifest, entry_for
from airlockd.pipeline.mirror import (
    Cached,
    Mirror,
    MirrorView,
    RefreshStats,
    _dump,
    _MirrorStager,
    _open_rel,
    log_line,
    mirror_for,
    policy_digest,
)
from airlockd.pipeline.staging import _O_DIR, StageResult, StagingError, Withheld, _open_dir, link_escapes
from airlockd.pipeline.treedigest import TreeDigest
from airlockd.pipeline.watcher import Changes, TreeWatcher, WatchUnavailable
from airlockd.policy import Level, Policy
from airlockd.redact import Redactor

log = logging.getLogger(__name__)

WALK_EVERY_S = 600.0  # a walk at least this often, for what inotify cannot see
COMPACT_LOG_BYTES = 4 << 20  # past this, `cache.log` is folded into a new `cache.json`
ESCAPE = "symlink-escape"


def _parent(rel: str) -> str:
    return rel.rpartition("/")[0]


def _join(d: str, name: str) -> str:
    return f"{d}/{name}" if d else name


def _depth(rel: str) -> int:
    return rel.count("/") + 1 if rel else 0


@dataclass
class _State:
    """What the keeper knows of one clearance's mirror: the current generation as last refreshed."""

    generation: int
    serial: int
    digest: str  # the policy digest the mirror was built under
    cache: dict[str, Cached]
    base: Manifest
    withheld: dict[str, str]
    skipped: dict[str, str]
    specials: dict[str, Entry]  # skipped special files, for the live-tree digest
    tree: TreeDigest
    walked: float
    files: int = 0
    bytes: int = 0
    children: dict[str, set[str]] = field(default_factory=dict)
    links: set[str] = field(default_factory=set)

    def index(self) -> None:
        self.children = {}
        for rel in self.base.keys() | self.withheld.keys() | self.skipped.keys() | self.cache.keys():
            self.children.setdefault(_parent(rel), set()).add(rel.rpartition("/")[2])
        self.links = {rel for rel, e in self.base.items() if e.kind is Kind.SYMLINK}

    def below(self, rel: str) -> set[str]:
        """Every recorded path under directory `rel` (not `rel` itself)."""
        out: set[str] = set()
        todo = [rel]
        while todo:
            d = todo.pop()
            for name in self.children.get(d, ()):
                child = _join(d, name)
                out.add(child)
                if child in self.children:
                    todo.append(child)
        return out

    def is_dir(self, rel: str) -> bool:
        e = self.base.get(rel)
        return rel == "" or (e is not None and e.kind is Kind.DIR)

    def withheld_under(self, rel: str) -> bool:
        while rel:
            if rel in self.withheld:
                return True
            rel = _parent(rel)
        return False

    def result(self) -> StageResult:
        res = StageResult(base=dict(self.base))
        res.withheld = [Withheld(p, r) for p, r in sorted(self.withheld.items())]
        res.skipped = [Withheld(p, r) for p, r in sorted(self.skipped.items())]
        res.files, res.bytes = self.files, self.bytes
        return res


def _specials(workspace: Path, skipped: dict[str, str]) -> dict[str, Entry]:
    out = {}
    for rel, rule in skipped.items():
        if rule.startswith("special-file:"):
            try:
                out[rel] = entry_for(workspace / rel)
            except OSError:
                continue
    return out


def live_tree_nodes(base: Manifest, specials: dict[str, Entry]) -> dict[str, Entry]:
    """The nodes the live-tree digest covers: the mirror's (the live tree minus what was withheld)
    plus the special files the stager skipped."""
    return {**base, **specials}


class _Incremental(_MirrorStager):
    """`_MirrorStager` re-listing single directories of an existing mirror."""

    def keep_dir(self, src: int, dst: int, rel: str) -> None:
        """An existing subdirectory whose contents are not in question: its own entry only."""
        name = rel.rpartition("/")[2]
        try:
            fd = os.open(name, _O_DIR, dir_fd=src)
        except OSError:
            return  # raced away: its parent's next re-listing sees that
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        self.result.base[rel] = Entry(Kind.DIR, stat.S_IMODE(st.st_mode))
        out = os.open(name, _O_DIR, dir_fd=dst)
        try:
            self._settle(out, st)
        finally:
            os.close(out)


class _Inconsistent(Exception):
    """The mirror on disk is not what the keeper remembers: walk instead."""


class MirrorKeeper:
    """The mirrors of one workspace (one per clearance) for a process that outlives its runs."""

    def __init__(
        self,
        workspace: Path,
        state_root: Path,
        *,
        walk_every_s: float = WALK_EVERY_S,
        walker: Callable[[Level], None] | None = None,
    ) -> None:
        """`walker(clearance)`, when given, makes the mirror current by a walk in another process
        and leaves a whole dump (`Mirror.refresh(dump=True)`): the daemon's walks then never hold
        its interpreter for seconds (it only loads the result). Without it, walks run here."""
        self.workspace = workspace
        self.state_root = state_root
        self.walk_every_s = walk_every_s
        self.walker = walker
        self.watcher: TreeWatcher | None = None
        self.why: str | None = "not started"  # why refreshes walk (None while watching)
        self._states: dict[str, _State] = {}
        self._pending: dict[str, Changes] = {}
        self._lock = threading.Lock()
        self.listeners: list[Callable[[Changes], None]] = []  # told of every drained change

    def start(self) -> str | None:
        """Watch the workspace; None when watching, else why every refresh will walk."""
        watcher = TreeWatcher(self.workspace)
        try:
            watcher.start()
        except WatchUnavailable as exc:
            self.why = str(exc)
            log.warning("mirror keeper: not watching the workspace, every refresh walks it: %s", exc)
            return self.why
        self.watcher, self.why = watcher, None
        return None

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
            self.why = "closed"

    def drain(self) -> None:
        """Take what the watcher queued now (the daemon calls it when the queue is readable, so
        its listeners hear of live edits at once; a refresh drains first anyway)."""
        with self._lock:
            self._drain()

    def _drain(self) -> None:
        w = self.watcher
        if w is None:
            return
        got = w.drain()
        if w.broken:
            self.why = w.broken
        if not got:
            return
        for pending in self._pending.values():
            pending.merge(got)
        for listener in self.listeners:
            try:
                listener(got)
            except Exception:
                log.exception("mirror keeper: a listener failed")

    # -- refresh --------------------------------------------------------------------------------

    def refresh(
        self,
        policy: Policy,
        clearance: Level,
        *,
        owner: tuple[int, int] | None = None,
        redactor: Redactor | None = None,
        progress: Callable[[int, int], None] | None = None,
        run_id: str | None = None,
        is_live: Callable[[str], bool] = lambda run_id: True,
    ) -> MirrorView:
        """The mirror at `clearance` brought up to date (incrementally when the watcher vouches
        for what changed, by a walk otherwise); with `run_id`, referenced by that run. The view's
        `live_tree` is the digest of the live tree this refresh established."""
        t0 = time.monotonic()
        mirror = mirror_for(self.state_root, clearance)
        digest = policy_digest(policy, clearance)
        key = clearance.value
        with self._lock:
            self._drain()
            st = self._states.get(key)
            walk = (
                st is None
                or self.why is not None
                or st.digest != digest
                or self._pending.get(key, Changes()).everything
                or time.monotonic() - st.walked > self.walk_every_s
            )
            if not walk and st is not None:
                try:
                    view = self._incremental(mirror, st, policy, clearance, owner, redactor, run_id, is_live)
                except _Inconsistent as exc:
                    log.info("mirror keeper: walking the workspace: %s", exc)
                    walk = True
            if walk:
                view = self._walk(mirror, digest, policy, clearance, owner, redactor, progress, run_id, is_live)
        view.stats.seconds = time.monotonic() - t0
        return view

    def _walk(
        self,
        mirror: Mirror,
        digest: str,
        policy: Policy,
        clearance: Level,
        owner: tuple[int, int] | None,
        redactor: Redactor | None,
        progress: Callable[[int, int], None] | None,
        run_id: str | None,
        is_live: Callable[[str], bool],
    ) -> MirrorView:
        self._pending[clearance.value] = Changes()  # the walk covers all that was pending
        if self.walker is not None:
            try:
                self.walker(clearance)
                with mirror.locked():
                    loaded = mirror.load_state(digest)
                    gen = mirror.current()
                    if loaded is not None and gen is not None:
                        if run_id is not None:
                            mirror.reference(gen, run_id)
                        stats = RefreshStats(generation=gen)
                        view = MirrorView(gen, mirror.tree(gen), loaded[1], stats, loaded[0], mirror.serial())
                        return self._adopt(view, digest, clearance)
                log.info("mirror keeper: the walk's dump was not there to load; walking here")
            except Exception:
                log.exception("mirror keeper: the walk in another process failed; walking here")
        view = mirror.refresh(
            self.workspace,
            policy,
            clearance,
            owner=owner,
            redactor=redactor,
            progress=progress,
            run_id=run_id,
            is_live=is_live,
        )
        return self._adopt(view, digest, clearance)

    def _adopt(self, view: MirrorView, digest: str, clearance: Level) -> MirrorView:
        """Take a walk's outcome as what the keeper knows from now on."""
        res = view.result
        skipped = {s.path: s.rule for s in res.skipped}
        specials = _specials(self.workspace, skipped)
        st = _State(
            generation=view.generation,
            serial=view.serial,
            digest=digest,
            cache=view.cache,
            base=dict(res.base),
            withheld={w.path: w.rule for w in res.withheld},
            skipped=skipped,
            specials=specials,
            tree=TreeDigest.of(live_tree_nodes(res.base, specials)),
            walked=time.monotonic(),
            files=res.files,
            bytes=res.bytes,
        )
        st.index()
        self._states[clearance.value] = st
        view.live_tree = _live(st)
        return view

    def _incremental(
        self,
        mirror: Mirror,
        st: _State,
        policy: Policy,
        clearance: Level,
        owner: tuple[int, int] | None,
        redactor: Redactor | None,
        run_id: str | None,
        is_live: Callable[[str], bool],
    ) -> MirrorView:
        key = clearance.value
        with mirror.locked():
            if mirror.current() != st.generation or mirror.serial() != st.serial:
                raise _Inconsistent("another process refreshed the mirror")
            if (mirror.root / "refreshing").exists() or not mirror.tree(st.generation).is_dir():
                raise _Inconsistent("the mirror on disk is incomplete")
            changes = self._pending.get(key, Changes())
            stats = RefreshStats(generation=st.generation)
            if not changes:
                if run_id is not None:
                    mirror.reference(st.generation, run_id)
                return MirrorView(st.generation, mirror.tree(st.generation), st.result(), stats, live_tree=_live(st))
            self._pending[key] = Changes()
            try:
                gen, cloned = mirror.writable(st.generation, is_live)
                mirror.begin(gen)
                stamp = mirror.stamp()
                stager = _Incremental(policy, clearance, owner, redactor, None, cache=st.cache)
                line = self._apply(st, changes, stager, mirror.tree(gen), policy, stamp, stats)
                size = mirror.append_cache(line)
                if size > COMPACT_LOG_BYTES:
                    mirror.write_cache(_dump(st.cache, st.base, st.digest, stamp, st.result()))
                st.serial = mirror.end(gen, True, run_id, is_live)
                st.generation = gen
            except BaseException:
                self._pending.setdefault(key, Changes()).merge(changes)  # nothing is lost: next time
                self._states.pop(key, None)  # and that next time walks (the marker says so too)
                raise
        stats.generation, stats.cloned = gen, cloned
        stats.read, stats.written, stats.removed = stager.stats.read, stager.stats.written, stager.stats.removed
        return MirrorView(gen, mirror.tree(gen), st.result(), stats, live_tree=_live(st))

    def _apply(
        self,
        st: _State,
        changes: Changes,
        stager: _Incremental,
        tree: Path,
        policy: Policy,
        stamp: int,
        stats: RefreshStats,
    ) -> bytes:
        """Re-list the directories `changes` touch in the mirror `tree` and fold the outcome into
        `st`; returns the cache.log line."""
        todo = {_parent(p) for p in changes.paths}
        deep = set(changes.trees)
        todo |= {_parent(t) for t in deep}
        todo |= {_parent(p) for p, rule in st.withheld.items() if rule == ESCAPE}  # judged again below
        dirs: set[str] = set()
        for d in todo:
            while not st.is_dir(d):  # a directory the mirror does not have (yet): rescan it whole
                if st.withheld_under(d):
                    break
                deep.add(d)
                d = _parent(d)
            else:
                dirs.add(d)
        scope: set[str] = set()  # recorded paths whose records this refresh replaces
        rescanned: set[str] = set()
        try:
            src_root = os.open(self.workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise StagingError(f"cannot open workspace {self.workspace}: {exc.strerror}") from None
        try:
            (tree.parent / "tmp").mkdir(mode=0o700, exist_ok=True)
            stager.tmp = os.open(tree.parent / "tmp", _O_DIR)
            dst_root = os.open(tree, _O_DIR)
            try:
                while dirs:
                    d = min(dirs, key=_depth)
                    dirs.discard(d)
                    if any(d == r or d.startswith(r + "/") for r in rescanned):
                        continue
                    if not self._relist(st, stager, src_root, dst_root, d, deep, scope, rescanned):
                        if d == "":
                            raise StagingError(f"the workspace {self.workspace} cannot be read")
                        dirs.add(_parent(d))
                self._fold(st, stager, dst_root, scope, stats)
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
        return self._log_line(st, scope | stager.result.base.keys() | stager.new.keys(), stamp)

    def _relist(
        self,
        st: _State,
        stager: _Incremental,
        src_root: int,
        dst_root: int,
        d: str,
        deep: set[str],
        scope: set[str],
        rescanned: set[str],
    ) -> bool:
        """Re-list directory `d`; False when it is no longer a directory of the workspace."""
        try:
            src = _open_dir(src_root, d)
        except OSError:
            return False
        try:
            try:
                dst = _open_dir(dst_root, d)
            except OSError as exc:
                raise _Inconsistent(f"the mirror lacks the directory {d!r}") from exc
            try:
                scope.update(_join(d, n) for n in st.children.get(d, ()))
                for sub in stager._fill(src, dst, d + "/" if d else ""):
                    if sub in deep or not st.is_dir(sub):
                        scope.update(st.below(sub))
                        rescanned.add(sub)
                        child = stager._enter(src, dst, sub)
                        if child is not None:
                            try:
                                stager._descend(*child, sub)
                                stager._settle(child[1], stager.dirs[sub])
                            finally:
                                os.close(child[0])
                                os.close(child[1])
                    else:
                        stager.keep_dir(src, dst, sub)
                stager._settle(dst, os.fstat(src))
            finally:
                os.close(dst)
        finally:
            os.close(src)
        return True

    def _fold(self, st: _State, stager: _Incremental, dst_root: int, scope: set[str], stats: RefreshStats) -> None:
        """Replace the records of `scope` with what the re-listing found; drop from the mirror
        what is gone; judge every link again."""
        res = stager.result
        new_base = res.base
        for rel in list(scope):  # a directory that is something else now takes its subtree with it
            old = st.base.get(rel)
            if old is not None and old.kind is Kind.DIR and (rel not in new_base or new_base[rel].kind is not Kind.DIR):
                scope |= st.below(rel)
        gone = sorted((p for p in scope if p in st.base and p not in new_base), key=_depth)
        dropped: list[str] = []
        for rel in gone:
            if any(rel.startswith(g + "/") for g in dropped):
                continue
            parent, _, name = rel.rpartition("/")
            try:
                fd = _open_rel(dst_root, parent)
            except OSError:
                continue
            try:
                stager._drop(fd, name)
            finally:
                os.close(fd)
            dropped.append(rel)
        touched = scope | new_base.keys() | stager.new.keys()
        touched |= {w.path for w in res.withheld} | {s.path for s in res.skipped}
        nodes: dict[str, Entry | None] = {}
        for rel in scope:
            e = st.base.pop(rel, None)
            if e is not None and e.kind is Kind.FILE:
                st.files -= 1
                st.bytes -= e.size or 0
            st.cache.pop(rel, None)
            st.withheld.pop(rel, None)
            st.skipped.pop(rel, None)
            st.specials.pop(rel, None)
            st.links.discard(rel)
            sibs = st.children.get(_parent(rel))
            if sibs is not None:
                sibs.discard(rel.rpartition("/")[2])
            if rel not in new_base:
                st.children.pop(rel, None)
            nodes[rel] = None
        for rel, e in new_base.items():
            st.base[rel] = e
            if e.kind is Kind.FILE:
                st.files += 1
                st.bytes += e.size or 0
            elif e.kind is Kind.SYMLINK:
                st.links.add(rel)
            nodes[rel] = e
        st.cache.update(stager.new)
        for w in res.withheld:
            st.withheld[w.path] = w.rule
        new_skipped = {s.path: s.rule for s in res.skipped}
        st.skipped.update(new_skipped)
        for rel, e in _specials(self.workspace, new_skipped).items():
            st.specials[rel] = e
            nodes[rel] = e
        for rel in touched:
            if rel in st.base or rel in st.withheld or rel in st.skipped or rel in st.cache:
                st.children.setdefault(_parent(rel), set()).add(rel.rpartition("/")[2])
        for rel in sorted(st.links):  # links are judged on the whole manifest, as after a walk
            e = st.base[rel]
            if link_escapes(rel, e.target or "", st.base):
                parent, _, name = rel.rpartition("/")
                fd = _open_rel(dst_root, parent)
                try:
                    stager._drop(fd, name)
                finally:
                    os.close(fd)
                del st.base[rel]
                st.links.discard(rel)
                st.withheld[rel] = ESCAPE
                nodes[rel] = None
                scope.add(rel)
        # removals first (a removed directory takes its subtree), then what is there now
        st.tree.update({p: None for p, e in nodes.items() if e is None})
        st.tree.update({p: e for p, e in nodes.items() if e is not None})
        stats.removed += len(dropped)

    @staticmethod
    def _log_line(st: _State, touched: set[str], stamp: int) -> bytes:
        files: dict[str, Cached | None] = {p: st.cache.get(p) for p in touched}
        others: dict[str, Entry | None] = {}
        for p in touched:
            e = st.base.get(p)
            others[p] = e if e is not None and e.kind is not Kind.FILE else None
        return log_line(st.digest, stamp, files, others)


def _live(st: _State) -> dict[str, object]:
    from airlockd.pipeline.stagers import live_tree_from

    return live_tree_from(st.tree)


def walk_elsewhere(workspace: Path) -> Callable[[Level], None]:
    """A keeper's `walker` that walks in a new process (`airlockd _mirror`), for the daemon."""
    import subprocess
    import sys

    def walk(clearance: Level) -> None:
        cmd = [sys.executable, "-m", "airlockd", "--workspace", str(workspace), "_mirror", "--clearance"]
        proc = subprocess.run([*cmd, clearance.value], capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise StagingError(f"walking the workspace into the {clearance.value} mirror failed: {last}")

    return walk
