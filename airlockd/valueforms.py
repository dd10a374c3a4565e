"""The forms of one known value an encoder writes, and which of them are sought where
(knownvalues.py finds them)."""

from __future__ import annotations

import base64
import codecs
from dataclasses import dataclass

from airlockd.folding import fold


def b64_stable(raw: bytes) -> list[str]:
    """The base64 text of `raw` at each of the 3 alignments it can have inside a longer base64
    stream: only the characters whose 6 bits all come from `raw`."""
    out = []
    for shift in range(3):
        enc = base64.b64encode(b"\0" * shift + raw + b"\0\0").decode()
        first = -(-8 * shift // 6)
        last = (8 * (shift + len(raw))) // 6
        out.append(enc[first:last])
    return out


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _quote(raw: bytes, safe: bytes = b"", plus: bool = False) -> str:
    """`raw` percent-encoded as urllib.parse.quote (`plus`: quote_plus) writes it."""
    keep = _UNRESERVED | frozenset(safe)
    return "".join(chr(b) if b in keep else "+" if plus and b == 0x20 else f"%{b:02X}" for b in raw)


def encodings(value: str) -> list[str]:
    """`value` as an encoder writes it: base64 (standard and url-safe alphabets) at each of the 3
    alignments inside a longer stream, hex, percent-encoding of every byte (upper and lower case),
    and as URL quoting leaves it. Distinct, and never `value` itself."""
    raw = value.encode("utf-8", "surrogatepass")
    b64 = b64_stable(raw)
    every = "".join(f"%{b:02X}" for b in raw)
    forms = [
        *b64,
        *(s.replace("+", "-").replace("/", "_") for s in b64),
        raw.hex(),
        raw.hex().upper(),
        every,
        every.lower(),
        _quote(raw),
        _quote(raw, b"/"),
        _quote(raw, plus=True),
    ]
    return [f for f in dict.fromkeys(forms) if f and f != value]


def utf16(value: str) -> list[bytes]:
    """`value`'s UTF-16 bytes, little- then big-endian (no byte-order mark)."""
    return [value.encode("utf-16-le", "surrogatepass"), value.encode("utf-16-be", "surrogatepass")]


def utf16_hex(value: str) -> list[str]:
    """`value`'s UTF-16 bytes (either byte order) in hex, lower and upper case."""
    return [h for raw in utf16(value) for h in (raw.hex(), raw.hex().upper())]


def turned(value: str) -> list[str]:
    """`value` reversed and in rot13 (never `value` itself: a palindrome, a value without letters)."""
    return [f for f in dict.fromkeys([value[::-1], codecs.encode(value, "rot13")]) if f != value]


# The least length of a value's own folded form that is sought: folded, two ordinary words can
# join into a shorter one ("data base"), so a value shorter than this once folded is sought only as
# it is written (and in its encodings, which ordinary words never are). So is a value fold takes
# characters from (a password in another script): what is left could be any string ("密码12345678").
# The value reversed and in rot13 are sought only when its own is: turning 8 characters or more of
# a value makes no ordinary word either.
LEAST_FOLDED = 8


@dataclass(frozen=True)
class ValueForms:
    """One known value: the forms of it an encoder writes (masked as they are, longest first, each
    with its folded form); the folded forms sought in the whole folded text (`folded`: its own when
    at least LEAST_FOLDED long, and then reversed and in rot13 too; its base64 and percent-encodings
    when at least `least`); those sought in runs of hex only (`hexes`: hex of its UTF-8 and UTF-16
    bytes); the bytes of a value outside ASCII (`wide`: UTF-8 and UTF-16, sought as they are in
    what a run decodes to, of which only the ASCII text is read); and the value itself when its own
    is not sought (sought as written)."""

    written: tuple[tuple[str, bytes], ...]
    folded: tuple[bytes, ...]
    hexes: tuple[bytes, ...]
    wide: tuple[bytes, ...]
    exact: str | None

    @classmethod
    def of(cls, value: str, least: int) -> ValueForms:
        own = fold(value)
        whole = len(own) >= sum(not c.isspace() for c in value)  # fold dropped nothing but blanks
        sought = own if whole and len(own) >= max(least, LEAST_FOLDED) else None
        raw = value.encode("utf-8", "surrogatepass")
        hexes = [fold(b.hex()) for b in (raw, *utf16(value))]
        encoded = encodings(value)
        turns = turned(value) if sought else []
        folded = [
            *([sought] if sought else []),
            *(f for f in map(fold, encoded) if len(f) >= least and f not in hexes),
            *(f for f in map(fold, turns) if len(f) >= LEAST_FOLDED),
        ]
        every = sorted(dict.fromkeys([value, *encoded, *utf16_hex(value), *turns]), key=len, reverse=True)
        return cls(
            tuple((w, fold(w)) for w in every),
            tuple(dict.fromkeys(folded)),
            tuple(dict.fromkeys(hexes)),
            () if value.isascii() else (raw, *utf16(value)),
            None if sought else value,
        )
