"""Folding: a text as a reader takes a value in, one character at a time (knownvalues.py seeks the
values it knows in folded text; what folding does and costs is said there)."""

from __future__ import annotations

import functools
import re
import unicodedata

from airlockd import foldtable

_UPPER = bytes(range(ord("A"), ord("Z") + 1))
FOLD = bytes.maketrans(_UPPER + b"-_", _UPPER.lower() + b"+/")
UNSEEN = bytes([*range(0x21), 0x7F])  # ASCII whitespace and controls


@functools.cache
def _lookalikes() -> tuple[re.Pattern[str], dict[int, str]]:
    looks = foldtable.lookalikes()
    return re.compile("[" + "".join(re.escape(chr(cp)) for cp in sorted(looks)) + "]+"), looks


def fold(text: str) -> bytes:
    """`text` as a reader takes a value in, one character at a time (so folding two pieces and
    joining them is folding the whole, which lets a stream be folded as it comes): NFKD (so
    full-width and mathematical letters, ligatures and accented letters are ASCII), look-alikes of
    ASCII characters in other scripts read as them, every other character outside ASCII dropped
    (zero-width and format characters, soft hyphens, combining marks, blank fillers, U+FFFD, but
    also letters of other scripts and emoji), ASCII whitespace and controls dropped, ASCII letters
    lower-cased, and `-` and `_` read as `+` and `/` (base64url as base64)."""
    return ascii_reading(text).translate(FOLD, UNSEEN)


def ascii_reading(text: str) -> bytes:
    """The first steps of `fold`: NFKD, look-alikes read as ASCII, every other character outside
    ASCII dropped; whitespace and case kept (what base64 needs to be decoded). Per character."""
    if text.isascii():
        return text.encode("ascii")
    # NFKD only reorders marks with a combining class, dropped here, so it is per character too
    text = unicodedata.normalize("NFKD", text)
    if not text.isascii():
        lookalike, looks = _lookalikes()
        text = lookalike.sub(lambda m: m[0].translate(looks), text)
    return text.encode("ascii", "ignore")


def lines_reading(text: str) -> bytes:
    """ascii_reading without line breaks: where runs of base64 are sought."""
    return ascii_reading(text).translate(None, b"\r\n")


fold_char = functools.lru_cache(maxsize=4096)(fold)
lines_char = functools.lru_cache(maxsize=4096)(lines_reading)
ascii_char = functools.lru_cache(maxsize=4096)(ascii_reading)
