"""The agent's home during a run: a copy on a capped filesystem, brought back when the run ends.

The agent's persistent home (`agents/<agent>/home` in the state directory: its conversations) is
never mounted into a container. An agent writing there would write to the host's disk outside
every cap (found in review: 300 MB written through `$CODEX_HOME` by a run whose workspace growth
was capped at 64 MB). So each run gets a copy, where its workspace's growth is capped too:

- as root with the overlay stager, beside the upper layer on the run's capped tmpfs
  (`staging/home`), so one cap and one measure hold for both;
- as a user who is not root, beside the upper layer on the capped filesystem the engine holds
  (sandbox/layers.py), likewise;
- as root with the copy stager (whose capped tmpfs is the agent's `/workspace`), on a tmpfs of
  its own in the run's folder (`agent-home`), as large as the agent's `workspace_growth_mb`;
- where none can be had (no cap for the workspace either, which the run's audit says), the home
  itself, as before.

The run's cap is sized for the home too (staging adds its size, `home_bytes`), and what the copy
holds before the agent starts is counted as staged, not as growth.

When the container has ended the copy replaces the persistent home (a swap: the old one is kept
until the new one is whole), and sessions.py's snapshot still decides whether the run's turns stay.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock

from airlockd.errors import AirlockError
from airlockd.fsutil import remove_tree, tree_bytes
from airlockd.staging import capfs
from airlockd.staging.base import HeldUpper
from airlockd.staging.bounds import ChangeBounds, ChangeSetTooLarge, Tally
from airlockd.staging.upperdump import read_dump

RUN_HOME = "agent-home"  # in the run's folder: the root's capped copy
HELD_NAME = "home"  # on the engine-held capped filesystem
_LENT = "agent-home.json"  # in the run's folder: where the run's copy is
INODES = 200_000


def write_fresh(home: Path, name: str, text: str, subdir: str | None = None) -> None:
    """Write `home/[subdir/]name` afresh (a file of the agent's configuration airlockd decides):
    whatever is there (a symlink an agent left, pointing anywhere on the host; a directory) is
    removed first, and the new file is created, never opened through a link (O_EXCL | O_NOFOLLOW
    under the home's own descriptor). `subdir` (one level) is made when it is not a directory,
    owned as the home is (the agent writes beside the file)."""
    dfd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    if subdir is not None:
        try:
            dfd = _fresh_dir(dfd, home, subdir)
        except BaseException:
            os.close(dfd)
            raise
        home = home / subdir
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            subprocess.run(["rm", "-rf", "--", str(home / name)], capture_output=True, check=False)
        elif st is not None:
            os.unlink(name, dir_fd=dfd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o644, dir_fd=dfd)  # the agent's user reads it
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
    finally:
        os.close(dfd)


def ensure_dir(home: Path, name: str) -> None:
    """`home/name` (one level) as a directory owned as the home is: made when it is anything
    else (a link an agent left is removed, never followed)."""
    dfd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    os.close(_fresh_dir(dfd, home, name))


def _fresh_dir(dfd: int, home: Path, name: str) -> int:
    """`name` under the directory `dfd` as a directory (made, owned as `dfd` is, when it is
    anything else), opened without following a link; `dfd` is closed."""
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=dfd)
            st = None
        if st is None:
            os.mkdir(name, 0o755, dir_fd=dfd)
            owner = os.fstat(dfd)
            os.chown(name, owner.st_uid, owner.st_gid, dir_fd=dfd, follow_symlinks=False)
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
    finally:
        os.close(dfd)


def home_bytes(home: Path) -> int:
    """What a copy of `home` takes (allocated bytes of everything in it, links not followed)."""
    return tree_bytes(home)


@contextlib.contextmanager
def locked(home: Path) -> Iterator[None]:
    """One process at a time reads or replaces an agent's home (two runs of an agent may end
    together: their take-backs would mix, attack review)."""
    with FileLock(str(home.with_name(home.name + ".lock"))):
        yield


def lend(
    run_dir: Path, home: Path, cap_bytes: int, run_id: str, held: HeldUpper | None, owner: tuple[int, int] | None = None
) -> Path:
    """The path the container mounts as the agent's home for this run (on this host, or on the
    engine's): a capped copy of `home` when one can be made, else `home` itself."""
    staging = run_dir / "staging"
    if held is None and capfs.available() is None and capfs.is_mount(staging) and (staging / "upper").is_dir():
        dst = staging / HELD_NAME  # beside the upper layer: the overlay never shows it
        dst.mkdir(mode=0o700)
        _copy(home, dst)
        _record(run_dir, "staging")
        return dst
    if held is None and capfs.available() is None:
        dst = run_dir / RUN_HOME
        capfs.mount(dst, cap_bytes, inodes=INODES)
        _copy(home, dst)
        _record(run_dir, "tmpfs")
        return dst
    if held is not None:
        held.put(run_id, HELD_NAME, home, owner)  # `owner`: the agent's user, when that is not us
        _record(run_dir, "held")
        return Path(held.where(run_id, HELD_NAME))
    _record(run_dir, "none")
    return home


class HomeRefused(AirlockError):
    """What a run left in its copy of the agent's home is not taken back (over its bounds)."""

    kind = "agent_home"


#: How deep below the home a run's copy may go (Codex's own tree is a few levels; a chain of
#: thousands would break the walks that read the home later).
HOME_DEPTH = 64


def take_back(run_dir: Path, home: Path, run_id: str, held: HeldUpper | None, cap_bytes: int) -> None:
    """Make what the run left in its copy the agent's home, and drop the copy. Nothing to do
    when the run used the home itself. The copy is counted as it is read (entries, depth, bytes
    up to `cap_bytes`, the home's total), and refused whole, with `HomeRefused`, past a bound:
    the home then stays as it was. The agent's `config.toml` is never kept (airlockd writes it
    before each run)."""
    lent = _lent(run_dir)
    if lent not in ("tmpfs", "staging", "held"):
        return
    bounds = ChangeBounds(entries=INODES, depth=HOME_DEPTH, bytes=cap_bytes)
    new = home.with_name(f"{home.name}.new.{run_id}")
    remove_tree(new)
    try:
        if lent in ("tmpfs", "staging"):
            src = run_dir / RUN_HOME if lent == "tmpfs" else run_dir / "staging" / HELD_NAME
            if not src.is_dir() or (lent == "tmpfs" and not capfs.is_mount(src)):
                return  # dropped already (a crash cleaned up): the home stays as it was
            check_tree(src, bounds)
            done = subprocess.run(["cp", "-a", "--", str(src), str(new)], capture_output=True, text=True)
            if done.returncode != 0:
                raise OSError(f"copying the agent's home back failed: {done.stderr.strip()}")
        else:
            if held is None:
                return
            tally = Tally(bounds, lambda rel: False)
            after, _, _ = read_dump(held.dump(run_id, HELD_NAME), new, tally, links_once=True)
            for rel, entry in sorted(after.items(), key=lambda kv: -kv[0].count("/")):  # deepest first
                node = new / rel
                if entry.kind.value not in ("dir", "file") or not node.exists() or node.is_symlink():
                    continue  # a link, or what the stream carries no content of (fifo, sparse file)
                wanted = stat.S_IRWXU if entry.kind.value == "dir" else stat.S_IRUSR | stat.S_IWUSR
                os.chmod(node, entry.mode | wanted)  # the agent's modes, readable by us
    except ChangeSetTooLarge as over:
        remove_tree(new)
        raise HomeRefused(
            f"the agent's home after run {run_id} is over its bounds, so it is not kept: {over}"
        ) from None
    except BaseException:
        remove_tree(new)
        raise
    finally:
        drop(run_dir)
    config = new / "config.toml"
    if config.is_dir() and not config.is_symlink():
        remove_tree(config)
    elif config.exists() or config.is_symlink():
        config.unlink()
    old = home.with_name(f"{home.name}.old.{run_id}")
    remove_tree(old)
    with locked(home):
        if home.exists():
            os.replace(home, old)
        os.replace(new, home)
    remove_tree(old)


def check_tree(root: Path, bounds: ChangeBounds) -> None:
    """Count the tree under `root` against `bounds` (entries, depth, allocated bytes with each
    inode once), without following links and without recursion; ChangeSetTooLarge past one."""
    tally = Tally(bounds, lambda rel: False)
    seen: set[tuple[int, int]] = set()
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(root / rel if rel else root) as it:
            for de in it:
                sub = f"{rel}/{de.name}" if rel else de.name
                st = de.stat(follow_symlinks=False)
                once = stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen
                seen.add((st.st_dev, st.st_ino))
                tally.count_node(sub, stat.S_ISREG(st.st_mode), st.st_blocks * 512 if once else 0)
                if stat.S_ISDIR(st.st_mode):
                    stack.append(sub)


def drop(run_dir: Path) -> None:
    """Unmount and remove the run's capped copy of the home, if it has one here."""
    src = run_dir / RUN_HOME
    if capfs.is_mount(src):
        capfs.unmount(src)
    if src.is_dir():
        remove_tree(src)
    lent = _lent(run_dir)
    if lent == "staging":  # only then is staging/home the home's copy (a copy stager's is the agent's)
        remove_tree(run_dir / "staging" / HELD_NAME)
    if lent in ("tmpfs", "staging"):
        _record(run_dir, "taken")


def _copy(src: Path, dst: Path) -> None:
    """`src`'s content into `dst` (a fresh mount), owners and modes kept, links never followed."""
    done = subprocess.run(["cp", "-a", "--", f"{src}/.", str(dst)], capture_output=True, text=True)
    if done.returncode != 0:
        drop(dst.parent)
        raise OSError(f"copying the agent's home for the run failed: {done.stderr.strip()}")
    st = os.lstat(src)
    os.chown(dst, st.st_uid, st.st_gid)
    os.chmod(dst, stat.S_IMODE(st.st_mode))


def _record(run_dir: Path, where: str) -> None:
    (run_dir / _LENT).write_text(json.dumps({"copy": where}))


def _lent(run_dir: Path) -> str:
    try:
        return str(json.loads((run_dir / _LENT).read_text()).get("copy", ""))
    except (OSError, ValueError, AttributeError):
        return ""
