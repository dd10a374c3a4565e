"""Archives of the kinds the standard library cannot write (a v7 tar, ar, cpio) and frames of
those it cannot read (zstd, lz4, 7z, rar), built byte by byte for the archive tests
(tests/unit/test_archives.py, tests/integration/test_withhold_engine.py, test_secrets_random.py)."""

from __future__ import annotations

import struct


def v7_tar_bytes(members: dict[str, bytes]) -> bytes:
    """A tar as Unix v7 wrote it: no ustar magic, nothing past the link name but zeros."""
    out = []
    for name, data in members.items():
        head = bytearray(512)
        head[0:100] = name.encode().ljust(100, b"\0")
        for at, width, value in ((100, 8, 0o644), (108, 8, 0), (116, 8, 0), (124, 12, len(data)), (136, 12, 0)):
            head[at : at + width] = b"%0*o\0" % (width - 1, value)
        head[148:156] = b" " * 8
        head[156] = ord("0")
        head[148:156] = b"%06o\0 " % sum(head)
        out += [bytes(head), data + bytes(-len(data) % 512)]
    return b"".join(out) + bytes(1024)


def ar_bytes(members: dict[str, bytes], *, bsd: bool = False) -> bytes:
    """An ar archive (the GNU variant: `name/`, long names in `//`; or BSD's `#1/<length>`)."""

    def member(field: bytes, data: bytes) -> bytes:
        head = b"%-16s%-12d%-6d%-6d%-8o%-10d`\n" % (field, 0, 0, 0, 0o644, len(data))
        return head + data + b"\n" * (len(data) % 2)

    names, body = b"", []
    for name, data in members.items():
        raw = name.encode()
        if bsd and (len(raw) > 16 or b" " in raw):
            body.append(member(b"#1/%d" % len(raw), raw + data))
        elif bsd:
            body.append(member(raw, data))
        elif len(raw) > 15:
            body.append(member(b"/%d" % len(names), data))
            names += raw + b"/\n"
        else:
            body.append(member(raw + b"/", data))
    table = [member(b"//", names)] if names else []
    return b"!<arch>\n" + b"".join(table + body)


def cpio_bytes(members: dict[str, bytes], fmt: str = "newc") -> bytes:
    """A cpio archive: "newc" (070701), "odc" (070707), "bin-le" or "bin-be" (0o070707 words)."""
    out = []
    for ino, (name, data) in enumerate([*members.items(), ("TRAILER!!!", b"")], 1):
        raw = name.encode() + b"\0"
        mode = 0o100644 if data or name != "TRAILER!!!" else 0
        if fmt == "newc":
            fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw), 0)
            head = b"070701" + b"".join(b"%08X" % f for f in fields)
            out += [head, raw, bytes(-(len(head) + len(raw)) % 4), data, bytes(-len(data) % 4)]
        elif fmt == "odc":
            fields = (0, ino, mode, 0, 0, 1, 0, 0, len(raw), len(data))
            head = b"070707" + b"%06o%06o%06o%06o%06o%06o%06o%011o%06o%011o" % fields
            out += [head, raw, data]
        else:
            order = "<" if fmt == "bin-le" else ">"
            words = (0o070707, 0, ino, mode, 0, 0, 1, 0, 0, 0, len(raw), len(data) >> 16, len(data) & 0xFFFF)
            out += [struct.pack(order + "13H", *words), raw, bytes(len(raw) % 2), data, bytes(len(data) % 2)]
    return b"".join(out)


# Frames of the formats the standard library cannot open (each holds "A=1\n"; written by zstd
# and lz4), and the signatures of 7z and rar followed by junk: withheld whatever they hold.
ZSTD_FRAME = bytes.fromhex("28b52ffd0458210000413d310a663fe4f7")
LZ4_FRAME = bytes.fromhex("04224d186440a704000080413d310a000000007979cb59")
SEVEN_ZIP = b"7z\xbc\xaf\x27\x1c\x00\x04" + bytes(24)
RAR = b"Rar!\x1a\x07\x01\x00" + bytes(24)
