"""A cold build's blobs packed in a process of its own, while the mirror's walk stages the tree.

The fresh repository of a mirror generation built from nothing (staging/gitcopy.py) needs every
staged file hashed (SHA-1) and written a second time, into a pack. Done in the walking process,
that cost as much as a third of the cold build; in a thread beside the walk it cost more (the
GIL changed hands at every system call). So `Packer` starts `python -m airlockd.staging.packer`
when the walk begins, hands it the path of each file the walk has put in place (NUL-terminated,
through a pipe that never blocks the walk), and the child reads the file back (the page cache
still holds it), packs it, and at the end of its input reports what it packed. The repository's
build then takes each reported blob whose node is still the one the child read (inode, mtime,
size) and reads only the rest.

Nothing rests on the child: if it cannot start, dies, or reports anything malformed, `finish`
gives None, what it wrote is removed, and the repository is built in this process as if there
had been no child. It reads only the mirror's own tree (already screened: no withheld file is
there), through directory descriptors opened without following links, and writes only the
generation's `.git/objects/pack`. A blob it packed for a file the walk later took out (a copy of
a withheld file found after) is referenced by nothing and goes at the build's purge.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

from airlockd.interpreter import module_command
from airlockd.staging.fdtree import read_all
from airlockd.staging.gitobjects import ObjectStore

MODULE = "airlockd.staging.packer"
_BATCH = 64 << 10  # names queued before a write to the child is tried
_PIPE = 1 << 20  # the pipe's capacity asked for (Linux's default ceiling for a user)
_F_SETPIPE_SZ = 1031
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_RECORD = struct.Struct(">20sQQQI")  # blob id, size, inode, mtime_ns, length of the path that follows
_MAGIC = b"airlockd-packer 1\n"

Packed = tuple[bytes, int, int, int]  # blob id, size, inode, mtime_ns of the node read
log = logging.getLogger(__name__)


class Packer:
    """The parent's side: `add` each file put in place under `tree`, then `finish` (or
    `abandon`)."""

    def __init__(self, proc: subprocess.Popen[bytes], tree: Path, errors: IO[bytes]) -> None:
        self.proc = proc
        self.tree = tree
        self.errors = errors  # the child's stderr, for the log line if it fails
        self._fd = proc.stdin.fileno() if proc.stdin is not None else -1
        self._queue = bytearray()
        self._dead = False

    @classmethod
    def start(cls, tree: Path, owner: tuple[int, int] | None) -> Packer | None:
        """A child packing into `tree/.git/objects/pack` (the directories made here, owned by
        `owner`), or None when none can be started."""
        cmd = module_command(MODULE, str(tree))
        if owner is not None:
            cmd += [str(owner[0]), str(owner[1])]
        errors = tempfile.TemporaryFile()  # noqa: SIM115 (closed by finish or abandon)
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, close_fds=True)
        except OSError as exc:
            errors.close()
            log.warning("the cold build packs in this process: no packer could be started (%s)", exc.strerror)
            return None
        assert proc.stdin is not None
        fd = proc.stdin.fileno()
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE)
        os.set_blocking(fd, False)
        return cls(proc, tree, errors)

    def add(self, rel: str) -> None:
        """The file `rel` is in place in the tree, as it will stay."""
        if self._dead:
            return
        self._queue += rel.encode("utf-8", "surrogateescape") + b"\0"
        if len(self._queue) >= _BATCH:
            self._send()

    def _send(self) -> None:
        """Write what the pipe takes now, never waiting (the walk goes on; the rest waits)."""
        try:
            while self._queue:
                done = os.write(self._fd, self._queue)
                del self._queue[:done]
        except BlockingIOError:
            return
        except OSError:  # the child is gone: the build reads every file itself
            self._dead = True
            self._queue.clear()

    def finish(self) -> dict[str, Packed] | None:
        """Every name handed over, the child's report: path -> what it packed. None when the child
        failed (what it wrote is removed then)."""
        report = None
        try:
            if not self._dead:
                os.set_blocking(self._fd, True)
                view = memoryview(bytes(self._queue))
                while view:
                    view = view[os.write(self._fd, view) :]
            self._queue.clear()
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            assert self.proc.stdout is not None
            raw = self.proc.stdout.read()
            if self.proc.wait() == 0 and not self._dead:
                report = _parse(raw)
        except (OSError, ValueError, struct.error):
            report = None
        finally:
            self._end()
        if report is None:
            log.warning("the cold build packs in this process: its packer failed (%s)", self._failure())
            self._remove()
        self.errors.close()
        return report

    def abandon(self) -> None:
        """The build is not going on: the child stopped, what it wrote removed."""
        self._end()
        self._remove()
        self.errors.close()

    def _end(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self.proc.wait()

    def _failure(self) -> str:
        """What the child said last (its stderr's last line, cut short), or its exit status."""
        with contextlib.suppress(OSError, ValueError):
            self.errors.seek(0)
            lines = self.errors.read()[-4096:].decode("utf-8", "replace").strip().splitlines()
            if lines:
                return lines[-1][:200]
        return f"exit status {self.proc.returncode}"

    def _remove(self) -> None:
        dotgit = self.tree / ".git"
        if dotgit.is_dir() and not dotgit.is_symlink():
            shutil.rmtree(dotgit, ignore_errors=True)


def _parse(raw: bytes) -> dict[str, Packed]:
    if not raw.startswith(_MAGIC):
        raise ValueError("no report")
    out: dict[str, Packed] = {}
    at = len(_MAGIC)
    while at < len(raw):
        oid, size, ino, mtime, n = _RECORD.unpack_from(raw, at)
        at += _RECORD.size
        if at + n > len(raw):
            raise ValueError("a truncated report")
        out[raw[at : at + n].decode("utf-8", "surrogateescape")] = (oid, size, ino, mtime)
        at += n
    return out


# -- the child ----------------------------------------------------------------------------------


class _Dirs:
    """Directory descriptors under a root, opened component by component without following
    links; the last directory's kept open (the walk hands files over directory by directory)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.path: str | None = None
        self.fd = -1

    def open_file(self, rel: str) -> int | None:
        parent, _, name = rel.rpartition("/")
        if parent != self.path:
            self.close()
            fd = os.dup(self.root)
            try:
                for part in parent.split("/") if parent else ():
                    sub = os.open(part, _O_DIR, dir_fd=fd)
                    os.close(fd)
                    fd = sub
            except OSError:
                os.close(fd)
                return None
            self.path, self.fd = parent, fd
        try:
            return os.open(name, _O_READ, dir_fd=self.fd)
        except OSError:
            return None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.path, self.fd = None, -1


def pack(tree: Path, owner: tuple[int, int] | None, names: int, out: int) -> None:
    """Pack each file named on `names` (NUL-terminated paths under `tree`) into
    `tree/.git/objects/pack`; write the report to `out` once the names end."""
    store = ObjectStore(tree / ".git", owner, None)
    for d in (tree / ".git", tree / ".git" / "objects"):
        store._mkdir(d)
    store.adopt(set(), set(), {}, set())
    root = os.open(tree, _O_DIR)
    dirs = _Dirs(root)
    report = [_MAGIC]
    pending = b""
    try:
        while chunk := os.read(names, 1 << 20):
            *done, pending = (pending + chunk).split(b"\0")
            for raw in done:
                rel = raw.decode("utf-8", "surrogateescape")
                fd = dirs.open_file(rel)
                if fd is None:
                    continue  # taken out since: nothing to pack
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    data = read_all(fd, st.st_size)
                except OSError:
                    continue
                finally:
                    os.close(fd)
                oid = store.put(b"blob", data)
                report.append(_RECORD.pack(oid, len(data), st.st_ino, st.st_mtime_ns, len(raw)) + raw)
        store.end_pack()
    except BaseException:
        store.abandon()
        raise
    finally:
        dirs.close()
        os.close(root)
    blob = b"".join(report)
    view = memoryview(blob)
    while view:
        view = view[os.write(out, view) :]


def main(argv: list[str] | None = None) -> int:
    """`python -m airlockd.staging.packer TREE [UID GID]`: names on stdin, the report on stdout."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 3):
        print("usage: python -m airlockd.staging.packer TREE [UID GID]", file=sys.stderr)
        return 2
    owner = (int(args[1]), int(args[2])) if len(args) == 3 else None
    pack(Path(args[0]), owner, sys.stdin.fileno(), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
