"""Re-listing the directories of a mirror that changed (the keeper's incremental refresh).

`KeptState` is what a keeper knows of one clearance's mirror: the stat cache, the manifest, the
withheld and skipped records, a children index and the Merkle digest of the live tree. `apply`
takes a set of changed paths (pipeline/watcher.py) and re-lists each directory whose entries
changed with the walk's own code (`StagingWalk._fill`, so a verdict cannot differ from a walk's),
rescans whole only the directories the mirror does not have yet, drops from the mirror what is
gone, judges every symlink again on the whole manifest (a change elsewhere can make a link
escape), updates the state and the digest, and returns the `cache.log` line. Nothing unchanged is
read; an untouched sibling of a changed file costs one `lstat`.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from airlockd.pipeline.manifest import Entry, Kind, Manifest, entry_for
from airlockd.staging.fdtree import O_DIR, open_dir
from airlockd.staging.gitcopy import DOTGIT as GIT
from airlockd.staging.mirrorstager import Cached, MirrorStager, RefreshStats, log_line, refresh_failed
from airlockd.staging.records import Ident, StageResult, StagingError, Withheld, link_escapes, values_text
from airlockd.staging.treedigest import TreeDigest
from airlockd.staging.watcher import Changes

ESCAPE = "symlink-escape"


def _parent(rel: str) -> str:
    return rel.rpartition("/")[0]


def _join(d: str, name: str) -> str:
    return f"{d}/{name}" if d else name


def _depth(rel: str) -> int:
    return rel.count("/") + 1 if rel else 0


@dataclass
class KeptState:
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
    ids: list[Ident] = field(default_factory=list)  # the files withheld by path, by identity
    rules: dict[tuple[str, bool], str | None] = field(default_factory=dict)  # path verdicts (`_path_rule`)

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
        res.ids = list(self.ids)
        return res


def specials_of(workspace: Path, skipped: dict[str, str]) -> dict[str, Entry]:
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


class Incremental(MirrorStager):
    """`MirrorStager` re-listing single directories of an existing mirror. `identity_changed`
    says, after `apply`, that a file withheld by path changed (content, node, or one came or
    went): what is a copy of one may have changed anywhere, so the keeper walks."""

    identity_changed = False
    changed: list[str] | None = None  # after `apply`: the paths whose entries changed (no directory)
    withheld_changed = False  # after `apply`: a path newly withheld, or a withheld file changed

    def keep_dir(self, src: int, dst: int, rel: str) -> None:
        """An existing subdirectory whose contents are not in question: its own entry only."""
        name = rel.rpartition("/")[2]
        try:
            fd = os.open(name, O_DIR, dir_fd=src)
        except OSError:
            return  # raced away: its parent's next re-listing sees that
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
        self.result.base[rel] = Entry(Kind.DIR, stat.S_IMODE(st.st_mode))
        try:
            out = os.open(name, O_DIR, dir_fd=dst)
        except OSError as exc:
            raise Inconsistent(f"the mirror lacks the directory {rel!r}") from exc
        try:
            self._settle(out, st)
        finally:
            os.close(out)


class Inconsistent(Exception):
    """The mirror on disk is not what the keeper remembers: walk instead."""


def apply(
    workspace: Path,
    st: KeptState,
    changes: Changes,
    stager: Incremental,
    tree: Path,
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
    hidden: list[str] = []  # changed files inside a withheld directory: read for the redactor only
    for d in todo:
        while not st.is_dir(d):  # a directory the mirror does not have (yet): rescan it whole
            if st.withheld_under(d):
                hidden.extend(p for p in changes.paths if _parent(p) == d and GIT not in p.split("/"))
                break
            deep.add(d)
            d = _parent(d)
        else:
            dirs.add(d)
    scope: set[str] = set()  # recorded paths whose records this refresh replaces
    rescanned: set[str] = set()
    try:
        src_root = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise StagingError(f"cannot open workspace {workspace}: {exc.strerror}") from None
    try:
        (tree.parent / "tmp").mkdir(mode=0o700, exist_ok=True)
        stager.tmp = os.open(tree.parent / "tmp", O_DIR)
        dst_root = os.open(tree, O_DIR)
        try:
            while dirs:
                d = min(dirs, key=_depth)
                dirs.discard(d)
                if any(d == r or d.startswith(r + "/") for r in rescanned):
                    continue
                if not _relist(st, stager, src_root, dst_root, d, deep, scope, rescanned):
                    if d == "":
                        raise StagingError(f"the workspace {workspace} cannot be read")
                    dirs.add(_parent(d))
            # copies of withheld files among what was listed, judged on the withheld files known
            # (were those to change, the keeper walks: see below)
            listed = [rel for rel, e in stager.result.base.items() if e.kind is Kind.FILE]
            stager.drop_identity_copies(dst_root, listed, [*st.ids, *stager.result.ids])
            _fold(workspace, st, stager, dst_root, scope, stats)
            hidden_ids = _learn(stager, src_root, hidden, st)
            _fold_ids(st, stager, scope, set(hidden), hidden_ids)
        finally:
            os.close(dst_root)
            os.close(stager.tmp)
    except OSError as exc:
        raise refresh_failed(tree, exc) from None
    finally:
        os.close(src_root)
    return _log_line(st, scope | stager.result.base.keys() | stager.new.keys(), stamp)


def _learn(stager: Incremental, src_root: int, rels: list[str], st: KeptState) -> list[Ident]:
    """The identities of changed files inside withheld directories, and their values for the
    redactor (a walk reads every file under one; the mirror never holds them)."""
    out: list[Ident] = []
    for rel in rels:
        try:
            fd = open_dir(src_root, _parent(rel))
        except OSError:
            continue  # gone, or no longer under a directory: nothing to learn
        top = _parent(rel)
        while top and top not in st.withheld:
            top = _parent(top)
        try:
            ident, data = stager.identify(fd, rel.rpartition("/")[2], top or rel, stager._shown(rel))
        finally:
            os.close(fd)
        if ident is not None:
            out.append(ident)
        text = values_text(data) if stager.redactor is not None and data is not None else None
        if stager.redactor is not None and text is not None:
            stager.redactor.add_file_values(text)
    return out


def _fold_ids(st: KeptState, stager: Incremental, scope: set[str], hidden: set[str], hidden_ids: list[Ident]) -> None:
    """Replace the identities of the withheld records this refresh saw again; flag a change."""
    kept = [i for i in st.ids if i.top not in scope and i.path not in hidden]
    new = [*kept, *stager.result.ids, *hidden_ids]
    before = Counter((i.node, i.sha256) for i in st.ids)
    stager.identity_changed = before != Counter((i.node, i.sha256) for i in new)
    st.ids = new


def _relist(
    st: KeptState,
    stager: Incremental,
    src_root: int,
    dst_root: int,
    d: str,
    deep: set[str],
    scope: set[str],
    rescanned: set[str],
) -> bool:
    """Re-list directory `d`; False when it is no longer a directory of the workspace."""
    try:
        src = open_dir(src_root, d)
    except OSError:
        return False
    try:
        try:
            dst = open_dir(dst_root, d)
        except OSError as exc:
            raise Inconsistent(f"the mirror lacks the directory {d!r}") from exc
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


def _fold(
    workspace: Path, st: KeptState, stager: Incremental, dst_root: int, scope: set[str], stats: RefreshStats
) -> None:
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
        if stager.drop_at(dst_root, rel):
            dropped.append(rel)
    touched = scope | new_base.keys() | stager.new.keys()
    touched |= {w.path for w in res.withheld} | {s.path for s in res.skipped}
    before = {rel: st.base.get(rel) for rel in scope | new_base.keys()}
    was = {rel: (st.withheld.get(rel), st.cache.get(rel)) for rel in scope}
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
    for rel, e in specials_of(workspace, new_skipped).items():
        st.specials[rel] = e
        nodes[rel] = e
    for rel in touched:
        if rel in st.base or rel in st.withheld or rel in st.skipped or rel in st.cache:
            st.children.setdefault(_parent(rel), set()).add(rel.rpartition("/")[2])
    for rel in sorted(st.links):  # links are judged on the whole manifest, as after a walk
        e = st.base[rel]
        if link_escapes(rel, e.target or "", st.base):
            if not stager.drop_at(dst_root, rel):
                raise Inconsistent(f"the mirror lacks the directory of {rel!r}")
            del st.base[rel]
            st.links.discard(rel)
            st.withheld[rel] = ESCAPE
            nodes[rel] = None
            scope.add(rel)
    stager.withheld_changed = _withheld_changed(st, was, res.withheld)
    stager.changed = []
    for rel, old in before.items():
        now = st.base.get(rel)
        if now != old and (now is None or now.kind is not Kind.DIR):
            stager.changed.append(rel)
    # removals first (a removed directory takes its subtree), then what is there now
    st.tree.update({p: None for p, e in nodes.items() if e is None})
    st.tree.update({p: e for p, e in nodes.items() if e is not None})
    stats.removed += len(dropped)


def _withheld_changed(st: KeptState, was: dict[str, tuple[str | None, Cached | None]], now: list[Withheld]) -> bool:
    """Whether this refresh withheld a path it did not before (any rule: by name, content,
    archive, identity) or saw a withheld file change: its values may be new to the redactor, and
    an earlier version of any file may hold them (the mirror's repository must drop its dead
    objects now, not at the next walk)."""
    for w in now:
        rule, cached = was.get(w.path, (None, None))
        if rule is None or rule != w.rule:
            return True
        after = st.cache.get(w.path)  # a verdict on content is cached; one on the path is not
        if (cached is None) != (after is None) or (
            cached is not None and after is not None and cached.key != after.key
        ):
            return True  # (a file withheld by its path that changed moves its identity: a walk)
    return False


def _log_line(st: KeptState, touched: set[str], stamp: int) -> bytes:
    files: dict[str, Cached | None] = {p: st.cache.get(p) for p in touched}
    others: dict[str, Entry | None] = {}
    for p in touched:
        e = st.base.get(p)
        others[p] = e if e is not None and e.kind is not Kind.FILE else None
    return log_line(st.digest, stamp, files, others)
