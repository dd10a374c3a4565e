"""The stretches of a text an encoder wrote, and what they decode to: runs of base64, runs of hex
(its bytes run together or held apart by `:`, `-`, `,`, spaces, `0x` or `\\x`), and escapes
(JSON's `\\u0061`, HTML's `&#97;` and `&#x61;`). knownvalues.py searches them for the values it
knows. Pure functions over the ASCII readings knownvalues.fold makes; each returns at most a fixed
multiple of what it is given, found by `bytes.translate` and `bytes.find` (never a regular
expression over the whole text: Python's `re` scans ~35 MB/s, `find` ~5 GB/s).
"""

from __future__ import annotations

import binascii
import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass

B64_LEAST = 16  # characters of the shortest run of base64 decoded
_B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"
# a base64 character -> "a", any other -> "."; line breaks dropped (base64 is wrapped at a column)
_B64_CLASS = bytes(ord("a") if b in _B64 else ord(".") for b in range(256))
_URLSAFE = bytes.maketrans(b"-_", b"+/")
_HEX = b"0123456789abcdef"
# in folded text (lower case, `-` read as `+`, whitespace gone): a hex digit or what separates two
# hex bytes (`:`, `-`, `,`, and the `x` and `\\` of `0x` and `\\x`) -> "h", any other -> "."
_HEX_CLASS = bytes(ord("h") if b in _HEX + b":+,x\\" else ord(".") for b in range(256))
_SEPARATORS = b":+,"


def runs(classes: bytes, mark: bytes, least: int) -> list[tuple[int, int]]:
    """The spans of the runs of `mark` at least `least` long in `classes` (a text mapped to `mark`
    and `.`): one `find` a run, so a text without one costs a single search."""
    out = []
    seed = mark * least
    at = classes.find(seed)
    while at >= 0:
        end = classes.find(b".", at + least)
        end = len(classes) if end < 0 else end
        out.append((at, end))
        at = classes.find(seed, end)
    return out


def b64_runs(raw: bytes, least: int) -> tuple[bytes, list[tuple[int, int]]]:
    """`raw` (an ASCII reading) without its line breaks, and the spans in it of the runs of at
    least `least` base64 characters (either alphabet), each with the shorter run that follows it
    across blanks only (the last line of a block wrapped and indented); (b"", []) when there is
    none."""
    classes = raw.translate(_B64_CLASS, b"\r\n")
    found = runs(classes, b"a", least)
    if not found:
        return b"", []
    lines = raw.translate(None, b"\r\n")
    tails = []
    for _, b in found:
        j = b
        while j < len(lines) and lines[j] in b" \t":
            j += 1
        if b < j < len(lines) and classes[j] == ord("a"):
            end = classes.find(b".", j)
            end = len(classes) if end < 0 else end
            if end - j < least:
                tails.append((j, end))
    return lines, sorted(found + tails) if tails else found


def hex_runs(folded: bytes, least: int) -> list[tuple[int, int]]:
    """The spans in `folded` of the runs of at least `least` hex digits and separators."""
    return runs(folded.translate(_HEX_CLASS), b"h", least)


_PAIR = re.compile(rb"(?:0x)?([0-9a-f]{2})")  # a byte, with its prefix


def plain_hex(run: bytes) -> list[bytes]:
    """The hex digits of a run of folded hex, what separates its bytes dropped (`de:ad`,
    `0xde,0xad`, `\\xde\\xad` -> `dead`); and when it has a `0x`, its bytes read pair by pair
    after a `0x` or none (the `0` of `...30x` or of `0x70x9a` is a digit: a prefix starts a byte);
    and with only its `x`s dropped (`...30` followed by the `x1` of a word after it)."""
    bare = run.translate(None, _SEPARATORS).replace(b"\\x", b"")
    digits = bare.replace(b"0x", b"").translate(None, b"x\\")
    if b"0x" not in bare:
        return [digits]
    return [digits, b"".join(_PAIR.findall(bare)), bare.translate(None, b"x\\")]


def plain_hex_at(run: bytes) -> list[tuple[bytes, list[int]]]:
    """plain_hex(run), each with where in `run` each of its digits is (to mask what was found)."""
    kept = _without(run, [i for i, b in enumerate(run) if b not in _SEPARATORS], b"\\x")
    at = [i for i in _without(run, kept, b"0x") if run[i] in _HEX]
    out = [(bytes(run[i] for i in at), at)]
    bare = bytes(run[i] for i in kept)
    if b"0x" in bare:
        at = [kept[k] for m in _PAIR.finditer(bare) for k in (m.start(1), m.start(1) + 1)]
        out.append((bytes(run[i] for i in at), at))
        at = [i for i in kept if run[i] in _HEX]
        out.append((bytes(run[i] for i in at), at))
    return out


def _without(run: bytes, kept: list[int], prefix: bytes) -> list[int]:
    """`kept` (positions in `run`) without each `prefix` the bytes at them spell, left to right."""
    s = bytes(run[i] for i in kept)
    drop: set[int] = set()
    at = s.find(prefix)
    while at >= 0:
        drop.update((at, at + 1))
        at = s.find(prefix, at + 2)
    return [k for n, k in enumerate(kept) if n not in drop]


def trim_hex(run: tuple[int, int], folded: bytes) -> tuple[int, int]:
    """A hex run without the separators at its ends (the `:` after a word, a trailing `,`)."""
    a, b = run
    while a < b and folded[a] in _SEPARATORS:
        a += 1
    while b > a and folded[b - 1] in _SEPARATORS:
        b -= 1
    return a, b


# a byte of ASCII text (printable, whitespace) or a NUL (UTF-16 of ASCII text) -> "t", any other -> "."
_TEXT_CLASS = bytes(ord("t") if b == 0 or 0x09 <= b <= 0x0D or 0x20 <= b <= 0x7E else ord(".") for b in range(256))


def text_in(data: bytes, least: int) -> bytes:
    """The stretches of ASCII text at least `least` bytes long in what runs decoded to (their NULs
    dropped: UTF-16 of ASCII text reads as the text), joined by line breaks; what decoding at the
    wrong alignment or from what was no encoding gives (random bytes) has next to none."""
    spans = runs(data.translate(_TEXT_CLASS), b"t", least)
    return b"\n".join(data[a:b] for a, b in spans).translate(None, b"\0")


def b64_decodings(run: bytes) -> list[bytes]:
    """What a run of base64 decodes to read from each of its first 4 characters (a run can start
    anywhere in a stream: one of the 4 is the stream's own alignment). Runs joined end to end are
    one run: each of them is read from each of its first 4 characters too (and a line of base64
    wrapped and indented is read on into the next)."""
    s = run.translate(_URLSAFE)
    out = []
    for k in range(4):
        seg = s[k:]
        seg = seg[: len(seg) - 1] if len(seg) % 4 == 1 else seg + b"=" * (-len(seg) % 4)  # its last bytes too
        if seg:
            out.append(binascii.a2b_base64(seg))
    return out


def hex_decodings(run: bytes) -> list[bytes]:
    """What a run of folded hex decodes to read from each of its first 2 digits (runs joined end
    to end: each of them from each of its first 2), in each of plain_hex's readings."""
    out = []
    for digits in plain_hex(run):
        for k in range(2):
            seg = digits[k:]
            seg = seg[: len(seg) // 2 * 2]
            if seg:
                out.append(binascii.unhexlify(seg))
    return out


_ESCAPE = re.compile(rb"(?i)\\u\{([0-9a-f]{1,6})\}|\\u([0-9a-f]{4})|&#x([0-9a-f]{1,7});?|&#([0-9]{1,8});?")


def has_escape(folded: bytes) -> bool:
    # one byte first: memchr, where a two-byte search of a megabyte takes a millisecond
    return (b"\\" in folded and (b"\\u" in folded or b"\\U" in folded)) or (b"&" in folded and b"&#" in folded)


@dataclass(frozen=True)
class Unescaped:
    """A folded text with its escapes decoded and folded again (`folded`), and where in the text
    each byte of it comes from."""

    folded: bytes
    _at: list[int]  # where the folding of each escape starts in `folded`
    _escapes: list[tuple[int, int, int]]  # its length there, and the escape's span in the text

    def around(self, margin: int) -> list[tuple[int, int]]:
        """The spans of `folded` within `margin` bytes of an escape's folding (merged where they
        meet): what a form that involves an escape lies in; one without any was in the text."""
        spans: list[tuple[int, int]] = []
        for at, (length, _, _) in zip(self._at, self._escapes, strict=True):
            a, b = max(0, at - margin), min(len(self.folded), at + length + margin)
            if spans and a <= spans[-1][1]:
                spans[-1] = (spans[-1][0], b)
            else:
                spans.append((a, b))
        return spans

    def source(self, byte: int) -> tuple[int, int]:
        """The span of the text that byte `byte` of `folded` comes from."""
        k = bisect.bisect_right(self._at, byte) - 1
        if k < 0:
            return byte, byte + 1
        length, start, end = self._escapes[k]
        if byte < self._at[k] + length:
            return start, end
        at = end + byte - self._at[k] - length
        return at, at + 1


def unescape(folded: bytes, fold: Callable[[str], bytes]) -> Unescaped | None:
    """`folded` with each JSON `\\u0061` / `\\u{61}` and HTML `&#97;` / `&#x61;` escape read as
    its character, folded by `fold`; None when it has none."""
    if not has_escape(folded):
        return None
    out: list[bytes] = []
    at: list[int] = []
    escapes: list[tuple[int, int, int]] = []
    chars: dict[bytes, bytes] = {}  # each escape's folding, worked out once
    last = size = 0
    for m in _ESCAPE.finditer(folded):
        start, end = m.span()
        char = chars.get(m[0])
        if char is None:
            group = m.lastindex or 0
            cp = int(m[group], 10 if group == 4 else 16)
            char = chars[m[0]] = fold(chr(cp)) if cp <= 0x10FFFF else b""
        out += (folded[last:start], char)
        size += start - last
        at.append(size)
        escapes.append((len(char), start, end))
        size += len(char)
        last = end
    if not escapes:
        return None
    out.append(folded[last:])
    return Unescaped(b"".join(out), at, escapes)
