"""Workspace paths and agent-written text as a person is shown them, and whether one path lies
under another.

Standard library only: the CLI prints paths on its fast path, where importing the manifest module
(and `dataclasses`, `enum`, `hashlib` with it) cost 8 ms. The confusables table
(`confusable_homoglyphs`, Unicode's confusables.txt) is imported only for a name that is not
plain ASCII.

What is escaped (`escape`, `display`): every character a terminal or an editor acts on or does not
draw, so that text an agent wrote cannot hide a line from its reviewer: C0 and C1 controls (ESC
starts ANSI/OSC sequences: concealed text, cursor moves, OSC 52 clipboard writes), DEL, carriage
return, bidirectional controls ("Trojan source"), zero-width and other format characters, line
and paragraph separators, and unassigned or private code points. Each is written as Python writes
it (`\\x1b`, `\\u202e`), so it is seen and never acted on. A newline and a tab are kept in text
(not in a name).
"""

from __future__ import annotations

import re
import unicodedata

# Controls, DEL and C1; format characters (bidi embeddings, overrides and isolates, zero-width
# space/joiners, word joiner, BOM, soft hyphen ...); separators; surrogates; private use. The
# categories are checked per character by `_hidden`; this class finds the candidates (every code
# point of those categories that a font or a terminal treats specially) without a per-character call.
_CANDIDATE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"
    "\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164"
    "\ud800-\udfff\ue000-\uf8ff\ufe00-\ufe0f\ufeff\uffa0\ufff0-\uffff"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff\U000f0000-\U0010ffff]"
)
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
# What each kind of hidden character is called in a mark.
BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _hidden(ch: str) -> bool:
    if ch in "\u115f\u1160\u3164\uffa0\u17b4\u17b5\u180e":  # Hangul fillers and Khmer/Mongolian blanks
        return True
    if "\ufe00" <= ch <= "\ufe0f":  # variation selectors
        return True
    return unicodedata.category(ch) in _HIDDEN_CATEGORIES


_SHORT = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape_char(ch: str) -> str:
    """As Python's repr writes it, for every hidden character (repr leaves a few that Python
    counts as printable, like the Hangul fillers, as they are)."""
    n = ord(ch)
    if ch in _SHORT:
        return _SHORT[ch]
    if n < 0x100:
        return f"\\x{n:02x}"
    return f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def escape(text: str, *, keep: str = "\n\t") -> str:
    """`text` with every hidden character (module docstring) written as its escape; the
    characters in `keep` pass as they are. Linear in the text's length."""

    def sub(m: re.Match[str]) -> str:
        ch = m.group(0)
        return ch if ch in keep or not _hidden(ch) else _escape_char(ch)

    return _CANDIDATE.sub(sub, text)


def has_hidden(text: str, *, keep: str = "\n\t") -> bool:
    """Whether `text` holds a character `escape` would write as an escape."""
    return any(ch not in keep and _hidden(ch) for ch in (m.group(0) for m in _CANDIDATE.finditer(text)))


# Spaces that are not U+0020 (no-break, ideographic, thin ...): text may hold them, a name that
# does looks like another name (`app.py\u00a0` beside `app.py`).
_SPACES = re.compile("[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]")


def display(path: str) -> str:
    """A path as a person should see it: hidden characters, spaces other than U+0020 and
    undecodable bytes escaped."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return repr(path)[1:-1]
    return _SPACES.sub(lambda m: _escape_char(m.group(0)), escape(path, keep=""))


def brief(path: str, limit: int = 160) -> str:
    """`display(path)`, its middle cut to keep it within `limit` characters (a message that
    names an agent's path stays readable whatever the path's length)."""
    shown = display(path)
    if len(shown) <= limit:
        return shown
    keep = (limit - 1) // 2
    return f"{shown[:keep]}…{shown[-keep:]}"


def confusable(path: str) -> str | None:
    """What a path whose letters include look-alikes of Latin letters (Cyrillic `е` in
    `sеtup.py`) would be read as, with the first look-alike named; None for a path with none.
    Only names that are not plain ASCII are looked up."""
    if path.isascii():
        return None
    from confusable_homoglyphs import confusables

    found = confusables.is_confusable(path, greedy=True, preferred_aliases=["latin"]) or []
    swaps = {}
    for hit in found:
        latin = next((g["c"] for g in hit["homoglyphs"] if g["c"].isascii()), None)
        if latin is not None:
            swaps[hit["character"]] = latin
    if not swaps:
        return None
    first = next(ch for ch in path if ch in swaps)
    try:
        name = unicodedata.name(first)
    except ValueError:
        name = f"U+{ord(first):04X}"
    reads_as = "".join(swaps.get(ch, ch) for ch in path)
    return f"reads as {reads_as!r}: {first!r} is {name}, not the Latin {swaps[first]!r}"


def marks(path: str) -> list[str]:
    """What a reviewer must be told about a path before trusting how it looks."""
    out = []
    if any(ch in BIDI for ch in path):
        out.append("bidirectional control in the name")
    elif has_hidden(path, keep="") or _SPACES.search(path):
        out.append("hidden character in the name")
    look = confusable(path)
    if look is not None:
        out.append(f"look-alike name: {look}")
    return out


def under(path: str, prefix: str) -> bool:
    """`path` is `prefix` or inside it (workspace-relative, '/'-separated; a trailing '/' on
    `prefix` is allowed). Compares strings only: never touches the filesystem."""
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")
