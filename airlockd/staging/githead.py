"""What a workspace's git repository is, for staging (staging/gitcopy.py): which entries are
history (`.git`, a directory of git's layout under any name, a bundle or a packfile: withheld,
never read), and where the workspace's HEAD is (the branch the fresh repository is on)."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from airlockd.redact import secret_in_name

DOTGIT = ".git"
RULE = "git-history"
DEFAULT_BRANCH = "main"
_HEAD_READ = 4096
_BRANCH = re.compile(r"(?!.*\.\.)(?!.*//)(?!.*@\{)(?![-./])(?!.*[./]$)(?!.*\.lock(?:/|$))[A-Za-z0-9._/+-]{1,200}")
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def is_git_entry(name: str) -> bool:
    """Whether a directory entry is a repository's `.git` (a directory, or a `gitdir:` file)."""
    return name == DOTGIT


def is_git_dir(parent_fd: int, name: str) -> bool:
    """Whether directory `name` under `parent_fd` is a repository of git's own layout under
    any other name (a bare clone `backup.git`, a `.jj/repo/store/git`, a moved `.git`): a `HEAD`
    file beside `objects/` and `refs/` directories. Its history is as secret as `.git`'s."""
    try:
        head = os.stat(f"{name}/HEAD", dir_fd=parent_fd, follow_symlinks=False)
        objects = os.stat(f"{name}/objects", dir_fd=parent_fd, follow_symlinks=False)
        refs = os.stat(f"{name}/refs", dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(head.st_mode) and stat.S_ISDIR(objects.st_mode) and stat.S_ISDIR(refs.st_mode)


def git_data(head: bytes) -> str | None:
    """What git history a file holds, by its first bytes: a bundle (`git bundle create`) or a
    packfile; None for anything else."""
    if head.startswith((b"# v2 git bundle\n", b"# v3 git bundle\n")):
        return "bundle"
    if head[:4] == b"PACK" and head[4:8] in (b"\0\0\0\x02", b"\0\0\0\x03"):
        return "packfile"
    return None


# -- the workspace's HEAD -------------------------------------------------------------------------


@dataclass(frozen=True)
class Head:
    """Where the workspace's HEAD is: a branch name, or detached (`branch` None)."""

    branch: str | None


def workspace_head(workspace: Path) -> Head | None:
    """The workspace's HEAD, read from `.git/HEAD` (or the HEAD of the directory a `gitdir:` file
    names); None when the workspace is no repository. A branch name git would not take, one that
    carries a secret (redact.secret_in_name), or a HEAD that cannot be read, is `main`. Reads
    two small files; never follows `.git` if a link."""
    dotgit = workspace / DOTGIT
    try:
        st = os.lstat(dotgit)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        gitdir = dotgit
    elif stat.S_ISREG(st.st_mode):
        text = _read_small(dotgit)
        if text is None or not text.startswith("gitdir:"):
            return None
        gitdir = workspace / text[len("gitdir:") :].strip()
    else:
        return None
    head = _read_small(gitdir / "HEAD")
    if head is None:
        return Head(DEFAULT_BRANCH)
    head = head.strip()
    if head.startswith("ref: refs/heads/"):
        name = head[len("ref: refs/heads/") :].strip()
        fine = _BRANCH.fullmatch(name) and not secret_in_name(name)  # `fix/<a token>`: not copied
        return Head(name if fine else DEFAULT_BRANCH)
    if _HEX.fullmatch(head):
        return Head(None)
    return Head(DEFAULT_BRANCH)


def _read_small(path: Path) -> str | None:
    try:
        fd = os.open(path, _O_READ)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, _HEAD_READ).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
