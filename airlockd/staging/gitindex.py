"""The index of the fresh repository (staging/gitcopy.py), written as a *split index*.

An index (version 2) carries each file's `lstat` data, so `git status` in the container trusts
it without reading the files. A full index of a 20,000-file tree is 1.8 MB, and writing it whole
(join, SHA-1, write) costs more than the rest of an incremental refresh together. So the index is
split, the way `git update-index --split-index` does it (Documentation/gitformat-index.txt,
"Split index"): a *shared index* `sharedindex.<sha1>` holds every entry as of the last time it
was written; the `index` file holds only what changed since (entries replacing shared ones, with
empty names, then added entries, sorted) and a `link` extension naming the shared index, with
EWAH bitmaps of the shared entries deleted and replaced. A refresh then writes what changed; the
shared index is written again when the changes reach `SHARE_AGAIN` of it. git reads both
(since 2.1), and keeps writing split indexes while `core.splitIndex` is unset.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import struct
from collections.abc import Callable, Iterable

SHARE_AGAIN = 0.1  # the fraction of shared entries changed past which the shared index is rewritten
_M32 = 0xFFFFFFFF


def git_mode(st_mode: int) -> int:
    if stat.S_ISLNK(st_mode):
        return 0o120000
    return 0o100755 if st_mode & stat.S_IXUSR else 0o100644


def pack_entry(name: bytes, st: os.stat_result, oid: bytes) -> bytes:
    """One index entry (version 2, stage 0) for a node's `lstat` data and object id."""
    head = struct.pack(
        ">10I",
        int(st.st_ctime) & _M32,
        st.st_ctime_ns % 1_000_000_000,
        int(st.st_mtime) & _M32,
        st.st_mtime_ns % 1_000_000_000,
        st.st_dev & _M32,
        st.st_ino & _M32,
        git_mode(st.st_mode),
        st.st_uid & _M32,
        st.st_gid & _M32,
        st.st_size & _M32,
    )
    body = head + oid + struct.pack(">H", min(len(name), 0xFFF)) + name
    return body + b"\0" * (8 - len(body) % 8)


def nameless(entry: bytes) -> bytes:
    """An entry with its name stripped, as a split index holds a replacement."""
    return entry[:60] + b"\0\0\0\0"


def index_file(entries: Iterable[bytes], extensions: bytes = b"") -> bytes:
    """A whole index file: header, entries (already in order), extensions, checksum."""
    parts = list(entries)
    body = b"".join([b"DIRC", struct.pack(">II", 2, len(parts)), *parts, extensions])
    return body + hashlib.sha1(body).digest()


# -- EWAH bitmaps (git's ewah/ewah_io.c) ------------------------------------------------------------


def ewah(bits: Iterable[int]) -> bytes:
    """The EWAH serialisation of a set of bit positions: bit count, word count, the words (a
    run-length word before each group of consecutive literal words), the last marker's position."""
    words: dict[int, int] = {}
    top = 0
    for b in bits:
        words[b >> 6] = words.get(b >> 6, 0) | (1 << (b & 63))
        top = max(top, b + 1)
    buf: list[int] = []
    marker = 0
    end = 0  # the word position the buffer reaches
    for w in sorted(words):
        if buf and w == end and (buf[marker] >> 33) < 0x7FFFFFFF:
            buf[marker] += 1 << 33  # one more literal word after the same marker
        else:
            marker = len(buf)
            buf.append(((w - end) << 1) | (1 << 33))  # run of `w - end` zero words, one literal
        buf.append(words[w])
        end = w + 1
    if not buf:
        buf = [0]
    return struct.pack(f">II{len(buf)}QI", top, len(buf), *buf, marker)


def ewah_bits(data: bytes, at: int) -> tuple[list[int], int]:
    """The bit positions of the EWAH bitmap at `data[at:]`, and where it ends."""
    _, n = struct.unpack_from(">II", data, at)
    words = struct.unpack_from(f">{n}Q", data, at + 8)
    end = at + 8 + 8 * n + 4
    if end > len(data):
        raise ValueError("a bitmap runs past its extension")
    out: list[int] = []
    pos = 0
    i = 0
    while i < n:
        rlw = words[i]
        run = (rlw >> 1) & _M32
        if rlw & 1:
            out.extend(range(pos, pos + 64 * run))
        pos += 64 * run
        i += 1
        for _ in range(rlw >> 33):
            if i >= n:
                raise ValueError("a bitmap's literal words run past it")
            lit = words[i]
            out.extend(pos + c for c in range(64) if lit >> c & 1)
            pos += 64
            i += 1
    return out, end


# -- reading ----------------------------------------------------------------------------------------

Parsed = dict[str, tuple[bytes, int, int, int, int, int]]  # path -> oid, ino, mtime_ns, size, git mode, uid


def read_index(dotgit: str) -> Parsed:
    """The entries of the index at `dotgit/index`, a split one merged with its shared index;
    an index that cannot be read whole is empty (everything is then read again)."""
    try:
        with open(os.path.join(dotgit, "index"), "rb") as fh:
            data = fh.read()
    except OSError:
        return {}
    try:
        entries, link = _parse(data)
        if link is None:
            return _named(entries)
        with open(os.path.join(dotgit, f"sharedindex.{link[0].hex()}"), "rb") as fh:
            base, _ = _parse(fh.read())
        return _named(_merge(base, entries, link[1], link[2]))
    except (OSError, ValueError, struct.error, IndexError, UnicodeDecodeError):
        return {}


def _parse(data: bytes) -> tuple[list[tuple[bytes, bytes]], tuple[bytes, list[int], list[int]] | None]:
    """(name, entry bytes) of every stage-0 entry, and the link extension (shared index id,
    deleted and replaced positions) if any."""
    if len(data) < 32 or data[:4] != b"DIRC" or hashlib.sha1(data[:-20]).digest() != data[-20:]:
        raise ValueError("not an index")
    version, count = struct.unpack(">II", data[4:12])
    if version != 2:
        raise ValueError("not an index of version 2")
    out: list[tuple[bytes, bytes]] = []
    pos = 12
    for _ in range(count):
        (flags,) = struct.unpack_from(">H", data, pos + 60)
        end = data.index(b"\0", pos + 62)
        size = (62 + (end - pos - 62) + 8) // 8 * 8
        if flags & 0x3000 == 0:
            out.append((data[pos + 62 : end], data[pos : pos + size]))
        pos += size
    link = None
    while pos + 8 <= len(data) - 20:
        sig, size = struct.unpack_from(">4sI", data, pos)
        ext = data[pos + 8 : pos + 8 + size]
        if sig == b"link":
            deleted, at = ewah_bits(ext, 20) if len(ext) > 20 else ([], 20)
            replaced, at = ewah_bits(ext, at) if len(ext) > 20 else ([], at)
            link = (ext[:20], deleted, replaced)
        pos += 8 + size
    return out, link


def _merge(
    base: list[tuple[bytes, bytes]], split: list[tuple[bytes, bytes]], deleted: list[int], replaced: list[int]
) -> list[tuple[bytes, bytes]]:
    merged = list(base)
    for n, pos in enumerate(replaced):
        merged[pos] = (merged[pos][0], split[n][1])
    gone = set(deleted)
    out = [e for i, e in enumerate(merged) if i not in gone]
    out.extend(split[len(replaced) :])
    return out


def _named(entries: list[tuple[bytes, bytes]]) -> Parsed:
    out: Parsed = {}
    for name, e in entries:
        f = struct.unpack_from(">10I", e)
        out[name.decode("utf-8", "surrogateescape")] = (e[40:60], f[5], f[2] * 1_000_000_000 + f[3], f[9], f[6], f[7])
    return out


# -- the split index of one repository --------------------------------------------------------------


class SplitIndex:
    """The shared entries of a repository's index as last written, and the paths changed since;
    `write` writes the `index` (and, when changes have grown, a new shared index)."""

    def __init__(self) -> None:
        self.shared: dict[str, tuple[int, bytes]] = {}  # path -> position, entry bytes
        self.shared_id = b""
        self.changed: set[str] = set()  # paths whose entry may differ from the shared one

    def write(
        self,
        dotgit: str,
        entry: Callable[[str], bytes | None],
        everything: Callable[[], dict[str, bytes]],
        owner: tuple[int, int] | None,
    ) -> None:
        """Write the index: `entry(path)` is a path's entry bytes now (None: not in the index),
        `everything()` all of them (for a new shared index); `changed` marks what may differ
        from the shared index."""
        if not self.shared_id or len(self.changed) > SHARE_AGAIN * max(len(self.shared), 1000):
            self._share(dotgit, everything(), owner)
        replaced: list[tuple[int, bytes]] = []
        deleted: list[int] = []
        added: list[tuple[bytes, bytes]] = []
        for name in self.changed:
            now = entry(name)
            had = self.shared.get(name)
            if had is None:
                if now is not None:
                    added.append((_sort_key(name), now))
            elif now is None:
                deleted.append(had[0])
            elif now != had[1]:
                replaced.append((had[0], nameless(now)))
        replaced.sort()
        added.sort()
        link = self.shared_id + ewah(deleted) + ewah(p for p, _ in replaced)
        ext = b"link" + struct.pack(">I", len(link)) + link
        data = index_file([e for _, e in replaced] + [e for _, e in added], ext)
        _replace(os.path.join(dotgit, "index"), data, owner)

    def _share(self, dotgit: str, entries: dict[str, bytes], owner: tuple[int, int] | None) -> None:
        names = sorted(entries, key=_sort_key)
        data = index_file(entries[n] for n in names)
        shared_id = data[-20:]
        _replace(os.path.join(dotgit, f"sharedindex.{shared_id.hex()}"), data, owner)
        drop_shared(dotgit, shared_id)
        self.shared = {n: (i, entries[n]) for i, n in enumerate(names)}
        self.shared_id = shared_id
        self.changed = set()


def _sort_key(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


def drop_shared(dotgit: str, keep: bytes) -> None:
    """Every shared index but `keep`'s removed (a rebuild in another process left them)."""
    try:
        names = os.listdir(dotgit)
    except OSError:
        return
    for n in names:
        if n.startswith("sharedindex.") and n != f"sharedindex.{keep.hex()}":
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(dotgit, n))


def _replace(path: str, data: bytes, owner: tuple[int, int] | None, mode: int = 0o644) -> None:
    """Write `path` by a new file renamed over the old (never in place)."""
    tmp = path + ".airlockd-tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if owner is not None:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)
    os.replace(tmp, path)
