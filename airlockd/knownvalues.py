"""The values a Redactor was told about, and the forms an agent that learnt one could pass it on in.

An exact search misses a withheld value written encoded or disguised. `KnownValues` finds (and
masks) each value:
- as it reads once the text is folded (`fold`): compatibility forms made plain (NFKD: full-width
  and mathematical letters, ligatures, accented letters), look-alikes of ASCII characters in other
  scripts read as them (Unicode's confusables), every other character outside ASCII dropped
  (format characters such as soft hyphens, zero-width characters, byte-order marks, bidirectional
  controls and tags; combining marks, blank fillers, emoji), ASCII whitespace and controls
  dropped, case ignored, `-` and `_` read as `+` and `/`;
- in base64 (standard and url-safe, at each of the 3 alignments it can have inside a longer
  stream: the characters whose bits all come from the value), in hex and percent-encoded (every
  byte, or as URL quoting leaves it), each folded too: wrapped at any column, in any case.

Never found: other encodings (base32, escapes such as \\x61 or \\u0061, HTML entities,
compression, encryption), the value reversed, cut into pieces held apart by visible ASCII
characters (string concatenation in code), or computed by a program.

Cost, linear in the text: folding is one `bytes.translate` for ASCII text (NFKD, one substitution
of look-alikes and an encoding otherwise), then one `bytes.find` per needle, about 7 per value (a
short text looks them up by their first bytes instead). No alternation of literals: Python's `re`
runs one at ~35 MB/s, `find` at ~5 GB/s.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import codecs
import functools
import itertools
import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from airlockd import foldtable

_UPPER = bytes(range(ord("A"), ord("Z") + 1))
_FOLD = bytes.maketrans(_UPPER + b"-_", _UPPER.lower() + b"+/")
_UNSEEN = bytes([*range(0x21), 0x7F])  # ASCII whitespace and controls


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
    if text.isascii():
        raw = text.encode("ascii")
    else:
        # NFKD only reorders marks with a combining class, dropped here, so it is per character too
        text = unicodedata.normalize("NFKD", text)
        if not text.isascii():
            lookalike, looks = _lookalikes()
            text = lookalike.sub(lambda m: m[0].translate(looks), text)
        raw = text.encode("ascii", "ignore")
    return raw.translate(_FOLD, _UNSEEN)


_fold_char = functools.lru_cache(maxsize=4096)(fold)


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


# The least length of a value's own folded form that is sought: folded, two ordinary words can
# join into a shorter one ("data base"), so a value shorter than this once folded is sought only as
# it is written (and in its encodings, which ordinary words never are). So is a value fold takes
# characters from (a password in another script): what is left could be any string ("密码12345678").
LEAST_FOLDED = 8


@dataclass(frozen=True)
class ValueForms:
    """One known value: the forms of it an encoder writes (masked as they are, longest first),
    the folded forms sought (its encodings' when at least `least` long, its own when at least
    LEAST_FOLDED), and the value itself when its own is not sought (sought as written, then)."""

    written: tuple[str, ...]
    folded: tuple[bytes, ...]
    exact: str | None

    @classmethod
    def of(cls, value: str, least: int) -> ValueForms:
        encoded = encodings(value)
        own = fold(value)
        whole = len(own) >= sum(not c.isspace() for c in value)  # fold dropped nothing but blanks
        sought = own if whole and len(own) >= max(least, LEAST_FOLDED) else None
        folded = dict.fromkeys([*([sought] if sought else []), *(f for f in map(fold, encoded) if len(f) >= least)])
        written = sorted([value, *encoded], key=len, reverse=True)
        return cls(tuple(written), tuple(folded), None if sought else value)


_HEAD = 6  # bytes of a needle's start looked up in a set of a short text's slices
_SHORT = 512  # folded bytes up to which that set costs less than a find per needle (40 µs for 200)
_CLEAN_KEPT = 4096  # short texts known to hold no value, kept to answer at once when they come again


class KnownValues:
    """An immutable set of known values and their forms (a Redactor swaps in a new one whole, so
    a reader in another thread sees the old set or the new one). Never says which value it found."""

    def __init__(self, values: Iterable[ValueForms] = ()) -> None:
        self._values = tuple(values)
        owners: dict[bytes, list[int]] = {}
        rank: dict[bytes, int] = {}
        for i, v in enumerate(self._values):
            for k, f in enumerate(v.folded):
                owners.setdefault(f, []).append(i)
                rank[f] = min(rank.get(f, k), k)
        self._owners = owners
        # the values themselves first (what a text most likely holds: `found_in` stops there)
        self._needles = tuple(sorted(owners, key=lambda f: (rank[f], -len(f))))
        self._exact = tuple(v.exact for v in self._values if v.exact is not None)
        self.longest = max((len(n) for n in self._needles), default=0)
        self.longest_exact = max((len(e) for e in self._exact), default=0)
        self._shortest = min((len(n) for n in self._needles), default=0)
        self._head = min(self._shortest, _HEAD)
        self._heads: dict[bytes, list[bytes]] = {}
        self._clean: set[str] = set()  # never a text that holds a value
        for n in self._needles:
            self._heads.setdefault(n[: self._head], []).append(n)

    def __bool__(self) -> bool:
        return bool(self._values)

    def _hits(self, folded: bytes, first: bool = False) -> list[bytes]:
        """The needles in `folded` (with `first`, the first one found only)."""
        if not self._needles or len(folded) < self._shortest:
            return []
        if len(folded) <= _SHORT:  # the needles whose first bytes start somewhere in it
            h = self._head
            starts = {folded[i : i + h] for i in range(len(folded) - h + 1)}
            maybe: Iterable[bytes] = (n for head in starts.intersection(self._heads) for n in self._heads[head])
        else:
            maybe = self._needles
        found = (n for n in maybe if n in folded)
        return list(itertools.islice(found, 1)) if first else list(found)

    def found_in(self, text: str) -> bool:
        """Whether `text` holds a known value in one of its forms."""
        return bool(self._values) and (self.in_written(text) or self.in_folded(fold(text)))

    def in_written(self, text: str) -> bool:
        """Whether `text` holds, as it is written, a value whose folded form is too short to seek."""
        return any(e in text for e in self._exact)

    def in_folded(self, folded: bytes) -> bool:
        """Whether `folded` (folded text) holds a folded form of a known value."""
        return bool(self._hits(folded, first=True))

    def mask(self, text: str, mask: str) -> str:
        """`text` with every form of a known value in it replaced by `mask`: the forms an encoder
        writes as they are; what is left of one only once folded (split by whitespace or format
        characters, look-alikes, other case), from its first character to its last."""
        if not self._values or (len(text) <= _SHORT and text in self._clean):
            return text
        exact = [e for e in self._exact if e in text]  # rare: a value of mostly whitespace
        hits = self._hits(fold(text))
        if not hits and not exact:
            if len(text) <= _SHORT:  # the same short strings come again and again (keys, states)
                if len(self._clean) >= _CLEAN_KEPT:
                    self._clean.clear()
                self._clean.add(text)
            return text
        found = {i for n in hits for i in self._owners[n]}
        written = {w for i in found for w in self._values[i].written} | set(exact)
        for w in sorted(written, key=len, reverse=True):
            text = text.replace(w, mask)
        if not hits:
            return text
        folded = fold(text)
        left = [n for n in hits if n in folded]
        return _mask_folded(text, folded, left, mask) if left else text

    def scan(self) -> KnownScan:
        """A search of a stream of bytes (a file read in chunks) for the known values."""
        return KnownScan(self)


def _mask_folded(text: str, folded: bytes, needles: list[bytes], mask: str) -> str:
    """`text` with the characters that fold to each occurrence of `needles` in `folded` (which is
    `fold(text)`) replaced by `mask`, one per run of overlapping occurrences. Fails closed: all of
    `text` is `mask` when a needle is still there after."""
    spans = []
    for n in needles:
        at = folded.find(n)
        while at >= 0:
            spans.append((at, at + len(n)))
            at = folded.find(n, at + 1)
    index = _FoldIndex(text)
    cuts: list[list[int]] = []
    for a, b in sorted(spans):
        start, end = index.char_at(a), index.char_at(b - 1) + 1
        if cuts and start <= cuts[-1][1]:
            cuts[-1][1] = max(cuts[-1][1], end)
        else:
            cuts.append([start, end])
    out, last = [], 0
    for start, end in cuts:
        out += [text[last:start], mask]
        last = end
    out.append(text[last:])
    masked = "".join(out)
    folded = fold(masked)
    return mask if any(n in folded for n in needles) else masked


class _FoldIndex:
    """Where in a text the character lies that a byte of its folded form comes from: folded
    lengths of blocks of the text, and of the characters of a block when a byte falls in it
    (linear in the text however many bytes are asked for)."""

    BLOCK = 512

    def __init__(self, text: str) -> None:
        self._text = text
        lengths = (len(fold(text[i : i + self.BLOCK])) for i in range(0, len(text), self.BLOCK))
        self._starts = list(itertools.accumulate(lengths, initial=0))
        self._within: dict[int, list[int]] = {}

    def char_at(self, byte: int) -> int:
        block = bisect.bisect_right(self._starts, byte) - 1
        starts = self._within.get(block)
        if starts is None:
            chars = self._text[block * self.BLOCK : (block + 1) * self.BLOCK]
            starts = list(itertools.accumulate((len(_fold_char(c)) for c in chars), initial=self._starts[block]))
            self._within[block] = starts
        return block * self.BLOCK + bisect.bisect_right(starts, byte) - 1


class KnownScan:
    """Whether a stream of bytes holds a known value: decoded as UTF-8 as it comes (an invalid
    byte is U+FFFD, which fold drops) and folded, with the end of what came before kept, so a value
    across the edge of two chunks is found, however much whitespace it is spread over."""

    def __init__(self, known: KnownValues) -> None:
        self._known = known
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._folded = b""
        self._text = ""

    def feed(self, chunk: bytes) -> bool:
        """Whether a known value ends in `chunk` (or in one fed before)."""
        known = self._known
        if not known:
            return False
        text = self._decoder.decode(chunk)
        if known.longest_exact:
            written = self._text + text
            if known.in_written(written):
                return True
            self._text = written[max(0, len(written) - known.longest_exact + 1) :]
        window = self._folded + fold(text)
        if known.in_folded(window):
            return True
        self._folded = window[max(0, len(window) - known.longest + 1) :]
        return False


# -- the values of a withheld file ------------------------------------------------------------

_QUOTED_KEY = re.compile(r"""(?:-\s*)?(?P<q>["'])(?:\\.|(?!(?P=q)).)*+(?P=q)\s*[:=]\s*(?P<value>.*)""")
_YAML_SEP = re.compile(r":(?:\s|$)")
_KEY_BREAK = re.compile(r"[\s\"']")
_BASE64_TEXT = re.compile(r"[A-Za-z0-9+/]{8,}={0,2}")
_JSON = json.JSONDecoder()


def file_values(text: str) -> list[str]:
    """The values in a withheld file's text: the value of each `KEY=value`, `key: value` or
    `"key": "value",` line (unquoted; the whole line when it has no key), every string in it when
    it is JSON, and what a value that is base64 of text decodes to (a docker `auth`, an `.npmrc`
    `_auth` or `_password`, a Kubernetes secret's data) with the password of a `user:password`."""
    values = (_json_strings(text) or []) if text.lstrip()[:1] in ("{", "[") else []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            values += _line_values(line)
    return values + [part for v in values for part in _decoded(v)]


def _line_values(line: str) -> list[str]:
    m = _QUOTED_KEY.match(line)  # JSON, or YAML with a quoted key: the key ends at its quote
    if m:
        return _unquoted(m["value"])
    body = line.removeprefix("export ").lstrip()
    key, eq, rest = body.partition("=")
    if eq and key.strip() and not _KEY_BREAK.search(key.strip()):  # KEY=value, an .npmrc //host/:_auth=
        return _unquoted(rest)
    m = _YAML_SEP.search(body)  # key: value (the value may hold '=' and ':')
    if m:
        return _unquoted(body[m.end() :])
    key, colon, rest = body.partition(":")
    return _unquoted(rest) if colon else [line]


def _unquoted(rest: str) -> list[str]:
    v = rest.strip()
    if v[:1] == '"':
        try:
            s, _ = _JSON.raw_decode(v)  # the string ends at its closing quote; escapes read
        except ValueError:
            pass
        else:
            if isinstance(s, str):
                return [s]
    end = v.find(v[0], 1) if v[:1] in ("'", '"') else -1
    if end > 0:
        return [v[1:end]]
    if v[:1] in ("{", "["):  # a JSON object or list on one line: its strings, if it has any
        inner = _json_strings(v)
        if inner:
            return inner
    v = v.strip("\"'")
    return [v, v.split(" #", 1)[0].rstrip()] if " #" in v else [v]


def _json_strings(text: str) -> list[str] | None:
    """Every string in `text` when it is a JSON document (None when it is not)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    out, todo = [], [doc]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            todo += item.values()
        elif isinstance(item, list):
            todo += item
    return out


def _decoded(value: str) -> list[str]:
    """What `value` decodes to when it is base64 of printable text, and the password of a
    `user:password` (the user alone is no secret)."""
    if len(value) % 4 or not _BASE64_TEXT.fullmatch(value):
        return []
    try:
        text = base64.b64decode(value, validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        return []
    if not text.isprintable():
        return []
    _, colon, password = text.partition(":")
    return [text, password] if colon else [text]
