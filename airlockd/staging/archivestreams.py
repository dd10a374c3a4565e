"""The streams `archives.ArchiveScanner` reads an archive through, each of which knows where its
archive ends, so that what follows the end is read too (and judged) rather than left unread.

`Decompressed` reads a gzip, bzip2 or xz file as their own tools do, member after member (`cat
a.gz b.gz` is one stream to `zcat`; zero padding between members skipped), and tells the file
name each gzip member's header stores; a zlib stream is one stream. It stops at the first bytes
that start no member, and `rest()` gives them. `Tape` keeps the last bytes it gave, so what
follows a tar's end can be read after tarfile has buffered past it. `Joined` reads some bytes,
then a stream.
"""

from __future__ import annotations

import bz2
import collections
import io
import lzma
import zlib
from collections.abc import Callable
from typing import Protocol

from airlockd.staging.archiveformats import CorruptArchive, Reader, sniff

_ZREAD = 1 << 16  # compressed bytes fed at a time: the scanner's ratio is checked at this grain
_GZIP_HEADER_MAX = 1 << 17  # an extra field (64 KiB at most) and a stored name, with room to spare
_KEPT = 1 << 15  # what a Tape keeps: more than tarfile reads past a header (a record, 10 KiB)


class _Decompressor(Protocol):
    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes, max_length: int, /) -> bytes: ...


class Joined:
    """`head`, then what `src` has left."""

    def __init__(self, head: bytes, src: Reader) -> None:
        self.head = head
        self.src = src

    def read(self, n: int, /) -> bytes:
        if not self.head:
            return self.src.read(n)
        data, self.head = self.head[:n], self.head[n:]
        return data


class Tape:
    """`src`, remembering the last bytes it gave (at least `_KEPT` of them)."""

    def __init__(self, src: Reader) -> None:
        self.src = src
        self.given = 0
        self.kept: collections.deque[bytes] = collections.deque()
        self.kept_size = 0

    def read(self, n: int, /) -> bytes:
        data = self.src.read(n)
        if data:
            self.given += len(data)
            self.kept.append(data)
            self.kept_size += len(data)
            while self.kept_size - len(self.kept[0]) >= _KEPT:
                self.kept_size -= len(self.kept.popleft())
        return data

    def since(self, offset: int) -> Joined:
        """What follows `offset` (counted in the bytes given): the kept bytes, then the source's."""
        back = self.given - offset
        if not 0 <= back <= self.kept_size:
            raise CorruptArchive("an archive's end before what was kept of it")
        kept = b"".join(self.kept)
        return Joined(kept[len(kept) - back :], self.src)


def gzip_name(head: bytes) -> bytes | None:
    """The file name a gzip member's header stores (b"" when it stores none), or None when `head`
    ends before the name does (RFC 1952: ten bytes, an optional extra field, then the name)."""
    if len(head) < 10:
        return None
    flags, at = head[3], 10
    if flags & 0x04:
        if len(head) < 12:
            return None
        at += 2 + int.from_bytes(head[10:12], "little")
    if not flags & 0x08:
        return b""
    end = head.find(b"\x00", at)
    return None if end < 0 else head[at:end]


def _decompressor(kind: str) -> _Decompressor:
    if kind == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)  # zlib reads the header and checks the trailer
    if kind == "zlib":
        return zlib.decompressobj()
    if kind == "bzip2":
        return bz2.BZ2Decompressor()
    return lzma.LZMADecompressor(lzma.FORMAT_XZ)


class Decompressed(io.BufferedIOBase):
    """A gzip, bzip2 or xz stream (`kind`) decompressed member after member, or one zlib stream.
    `named` is told each gzip member's stored name. A stream cut short is corrupt (EOFError),
    except a zlib stream, which ends where its data does; one that fails to decompress raises,
    except a zlib stream, which is `broken` (not zlib after all) and ends there."""

    def __init__(self, kind: str, src: Reader, named: Callable[[bytes], None] | None = None) -> None:
        self.kind = kind
        self.src = src
        self.named = named
        self.zlib = kind in ("gzip", "zlib")  # zlib's interface: unconsumed_tail, no needs_input
        self.dec: _Decompressor | None = None
        self.feed = b""  # read from src, not yet given to the decompressor
        self.exhausted = False
        self.broken = False
        self.done = False
        self.left = b""  # once done: the first bytes after the last member

    def readable(self) -> bool:
        return True

    def rest(self) -> Joined:
        """What follows the stream's last member (read it to its end first)."""
        if not self.done:
            raise CorruptArchive("a compressed stream not read to its end")
        return Joined(self.left, self.src)

    def read(self, n: int | None = -1, /) -> bytes:
        want = 1 << 20 if n is None or n < 0 else n
        while want and not self.done:
            if self.dec is None:
                self._begin(b"")
                continue
            if self.dec.eof:
                self._next(self.dec.unused_data)
                continue
            more = self._input()
            try:
                data = self.dec.decompress(more, want)
            except zlib.error:
                if self.kind != "zlib":
                    raise
                self.broken = self.done = True
                break
            if data:
                return data
            if not more and self.exhausted and not self.dec.eof:
                if self.kind != "zlib":
                    raise EOFError(f"a {self.kind} stream cut short")
                self.done = True
        return b""

    def _input(self) -> bytes:
        if self.feed:
            data, self.feed = self.feed, b""
            return data
        if self.zlib:
            tail: bytes = getattr(self.dec, "unconsumed_tail", b"")
            if tail:
                return tail
        elif not getattr(self.dec, "needs_input", True):
            return b""
        data = self.src.read(_ZREAD)
        self.exhausted = not data
        return data

    def _begin(self, data: bytes) -> None:
        """A member starts with `data` (more is read for a gzip header)."""
        if self.kind == "gzip":
            while (name := gzip_name(data)) is None:
                more = self.src.read(_ZREAD)
                if not more or len(data) > _GZIP_HEADER_MAX:
                    raise CorruptArchive("a gzip header that does not end")
                data += more
            if name and self.named is not None:
                self.named(name)
        self.dec = _decompressor(self.kind)
        self.feed = data

    def _next(self, data: bytes) -> None:
        """A member has ended, `data` after it: another member, or the end of the stream."""
        if self.kind != "zlib":  # zlib streams are not read one after another
            data = data.lstrip(b"\x00")
            while len(data) < 10 and (more := self.src.read(_ZREAD)):
                data = (data + more).lstrip(b"\x00")
            if sniff(data[:512], b"") == self.kind:
                self._begin(data)
                return
        self.done = True
        self.left = data
