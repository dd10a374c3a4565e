"""The overlay stager behind the copy stager's interface (`stage` / `inspect` on one directory),
for tests and benchmarks that run the same checks against both: `stage_merged` mounts mirror +
upper layer at the destination with the kernel (needs root), `inspect_merged` inspects it from the
upper layer, `unmount_merged` takes it down."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from airlockd.pipeline.manifest import ChangeSet, Manifest
from airlockd.policy import Level, Policy
from airlockd.redact import Redactor
from airlockd.staging import capfs, overlay, stagers
from airlockd.staging.base import Base
from airlockd.staging.mirror import Mirror
from airlockd.staging.readback import inspect
from airlockd.staging.records import StageResult, StagingError
from airlockd.staging.runbase import ManifestBase

MOUNTED: dict[str, Path] = {}  # merged mount point -> its upper layer


def stage_merged(
    workspace: Path,
    dest: Path,
    policy: Policy,
    clearance: Level,
    *,
    owner: tuple[int, int] | None = None,
    redactor: Redactor | None = None,
    progress: Callable[[int, int], None] | None = None,
    mirror_root: Path | None = None,
) -> StageResult:
    """`staging.stage` done the overlay way: refresh a mirror (beside `dest` unless given), and
    mount mirror + a fresh upper layer (on a tmpfs) at `dest` with the kernel. `inspect_merged`
    then inspects from the upper layer. Needs root."""
    ws = os.path.realpath(workspace)
    if os.path.commonpath([ws, os.path.realpath(dest)]) == ws:
        raise StagingError(f"staging destination {dest} is inside the workspace {workspace}")
    if dest.exists() and (not dest.is_dir() or dest.is_symlink() or any(dest.iterdir())):
        raise StagingError(f"staging destination {dest} exists and is not an empty directory")
    mirror = Mirror(mirror_root or dest.parent / f".{dest.name}.mirror")
    view = mirror.refresh(workspace, policy, clearance, owner=owner, redactor=redactor, progress=progress)
    layers = dest.parent / f".{dest.name}.layers"
    capfs.mount(layers)
    lay = stagers.layout(layers, view.tree)
    stagers.prepare(lay, owner)
    overlay.mount(lay.lower, lay.upper, lay.work, dest)
    MOUNTED[str(dest)] = lay.upper
    return view.result


def inspect_merged(dest: Path, base: Manifest | Base) -> ChangeSet:
    """Inspect a tree `stage_merged` mounted (from its upper layer, against `base`: a manifest or
    a `Base`, such as the `LowerBase` of its mirror); a plain copy otherwise (a manifest)."""
    upper = MOUNTED.get(str(dest))
    if upper is not None:
        return overlay.inspect_upper(upper, ManifestBase(base) if isinstance(base, dict) else base)
    if isinstance(base, ManifestBase):
        base = base.manifest
    if not isinstance(base, dict):
        raise TypeError("a plain copy is inspected against a manifest")
    return inspect(dest, base)


def unmount_merged(dest: Path) -> None:
    upper = MOUNTED.pop(str(dest), None)
    overlay.unmount(dest)
    if upper is not None:
        capfs.unmount(upper.parent)
