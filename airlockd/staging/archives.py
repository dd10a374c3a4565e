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
  lz4, 7z, rar, whatever they hold), `orphan-entry` (a zip local header outside the entries its
  central directory names), `corrupt`;
- otherwise the SHA-256 of each member's content (`members`), so the walk can withhold the
  archive when one of them is a withheld file's content, whichever it meets first.

What follows an archive's end is read too (`_follow`): after a tar's end blocks, a cpio's
trailer, the last member of a gzip, bzip2 or xz stream, a zlib stream's end, and a zip's bytes
outside its entries. Zero padding is nothing; anything else is judged as a file of its own would
be: an archive is opened at the same level (a tar after a tar is read as `tar -i` reads them),
other bytes are content (detectors, identity). A gzip member's stored file name is judged like a
member's path (`gzip -c .env > env.bak` keeps `.env`).

A file that starts like a zlib stream but does not decompress as one is not one (a text that
starts with "x^"): it is ordinary content. Never extracts to disk, never follows a member's link,
never reads past its bounds.
"""

from __future__ import annotations

import contextlib
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
    LOCAL,
    STREAMED,
    UNSUPPORTED,
    CorruptArchive,
    Member,
    Reader,
    Span,
    ar_members,
    cpio_members,
    exact,
    sniff,
    zip_gaps,
)
from airlockd.staging.archivestreams import Decompressed, Tape
from airlockd.staging.secretscan import SecretScanner

MAX_DEPTH = 3  # an archive in an archive in an archive; one deeper is unscannable
MIN_IDENTITY = 8  # shorter contents (and whitespace-only ones) are never matched by identity
RATIO = 1000  # uncompressed / compressed past RATIO_FLOOR bytes: a bomb
RATIO_FLOOR = 1 << 20
MEMBER_CHARS = 120
_READ = 1 << 20
_SNIFF = 512  # the first bytes `sniff` needs of a member (a tar header)
_BLOCK = 512  # a tar's block: what follows a tar's end starts on one
_SKIP = 1 << 16  # zero padding read at a time (a multiple of _BLOCK)
AFTER = "(after the end)"  # how bytes after an archive's end are shown
OUTSIDE = "(outside the entries)"  # and a zip's bytes outside its entries
PAYLOAD = "(compressed payload)"
_PAX_NUMBERS = frozenset({"mtime", "atime", "ctime", "size", "uid", "gid"})  # records that hold no text


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
                    zipfile.ZipFile(fh).close()
                except (zipfile.BadZipFile, OSError, ValueError, EOFError):
                    return None
                fh.seek(0)
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
        """Open the archive `fh` holds, then judge what follows its end."""
        if depth > self.max_depth:
            raise _Stop("archive-unscannable:too-deep")
        try:
            rest = self._open_one(kind, fh, prefix, depth, budget, out)
            if rest is not None:
                self._follow(rest, prefix, depth, budget, out, AFTER)
        except (_Stop, _NotZlib):
            raise
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, ValueError, OSError):
            raise _Stop("archive-unscannable:corrupt") from None
        except NotImplementedError:
            raise _Stop("archive-unscannable:unsupported") from None
        except RuntimeError:  # zipfile: a password is required
            raise _Stop("archive-unscannable:encrypted") from None

    def _open_one(
        self, kind: str, fh: IO[bytes], prefix: str, depth: int, budget: _Budget, out: ArchiveScan
    ) -> Reader | None:
        """Open one archive; return what follows its end, when its format has one."""
        if kind in ("zip", "zip?"):
            with zipfile.ZipFile(fh) as zf:
                self._zip(zf, prefix, depth, budget, out)
            return None
        if kind in STREAMED:
            return self._streamed(kind, fh, prefix, depth, budget, out)
        if kind in UNSUPPORTED:
            raise _Stop("archive-unscannable:unsupported")
        return self._compressed(kind, fh, prefix, depth, budget, out)

    def _follow(self, rest: Reader, prefix: str, depth: int, budget: _Budget, out: ArchiveScan, label: str) -> None:
        """Judge the bytes after an archive's end (`rest`) as a file of their own would be: zero
        padding is nothing; an archive is opened at the same level and under the same prefix (a
        tar after a tar is read as `tar -i` reads them), then what follows it, and so on; other
        bytes are content, shown as `label`. Each piece counts as a member."""
        shown = self._shown(f"{prefix}/{label}" if prefix else label)
        while (found := self._after(rest, shown, budget, out)) is not None:
            try:
                following = self._open_one(found[0], io.BytesIO(found[1]), prefix, depth, budget, out)
            except _NotZlib:
                return  # ordinary bytes after all, judged as such
            if following is None:
                return
            rest = following

    def _after(self, rest: Reader, shown: str, budget: _Budget, out: ArchiveScan) -> tuple[str, bytes] | None:
        """Skip the zero padding `rest` starts with; judge what follows (`_judge`), None when
        nothing does. A tar may start with a zero byte (an empty name field): the block that
        holds the first other byte is sniffed for one first."""
        chunk = b""
        while not (tail := chunk.lstrip(b"\x00")):
            chunk = exact(rest, _SKIP)
            if not chunk:
                return None
            budget.spend(len(chunk))
        budget.bytes += len(chunk)  # spent again by _judge
        budget.member()
        skipped = len(chunk) - len(tail)
        block = chunk[skipped - skipped % _BLOCK :]
        first = block if len(block) != len(tail) and sniff(block, b"") == "tar" else tail
        return self._judge(_chunks(rest, 0, first), shown, budget, out)

    def _zip(self, zf: zipfile.ZipFile, prefix: str, depth: int, budget: _Budget, out: ArchiveScan) -> None:
        infos = zf.infolist()
        if len(infos) > budget.members:
            raise _Stop("archive-unscannable:too-many-members")
        if sum(i.file_size for i in infos) > budget.bytes:  # declared sizes: stopped before reading
            raise _Stop("archive-unscannable:too-big")
        fh = zf.fp
        assert fh is not None
        gaps = zip_gaps(fh, infos, zf.start_dir, fh.seek(0, os.SEEK_END))
        for start, stop in gaps:
            if _holds_local_header(fh, start, stop):
                raise _Stop("archive-unscannable:orphan-entry")
        for info in infos:
            budget.member()
            name = self._name(prefix, info.filename, info.is_dir())
            if info.is_dir() and not info.file_size:
                continue  # a directory with content has it scanned
            if info.flag_bits & 0x1:
                raise _Stop("archive-unscannable:encrypted")
            with zf.open(info) as member:
                self._content(_chunks(member, info.compress_size), name, depth, budget, out)
                if _unused(member):
                    # a deflate stream that ends before the entry's data does: what follows it
                    # is read as another entry by a reader that walks local headers
                    raise _Stop("archive-unscannable:inconsistent-entry")
        for start, stop in gaps:
            fh.seek(start)
            self._follow(Span(fh, stop - start), prefix, depth, budget, out, OUTSIDE)

    def _streamed(
        self, kind: str, fh: Reader, prefix: str, depth: int, budget: _Budget, out: ArchiveScan
    ) -> Reader | None:
        """Read a tar, ar or cpio front to back; return what follows its end (an ar has none:
        bytes after its last member are a header that does not parse, so corrupt)."""
        if kind == "tar":
            tape = Tape(fh)
            with tarfile.open(fileobj=tape, mode="r|") as tf:  # type: ignore[call-overload]
                self._tar(tf, prefix, depth, budget, out)
                end = tf.offset  # the block that ended it: zeros, or no header at all
            return tape.since(end)
        if kind == "ar":
            self._members(ar_members(fh, budget.spend), prefix, depth, budget, out)
            return None
        self._members(cpio_members(fh, budget.spend), prefix, depth, budget, out)
        return fh  # after the trailer

    def _tar(self, tf: tarfile.TarFile, prefix: str, depth: int, budget: _Budget, out: ArchiveScan) -> None:
        for info in tf:
            budget.member()
            name = self._name(prefix, info.name, info.isdir())
            texts = [v for k, v in info.pax_headers.items() if k not in _PAX_NUMBERS]
            if info.linkname:
                texts.append(info.linkname)
            if texts:  # a header's texts, which no detector read in a compressed tar
                self._detect("\n".join(texts).encode("utf-8", "surrogateescape"), name)
            if not info.isreg() and info.type in tarfile.SUPPORTED_TYPES:
                continue  # links, devices, directories: their names were judged above
            member = tf.extractfile(info)  # a type tar does not know is a file to GNU tar
            if member is None:
                continue
            self._content(_chunks(member, info.size), name, depth, budget, out)

    def _members(self, members: Iterator[Member], prefix: str, depth: int, budget: _Budget, out: ArchiveScan) -> None:
        for member in members:
            budget.member()
            name = self._name(prefix, member.name, member.is_dir)
            self._content(_chunks(member.body, 0), name, depth, budget, out)

    def _compressed(
        self, kind: str, fh: IO[bytes], prefix: str, depth: int, budget: _Budget, out: ArchiveScan
    ) -> Reader:
        """A gzip / bzip2 / xz / zlib stream: a tar, ar or cpio inside counts as one archive with
        it (`.tar.gz`, `.cpio.gz`), and what follows its end inside the stream is judged; any
        other payload is a member of its own, one level down. Each gzip member's stored name is
        judged as a member's path. Returns what follows the stream's end. A zlib stream that
        fails to decompress is no stream (`_NotZlib`), once what it gave is scanned."""
        start = fh.tell()
        raw = Decompressed(kind, fh, lambda stored: self._stored_name(prefix, stored))
        payload = _Ratio(raw, fh, start)
        try:
            inner = sniff(payload.peek_head(), b"")
            if inner in STREAMED:
                after = self._streamed(inner, payload, prefix, depth, budget, out)
                if after is not None:
                    self._follow(after, prefix, depth, budget, out, AFTER)
            else:
                budget.member()
                self._content(_chunks(payload, 0), prefix or PAYLOAD, depth, budget, out)
        except (CorruptArchive, tarfile.TarError):
            if not raw.broken:
                raise
        if raw.broken:
            raise _NotZlib()
        return raw.rest()

    def _stored_name(self, prefix: str, stored: bytes) -> None:
        """Judge the file name a gzip member's header keeps (`gzip -c .env > env.bak`: `.env`)."""
        self._name(prefix, stored.decode("utf-8", "surrogateescape"), False)

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
        """Scan one member's bytes (`_judge`); open it, one level down, when it is an archive."""
        found = self._judge(chunks, name, budget, out)
        if found is not None:
            with contextlib.suppress(_NotZlib):  # then ordinary bytes, scanned and hashed already
                self._open(found[0], io.BytesIO(found[1]), name, depth + 1, budget, out)

    def _judge(self, chunks: Iterator[bytes], name: str, budget: _Budget, out: ArchiveScan) -> tuple[str, bytes] | None:
        """Scan one content's bytes (detectors with overlap, hash); return its kind and bytes,
        for the caller to open, when it is an archive."""
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
            return kind, data
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
        return None

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


def _unused(member: IO[bytes]) -> bool:
    """Whether a zip member read to its end left compressed bytes its stream did not use
    (zipfile keeps its decompressor: a zlib one has `unused_data`; other methods are read by
    length)."""
    dec = getattr(member, "_decompressor", None)
    return bool(getattr(dec, "eof", False) and getattr(dec, "unused_data", b""))


def _holds_local_header(fh: IO[bytes], start: int, stop: int) -> bool:
    """Whether the span [start, stop) of `fh` holds a zip local header, except as the start of a
    zip with an end record of its own (opened, and accounted for, as one)."""
    fh.seek(start)
    left, tail = stop - start, b""
    local = end = False
    while left > 0 and (chunk := fh.read(min(left, _READ))):
        window = tail + chunk
        local = local or LOCAL in window
        end = end or EOCD in window
        left -= len(chunk)
        tail = chunk[-3:]
    if not local:
        return False
    fh.seek(start)
    return not (end and fh.read(4) == LOCAL)


def _chunks(member: Reader, compressed: int, first: bytes = b"") -> Iterator[bytes]:
    """A member's bytes in chunks (after `first`, when given); for a zip member (`compressed` >
    0), stopped as a bomb past RATIO times its compressed size."""
    if first:
        yield first
    given = 0
    while chunk := member.read(_READ):
        given += len(chunk)
        if compressed and given > RATIO_FLOOR and given > RATIO * compressed:
            raise _Stop("archive-unscannable:ratio")
        yield chunk
