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
The stager's decisions are the walk's own (`MirrorStager`: withhold patterns, labels, content
detectors, symlink and special-file rules), and escaping links are judged again over the whole
manifest after each refresh. When the watcher cannot vouch (queue overflow, a watch limit, the
workspace root moved), when another process refreshed the mirror (its `serial` moved), when the
policy changed, and at least every `walk_every_s`, the keeper walks instead: the walk is the
ground truth, the watcher only a way to skip it. What inotify cannot see (a write through a
shared `mmap` with no later `write`/`close`; a staged file's hard link changed from outside the
workspace) reaches the mirror at the next walk; it can only make the agent's copy older, and the
approval's conflict check compares against the live file either way. A *withheld* file with
other links is `stat`ed at every refresh (`linked_moved`): changed from outside, it makes the
keeper walk, since what it holds now may sit in the mirror (a copy, an earlier version).

Generations are as for the walk: a generation a live run has mounted is cloned before it changes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from airlockd.policy import Level, Policy
from airlockd.redact import MASK, Redactor
from airlockd.staging import mirrorrepo
from airlockd.staging.mirror import Mirror, MirrorView, mirror_for, policy_digest
from airlockd.staging.mirrorstager import RefreshStats, dump
from airlockd.staging.records import Ident
from airlockd.staging.relist import Inconsistent, Incremental, KeptState, apply, live_tree_nodes, specials_of
from airlockd.staging.treedigest import TreeDigest
from airlockd.staging.watcher import Changes, TreeWatcher, WatchUnavailable

log = logging.getLogger(__name__)

WALK_EVERY_S = 600.0  # a walk at least this often, for what inotify cannot see
COMPACT_LOG_BYTES = 4 << 20  # past this, `cache.log` is folded into a new `cache.json`


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
        self._states: dict[str, KeptState] = {}
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

    def withheld_since(self, policy: Policy, clearance: Level) -> tuple[list[str], Changes] | None:
        """The paths withheld at `clearance` at the last refresh, and what may have changed since
        (a copy: the next refresh still applies it); None when the keeper cannot vouch for that
        (not watching, no refresh yet, another policy, a change it lost count of, a withheld file
        changed through a link outside). What only a walk sees (a write through a shared `mmap`)
        creates, renames or removes no path, so it moves no path rule's verdict: unlike `refresh`,
        this does not care how long ago the last walk was."""
        key = clearance.value
        with self._lock:
            self._drain()
            st = self._states.get(key)
            pending = self._pending.get(key)
            if (
                self.why is not None
                or st is None
                or pending is None
                or pending.everything
                or st.digest != policy_digest(policy, clearance)
                or linked_moved(self.workspace, st.ids)
            ):
                return None
            return list(st.withheld), Changes(set(pending.paths), set(pending.trees))

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
        walk: bool = False,
    ) -> MirrorView:
        """The mirror at `clearance` brought up to date (incrementally when the watcher vouches
        for what changed, by a walk otherwise or with `walk`); with `run_id`, referenced by that
        run. The view's `live_tree` is the digest of the live tree this refresh established."""
        t0 = time.monotonic()
        mirror = mirror_for(self.state_root, clearance)
        digest = policy_digest(policy, clearance)
        key = clearance.value
        with self._lock:
            self._drain()
            st = self._states.get(key)
            walk = (
                walk
                or st is None
                or self.why is not None
                or st.digest != digest
                or self._pending.get(key, Changes()).everything
                or time.monotonic() - st.walked > self.walk_every_s
            )
            if not walk and st is not None:
                try:
                    got = self._incremental(mirror, st, policy, clearance, owner, redactor, run_id, is_live)
                except Inconsistent as exc:
                    log.info("mirror keeper: walking the workspace: %s", exc)
                    walk = True
                else:
                    if got is None:  # a withheld file changed: its copies may be anywhere
                        walk = True
                    else:
                        view = got
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
                        # the walk left the repository to us (`walk_here`): what changed only,
                        # with the state this process keeps, and the nodes it renewed; purged,
                        # as at every walk. Without its record, the whole tree is looked at.
                        renewed = mirror.left_to_keeper(gen)
                        if renewed is None:
                            mirrorrepo.MIRRORS.forget(mirror.root)
                        mirrorrepo.MIRRORS.refresh(
                            mirror.root,
                            mirror.tree(gen),
                            self.workspace,
                            owner,
                            loaded[1].base,
                            purge=True,
                            also=renewed or (),
                        )
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
        specials = specials_of(self.workspace, skipped)
        st = KeptState(
            generation=view.generation,
            serial=view.serial or 0,
            digest=digest,
            cache=view.cache,
            base=dict(res.base),
            withheld={w.path: w.rule for w in res.withheld},
            ids=list(res.ids),
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
        st: KeptState,
        policy: Policy,
        clearance: Level,
        owner: tuple[int, int] | None,
        redactor: Redactor | None,
        run_id: str | None,
        is_live: Callable[[str], bool],
    ) -> MirrorView | None:
        """The mirror refreshed by re-listing what changed; None when a file withheld by path
        changed, or one withheld taught the redactor a credential (the refresh is complete, but
        only a walk finds every copy of it, and every name that carries it)."""
        key = clearance.value
        with mirror.locked():
            if mirror.current() != st.generation or mirror.serial() != st.serial:
                raise Inconsistent("another process refreshed the mirror")
            if (mirror.root / "refreshing").exists() or not mirror.tree(st.generation).is_dir():
                raise Inconsistent("the mirror on disk is incomplete")
            if linked_moved(self.workspace, st.ids):
                raise Inconsistent("a withheld file with other links changed (through a link outside)")
            changes = self._pending.get(key, Changes())
            stats = RefreshStats(generation=st.generation)
            if not changes:
                if run_id is not None:
                    mirror.reference(st.generation, run_id)
                view = MirrorView(st.generation, mirror.tree(st.generation), st.result(), stats, live_tree=_live(st))
                view.serial = st.serial
                return view
            self._pending[key] = Changes()
            try:
                gen, cloned = mirror.writable(st.generation, is_live)
                mirror.begin(gen)
                stamp = mirror.stamp()
                stager = Incremental(policy, clearance, owner, redactor, None, cache=st.cache)
                if len(st.rules) > 2 * len(st.base) + 10_000:  # paths come and go: forget the gone
                    st.rules.clear()
                stager.rules = st.rules
                known = redactor.names_known if redactor is not None else 0
                line = apply(self.workspace, st, changes, stager, mirror.tree(gen), stamp, stats)
                if redactor is not None and redactor.names_known > known:
                    stager.identity_changed = True  # a credential learnt now: only a walk sees every name
                mirrorrepo.MIRRORS.refresh(
                    mirror.root,
                    mirror.tree(gen),
                    self.workspace,
                    owner,
                    st.base,
                    changed=stager.changed,
                    purge=stager.withheld_changed,  # a value learnt now may be in a dead object
                )
                size = mirror.append_cache(line)
                if size > COMPACT_LOG_BYTES:
                    mirror.write_cache(dump(st.cache, st.base, st.digest, stamp, st.result()))
                st.serial = mirror.end(gen, True, None if stager.identity_changed else run_id, is_live)
                st.generation = gen
            except BaseException:
                self._pending.setdefault(key, Changes()).merge(changes)  # nothing is lost: next time
                self._states.pop(key, None)  # and that next time walks (the marker says so too)
                raise
        stats.generation, stats.cloned = gen, cloned
        stats.read, stats.written, stats.removed = stager.stats.read, stager.stats.written, stager.stats.removed
        if stager.identity_changed:
            return None
        return MirrorView(gen, mirror.tree(gen), st.result(), stats, serial=st.serial, live_tree=_live(st))


def linked_moved(workspace: Path, ids: list[Ident]) -> bool:
    """Whether a withheld file with other links is not as the last walk found it: a link outside
    the workspace writes it with no event inside (the attack review rewrote a withheld `.env`
    that way to hold an earlier version of another file, which the mirror's store still had).
    One `stat` per such file; a name recorded masked cannot be looked up and is skipped."""
    for ident in ids:
        if ident.stamp is None or MASK in ident.path:
            continue
        try:
            st = os.stat(workspace / ident.path, follow_symlinks=False)
        except OSError:
            return True
        if (st.st_dev, st.st_ino) != ident.node or (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != ident.stamp:
            return True
    return False


def _live(st: KeptState) -> dict[str, object]:
    from airlockd.staging.stagers import live_tree_from

    return live_tree_from(st.tree)
