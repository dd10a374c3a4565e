"""Overlay staging: a run's workspace is the mirror (read-only lower layer) under a per-run upper
layer, and inspection reads the upper layer only.

With `metacopy=off` every copy-up copies the whole file, and with `redirect_dir=off` renaming a
directory that exists in the lower layer fails with EXDEV (tools fall back to copy + delete, as
across filesystems), so the upper layer holds, exactly:

- every created or modified file, symlink or special file, in full;
- a whiteout (a character device 0/0) for each deleted node;
- directories: copied-up parents of the above (a change only if their mode changed), created
  ones, and *opaque* ones (xattr trusted.overlay.opaque=y: made where a directory was deleted and
  re-created, or where a non-directory stood); below an opaque directory nothing of the lower
  layer shows, so every base path below it that the upper layer does not hold is deleted.

The agent cannot forge any of these: making a device needs CAP_MKNOD and setting a trusted.*
xattr CAP_SYS_ADMIN, both dropped in the container. Hashes are computed only for what the upper
layer holds and for the lower nodes those paths replace or hide: the base is asked (a
`base.Base`, for a run the lower layer itself) only about the paths the upper layer touches.
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from airlockd.pipeline.manifest import ChangeSet, Manifest, diff
from airlockd.staging.bounds import ChangeBounds, Tally
from airlockd.staging.fdtree import O_DIR, entry_at
from airlockd.staging.readback import read_nodes
from airlockd.staging.records import StagingError
from airlockd.staging.upperdump import read_dump

if TYPE_CHECKING:
    from airlockd.staging.base import Base

OPAQUE = "trusted.overlay.opaque"
# Complete copy-up (no metadata-only copies whose data stays in the lower layer), no directory
# redirects (renames of lower directories fail with EXDEV and become copy + delete), no inode
# index; xino/nfs_export off so nothing depends on the lower layer's inode numbers.
OPTIONS = "metacopy=off,redirect_dir=off,index=off,xino=off,nfs_export=off"
_BAD_CHARS = frozenset(",:\\") | frozenset(chr(c) for c in range(33))


def is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _opaque(dir_fd: int, name: str) -> bool:
    fd = os.open(name, O_DIR, dir_fd=dir_fd)
    try:
        return os.getxattr(fd, OPAQUE) == b"y"
    except OSError:
        return False
    finally:
        os.close(fd)


def scan_upper(upper: Path, tally: Tally | None = None) -> tuple[Manifest, list[str], list[str]]:
    """(entries of every non-whiteout node, whiteout paths, opaque directory paths) of an upper
    layer, hashing each file it holds through an fd opened without following links; each node
    counted by `tally` first (which stops the walk at a bound)."""
    after: Manifest = {}
    whiteouts: list[str] = []
    opaque: list[str] = []

    def visit(fd: int, rel: str, de: os.DirEntry[str], st: os.stat_result) -> None:
        if is_whiteout(st):
            whiteouts.append(rel)
            return
        after[rel] = entry_at(fd, de.name, st)
        if stat.S_ISDIR(st.st_mode) and _opaque(fd, de.name):
            opaque.append(rel)

    read_nodes(upper, visit, tally)
    return after, whiteouts, opaque


def inspect_upper(upper: Path, base: Base, bounds: ChangeBounds | None = None) -> ChangeSet:
    """The changes from `base` (what the lower layer shows: `runbase.LowerBase`, or a manifest's
    `runbase.ManifestBase`) that the upper layer `upper` makes.

    Only what the upper layer holds is read and hashed, and the base is asked only about the
    paths the upper layer touches (and, below a whiteout, an opaque directory or a non-directory
    over a lower directory, what it hides); the result equals `diff(base, merged)` for the merged
    view (a file written back identical, or only touched, is no change)."""
    tally = None if bounds is None else Tally(bounds, lambda rel: base.get(rel) is not None)
    return changes(scan_upper(upper, tally), base)


def inspect_stream(chunks: Iterable[bytes], dest: Path, base: Base, bounds: ChangeBounds | None = None) -> ChangeSet:
    """`inspect_upper` of an upper layer this process cannot open, from the stream
    `upperdump.DUMP` made of it where it lives; its files are written under `dest` on the way."""
    tally = None if bounds is None else Tally(bounds, lambda rel: base.get(rel) is not None)
    return changes(read_dump(chunks, dest, tally), base)


def changes(scanned: tuple[Manifest, list[str], list[str]], base: Base) -> ChangeSet:
    """The changes from `base` of an upper layer scanned as (entries, whiteouts, opaque)."""
    after, whiteouts, opaque = scanned
    touched = set(after)
    for rel in whiteouts:
        touched.add(rel)
        touched.update(base.below(rel))
    for rel in opaque:
        touched.update(base.below(rel))
    for rel in list(after):  # a non-directory in upper hides whatever the lower had below it
        if after[rel].kind.value != "dir":
            touched.update(base.below(rel))
    b: Manifest = {}
    for p in sorted(touched):
        e = base.get(p)
        if e is not None:
            b[p] = e
    a = {p: after[p] for p in touched if p in after}
    return diff(b, a)


# -- availability and mounts ----------------------------------------------------------------------


def options(lower: Path, upper: Path, work: Path) -> str:
    return f"lowerdir={lower},upperdir={upper},workdir={work},{OPTIONS}"


def unsuitable_path(*paths: Path) -> str | None:
    for p in paths:
        if any(c in _BAD_CHARS for c in str(p)):
            return f"the path {str(p)!r} has a character overlay mount options cannot carry (',', ':', '\\\\' or space)"
    return None


def _run(args: list[str]) -> str | None:
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")


@functools.cache
def _probe(where: str) -> str | None:
    """Mount a tiny overlay with OPTIONS (upper on a tmpfs, as runs have it) under `where`, in a
    folder of this call's own (run processes of one workspace probe at the same time)."""
    base = Path(where) / f".overlay-probe-{os.getpid()}-{os.urandom(4).hex()}"
    layers, lower, merged = base / "layers", base / "lower", base / "merged"
    for d in (layers, lower, merged):
        d.mkdir(parents=True, exist_ok=True)
    try:
        if err := _run(["mount", "-t", "tmpfs", "-o", "size=1m", "airlockd-probe", str(layers)]):
            return f"cannot mount a tmpfs for the upper layer: {err}"
        try:
            (layers / "upper").mkdir()
            (layers / "work").mkdir()
            opts = options(lower, layers / "upper", layers / "work")
            if err := _run(["mount", "-t", "overlay", "-o", opts, "overlay", str(merged)]):
                return f"the kernel refused an overlay with {OPTIONS}: {err}"
            _run(["umount", str(merged)])
        finally:
            _run(["umount", "-l", str(layers)])
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return None


def unavailable(state_root: Path) -> str | None:
    """None when overlay staging can be used with state under `state_root`; else why not."""
    if os.geteuid() != 0:
        return "airlockd is not running as root: it cannot mount the capped upper layer or probe overlay support"
    try:
        if "overlay" not in Path("/proc/filesystems").read_text().split():
            _run(["modprobe", "overlay"])
            if "overlay" not in Path("/proc/filesystems").read_text().split():
                return "the kernel has no overlay filesystem"
    except OSError as exc:
        return f"cannot read /proc/filesystems: {exc.strerror}"
    if why := unsuitable_path(state_root):
        return why
    state_root.mkdir(parents=True, exist_ok=True)
    return _probe(str(state_root.resolve()))


def mount(lower: Path, upper: Path, work: Path, merged: Path) -> None:
    """Mount the overlay here (tests and the engine-less sandbox; runs use an engine volume)."""
    merged.mkdir(parents=True, exist_ok=True)
    if err := _run(["mount", "-t", "overlay", "-o", options(lower, upper, work), "overlay", str(merged)]):
        raise StagingError(f"cannot mount the overlay at {merged}: {err}")


def unmount(merged: Path) -> None:
    if os.path.ismount(merged):
        _run(["umount", "-l", str(merged)])
