"""An upper layer read where it lives and carried back as one stream: for an engine whose files
this process cannot open (a user who is not root, whose engine keeps volumes under a directory
only root may enter; a remote engine, later), the run's upper layer is walked by `DUMP`, a small
program run beside it (in the holder container that keeps its capped filesystem mounted,
sandbox/layers.py), and read here by `read_dump` into the same three things `overlay.scan_upper`
takes from a local upper layer: the entries of what it holds, its whiteouts, its opaque
directories. The content of each file is written under `dest` as it streams past, so a proposal
reads it from there as it does from a local upper layer.

The stream, one node after another in pre-order (a directory before what it holds):

    {"p": HEX(path), "m": st_mode, "s": size, "r": rdev, "t": HEX(link target), "q": opaque,
     "sp": sparse, "h": HEX(an earlier path of the same inode: a hard link, sent once)}\\n
    then, for a regular file that is not sparse nor a hard link sent before, `s` bytes and one
    status byte (b"." whole, b"!" cut short: the file shrank while it was read)

Paths and targets are hex of their bytes (a name may be any bytes). Nothing of the stream is
trusted: a path that is not a clean relative path under a directory the stream already gave, a
header too long, a count that does not add up, is an error naming what was wrong; every node is
counted against the run's bounds before a byte of it is read (`bounds.Tally`), and the reader
stops at the first one over, which ends the program on the other side (its pipe closes).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

from airlockd.pipeline.manifest import Entry, Kind, Manifest, kind_of
from airlockd.staging.bounds import Tally
from airlockd.staging.records import StagingError

#: The program that walks an upper layer (argv[1]) and writes the stream to stdout. It runs with
#: the image's python3 under `python3 -I -c`, as root with CAP_DAC_READ_SEARCH only (it must read
#: what the agent made unreadable; it writes nothing). It never follows a link: each directory is
#: opened by its fd with O_NOFOLLOW; the agent's container is gone, so nothing changes the tree.
DUMP = r"""
import os, stat, sys, json
out = sys.stdout.buffer
OPAQUE = sys.argv[2]
links = {}
def header(rel, st, target=b"", opaque=False, sparse=False, same=b""):
    h = {"p": rel.hex(), "m": st.st_mode, "s": st.st_size, "r": st.st_rdev, "t": target.hex(),
         "q": opaque, "sp": sparse, "h": same.hex()}
    out.write(json.dumps(h).encode() + b"\n")
def opaque_at(fd):
    try:
        return os.getxattr(fd, OPAQUE) == b"y"
    except OSError:
        return False
def content(fd, name, size):
    f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    left = size
    while left:
        chunk = os.read(f, min(left, 1 << 20))
        if not chunk:
            break
        out.write(chunk)
        left -= len(chunk)
    os.close(f)
    out.write(b"\0" * left + (b"!" if left else b"."))
def walk(fd, rel):
    for name in sorted(os.fsencode(n) for n in os.listdir(fd)):
        path = rel + b"/" + name if rel else name
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            header(path, st, opaque=opaque_at(sub))
            walk(sub, path)
            os.close(sub)
        elif stat.S_ISLNK(st.st_mode):
            header(path, st, target=os.readlink(name, dir_fd=fd))
        elif stat.S_ISREG(st.st_mode) and st.st_nlink > 1 and (st.st_dev, st.st_ino) in links:
            header(path, st, same=links[(st.st_dev, st.st_ino)])  # a hard link: no content again
        elif stat.S_ISREG(st.st_mode):
            sparse = st.st_blocks * 512 < st.st_size
            header(path, st, sparse=sparse)
            if st.st_nlink > 1 and not sparse:
                links[(st.st_dev, st.st_ino)] = path
            if not sparse:
                content(fd, name, st.st_size)
        else:
            header(path, st)
sys.setrecursionlimit(1 << 20)
try:
    walk(os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW), b"")
    out.flush()
except BrokenPipeError:
    os._exit(0)
"""

HEADER_MAX = 1 << 20  # a header line: a path of up to ~500 KiB of bytes (hex doubles it)


class _Reader:
    """Exact reads over an iterator of chunks of any size."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it: Iterator[bytes] = iter(chunks)
        self._buf = bytearray()

    def _fill(self) -> bool:
        for chunk in self._it:
            if chunk:
                self._buf += chunk
                return True
        return False

    def line(self) -> bytes | None:
        """The next line without its newline; None at a clean end."""
        while (i := self._buf.find(b"\n")) < 0:
            if len(self._buf) > HEADER_MAX:
                raise StagingError(f"the upper layer's stream has a header over {HEADER_MAX} bytes")
            if not self._fill():
                if self._buf:
                    raise StagingError("the upper layer's stream ends inside a header")
                return None
        out = bytes(self._buf[:i])
        del self._buf[: i + 1]
        return out

    def take(self, n: int) -> Iterator[bytes]:
        """Exactly `n` bytes, in pieces."""
        while n:
            if not self._buf and not self._fill():
                raise StagingError("the upper layer's stream ends inside a file")
            piece = bytes(self._buf[:n])
            del self._buf[: len(piece)]
            n -= len(piece)
            yield piece


def _rel(hexed: object) -> str:
    try:
        raw = bytes.fromhex(str(hexed))
    except ValueError:
        raise StagingError("the upper layer's stream has a path that is not hex") from None
    parts = raw.split(b"/")
    if not raw or any(p in (b"", b".", b"..") for p in parts) or b"\0" in raw:
        raise StagingError(f"the upper layer's stream has an unclean path {raw[:200]!r}")
    return os.fsdecode(raw)


class _Dest:
    """Writes what streams past under `dest`, one open directory per level of the current path
    (so any depth works without long paths), never following a link it did not make."""

    def __init__(self, dest: Path) -> None:
        dest.mkdir(mode=0o700)
        self.root = str(dest)
        self.stack: list[tuple[str, int]] = [("", os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW))]

    def parent_fd(self, rel: str) -> int:
        parent = rel.rpartition("/")[0]
        while self.stack and self.stack[-1][0] != parent:
            os.close(self.stack.pop()[1])
        if not self.stack:
            raise StagingError(f"the upper layer's stream gives {rel!r} before its directory")
        return self.stack[-1][1]

    def directory(self, rel: str) -> None:
        fd = self.parent_fd(rel)
        name = rel.rpartition("/")[2]
        os.mkdir(name, 0o700, dir_fd=fd)
        self.stack.append((rel, os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)))

    def link(self, rel: str, target: str) -> None:
        os.symlink(target, rel.rpartition("/")[2], dir_fd=self.parent_fd(rel))

    def hard_link(self, existing: str, rel: str) -> None:
        """`rel` as another name of the file written as `existing` (under the same root)."""
        os.link(os.path.join(self.root, existing), rel.rpartition("/")[2], dst_dir_fd=self.parent_fd(rel))

    def file(self, rel: str) -> int:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        return os.open(rel.rpartition("/")[2], flags, 0o600, dir_fd=self.parent_fd(rel))

    def close(self) -> None:
        for _, fd in self.stack:
            os.close(fd)
        self.stack.clear()


def read_dump(
    chunks: Iterable[bytes], dest: Path | None, tally: Tally | None = None, *, links_once: bool = False
) -> tuple[Manifest, list[str], list[str]]:
    """(entries of every non-whiteout node, whiteout paths, opaque directory paths) of the upper
    layer `DUMP` streamed as `chunks`, as `overlay.scan_upper` gives them for a local one; each
    file's content is hashed as it passes and, with `dest` (created; it must not exist), written
    there (files 0600, directories 0700: the entries keep the modes the agent left). Each node is
    counted by `tally` first, which raises `ChangeSetTooLarge` at a bound before it is read; a
    hard link's bytes count for each name unless `links_once`."""
    src = _Reader(chunks)
    out = None if dest is None else _Dest(dest)
    after: Manifest = {}
    whiteouts: list[str] = []
    opaque: list[str] = []
    dirs = {""}
    try:
        while (line := src.line()) is not None:
            try:
                h = json.loads(line)
                mode, size, rdev = int(h["m"]), int(h["s"]), int(h["r"])
            except (ValueError, KeyError, TypeError):
                raise StagingError("the upper layer's stream has a malformed header") from None
            rel = _rel(h["p"])
            if rel.rpartition("/")[0] not in dirs or rel in after or rel in whiteouts:
                raise StagingError(f"the upper layer's stream gives {rel!r} out of order or twice")
            sparse = bool(h.get("sp")) and stat.S_ISREG(mode)
            same = _rel(h["h"]) if h.get("h") else None
            if same is not None and (same not in after or after[same].sha256 is None):
                raise StagingError(f"the upper layer's stream links {rel!r} to {same!r}, which it has not given")
            if tally is not None:  # a hard link is read and written here once; landing it writes a
                # file per name, so for a change set each name counts (`links_once`: a home)
                tally.count_node(rel, stat.S_ISREG(mode), 0 if sparse or (same and links_once) else size)
            perm = stat.S_IMODE(mode)
            if stat.S_ISCHR(mode) and rdev == 0:
                whiteouts.append(rel)
            elif stat.S_ISDIR(mode):
                dirs.add(rel)
                after[rel] = Entry(Kind.DIR, perm)
                if h.get("q") is True:
                    opaque.append(rel)
                if out is not None:
                    out.directory(rel)
            elif stat.S_ISLNK(mode):
                target = os.fsdecode(bytes.fromhex(str(h.get("t", ""))))
                after[rel] = Entry(Kind.SYMLINK, perm, 0, None, target)
                if out is not None:
                    out.link(rel, target)
            elif stat.S_ISREG(mode) and same is not None:
                after[rel] = Entry(Kind.FILE, perm, after[same].size, after[same].sha256)
                if out is not None:
                    out.hard_link(same, rel)
            elif stat.S_ISREG(mode) and sparse:
                after[rel] = Entry(Kind.FILE, perm, size, None)  # never read: no hash, no commit
            elif stat.S_ISREG(mode):
                after[rel] = Entry(Kind.FILE, perm, size, _copy(src, size, rel, out))
            else:
                after[rel] = Entry(kind_of(mode), perm)
    finally:
        if out is not None:
            out.close()
    return after, whiteouts, opaque


def _copy(src: _Reader, size: int, rel: str, out: _Dest | None) -> str:
    h = hashlib.sha256()
    fd = None if out is None else out.file(rel)
    try:
        for piece in src.take(size):
            h.update(piece)
            if fd is not None:
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view) :]
    finally:
        if fd is not None:
            os.close(fd)
    status = b"".join(src.take(1))
    if status != b".":
        raise StagingError(f"{rel!r} changed while the upper layer was read", hint="inspect the run again")
    return h.hexdigest()
