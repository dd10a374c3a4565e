"""Which archive a file's first bytes say it is, readers of the formats the standard library
lacks (ar, cpio), and what of a zip its central directory does not account for (`zip_gaps`), for
`archives.ArchiveScanner`.

Recognised by their first bytes, never by extension: zip; tar (the `ustar` magic, or an old v7
header by its checksum); ar (`.a`, `.deb`); cpio (newc, odc, binary in either byte order); gzip,
bzip2, xz and zlib streams; and UNSUPPORTED kinds, which the scanner withholds unopened. Each kind
after the common ones is checked beyond its magic where the format allows (a header that
parses), so a text that starts like one ("!<arch>" prose, "070701...") is not taken for it; a
zlib header is only a guess the scanner settles by decompressing.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Literal, Protocol

EOCD = b"PK\x05\x06"
LOCAL = b"PK\x03\x04"  # a zip's local file header
EOCD_SPAN = 65_557  # the end-of-central-directory record and the longest comment
STREAMED = ("tar", "ar", "cpio")  # read front to back: inside a compressed stream, one archive with it
# Formats the standard library cannot open (no zstd or lz4 module before Python 3.14, and this
# project takes no dependency for them): withheld as archive-unscannable:unsupported, whatever
# they hold, rather than staged unscanned.
UNSUPPORTED = ("zstd", "lz4", "7z", "rar")

_READ = 1 << 20
_DESCRIPTOR = b"PK\x07\x08"
_BZ2_BLOCKS = (b"1AY&SY", b"\x17rE8P\x90")  # first block, or the end of an empty stream
_AR = b"!<arch>\n"
_CPIO_NEWC = (b"070701", b"070702")  # without and with a checksum
_CPIO_ODC = b"070707"
_CPIO_BINARY = (b"\xc7\x71", b"\x71\xc7")  # 0o070707 as a little- or big-endian 16-bit word
_CPIO_NAME_MAX = 1 << 16
_CPIO_TYPES = {0o010000, 0o020000, 0o040000, 0o060000, 0o100000, 0o120000, 0o140000}
_CPIO_DIR = 0o040000
_CPIO_TRAILER = b"TRAILER!!!"
_HEX = re.compile(rb"[0-9A-Fa-f]+")
_OCTAL = re.compile(rb"[0-7]+")
_DECIMAL = re.compile(rb"[0-9]+")
_ZSTD = b"\x28\xb5\x2f\xfd"
_ZSTD_SKIPPABLE = b"\x2a\x4d\x18"  # after a first byte of 0x50-0x5f: a frame a decoder skips
_LZ4 = b"\x04\x22\x4d\x18"
_LZ4_LEGACY = b"\x02\x21\x4c\x18"
_7Z = b"7z\xbc\xaf\x27\x1c"
_RAR = b"Rar!\x1a\x07"


class Reader(Protocol):
    def read(self, n: int, /) -> bytes: ...


class CorruptArchive(ValueError):
    """An archive that does not parse to its end (the scanner withholds it: corrupt)."""


def sniff(data: bytes, tail: bytes | None = None) -> str | None:
    """The container kind `data` (a file's first bytes, at least 512 of them when it has them)
    starts with: "zip", "tar", "ar", "cpio", "gzip", "bzip2", "xz", "zlib" (a zlib header: a
    stream only if it decompresses), one of UNSUPPORTED; "zip?" when only a zip's end record shows
    in `tail` (the file's last bytes; `data` itself when None): possibly a zip with data before
    it. Compares a few bytes at fixed places (and sums a 512-byte tar header whose checksum field
    is octal), then searches `tail` for a zip's end record."""
    head = data[:8]
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08"):
        return "zip"
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:6] == b"\xfd7zXZ\x00":
        return "xz"
    if head[:3] == b"BZh" and head[3:4] in b"123456789" and len(data) >= 10 and data[4:10] in _BZ2_BLOCKS:
        return "bzip2"
    if data[257:262] == b"ustar":
        return "tar"
    for check in _BY_FIRST_BYTE.get(data[:1], ()):
        if (kind := check(data)) is not None:
            return kind
    if _tar_header(data):
        return "tar"
    if _zlib(data):  # only a guess (the scanner decompresses to know): after every other kind
        return "zlib"
    end = data if tail is None else tail
    if EOCD in end[-EOCD_SPAN:]:
        return "zip?"
    return None


def _zstd(data: bytes) -> str | None:
    if data[:4] == _ZSTD and len(data) > 4 and not data[4] & 0x08:  # the descriptor's reserved bit
        return "zstd"
    return "zstd" if data[1:4] == _ZSTD_SKIPPABLE and 0x50 <= data[0] <= 0x5F else None


def _lz4(data: bytes) -> str | None:
    if data[:4] == _LZ4 and len(data) > 4 and data[4] & 0xC2 == 0x40:  # version 01, reserved bit 0
        return "lz4"
    return "lz4" if data[:4] == _LZ4_LEGACY else None


def _7z(data: bytes) -> str | None:
    return "7z" if data[:6] == _7Z else None


def _rar(data: bytes) -> str | None:
    return "rar" if data[:6] == _RAR and data[6:7] in (b"\x00", b"\x01") else None  # RAR 1.5-4, RAR 5


def _ar(data: bytes) -> str | None:
    return "ar" if data[:8] == _AR and (len(data) == 8 or _ar_header(data[8:68]) is not None) else None


def _cpio(data: bytes) -> str | None:
    return "cpio" if _cpio_start(data) else None


def _zlib(data: bytes) -> bool:
    """Whether `data` starts with a zlib header (RFC 1950): deflate, a window of at most 32 KiB,
    no preset dictionary (a stream that needs one cannot be read without it), the check bits."""
    return len(data) >= 2 and data[0] & 0x8F == 0x08 and not data[1] & 0x20 and (data[0] << 8 | data[1]) % 31 == 0


def _by_first_byte() -> dict[bytes, tuple[Callable[[bytes], str | None], ...]]:
    """The checks worth making on a file that starts with a given byte: most files pay one dict
    lookup for the kinds below (and the tar checksum field's look, which any byte can start)."""
    table: dict[int, list[Callable[[bytes], str | None]]] = {}
    firsts: list[tuple[Iterable[int], Callable[[bytes], str | None]]] = [
        ([0x28, *range(0x50, 0x60)], _zstd),
        ([0x04, 0x02], _lz4),
        ([ord("7")], _7z),
        ([ord("R")], _rar),
        ([ord("!")], _ar),
        ([ord("0"), 0xC7, 0x71], _cpio),
    ]
    for bytes_, check in firsts:
        for b in bytes_:
            table.setdefault(b, []).append(check)
    return {bytes([b]): tuple(checks) for b, checks in table.items()}


_BY_FIRST_BYTE = _by_first_byte()


def _tar_header(block: bytes) -> bool:
    """Whether `block` starts with a tar header by its checksum (a v7 archive has no magic): the
    octal checksum field equals the sum of the header's bytes, unsigned or signed, with the field
    itself counted as spaces."""
    if len(block) < 512 or block[0] == 0:
        return False
    field = block[148:156].strip(b" \x00")
    if not field or field.strip(b"01234567"):
        return False
    header = block[:512]
    unsigned = sum(header) - sum(header[148:156]) + 8 * 0x20
    high = 512 - len(header.translate(None, bytes(range(0x80, 0x100))))
    return int(field, 8) in (unsigned, unsigned - 0x100 * high)


# -- ar ------------------------------------------------------------------------------------------


@dataclass
class Member:
    """One member of an archive read front to back; `body` must be read before the next."""

    name: str  # as the archive spells it ("" for ar's symbol table and long names)
    is_dir: bool
    body: Reader


def _ar_header(header: bytes) -> tuple[bytes, int] | None:
    """An ar member header's name field (trailing blanks off) and size, or None when it is not
    one (60 bytes: name, dates, owner, mode, a decimal size, then a backquote and a newline)."""
    if len(header) != 60 or header[58:60] != b"`\n":
        return None
    size = header[48:58].rstrip(b" ")
    if not _DECIMAL.fullmatch(size):
        return None
    return header[:16].rstrip(b" "), int(size)


def ar_members(src: Reader, spend: Callable[[int], None]) -> Iterator[Member]:
    """The members of an ar archive (`.a`, `.deb`): 60-byte headers, each member padded to an
    even size; long names in GNU's `//` member (`/<offset>`) or BSD's `#1/<length>` before the
    data. The symbol table and the long names are members without a name (their bytes are
    scanned like any). `spend` is told of every byte read that no member's body gives."""
    if exact(src, 8) != _AR:
        raise CorruptArchive("ar magic")
    names = b""
    while header := exact(src, 60):
        parsed = _ar_header(header)
        if parsed is None:
            raise CorruptArchive("ar header")
        field, size = parsed
        body = Span(src, size)
        if field == b"//":
            spend(size)
            names = body.take(size)
            yield Member("", False, io.BytesIO(names))
        else:
            yield Member(_ar_name(field, body, names, spend), False, body)
        body.skip(spend)
        if size % 2 and len(exact(src, 1)) != 1:
            raise CorruptArchive("ar padding")


def _ar_name(field: bytes, body: Span, names: bytes, spend: Callable[[int], None]) -> str:
    """An ar member's name from its header's field: `/` (the symbol table: no name), a GNU name
    (`name/`, or `/<offset>` into the `//` member's names), a BSD `#1/<length>` that leads the
    member's data, else the field itself."""
    if field in (b"/", b"/SYM64/"):
        return ""
    if field.startswith(b"#1/"):
        if not _DECIMAL.fullmatch(field[3:]):
            raise CorruptArchive("ar name length")
        size = int(field[3:])
        spend(size)
        raw = body.take(size).rstrip(b"\x00")
    elif field[:1] == b"/" and _DECIMAL.fullmatch(field[1:]):
        at = int(field[1:])
        end = names.find(b"\n", at)
        if at >= len(names) or end < 0:
            raise CorruptArchive("ar long name")
        raw = names[at:end].removesuffix(b"/")
    else:
        raw = field.removesuffix(b"/")
    return raw.decode("utf-8", "surrogateescape")


# -- cpio ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _CpioHeader:
    size: int  # of the header
    mode: int
    namesize: int  # the name's bytes with its NUL
    filesize: int
    align: int  # the header with the name, and the data, are padded to a multiple of this


def _cpio_header(data: bytes) -> _CpioHeader | None:
    """The cpio header `data` starts with (newc, odc, or binary in either byte order), or None
    when it does not start with one whose fields parse."""
    magic = data[:6]
    if magic in _CPIO_NEWC:
        fields = data[6:110]
        if len(fields) < 104 or not _HEX.fullmatch(fields):
            return None
        num = [int(fields[i : i + 8], 16) for i in range(0, 104, 8)]
        return _CpioHeader(110, num[1], num[11], num[6], 4)
    if magic == _CPIO_ODC:
        fields = data[6:76]
        if len(fields) < 70 or not _OCTAL.fullmatch(fields):
            return None
        return _CpioHeader(76, int(fields[12:18], 8), int(fields[53:59], 8), int(fields[59:70], 8), 1)
    if magic[:2] in _CPIO_BINARY and len(data) >= 26:
        order: Literal["little", "big"] = "little" if magic[:2] == _CPIO_BINARY[0] else "big"
        word = [int.from_bytes(data[i : i + 2], order) for i in range(0, 26, 2)]
        return _CpioHeader(26, word[3], word[10], word[11] << 16 | word[12], 2)
    return None


def _cpio_start(data: bytes) -> bool:
    """Whether `data` starts with a cpio header that makes sense: a file type cpio writes (or the
    trailer), a name that is not empty and ends in its NUL where `data` reaches that far."""
    header = _cpio_header(data)
    if header is None or not 2 <= header.namesize <= _CPIO_NAME_MAX:
        return False
    name = data[header.size : header.size + header.namesize]
    if name[:1] in (b"", b"\x00") or (len(name) == header.namesize and name[-1:] != b"\x00"):
        return False
    return header.mode & 0o170000 in _CPIO_TYPES or name == _CPIO_TRAILER + b"\x00"


def cpio_members(src: Reader, spend: Callable[[int], None]) -> Iterator[Member]:
    """The members of a cpio archive up to its trailer (an archive that ends before it is
    corrupt). Every member's data is its body, a symbolic link's target included."""
    while True:
        magic = exact(src, 6)
        size = 26 if magic[:2] in _CPIO_BINARY else 110 if magic in _CPIO_NEWC else 76
        header = _cpio_header(magic + exact(src, size - len(magic)))
        if header is None or not 1 <= header.namesize <= _CPIO_NAME_MAX:
            raise CorruptArchive("cpio header")
        padded = header.namesize + (-(header.size + header.namesize) % header.align)
        spend(padded)
        raw = exact(src, padded)
        if len(raw) != padded:
            raise CorruptArchive("cpio name")
        name = raw[: header.namesize].split(b"\x00", 1)[0]
        if name == _CPIO_TRAILER:
            return
        body = Span(src, header.filesize)
        yield Member(name.decode("utf-8", "surrogateescape"), header.mode & 0o170000 == _CPIO_DIR, body)
        body.skip(spend)
        pad = -header.filesize % header.align
        if len(exact(src, pad)) != pad:
            raise CorruptArchive("cpio padding")


# -- zip ---------------------------------------------------------------------------------------


def zip_end(fh: IO[bytes], size: int) -> tuple[int, int] | None:
    """Where the end record of the zip `fh` (`size` bytes) is, found as zipfile finds it (the last
    22 bytes, else the last signature in the last 64 KiB), and where it ends with its comment."""
    if size >= 22:
        fh.seek(size - 22)
        record = fh.read(22)
        if record[:4] == EOCD and record[20:22] == b"\x00\x00":
            return size - 22, size
    start = max(0, size - (1 << 16) - 22)
    fh.seek(start)
    data = fh.read()
    at = data.rfind(EOCD)
    if at < 0 or len(data) - at < 22:
        return None
    comment = int.from_bytes(data[at + 20 : at + 22], "little")
    return start + at, min(size, start + at + 22 + comment)


def _local_agrees(head: bytes, info: zipfile.ZipInfo) -> bool:
    """Whether a local header without a data descriptor says what the central directory says of
    its entry: method, CRC and both sizes (a zip64 size, 0xFFFFFFFF there, is in its extra)."""
    method, crc = int.from_bytes(head[8:10], "little"), int.from_bytes(head[14:18], "little")
    packed, size = int.from_bytes(head[18:22], "little"), int.from_bytes(head[22:26], "little")
    if method != info.compress_type or crc != info.CRC:
        return False
    return (packed == 0xFFFFFFFF or packed == info.compress_size) and (size == 0xFFFFFFFF or size == info.file_size)


def zip_gaps(fh: IO[bytes], infos: Iterable[zipfile.ZipInfo], start_dir: int, size: int) -> list[tuple[int, int]]:
    """The spans (start, end) of the zip `fh` (`size` bytes) that its central directory does not
    account for: before the first entry (a self-extractor's stub, a script's shebang line),
    between entries, after the end record and its comment. Every entry's local header must be
    where the directory says and name the same file (else CorruptArchive): an entry the
    directory does not name, or names otherwise, would be extracted by a reader that walks the
    local headers (`bsdtar`, Java's ZipInputStream) and never by zipfile."""
    end = zip_end(fh, size)
    if end is None:
        raise CorruptArchive("no zip end record")
    spans = [(start_dir, end[1])]  # the central directory, zip64 records, end record, comment
    for info in infos:
        at = info.header_offset
        fh.seek(at)
        head = fh.read(30)
        if len(head) != 30 or head[:4] != LOCAL:
            raise CorruptArchive("no zip local header where the directory says")
        names, extra = int.from_bytes(head[26:28], "little"), int.from_bytes(head[28:30], "little")
        raw = fh.read(names)
        utf8 = int.from_bytes(head[6:8], "little") & 0x800
        if raw.decode("utf-8" if utf8 else "cp437", "replace") != info.orig_filename:
            raise CorruptArchive("a zip local header names another file")
        if int.from_bytes(head[8:10], "little") != info.compress_type:
            # a reader of local headers decompresses by theirs (deflate where the directory says
            # stored: the stream ends early, and what follows reads as an entry of its own)
            raise CorruptArchive("a zip local header gives another method than the directory")
        if not int.from_bytes(head[6:8], "little") & 0x08 and not _local_agrees(head, info):
            # a reader of local headers takes the entry's end from them: data the directory
            # gives this entry past that end would be read as an entry of its own
            raise CorruptArchive("a zip local header gives other sizes than the directory")
        data_end = at + 30 + names + extra + info.compress_size
        if info.flag_bits & 0x08:
            data_end += _zip_descriptor(fh, data_end, info)
        spans.append((at, data_end))
    gaps, covered = [], 0
    for start, stop in sorted(spans):
        if start > covered:
            gaps.append((covered, start))
        covered = max(covered, stop)
    if covered < size:
        gaps.append((covered, size))
    return gaps


def _zip_descriptor(fh: IO[bytes], at: int, info: zipfile.ZipInfo) -> int:
    """The length of the data descriptor at `at` that repeats `info`'s checksum and sizes (with
    or without its signature, sizes of 4 or 8 bytes); 0 when there is none."""
    fh.seek(at)
    raw = fh.read(24)
    crc = info.CRC.to_bytes(4, "little")
    for width in (4, 8):
        if max(info.compress_size, info.file_size) >> (8 * width):
            continue
        body = crc + info.compress_size.to_bytes(width, "little") + info.file_size.to_bytes(width, "little")
        if raw.startswith(_DESCRIPTOR + body):
            return 4 + len(body)
        if raw.startswith(body):
            return len(body)
    return 0


# -- readers -------------------------------------------------------------------------------------


class Span:
    """The next `size` bytes of an archive read front to back: one member's data."""

    def __init__(self, src: Reader, size: int) -> None:
        self.src = src
        self.left = size

    def read(self, n: int, /) -> bytes:
        if self.left <= 0:
            return b""
        data = self.src.read(min(n, self.left))
        if not data:
            raise CorruptArchive("the archive ends inside a member")
        self.left -= len(data)
        return data

    def take(self, n: int) -> bytes:
        data = exact(self, n) if n <= self.left else b""
        if len(data) != n:
            raise CorruptArchive("a member shorter than its header says")
        return data

    def skip(self, spend: Callable[[int], None]) -> None:
        while chunk := self.read(_READ):
            spend(len(chunk))


def exact(src: Reader, n: int) -> bytes:
    """`n` bytes of `src`, fewer only at its end."""
    parts = []
    while n > 0:
        data = src.read(n)
        if not data:
            break
        parts.append(data)
        n -= len(data)
    return b"".join(parts)
