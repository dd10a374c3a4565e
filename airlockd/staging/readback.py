"""Read back: the manifest of a tree as it is on disk, and what a run changed in its copy, hashed
again from the filesystem (never the agent's account of it)."""

from __future__ import annotations

import os
from pathlib import Path

from airlockd.pipeline.manifest import ChangeSet, Kind, Manifest, diff
from airlockd.staging.bounds import ChangeBounds, Tally
from airlockd.staging.fdtree import O_DIR, entry_at, walk_fds
from airlockd.staging.records import StagingError


def scan_tree(root: Path, tally: Tally | None = None) -> Manifest:
    """Manifest of everything under `root`, every hash computed now from the bytes on disk.

    Never follows a symlink and never opens a fifo or device. A node that vanishes during the scan
    is left out; one that cannot be read raises `StagingError` (an unreadable corner is never
    silently taken for an unchanged one)."""
    out: Manifest = {}
    try:
        root_fd = os.open(root, O_DIR)
        try:
            for fd, rel, de in walk_fds(root_fd):
                try:
                    st = de.stat(follow_symlinks=False)
                    if tally is not None:
                        tally.count(rel, st)
                    out[rel] = entry_at(fd, de.name, st)
                except FileNotFoundError:
                    continue
        finally:
            os.close(root_fd)
    except OSError as exc:
        raise StagingError(
            f"cannot read {exc.filename or root} in the staging copy {root}: {exc.strerror}",
            hint="the agent may have changed permissions; the run cannot be inspected",
        ) from None
    return out


def inspect(staging: Path, base: Manifest, bounds: ChangeBounds | None = None) -> ChangeSet:
    """The changes from `base` to what is on disk in `staging` now.

    Rescans and rehashes the whole copy; never trusts a hash, a list of changes or anything else
    the agent says. With `bounds`, the agent's allowance is counted on top of the base's own
    entries and bytes (staging/bounds.py)."""
    tally = None
    if bounds is not None:
        base_bytes = sum(e.size for e in base.values() if e.kind is Kind.FILE)
        tally = Tally(bounds, base.__contains__, base_entries=len(base), base_bytes=base_bytes)
    return diff(base, scan_tree(staging, tally))
