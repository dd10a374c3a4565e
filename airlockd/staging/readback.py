"""Read back: the manifest of a tree as it is on disk, and what a run changed in its copy, hashed
again from the filesystem (never the agent's account of it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from airlockd.pipeline.manifest import ChangeSet, Kind, Manifest, diff
from airlockd.staging.bounds import ChangeBounds, Tally
from airlockd.staging.fdtree import O_DIR, entry_at, walk_fds
from airlockd.staging.records import StagingError


def read_nodes(
    root: Path, visit: Callable[[int, str, os.DirEntry[str], os.stat_result], None], tally: Tally | None
) -> None:
    """`visit(dir_fd, rel, entry, lstat)` for every node under `root` (a staging copy or an upper
    layer), each counted by `tally` first (which stops the walk at a bound). Never follows a
    symlink. A node that vanishes meanwhile (in the walk or in `visit`) is left out; one that
    cannot be read raises `StagingError` (an unreadable corner is never silently taken for an
    unchanged one)."""
    try:
        root_fd = os.open(root, O_DIR)
        try:
            for fd, rel, de in walk_fds(root_fd):
                try:
                    st = de.stat(follow_symlinks=False)
                    if tally is not None:
                        tally.count(rel, st)
                    visit(fd, rel, de, st)
                except FileNotFoundError:
                    continue
        finally:
            os.close(root_fd)
    except OSError as exc:
        raise StagingError(
            f"cannot read {exc.filename or root} in the staging copy {root}: {exc.strerror}",
            hint="the agent may have changed permissions; the run cannot be inspected",
        ) from None


def scan_tree(root: Path, tally: Tally | None = None) -> Manifest:
    """Manifest of everything under `root`, every hash computed now from the bytes on disk
    (`read_nodes`; a fifo or device is never opened)."""
    out: Manifest = {}

    def visit(fd: int, rel: str, de: os.DirEntry[str], st: os.stat_result) -> None:
        out[rel] = entry_at(fd, de.name, st)

    read_nodes(root, visit, tally)
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
