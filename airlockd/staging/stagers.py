"""Which stager a run uses, where its proposed content lives, and the overlay stager's layout.

Two stagers give a run its private `/workspace`:

- "overlay" (preferred): the workspace's mirror (pipeline/mirror.py) as a read-only lower layer,
  a per-run upper layer and work directory on the run's capped tmpfs (`run_dir/staging`, so the
  growth cap caps exactly what the agent writes), mounted by the engine as a named volume;
- "copy" (the fallback): a full copy into `run_dir/staging` (pipeline/staging.py).

`choose()` picks one per run: AIRLOCK_STAGER=overlay|copy forces it (a forced overlay that cannot
work is an error, never a silent copy); otherwise overlay whenever `overlay.unavailable()` finds
nothing against it. `proposed_path()` is the one accessor for "the file the agent proposes" that
both stagers answer: the upper layer for overlay (copy-up is complete), the copy otherwise.

Inspection asks a `Base` about the run's base, and only about the paths that matter: `run_base()`
answers from the lower layer itself for overlay runs (`LowerBase`: the mirror generation stays
referenced until inspection is done, and is exactly the base but for the paths `hide()` recorded),
from the saved manifest `base.json` for copy runs (`ManifestBase`).
"""

from __future__ import annotations

import bisect
import errno
import json
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from airlockd.pipeline.classify import fold
from airlockd.pipeline.manifest import ChangeSet, Entry, Kind, Manifest, load_manifest
from airlockd.staging import overlay
from airlockd.staging.copy import StageResult, StagingError, inspect
from airlockd.staging.fdtree import O_DIR, entry_at, open_dir, walk_fds
from airlockd.staging.mirror import Mirror, MirrorView
from airlockd.staging.treedigest import SCHEME, TreeDigest

OVERLAY = "overlay"
COPY = "copy"
ENV = "AIRLOCK_STAGER"
_META = "stager.json"
_HIDDEN = "hidden.jsonl"


def choose(state_root: Path) -> tuple[str, str]:
    """(stager, why) for the next run with state under `state_root`."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced not in ("", OVERLAY, COPY):
        raise StagingError(f"{ENV}={forced!r} is not a stager", hint=f"use {ENV}=overlay or {ENV}=copy, or unset it")
    if forced == COPY:
        return COPY, f"forced by {ENV}=copy"
    why = overlay.unavailable(state_root)
    if forced == OVERLAY:
        if why:
            raise StagingError(f"{ENV}=overlay, but overlay staging is unavailable: {why}")
        return OVERLAY, f"forced by {ENV}=overlay"
    if why:
        return COPY, f"overlay unavailable: {why}"
    return OVERLAY, "root, kernel overlay with complete copy-up, capped tmpfs for the upper layer"


@dataclass(frozen=True)
class Layout:
    """Where one overlay run's layers are (all on the run's capped tmpfs but `lower`)."""

    lower: Path
    upper: Path
    work: Path

    @property
    def options(self) -> str:
        return overlay.options(self.lower, self.upper, self.work)

    @property
    def hidden(self) -> Path:
        """The record of the paths `hide()` took out of the base (JSON strings, one a line),
        beside the layers, where the agent cannot reach it."""
        return self.upper.parent / _HIDDEN


def layout(staging: Path, lower: Path) -> Layout:
    return Layout(lower, staging / "upper", staging / "work")


def prepare(lay: Layout, owner: tuple[int, int] | None) -> None:
    """Create the upper and work directories; the upper root gives the merged root its owner and
    mode (the lower root's)."""
    lay.upper.mkdir(mode=0o700)
    lay.work.mkdir(mode=0o700)
    st = os.lstat(lay.lower)
    if owner is not None:
        os.chown(lay.upper, *owner)
    os.chmod(lay.upper, stat.S_IMODE(st.st_mode))


def hide(lay: Layout, rel: str) -> None:
    """Make `rel` absent from the merged view before the agent starts: a whiteout in the upper
    layer, its parents copied up as they are in the lower (mode and owner). The path is recorded
    (`Layout.hidden`): it is no longer part of the base the lower layer shows."""
    with open(lay.hidden, "a", encoding="ascii") as fh:
        fh.write(json.dumps(rel) + "\n")
    parts = rel.split("/")
    for i in range(1, len(parts)):
        sub = "/".join(parts[:i])
        up = lay.upper / sub
        if not up.exists():
            st = os.lstat(lay.lower / sub)
            up.mkdir(mode=0o700)
            os.chown(up, st.st_uid, st.st_gid)
            os.chmod(up, stat.S_IMODE(st.st_mode))
    os.mknod(lay.upper / rel, stat.S_IFCHR | 0o000, os.makedev(0, 0))


def write_meta(run_dir: Path, stager: str, why: str, view: MirrorView | None = None) -> None:
    meta: dict[str, object] = {"stager": stager, "why": why}
    if view is not None:
        meta.update(lower=str(view.tree), generation=view.generation, mirror=str(view.tree.parent))
    (run_dir / _META).write_text(json.dumps(meta))


def meta(run_dir: Path) -> dict[str, object]:
    try:
        out = json.loads((run_dir / _META).read_text())
        return out if isinstance(out, dict) else {}
    except (OSError, ValueError):
        return {}


def stager_of(run_dir: Path) -> str:
    return str(meta(run_dir).get("stager", COPY))


def staged_root(run_dir: Path) -> Path:
    """The directory that holds what the agent wrote: the upper layer, or the full copy."""
    staging = run_dir / "staging"
    return staging / "upper" if stager_of(run_dir) == OVERLAY else staging


def proposed_path(run_dir: Path, rel: str) -> Path:
    """Where the proposed content of `rel` (a created or modified file) is, for either stager."""
    return staged_root(run_dir) / rel


# -- the run's base, asked only about the paths that matter ----------------------------------------


class Base(Protocol):
    """A run's base tree, looked up by relative path."""

    def get(self, rel: str) -> Entry | None:
        """The base entry of `rel`; None when the base has no such path."""
        ...

    def below(self, rel: str) -> list[str]:
        """Every base path under directory `rel` (`rel` itself excluded), sorted."""
        ...

    def twins(self, paths: Iterable[str]) -> list[str]:
        """The base paths equal, as `classify` folds them for case collisions, to any of `paths`
        or any of their parent directories, sorted."""
        ...


def _folds(paths: Iterable[str]) -> set[str]:
    """The folded forms of `paths` and of all their parent directories."""
    out: set[str] = set()
    for p in paths:
        parts = p.split("/")
        out.update(fold("/".join(parts[:i])) for i in range(1, len(parts) + 1))
    return out


class ManifestBase:
    """A base given as a manifest (the copy stager's `base.json`; tests)."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self._keys: list[str] | None = None

    def get(self, rel: str) -> Entry | None:
        return self.manifest.get(rel)

    def below(self, rel: str) -> list[str]:
        if self._keys is None:
            self._keys = sorted(self.manifest)
        keys = self._keys
        if not rel:
            return list(keys)
        prefix = rel + "/"
        out = []
        for i in range(bisect.bisect_left(keys, prefix), len(keys)):
            if not keys[i].startswith(prefix):
                break
            out.append(keys[i])
        return out

    def twins(self, paths: Iterable[str]) -> list[str]:
        want = _folds(paths)
        return sorted(p for p in self.manifest if fold(p) in want) if want else []


_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)
_Trie = dict[str, "_Trie"]


class LowerBase:
    """The base of an overlay run, read from its lower layer (the run's mirror generation, whose
    every node is the base's: content, mode and kind) less the paths `hide()` recorded. Each
    question reads only the nodes it is about, through directory descriptors opened one
    component at a time without following links: a symlinked directory is never entered, so a
    path through one is absent, as in a manifest."""

    def __init__(self, lower: Path, hidden: Iterable[str] = ()) -> None:
        self.lower = lower
        self.hidden = frozenset(hidden)
        self._barren: set[str] = set()  # paths known to have nothing below them in the lower

    def _is_hidden(self, rel: str) -> bool:
        if not self.hidden:
            return False
        parts = rel.split("/")
        return any("/".join(parts[:i]) in self.hidden for i in range(1, len(parts) + 1))

    def _open(self, rel: str) -> int | None:
        """A descriptor of directory `rel` of the lower layer; None when there is none there."""
        try:
            root = os.open(self.lower, O_DIR)
            try:
                return open_dir(root, rel)
            finally:
                os.close(root)
        except OSError as exc:
            if exc.errno in _ABSENT:
                return None
            raise self._error(exc) from None

    def _error(self, exc: OSError) -> StagingError:
        return StagingError(
            f"cannot read {exc.filename or self.lower} in the mirror generation {self.lower}: {exc.strerror}",
            hint="the run's lower layer must stay in place until it is inspected",
        )

    def get(self, rel: str) -> Entry | None:
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts) or self._is_hidden(rel):
            return None
        if any("/".join(parts[:i]) in self._barren for i in range(1, len(parts))):
            return None
        parent, _, name = rel.rpartition("/")
        fd = self._open(parent)
        if fd is None:
            self._barren.add(parent)
            return None
        try:
            entry = entry_at(fd, name, os.stat(name, dir_fd=fd, follow_symlinks=False))
        except OSError as exc:
            if exc.errno not in _ABSENT:
                raise self._error(exc) from None
            self._barren.add(rel)
            return None
        finally:
            os.close(fd)
        if entry.kind is not Kind.DIR:
            self._barren.add(rel)
        return entry

    def below(self, rel: str) -> list[str]:
        parts = rel.split("/") if rel else []
        if any(p in ("", ".", "..") for p in parts):
            return []
        fd = self._open(rel)
        if fd is None:
            return []
        prefix = rel + "/" if rel else ""
        try:
            out = [prefix + sub for _, sub, _ in walk_fds(fd)]
        except OSError as exc:
            raise self._error(exc) from None
        finally:
            os.close(fd)
        return sorted(p for p in out if not self._is_hidden(p))

    def twins(self, paths: Iterable[str]) -> list[str]:
        """Found by descending only the directories along `paths`, matching each name folded:
        O(depth x fan-out), never the whole tree."""
        paths = list(paths)
        want = _folds(paths)
        trie: _Trie = {}  # folded name -> what to look for below it
        for p in paths:
            node = trie
            for part in p.split("/"):
                node = node.setdefault(fold(part), {})
        out: list[str] = []
        root = self._open("") if trie else None
        if root is None:
            return []
        stack: list[tuple[int, str, _Trie]] = [(root, "", trie)]
        try:
            while stack:
                fd, prefix, node = stack.pop()
                try:
                    with os.scandir(fd) as it:
                        hits = [(de.name, de.is_dir(follow_symlinks=False), fold(de.name)) for de in it]
                    for name, is_dir, key in hits:
                        if key not in node:
                            continue
                        rel = prefix + name
                        if fold(rel) in want and not self._is_hidden(rel):
                            out.append(rel)
                        sub = node[key]
                        if not (is_dir and sub):
                            continue
                        try:
                            stack.append((os.open(name, O_DIR, dir_fd=fd), rel + "/", sub))
                        except OSError as exc:
                            if exc.errno not in _ABSENT:
                                raise
                finally:
                    os.close(fd)
        except OSError as exc:
            raise self._error(exc) from None
        finally:
            for fd, _, _ in stack:
                os.close(fd)
        return sorted(out)


def hidden_paths(run_dir: Path) -> list[str]:
    """The paths `hide()` took out of an overlay run's base."""
    try:
        lines = (run_dir / "staging" / _HIDDEN).read_text(encoding="ascii").splitlines()
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise StagingError(f"cannot read the run's record of hidden paths: {exc}") from None
    try:
        return [str(json.loads(line)) for line in lines if line]
    except ValueError as exc:
        raise StagingError(f"the run's record of hidden paths is damaged: {exc}") from None


def run_base(run_dir: Path) -> Base:
    """The run's base: its lower layer for an overlay run (never `base.json`, which an overlay
    run need not have), its saved manifest for a copy run."""
    m = meta(run_dir)
    if m.get("stager") == OVERLAY:
        if not m.get("lower"):
            raise StagingError(f"the overlay run in {run_dir} has no lower layer on record")
        return LowerBase(Path(str(m["lower"])), hidden_paths(run_dir))
    return ManifestBase(load_manifest(run_dir / "base.json"))


def inspect_run(run_dir: Path, base: Base) -> ChangeSet:
    """The run's change set: from the upper layer (overlay) or a full rescan (copy, whose base is
    its `ManifestBase`)."""
    if stager_of(run_dir) == OVERLAY:
        return overlay.inspect_upper(run_dir / "staging" / "upper", base)
    if not isinstance(base, ManifestBase):
        raise TypeError("a copy run is inspected against its manifest (a ManifestBase)")
    return inspect(run_dir / "staging", base.manifest)


def release(run_dir: Path, is_live: Callable[[str], bool] = lambda r: True) -> None:
    """The run's overlay is gone: drop its reference to the mirror generation (idempotent)."""
    m = meta(run_dir)
    if m.get("stager") == OVERLAY and m.get("mirror"):
        Mirror(Path(str(m["mirror"]))).release(run_dir.name, is_live)


def live_tree_of(workspace: Path, result: StageResult) -> dict[str, object]:
    """`evidence.live_tree(workspace, withheld)` from what a mirror refresh just established,
    without reading the workspace again: the base manifest is the live tree minus what was
    withheld (whose paths the digest leaves out too), plus the special files the stager skipped
    (looked up here; nodes that vanished are absent from both)."""
    from airlockd.pipeline.manifest import entry_for

    nodes = dict(result.base)
    for s in result.skipped:
        if s.rule.startswith("special-file:"):
            try:
                nodes[s.path] = entry_for(workspace / s.path)
            except OSError:
                continue
    return live_tree_from(TreeDigest.of(nodes))


def live_tree_from(digest: TreeDigest) -> dict[str, object]:
    """The `evidence.live_tree` dict from a digest already at hand (one kept up to date as the
    tree changes): its root digest, node count and scheme."""
    import time

    return {"sha256": digest.hexdigest(), "entries": len(digest), "scheme": SCHEME, "at": round(time.time(), 3)}
