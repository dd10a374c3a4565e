"""Archives in the workspace, opened and judged like the files they hold.

A `.zip` or `.tar.gz` holding `.env` or `id_rsa` hands it to the agent as surely as the file
itself. Staging asks `ArchiveScanner` about every file whose first bytes say it is an archive
(`archiveformats.sniff`: zip; tar, with the ustar magic or an old v7 header; ar, as `.a` and
`.deb`; cpio; gzip, bzip2, xz and raw zlib streams, whatever their payload: recognised by their
first bytes, never by extension; `sniff` is all a non-archive costs). The scanner walks the
members with the standard library and the small readers of `archiveformats`, streaming where it
can, nested archives to `max_depth` levels, and answers:

- `archive:<member>:<rule>` when a member's path would be withheld (the walk's own path rule:
  withhold patterns, labels above the clearance, a secret in the name) or its content hits a
  content detector; `<member>` is printable, bounded, and masked where it carries a secret;
- `archive-unscannable:<why>` (fail closed) when it cannot be scanned whole within the bounds:
  `too-big` (more than `max_bytes` uncompressed, nested included), `too-many-members`,
  `too-deep`, `ratio` (a compression bomb, stopped early), `encrypted`, `unsupported`
  (a compression method the standard library lacks, or a format it cannot open at all: zstd,
  lz4, 7z, rar, whatever they hold), `corrupt`;
- otherwise the SHA-256 of each member's content (`members`), so the walk can withhold the
  archive when one of them is a withheld file's content, whichever it meets first.

A file that starts like a zlib stream but does not decompress as one is not one (a text that
starts with "x^"): it is ordinary content. Never extracts to disk, never follows a member's link,
never reads past its bounds.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import io
import lzma
import os
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from airlockd.staging.archiveformats import (
    EOCD,
    EOCD_SPAN,
    STREAMED,
    UNSUPPORTED,
    CorruptArchive,
    Member,
    Reader,
    ZlibStream,
    ar_members,
    cpio_members,
    sniff,
)
from airlockd.staging.secretscan import SecretScanner

MAX_DEPTH = 3  # an archive in an archive in an archive; one deeper is unscannable
MIN_IDENTITY = 8  # shorter contents (and whitespace-only ones) are never matched by identity
RATIO = 1000  # uncompressed / compressed past RATIO_FLOOR bytes: a bomb
RATIO_FLOOR = 1 << 20
MEMBER_CHARS = 120
_READ = 1 << 20
_SNIFF = 512  # the first bytes `sniff` needs of a member (a tar header)


def trivial(size: int, data: bytes) -> bool:
    """Whether a content is too slight to match by identity (an empty `__init__.py`)."""
    return size < MIN_IDENTITY or not data.strip()


@dataclass
class ArchiveScan:
    """One archive's verdict: `rule` when withheld; else `members`, sha256 -> member path."""

    rule: str | None = None
    members: dict[str, str] = field(default_factory=dict)


class _Stop(Exception):
    def __init__(self, rule: str) -> None:
        super().__init__(rule)
        self.rule = rule


class _NotZlib(Exception):
    """What started like a zlib stream does not decompress: it is not one."""


class _Budget:
    def __init__(self, max_bytes: int, max_members: int) -> None:
        self.bytes = max_bytes
        self.members = max_members

    def spend(self, n: int) -> None:
        self.bytes -= n
        if self.bytes < 0:
            raise _Stop("archive-unscannable:too-big")

    def member(self) -> None:
        self.members -= 1
        if self.members < 0:
            raise _Stop("archive-unscannable:too-many-members")


def _norm(name: str) -> str:
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return "/".join(parts)


class ArchiveScanner:
    """Judges archives for one walk: `path_rule(path, is_dir)` is the walk's own, `mask` makes a
    member path safe to show (the redactor's `text`)."""

    def __init__(
        self,
        path_rule: Callable[[str, bool], str | None],
        scanner: SecretScanner,
        mask: Callable[[str], str],
        *,
        max_bytes: int,
        max_members: int,
        max_depth: int = MAX_DEPTH,
    ) -> None:
        self.path_rule = path_rule
        self.scanner = scanner
        self.mask = mask
        self.max_bytes = max_bytes
        self.max_members = max_members
        self.max_depth = max_depth

    # -- entry points -----------------------------------------------------------------------------

    def scan_bytes(self, data: bytes) -> ArchiveScan | None:
        """The verdict on a whole file in memory; None when it is not an archive."""
        kind = sniff(data)
        if kind is None:
            return None
        return self._top(kind, io.BytesIO(data), EOCD in data[-EOCD_SPAN:])

    def scan_fd(self, fd: int) -> ArchiveScan | None:
        """The verdict on the regular file open as `fd` (read with pread and a dup; the
        caller's offset is left alone); None when it is not an archive."""
        size = os.fstat(fd).st_size
        head = os.pread(fd, 512, 0)
        tail = os.pread(fd, EOCD_SPAN, max(0, size - EOCD_SPAN))
        kind = sniff(head, tail)
        if kind is None:
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            fh.seek(0)
            return self._top(kind, fh, EOCD in tail)

    def _top(self, kind: str, fh: IO[bytes], zip_end: bool) -> ArchiveScan | None:
        """`zip_end`: the file's tail holds a zip's end record (a zip with data before it)."""
        out = ArchiveScan()
        budget = _Budget(self.max_bytes, self.max_members)
        try:
            if kind == "zip?":  # an end record in the tail only: a zip only if it opens as one
                try:
                    zf = zipfile.ZipFile(fh)
                except (zipfile.BadZipFile, OSError, ValueError, EOFError):
                    return None
                with zf:
                    self._zip(zf, "", 1, budget, out)
            else:
                self._open(kind, fh, "", 1, budget, out)
        except _NotZlib:  # ordinary content after all; unless a zip follows what looked like zlib
            if not zip_end:
                return None
            fh.seek(0)
            return self._top("zip?", fh, False)
        except _Stop as stop:
            out.rule = stop.rule
        except RecursionError:
            out.rule = "archive-unscannable:too-deep"
        return out

    # -- containers -------------------------------------------------------------------------------

    def _open(self, kind: str, fh: IO[bytes], prefix: str, depth: int, budget: _Budget, out: ArchiveScan) -> None:
        if depth > self.max_depth:
            raise _Stop("archive-unscannable:too-deep")
        try:
            if kind in ("zip", "zip?"):
                with zipfile.ZipFile(fh) as zf:
                    self._zip(zf, prefix, depth, budget, out)
            elif kind in STREAMED:
                self._streamed(kind, fh, prefix, depth, budget, out)
            elif kind in UNSUPPORTED:
                raise _Stop("archive-unscannable:unsupported")
            else:
                self._compressed(kind, fh, prefix, depth, budget, out)
        except (_Stop, _NotZlib):
            raise
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, ValueError, OSError):
            raise _Stop("archive-unscannable:corrupt") from None
        except NotImplementedError:
            raise _Stop("archive-unscannable:unsupported") from None
        except RuntimeError:  # zipfile: a password is required
            raise _Stop("archive-unscannable:encrypted") from None

    def _zip(self, zf: zipfile.ZipFile, prefix: str, depth: int, budget: _Budget, out: ArchiveScan) -> None:
        infos = zf.infolist()
        if len(infos) > budget.members:
            raise _Stop("archive-unscannable:too-many-members")
        if sum(i.file_size for i in infos) > budget.bytes:  # declared sizes: stopped before reading
            raise _Stop("archive-unscannable:too-big")
        for info in infos:
            budget.member()
            name = self._name(prefix, info.filename, info.is_dir())
            if info.is_dir():
                continue
            if info.flag_bits & 0x1:
                raise _Stop("archive-unscannable:encrypted")
            with zf.open(info) as member:
                self._content(_chunks(member, info.compress_size), name, depth, budget, out)

    def _streamed(self, kind: str, fh: Reader, prefix: str, depth: int, budget: _Budget, out: ArchiveScan) -> None:
        if kind == "tar":
            with tarfile.open(fileobj=fh, mode="r|") as tf:  # type: ignore[call-overload]
                self._tar(tf, prefix, depth, budget, out)
        else:
            members = ar_members if kind == "ar" else cpio_members
            self._members(members(fh, budget.spend), prefix, depth, budget, out)

    def _tar(self, tf: tarfile.TarFile, prefix: str, depth: int, budget: _Budget, out: ArchiveScan) -> None:
        for info in tf:
            budget.member()
            name = self._name(prefix, info.name, info.isdir())
            if not info.isreg():
                continue  # links, devices, directories: their names were judged above
            member = tf.extractfile(info)
            if member is None:
                continue
            self._content(_chunks(member, info.size), name, depth, budget, out)

    def _members(self, members: Iterator[Member], prefix: str, depth: int, budget: _Budget, out: ArchiveScan) -> None:
        for member in members:
            budget.member()
            name = self._name(prefix, member.name, member.is_dir)
            self._content(_chunks(member.body, 0), name, depth, budget, out)

    def _compressed(self, kind: str, fh: IO[bytes], prefix: str, depth: int, budget: _Budget, out: ArchiveScan) -> None:
        """A gzip / bzip2 / xz / zlib stream: a tar, ar or cpio inside counts as one archive with
        it (`.tar.gz`, `.cpio.gz`); any other payload is a member of its own, one level down. A
        zlib stream that fails to decompress is no stream (`_NotZlib`), once what it gave is
        scanned."""
        start = fh.tell()
        with _decompressor(kind, fh) as raw:
            payload = _Ratio(raw, fh, start)
            try:
                inner = sniff(payload.peek_head(), b"")
                if inner in STREAMED:
                    self._streamed(inner, payload, prefix, depth, budget, out)
                else:
                    budget.member()
                    name = prefix or "(compressed payload)"
                    self._content(_chunks(payload, 0), name, depth, budget, out)
            except (CorruptArchive, tarfile.TarError):
                if not (isinstance(raw, ZlibStream) and raw.broken):
                    raise
            if isinstance(raw, ZlibStream) and raw.broken:
                raise _NotZlib()

    # -- members ----------------------------------------------------------------------------------

    def _name(self, prefix: str, raw: str, is_dir: bool) -> str:
        """Judge a member's path; return it as the rules show it (prefixed by its archive)."""
        path = _norm(raw)
        if path:
            rule = self.path_rule(path, is_dir)
            shown = self._shown(f"{prefix}/{path}" if prefix else path)
            if rule is not None:
                raise _Stop(f"archive:{shown}:{rule}")
            return shown
        return prefix or "(unnamed)"

    def _shown(self, path: str) -> str:
        masked = self.mask(path)
        clean = "".join(ch if ch.isprintable() else "?" for ch in masked)
        return clean if len(clean) <= MEMBER_CHARS else clean[: MEMBER_CHARS - 1] + "…"

    def _content(self, chunks: Iterator[bytes], name: str, depth: int, budget: _Budget, out: ArchiveScan) -> None:
        """Scan one member's bytes (detectors with overlap, hash); open it when it is an archive."""
        first = next(chunks, b"")
        while len(first) < _SNIFF and (more := next(chunks, None)) is not None:
            first += more  # a stream may give a short first read: too short to know a tar by
        budget.spend(len(first))
        kind = sniff(first, b"")
        if kind is not None:
            parts = [first]
            for chunk in chunks:
                budget.spend(len(chunk))
                parts.append(chunk)
            data = b"".join(parts)
            self._detect(data, name)
            if not trivial(len(data), data):
                out.members.setdefault(hashlib.sha256(data).hexdigest(), name)
            with contextlib.suppress(_NotZlib):  # then ordinary bytes, scanned and hashed above
                self._open(kind, io.BytesIO(data), name, depth + 1, budget, out)
            return
        h = hashlib.sha256()
        size = 0
        tail = b""
        solid = False
        chunk = first
        while True:
            window = tail + chunk
            self._detect(window, name)
            h.update(chunk)
            size += len(chunk)
            solid = solid or bool(chunk.strip())
            tail = window[-self.scanner.overlap :]
            nxt = next(chunks, None)
            if nxt is None:
                break
            budget.spend(len(nxt))
            chunk = nxt
        if size >= MIN_IDENTITY and solid:
            out.members.setdefault(h.hexdigest(), name)

    def _detect(self, data: bytes, name: str) -> None:
        hit = self.scanner.first_hit(data)
        if hit is not None:
            raise _Stop(f"archive:{name}:detector:{hit}")


class _Ratio(io.RawIOBase):
    """A decompressed stream that stops (a bomb) once it has given RATIO times more bytes than
    it consumed of the compressed file, past RATIO_FLOOR; its first bytes can be peeked."""

    def __init__(self, raw: io.BufferedIOBase, src: IO[bytes], start: int) -> None:
        self.raw, self.src, self.start = raw, src, start
        self.given = 0
        self.head = b""

    def readable(self) -> bool:
        return True

    def peek_head(self) -> bytes:
        while len(self.head) < 512:
            more = self._read(512 - len(self.head))
            if not more:
                break
            self.head += more
        return self.head

    def _read(self, n: int) -> bytes:
        data = self.raw.read(n)
        self.given += len(data)
        if self.given > RATIO_FLOOR and self.given > RATIO * max(1, self.src.tell() - self.start):
            raise _Stop("archive-unscannable:ratio")
        return data

    def readinto(self, buf: Any) -> int:
        n = len(buf)
        if self.head:
            data, self.head = self.head[:n], self.head[n:]
        else:
            data = self._read(n)
        buf[: len(data)] = data
        return len(data)


def _decompressor(kind: str, fh: IO[bytes]) -> io.BufferedIOBase:
    if kind == "gzip":
        return gzip.GzipFile(fileobj=fh, mode="rb")
    if kind == "bzip2":
        return bz2.BZ2File(fh, "rb")
    if kind == "zlib":
        return ZlibStream(fh)
    return lzma.LZMAFile(fh, "rb")


def _chunks(member: Reader, compressed: int) -> Iterator[bytes]:
    """A member's bytes in chunks; for a zip member (`compressed` > 0), stopped as a bomb past
    RATIO times its compressed size."""
    given = 0
    while chunk := member.read(_READ):
        given += len(chunk)
        if compressed and given > RATIO_FLOOR and given > RATIO * compressed:
            raise _Stop("archive-unscannable:ratio")
        yield chunk
