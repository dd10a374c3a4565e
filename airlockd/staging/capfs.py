"""Size-capped filesystems for what an agent may write: the workspace-growth limit.

The agent's writable copy lives on its own tmpfs whose size is what was staged plus the policy's
`workspace_growth_mb`; writing past it fails with ENOSPC inside the container, so the host disk is
never at risk and nothing has to be checked after the fact. Mounting needs CAP_SYS_ADMIN (airlockd
running as root); `available()` says why not otherwise, and `airlockd doctor` reports it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from airlockd.errors import AirlockError

# Before staging we do not know the size yet; the mount starts at this cap and is shrunk to
# staged bytes + growth right after staging (tmpfs can be resized while mounted).
INITIAL_FRACTION = 0.5


class CapError(AirlockError):
    kind = "capfs"


def available() -> str | None:
    """None when capped mounts can be made here; else the reason they cannot."""
    if os.geteuid() != 0:
        return "airlockd is not running as root, so it cannot mount a size-capped tmpfs for the agent's copy"
    return None


def _mount(args: list[str]) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CapError(f"`{' '.join(args)}` failed: {proc.stderr.strip()}", hint="run airlockd as root, or see doctor")


def mount(path: Path, size_bytes: int | None = None, inodes: int | None = None) -> None:
    """Mount an empty tmpfs at `path` (created), owned by root, mode 0755."""
    path.mkdir(parents=True, exist_ok=True)
    if size_bytes is None:
        size_bytes = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * INITIAL_FRACTION)
    opts = f"size={max(size_bytes, 1 << 20)},mode=0755"
    if inodes:
        opts += f",nr_inodes={inodes}"
    _mount(["mount", "-t", "tmpfs", "-o", opts, "airlockd", str(path)])


def resize(path: Path, size_bytes: int, inodes: int | None = None) -> None:
    """Set the cap of a mounted tmpfs (never below what it already holds)."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    opts = f"remount,size={max(size_bytes, used + (1 << 20))}"
    if inodes:
        used_inodes = st.f_files - st.f_ffree
        opts += f",nr_inodes={max(inodes, used_inodes + 64)}"
    _mount(["mount", "-o", opts, str(path)])


def used_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def used_entries(path: Path) -> int:
    """Inodes in use on the filesystem at `path` (every file, directory and link on it)."""
    st = os.statvfs(path)
    return st.f_files - st.f_ffree


def is_mount(path: Path) -> bool:
    return os.path.ismount(path)


def unmount(path: Path) -> None:
    """Unmount (lazily, so a straggling reader cannot block cleanup); no-op if not mounted, also
    when another process (a decision, a sweep) unmounted it between the look and the unmount."""
    if is_mount(path):
        try:
            _mount(["umount", "-l", str(path)])
        except CapError:
            if is_mount(path):
                raise
