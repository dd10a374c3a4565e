"""The two stagers behind `base.Stager`, which one a run uses, and the overlay stager's layout.

Two stagers give a run its private `/workspace`:

- `OverlayStager` (preferred): the workspace's mirror (staging/mirror.py) as a read-only lower
  layer, a per-run upper layer and work directory on the run's capped tmpfs (`run_dir/staging`, so
  the growth cap caps exactly what the agent writes), mounted by the engine as a named volume;
- `CopyStager` (the fallback): a full copy into `run_dir/staging` (staging/copy.py).

`choose()` picks one per run: AIRLOCK_STAGER=overlay|copy forces it (a forced overlay that cannot
work is an error, never a silent copy); otherwise overlay whenever `overlay.unavailable()` finds
nothing against it. The stager records itself in the run's folder; `for_run()` finds it again.
`proposed_path()` is the one accessor for "the file the agent proposes": the upper layer for
overlay (copy-up is complete), the copy otherwise.

Inspection asks the run's `Base` only about the paths that matter (staging/runbase.py): the lower
layer itself for overlay runs (`LowerBase`, less the paths `hide()` recorded), the saved manifest
`base.json` for copy runs (`ManifestBase`).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from airlockd.fsutil import atomic_write_bytes, remove_tree
from airlockd.pipeline.manifest import ChangeSet, Entry, Kind, Manifest, load_manifest, save_manifest
from airlockd.staging import capfs, gitcopy, overlay
from airlockd.staging.base import Base, HeldUpper, Staged, Stager, StageRequest
from airlockd.staging.bounds import ChangeBounds, Tally
from airlockd.staging.copy import stage as copy_stage
from airlockd.staging.mirror import Mirror, MirrorView
from airlockd.staging.readback import inspect
from airlockd.staging.records import StageResult, StagingError
from airlockd.staging.runbase import LowerBase, ManifestBase
from airlockd.staging.treedigest import SCHEME, TreeDigest
from airlockd.staging.upperdump import read_dump

OVERLAY = "overlay"
COPY = "copy"
ENV = "AIRLOCK_STAGER"
_META = "stager.json"
_HIDDEN = "hidden.jsonl"


def choose(state_root: Path, held: HeldUpper | None = None) -> Stager:
    """The stager for the next run with state under `state_root` (its `why` says why); `held`:
    the engine can hold a capped upper layer, which serves when this process cannot mount one
    (not root)."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced not in ("", OVERLAY, COPY):
        raise StagingError(f"{ENV}={forced!r} is not a stager", hint=f"use {ENV}=overlay or {ENV}=copy, or unset it")
    remote = held is not None and held.remote
    if forced == COPY:
        if remote:
            raise StagingError(
                f"{ENV}=copy, but the engine is remote: it cannot see a copy made on this machine",
                hint=f"unset {ENV}; runs on a remote engine are staged in its own volumes (docs/engines.md)",
            )
        return CopyStager(f"forced by {ENV}=copy")
    if remote:
        return OverlayStager("remote engine: the mirror is synced into its volume, the capped upper layer held there")
    why = overlay.unavailable(state_root)
    if why and held is not None and os.geteuid() != 0 and not overlay.unsuitable_path(state_root):
        held_why = "not root: the engine mounts the overlay and holds the capped upper layer"
        return OverlayStager(f"forced by {ENV}=overlay; {held_why}" if forced else held_why)
    if forced == OVERLAY:
        if why:
            raise StagingError(f"{ENV}=overlay, but overlay staging is unavailable: {why}")
        return OverlayStager(f"forced by {ENV}=overlay")
    if why:
        return CopyStager(f"overlay unavailable: {why}")
    return OverlayStager("root, kernel overlay with complete copy-up, capped tmpfs for the upper layer")


def for_run(run_dir: Path) -> Stager:
    """The stager the run in `run_dir` was staged with (a run that recorded none: the copy)."""
    m = meta(run_dir)
    why = str(m.get("why", ""))
    return OverlayStager(why) if m.get("stager") == OVERLAY else CopyStager(why)


@dataclass(frozen=True)
class Layout:
    """Where one overlay run's layers are: all on the run's capped tmpfs but `lower` (the upper
    and work directories are paths on the engine's host when the engine holds them)."""

    lower: Path
    upper: Path
    work: Path
    staging: Path  # the run's own `staging/` here, where the record of hidden paths is
    tail: str = overlay.OPTIONS
    engine_lower: str | None = None  # the lower layer on a remote engine's host (its copy of `lower`)

    @property
    def options(self) -> str:
        lower = self.engine_lower or self.lower
        return f"lowerdir={lower},upperdir={self.upper},workdir={self.work},{self.tail}"

    @property
    def hidden(self) -> Path:
        """The record of the paths `hide()` took out of the base (JSON strings, one a line),
        beside the layers, where the agent cannot reach it."""
        return self.staging / _HIDDEN


def layout(staging: Path, lower: Path) -> Layout:
    return Layout(lower, staging / "upper", staging / "work", staging)


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


def write_meta(
    run_dir: Path, stager: str, why: str, view: MirrorView | None = None, *, held: Layout | None = None,
    cap: tuple[int, int, tuple[int, int], int] | None = None,
) -> None:  # fmt: skip
    meta: dict[str, object] = {"stager": stager, "why": why}
    if view is not None:
        meta.update(lower=str(view.tree), generation=view.generation, mirror=str(view.tree.parent))
    if held is not None:
        on_engine: dict[str, object] = {"upper": str(held.upper), "work": str(held.work), "options": held.tail}
        if held.engine_lower:
            on_engine["lower"] = held.engine_lower
        if cap is not None:  # what it was held with: the daemon makes the next run's spare so
            on_engine["cap"] = [cap[0], cap[1], list(cap[2]), cap[3]]
        meta["held"] = on_engine
    (run_dir / _META).write_text(json.dumps(meta))


def view_version(view: MirrorView) -> str | None:
    """What names the content of the view's generation while the view's run references it: the
    mirror's serial as its refresh found it (bumped by every refresh that changes the mirror),
    with the generation's inode (a mirror made again from nothing starts its serials again).
    None when the view does not know the serial."""
    if view.serial is None:
        return None
    try:
        ino = os.lstat(view.tree).st_ino
    except OSError:
        return None
    return f"{view.serial}:{ino}"


def held_cap(run_dir: Path) -> tuple[int, int, tuple[int, int], int] | None:
    """(bytes, inodes, owner, mode) of the capped upper layer the engine held for the run."""
    held = meta(run_dir).get("held")
    cap = held.get("cap") if isinstance(held, dict) else None
    try:
        size, inodes, (uid, gid), mode = cap  # type: ignore[misc]
        return int(size), int(inodes), (int(uid), int(gid)), int(mode)
    except (TypeError, ValueError):
        return None


def held_run(run_dir: Path) -> bool:
    """Whether the run's upper layer was held by the engine (read back at inspection)."""
    return isinstance(meta(run_dir).get("held"), dict)


_SCAN = "upper.scan.json"


def read_back(run_dir: Path, chunks: Iterable[bytes], base: Base, bounds: ChangeBounds | None) -> None:
    """Read an engine-held upper layer, streamed as `chunks` (`HeldUpper.dump`), into the run's
    `staging/upper` (what a proposal reads) and keep its scan for `inspect`. Counted against
    `bounds` as it streams (ChangeSetTooLarge at the first node over one). Once only: a run read
    back already is left as it is."""
    staging = run_dir / "staging"
    if (staging / _SCAN).exists():
        return
    upper = staging / "upper"
    if upper.exists():  # a read cut short before (a crash): start again
        remove_tree(upper)
    tally = None if bounds is None else Tally(bounds, lambda rel: base.get(rel) is not None)
    after, whiteouts, opaque = read_dump(chunks, upper, tally)
    doc = {"after": {p: e.to_json() for p, e in after.items()}, "whiteouts": whiteouts, "opaque": opaque}
    atomic_write_bytes(staging / _SCAN, json.dumps(doc).encode())


def forget_scanned(run_dir: Path, paths: Iterable[str]) -> None:
    """Take `paths` out of the run's read-back scan (an engine-held run's), as their nodes are
    taken out of its copy: the scan names them, and a name or a link target may hold a secret."""
    scan = run_dir / "staging" / _SCAN
    try:
        doc = json.loads(scan.read_bytes())
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        raise StagingError(f"the read-back scan of run {run_dir.name} is damaged: {exc}") from None
    gone = set(paths)
    doc["after"] = {p: e for p, e in doc["after"].items() if p not in gone}
    atomic_write_bytes(scan, json.dumps(doc).encode())


def load_scan(run_dir: Path) -> tuple[Manifest, list[str], list[str]]:
    try:
        doc = json.loads((run_dir / "staging" / _SCAN).read_bytes())
        after = {p: Entry.from_json(e) for p, e in doc["after"].items()}
        return after, list(doc["whiteouts"]), list(doc["opaque"])
    except FileNotFoundError:
        raise StagingError(f"the upper layer of run {run_dir.name} was never read back from the engine") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StagingError(f"the read-back scan of run {run_dir.name} is damaged: {exc}") from None


def meta(run_dir: Path) -> dict[str, object]:
    try:
        out = json.loads((run_dir / _META).read_text())
        return out if isinstance(out, dict) else {}
    except (OSError, ValueError):
        return {}


def proposed_path(run_dir: Path, rel: str) -> Path:
    """Where the proposed content of `rel` (a created or modified file) is, for either stager."""
    return for_run(run_dir).staged_root(run_dir) / rel


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


def _inodes(result: StageResult, growth: int) -> int:
    return result.files + max(4096, growth // 4096)


class OverlayStager:
    """The mirror as the lower layer, a fresh upper layer on the run's capped tmpfs."""

    name = OVERLAY
    summary = "overlay (mirror + per-run upper layer)"
    uses_mirror = True

    def __init__(self, why: str) -> None:
        self.why = why

    def stage(self, req: StageRequest) -> Staged:
        if req.held is not None and (req.held.remote or capfs.available() is not None):
            return self._stage_held(req, req.held)
        staging = req.run_dir / "staging"
        view = req.refresh()
        result, lay = view.result, layout(staging, view.tree)
        if req.capped:  # the upper layer holds only what the agent writes: `growth` bytes, not one more
            capfs.mount(staging, req.growth, inodes=_inodes(result, req.growth))
        else:
            staging.mkdir(exist_ok=True)
        prepare(lay, req.owner)
        write_meta(req.run_dir, self.name, self.why, view)
        before = len(result.withheld)
        req.screen(lay.lower, result, lambda p: hide(lay, p))
        if len(result.withheld) != before and (lay.lower / gitcopy.DOTGIT).is_dir():
            hide(lay, gitcopy.DOTGIT)  # the mirror's repository names (and holds) what was just hidden
        # the live tree as the agent's copy was taken (evidence that it stays put while proposed),
        # as the refresh established it; the model withheld more: digest without it
        relabelled = len(result.withheld) != before
        tree = view.live_tree if view.live_tree and not relabelled else live_tree_of(req.workspace, result)
        mirror = {k: v for k, v in vars(view.stats).items() if k != "seconds"}
        entries = capfs.used_entries(staging) if req.capped else 0
        return Staged(result, capfs.used_bytes(staging) if req.capped else 0, tree, mirror, entries)

    def _stage_held(self, req: StageRequest, held: HeldUpper) -> Staged:
        """`stage` with the capped upper layer held by the engine: the same layers, laid out,
        hidden and measured through it (nothing is mounted or made here but `staging/`)."""
        staging = req.run_dir / "staging"
        staging.mkdir(exist_ok=True)
        view = req.refresh()
        result = view.result
        st = os.lstat(view.tree)
        owner = req.owner or (st.st_uid, st.st_gid)
        inodes = _inodes(result, req.growth)
        mode = stat.S_IMODE(st.st_mode)
        upper, work = held.hold(req.run_id, req.growth, inodes, owner, mode, spare=req.spare, claimed=req.claimed)
        # synced there: what changed travels (nothing, when the daemon synced it at this version)
        engine_lower = held.lower(view.tree, view_version(view)) if held.remote else None
        lay = Layout(view.tree, Path(upper), Path(work), staging, held.options, engine_lower)
        write_meta(req.run_dir, self.name, self.why, view, held=lay, cap=(req.growth, inodes, owner, mode))
        dirs: dict[str, tuple[tuple[int, int], int]] = {}
        whiteouts: list[str] = []

        def hide_there(rel: str) -> None:
            with open(lay.hidden, "a", encoding="ascii") as fh:
                fh.write(json.dumps(rel) + "\n")
            parts = rel.split("/")
            for i in range(1, len(parts)):
                sub = "/".join(parts[:i])
                if sub not in dirs:
                    pst = os.lstat(lay.lower / sub)
                    dirs[sub] = ((pst.st_uid, pst.st_gid), stat.S_IMODE(pst.st_mode))
            whiteouts.append(rel)

        before = len(result.withheld)
        req.screen(lay.lower, result, hide_there)
        if len(result.withheld) != before and (lay.lower / gitcopy.DOTGIT).is_dir():
            hide_there(gitcopy.DOTGIT)
        if whiteouts:
            held.place(req.run_id, [(d, o, m) for d, (o, m) in dirs.items()], whiteouts)
        relabelled = len(result.withheld) != before
        tree = view.live_tree if view.live_tree and not relabelled else live_tree_of(req.workspace, result)
        mirror = {k: v for k, v in vars(view.stats).items() if k != "seconds"}
        # nothing is staged on the capped filesystem but empty directories and whiteouts (no
        # blocks): what it holds later is all growth, and asking the engine would cost an exec
        return Staged(result, 0, tree, mirror, 0)

    def staged_root(self, run_dir: Path) -> Path:
        """The upper layer; for one the engine held, the copy read back from it at inspection."""
        return run_dir / "staging" / "upper"

    def layers(self, run_dir: Path) -> Layout:
        m = meta(run_dir)
        held = m.get("held")
        if isinstance(held, dict):
            staging = run_dir / "staging"
            lower = held.get("lower")
            return Layout(
                self._lower(run_dir), Path(held["upper"]), Path(held["work"]), staging, str(held["options"]),
                str(lower) if lower else None,
            )  # fmt: skip
        return layout(run_dir / "staging", self._lower(run_dir))

    def base(self, run_dir: Path) -> Base:
        """The lower layer itself (never `base.json`, which an overlay run need not have)."""
        return LowerBase(self._lower(run_dir), hidden_paths(run_dir))

    def inspect(self, run_dir: Path, base: Base, bounds: ChangeBounds | None = None) -> ChangeSet:
        """From the upper layer alone (for one the engine held, as `read_back` read it)."""
        if held_run(run_dir):
            return overlay.changes(load_scan(run_dir), base)
        return overlay.inspect_upper(self.staged_root(run_dir), base, bounds)

    def release(self, run_dir: Path, is_live: Callable[[str], bool]) -> None:
        """The run's overlay is gone: drop its reference to the mirror generation."""
        m = meta(run_dir)
        if m.get("mirror"):
            Mirror(Path(str(m["mirror"]))).release(run_dir.name, is_live)

    @staticmethod
    def _lower(run_dir: Path) -> Path:
        m = meta(run_dir)
        if not m.get("lower"):
            raise StagingError(f"the overlay run in {run_dir} has no lower layer on record")
        return Path(str(m["lower"]))


class CopyStager:
    """A full copy of the workspace, withheld files absent, on the run's capped tmpfs."""

    name = COPY
    summary = "copy (full copy per run)"
    uses_mirror = False

    def __init__(self, why: str) -> None:
        self.why = why

    def stage(self, req: StageRequest) -> Staged:
        staging = req.run_dir / "staging"
        if req.capped:
            capfs.mount(staging)
        result = copy_stage(req.workspace, staging, req.policy, req.clearance, owner=req.owner, redactor=req.redactor)
        write_meta(req.run_dir, self.name, self.why)
        req.screen(staging, result, None)
        _add_repo(result, gitcopy.build_copy(staging, req.workspace, req.owner))  # of what stayed in
        if req.capped:  # the agent may add `growth` bytes to what was staged, and not one more
            capfs.resize(staging, capfs.used_bytes(staging) + req.growth, inodes=_inodes(result, req.growth))
        save_manifest(result.base, req.run_dir / "base.json")
        entries = capfs.used_entries(staging) if req.capped else 0
        return Staged(result, capfs.used_bytes(staging) if req.capped else result.bytes, staged_entries=entries)

    def staged_root(self, run_dir: Path) -> Path:
        return run_dir / "staging"

    def layers(self, run_dir: Path) -> None:
        return None

    def base(self, run_dir: Path) -> Base:
        """The manifest saved when the run was staged."""
        return ManifestBase(load_manifest(run_dir / "base.json"))

    def inspect(self, run_dir: Path, base: Base, bounds: ChangeBounds | None = None) -> ChangeSet:
        """A full rescan of the copy against its manifest."""
        if not isinstance(base, ManifestBase):
            raise TypeError("a copy run is inspected against its manifest (a ManifestBase)")
        return inspect(self.staged_root(run_dir), base.manifest, bounds)

    def release(self, run_dir: Path, is_live: Callable[[str], bool]) -> None:
        """Nothing outside the run's folder to let go of."""


def _add_repo(result: StageResult, repo: Manifest) -> None:
    """Count the fresh repository's nodes in with the copy's (its base manifest, files, bytes)."""
    result.base.update(repo)
    files = [e for e in repo.values() if e.kind is Kind.FILE]
    result.files += len(files)
    result.bytes += sum(e.size for e in files)


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
