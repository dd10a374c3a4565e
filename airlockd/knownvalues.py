"""The values a Redactor was told about, and the forms an agent that learnt one could pass it on in.

An exact search misses a withheld value written encoded or disguised. `KnownValues` finds (and
masks) each value:
- as it reads once the text is folded (`fold`): compatibility forms made plain (NFKD: full-width
  and mathematical letters, ligatures, accented letters), look-alikes of ASCII characters in other
  scripts read as them (Unicode's confusables), every other character outside ASCII dropped
  (format characters such as soft hyphens, zero-width characters, byte-order marks, bidirectional
  controls and tags; combining marks, blank fillers, emoji), ASCII whitespace and controls
  dropped, case ignored, `-` and `_` read as `+` and `/`; and so reversed and in rot13 too;
- in base64 (standard and url-safe, at each of the 3 alignments it can have inside a longer
  stream: the characters whose bits all come from the value) and percent-encoded (every byte, or
  as URL quoting leaves it), each folded too: wrapped at any column, in any case;
- beneath an encoding (decodings.py finds the stretches): in hex of its UTF-8 or UTF-16 bytes in
  runs of hex, the bytes run together or held apart (`de:ad`, `de-ad`, `de ad`, `0xde, 0xad`,
  `\\xde\\xad`); under JSON `\\u0061` and HTML `&#97;`, `&#x61;` escapes; and in the ASCII text
  (UTF-16 too: PowerShell's `-EncodedCommand`) that runs of base64 (16 characters or more, wrapped
  and indented, read at each alignment) and of hex decode to, every form sought again there, DEPTH
  layers deep (base64 of base64 of hex of a value is found; a fourth layer is not).

Never found: other encodings (base32, ascii85, uuencode, octal escapes, named HTML entities,
compression, encryption), a value cut into pieces held apart by visible ASCII characters (string
concatenation in code), or computed by a program; beneath an encoding, a value split by characters
outside ASCII or written with look-alikes (only decoded ASCII text is read; a value outside ASCII
is sought there as its UTF-8 and UTF-16 bytes).

Cost, linear in the text: folding is one `bytes.translate` for ASCII text (NFKD, one substitution
of look-alikes and an encoding otherwise), then one `bytes.find` per needle, about 6 per value (a
short text looks them up by their first bytes instead); hex and percent-encodings only where the
text has runs of hex or a `%`. Beneath, two more translations and a few finds place the runs and
escapes (ordinary text has few, and short); what they decode to (at most 8 bytes for each of the
text's, or the text is held to hold a value) is read for its ASCII text, of which decoding at a
wrong alignment or what was no encoding gives next to none. No alternation of literals: Python's
`re` runs one at ~35 MB/s, `find` at ~5 GB/s.
"""

from __future__ import annotations

import bisect
import codecs
import itertools
from collections.abc import Callable, Iterable

from airlockd import decodings
from airlockd.folding import FOLD, UNSEEN, ascii_char, ascii_reading, fold, fold_char, lines_char, lines_reading
from airlockd.valueforms import LEAST_FOLDED, ValueForms, b64_stable

__all__ = ["LEAST_FOLDED", "KnownScan", "KnownValues", "ValueForms", "b64_stable", "fold"]


_HEAD = 6  # bytes of a needle's start looked up in a set of a short text's slices
_SHORT = 512  # folded bytes up to which that set costs less than a find per needle (40 µs for 200)
_CLEAN_KEPT = 4096  # short texts known to hold no value, kept to answer at once when they come again
DEPTH = 2  # layers of encoding decoded (base64 of base64 of hex of a value is found: 3 deep)
_DEEP_TAIL = 64 << 10  # characters of a stream kept for a form beneath an encoding across a chunk's edge


class _Budget:
    """The bytes the decoding of one text may still produce: 8 for each of its own, and 64 KiB (an
    honest text decodes to at most about 6 times its length over both layers; past the budget the
    text is held to hold a value, so a text built to decode to ever more fails closed)."""

    def __init__(self, size: int) -> None:
        self.left = 8 * size + (64 << 10)

    def spend(self, n: int) -> bool:
        self.left -= n
        return self.left >= 0


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
            for f in v.hexes:
                owners.setdefault(f, []).append(i)
        self._owners = owners
        # the values themselves first (what a text most likely holds: `found_in` stops there)
        folded = sorted(rank, key=lambda f: (rank[f], -len(f)))
        self._needles = tuple(n for n in folded if b"%" not in n)
        self._all = (*self._needles, *(n for n in folded if b"%" in n))  # percent-encodings: when a % is there
        self._hexes = tuple(dict.fromkeys(f for v in self._values for f in v.hexes))
        self._wide = tuple(dict.fromkeys(f for v in self._values for f in v.wide))
        self._exact = tuple(v.exact for v in self._values if v.exact is not None)
        self.longest = max((len(n) for n in self._all), default=0)
        self.longest_exact = max((len(e) for e in self._exact), default=0)
        widest = max((len(h) for h in self._hexes), default=0)  # 4 for each character of UTF-16
        self.deep_tail = min(max(_DEEP_TAIL, 64 * widest), 4 << 20)
        self._shortest = min((len(n) for n in self._all), default=0)
        self._hex_least = min((len(n) for n in self._hexes), default=0)
        self._hex_longest = max((len(n) for n in self._hexes), default=0)
        self._text_least = min((len(n) for n in (*self._all, *self._hexes, *self._exact)), default=0)
        self._head = min(self._shortest, _HEAD)
        self._heads: dict[bytes, list[bytes]] = {}
        self._clean: set[str] = set()  # never a text that holds a value
        for n in self._all:
            self._heads.setdefault(n[: self._head], []).append(n)

    def __bool__(self) -> bool:
        return bool(self._values)

    def _hits(self, folded: bytes, first: bool = False) -> list[bytes]:
        """The needles in `folded` (with `first`, the first one found only)."""
        if not self._all or len(folded) < self._shortest:
            return []
        if len(folded) <= _SHORT:  # the needles whose first bytes start somewhere in it
            h = self._head
            starts = {folded[i : i + h] for i in range(len(folded) - h + 1)}
            maybe: Iterable[bytes] = (n for head in starts.intersection(self._heads) for n in self._heads[head])
        else:
            maybe = self._all if b"%" in folded else self._needles
        found = (n for n in maybe if n in folded)
        return list(itertools.islice(found, 1)) if first else list(found)

    def found_in(self, text: str) -> bool:
        """Whether `text` holds a known value in one of its forms."""
        if not self._values:
            return False
        if self.in_written(text):
            return True
        raw = ascii_reading(text)
        folded = raw.translate(FOLD, UNSEEN)
        return self.in_folded(folded) or self.beneath(raw, folded)

    def in_written(self, text: str) -> bool:
        """Whether `text` holds, as it is written, a value whose folded form is too short to seek."""
        return any(e in text for e in self._exact)

    def in_folded(self, folded: bytes) -> bool:
        """Whether `folded` (folded text) holds a folded form of a known value."""
        return bool(self._hits(folded, first=True))

    def beneath(self, raw: bytes, folded: bytes) -> bool:
        """Whether a text (`raw`: its ascii_reading, line breaks kept or not; `folded`: its fold)
        holds a known value beneath an encoding or escapes: hex with its bytes held apart, JSON
        `\\u0061` or HTML `&#97;` escapes, or in what runs of base64 and of hex decode to (the
        ASCII text in it, UTF-16 too), searched again for every form, DEPTH layers deep. Decodes at most a
        multiple of the text (`_Budget`)."""
        return bool(self._values) and self._beneath(raw, folded, 1, _Budget(len(raw)))

    def _beneath(self, raw: bytes, folded: bytes, layer: int, budget: _Budget) -> bool:
        hexes = self._hex_runs(folded)
        if hexes and self._in_hex(folded, hexes):
            return True
        near = self._near_escapes(folded)
        if near is not None and (self.in_folded(near[0]) or self._in_hex(near[0], self._hex_runs(near[0]))):
            return True
        if layer > DEPTH:
            return False
        lines, b64 = decodings.b64_runs(raw, decodings.B64_LEAST)
        pieces = _run_decodings(lines, b64, folded, hexes)
        if near is not None:  # what is under the escapes, case kept, is decoded at the next layer
            pieces += [w for w, _ in self._unescaped(raw)]
        return bool(pieces) and self._in_decoded(pieces, layer, budget)

    def _unescaped(self, raw: bytes) -> list[tuple[bytes, tuple[int, int]]]:
        """The stretches around the escapes of `raw` (an ASCII reading) with the escapes read as
        their characters, case kept (base64 written in escapes), each with its span in `raw`
        without line breaks."""
        lines = raw.translate(None, b"\r\n")
        esc = decodings.unescape(lines, ascii_char)
        if esc is None:
            return []
        return [(esc.folded[a:b], (esc.source(a)[0], esc.source(b - 1)[1])) for a, b in esc.around(4 * self.longest)]

    def _near_escapes(self, folded: bytes) -> tuple[bytes, list[tuple[int, int]], decodings.Unescaped] | None:
        """`folded` with its escapes read, where a form could involve one (the spans of the
        unescaped text around them, joined by line breaks, which no folded form holds)."""
        esc = decodings.unescape(folded, fold_char)
        if esc is None:
            return None
        spans = esc.around(max(self.longest, 3 * self._hex_longest))  # hex held apart: 3 bytes a digit
        return b"\n".join(esc.folded[a:b] for a, b in spans), spans, esc

    def _hex_runs(self, folded: bytes) -> list[tuple[int, int]]:
        return decodings.hex_runs(folded, self._hex_least) if self._hex_least else []

    def _in_hex(self, folded: bytes, runs: list[tuple[int, int]]) -> bool:
        """Whether a hex needle is in one of the runs of hex of `folded`, as it is or with what
        separates its bytes dropped (sought in runs only: what ordinary text has is few and short)."""
        if not runs:
            return False
        pieces = [folded[a:b] for a, b in runs]
        hay = b".".join([*pieces, *(d for p in pieces for d in decodings.plain_hex(p))])
        return any(n in hay for n in self._hexes)

    def _in_decoded(self, pieces: list[bytes], layer: int, budget: _Budget) -> bool:
        """Whether what runs decoded to (`pieces`, read on from one to the next) holds a value: the
        bytes of one outside ASCII, or any form in the ASCII text in it, or beneath one more layer."""
        data = b"\n".join(pieces)
        if not budget.spend(len(data)):
            return True
        if any(w in data for w in self._wide):
            return True
        raw = decodings.text_in(data, self._text_least)
        if not raw:
            return False
        if self._exact and self.in_written(raw.decode("ascii")):
            return True
        folded = raw.translate(FOLD, UNSEEN)
        return self.in_folded(folded) or self._beneath(raw, folded, layer + 1, budget)

    def mask(self, text: str, mask: str) -> str:
        """`text` with every form of a known value in it replaced by `mask`: the forms an encoder
        writes as they are; what is left of one only once folded (split by whitespace or format
        characters, look-alikes, other case), from its first character to its last; a value in
        separated hex or escapes from its first byte or escape to its last; a run of base64 or hex
        whose decoding holds one, whole. Fails closed: all of `text` is `mask` when a form is still
        there after."""
        if not self._values or (len(text) <= _SHORT and text in self._clean):
            return text
        exact = [e for e in self._exact if e in text]  # rare: a value of mostly whitespace
        raw = ascii_reading(text)
        folded = raw.translate(FOLD, UNSEEN)
        hits = self._hits(folded)
        if hits or exact:
            return self._mask_beneath(self._mask_surface(text, hits, exact, mask), mask)
        if not self.beneath(raw, folded):
            if len(text) <= _SHORT:  # the same short strings come again and again (keys, states)
                if len(self._clean) >= _CLEAN_KEPT:
                    self._clean.clear()
                self._clean.add(text)
            return text
        return self._mask_beneath(text, mask, raw, folded)

    def _mask_surface(self, text: str, hits: list[bytes], exact: list[str], mask: str) -> str:
        """`text` with the forms of the values `hits` and `exact` show masked: the forms an encoder
        writes that are there (a form is there only if its folded form is, or it has none), then
        what is left of one once folded."""
        found = {i for n in hits for i in self._owners[n]}
        hit = set(hits)
        written = {w for i in found for w, f in self._values[i].written if f in hit or f not in self._owners}
        for w in sorted(written | set(exact), key=len, reverse=True):
            text = text.replace(w, mask)
        if not hits:
            return text
        folded = fold(text)
        left = [n for n in hits if n in folded]
        return _mask_folded(text, folded, left, mask) if left else text

    def _mask_beneath(self, text: str, mask: str, raw: bytes | None = None, folded: bytes | None = None) -> str:
        """`text` with what beneath() finds masked (`raw`, `folded`: its readings, when known to
        hold one): the hex forms and escapes found from first byte to last; then, if one is still
        there, each run (a block of runs) whose decoding holds one, whole."""
        if raw is None or folded is None:
            raw = ascii_reading(text)
            folded = raw.translate(FOLD, UNSEEN)
            if not self.beneath(raw, folded):
                return text
        precise = self._spans_near(folded)
        if precise:
            text = _cut(text, _chars(text, precise, fold, fold_char), mask)
            raw = ascii_reading(text)
            folded = raw.translate(FOLD, UNSEEN)
            if not self.beneath(raw, folded):
                return text
        in_folded, in_lines = self._spans_of_runs(raw, folded)
        cuts = _chars(text, in_folded, fold, fold_char) + _chars(text, in_lines, lines_reading, lines_char)
        masked = _cut(text, cuts, mask)
        return mask if self.found_in(masked) else masked

    def _spans_near(self, folded: bytes) -> list[tuple[int, int]]:
        """Where in `folded` the hex forms in runs of hex and the forms under escapes lie."""
        spans = self._hex_spans(folded, self._hex_runs(folded))
        near = self._near_escapes(folded)
        if near is not None:
            hay, windows, esc = near
            starts = list(itertools.accumulate((b - a + 1 for a, b in windows), initial=0))
            for a, b in _occurrences(hay, self._hits(hay)) + self._hex_spans(hay, self._hex_runs(hay)):
                w = bisect.bisect_right(starts, a) - 1  # from the joined windows to the unescaped text
                shift = windows[w][0] - starts[w]
                spans.append((esc.source(a + shift)[0], esc.source(b - 1 + shift)[1]))
        return spans

    def _spans_of_runs(self, raw: bytes, folded: bytes) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The runs of hex (spans in `folded`) and the blocks of runs of base64 (lines of it held
        apart by indentation only: spans in `raw` without line breaks) whose decoding holds a value."""
        hexes = self._hex_runs(folded)
        lines, b64 = decodings.b64_runs(raw, decodings.B64_LEAST)
        unescaped = self._unescaped(raw) if decodings.has_escape(folded) else []
        pieces = _run_decodings(lines, b64, folded, hexes) + [w for w, _ in unescaped]
        if not self._in_decoded(pieces, 1, _Budget(len(raw))):
            return [], []
        blocks: list[list[tuple[int, int]]] = []
        for a, b in b64:
            if blocks and not lines[blocks[-1][-1][1] : a].strip(b" \t"):
                blocks[-1].append((a, b))
            else:
                blocks.append([(a, b)])
        budget = _Budget(len(raw))  # the runs one by one: a second pass
        in_lines = []
        for block in blocks:
            if self._in_decoded(_run_decodings(lines, block, b"", []), 1, budget):
                end = block[-1][1]
                in_lines.append((block[0][0], end + len(lines[end : end + 2]) - len(lines[end : end + 2].lstrip(b"="))))
        in_lines += [span for w, span in unescaped if self._in_decoded([w], 1, budget)]
        in_folded = []
        for a, b in hexes:
            if self._in_decoded(decodings.hex_decodings(folded[a:b]), 1, budget):
                in_folded.append(decodings.trim_hex((a, b), folded))
        return in_folded, in_lines

    def _hex_spans(self, folded: bytes, runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Where in `folded` the hex needles in its runs `runs` lie, first digit to last."""
        spans = []
        for a, b in runs:
            run = folded[a:b]
            spans += [(a + i, a + j) for i, j in _occurrences(run, self._hexes)]
            if any(n in d for d in decodings.plain_hex(run) for n in self._hexes):
                for plain, at in decodings.plain_hex_at(run):
                    spans += [(a + at[i], a + at[j - 1] + 1) for i, j in _occurrences(plain, self._hexes)]
        return spans

    def scan(self) -> KnownScan:
        """A search of a stream of bytes (a file read in chunks) for the known values."""
        return KnownScan(self)


def _run_decodings(
    lines: bytes, b64: list[tuple[int, int]], folded: bytes, hexes: list[tuple[int, int]]
) -> list[bytes]:
    """What the runs of base64 (in `lines`) and of hex (in `folded`) decode to, all the runs of a
    kind joined (each is read from each of its alignments, a wrapped line on into the next)."""
    out = decodings.b64_decodings(b"".join(lines[a:b] for a, b in b64)) if b64 else []
    return out + (decodings.hex_decodings(b"".join(folded[a:b] for a, b in hexes)) if hexes else [])


def _occurrences(hay: bytes, needles: Iterable[bytes]) -> list[tuple[int, int]]:
    spans = []
    for n in needles:
        at = hay.find(n)
        while at >= 0:
            spans.append((at, at + len(n)))
            at = hay.find(n, at + 1)
    return spans


def _mask_folded(text: str, folded: bytes, needles: list[bytes], mask: str) -> str:
    """`text` with the characters that fold to each occurrence of `needles` in `folded` (which is
    `fold(text)`) replaced by `mask`, one per run of overlapping occurrences. Fails closed: all of
    `text` is `mask` when a needle is still there after."""
    masked = _cut(text, _chars(text, _occurrences(folded, needles), fold, fold_char), mask)
    folded = fold(masked)
    return mask if any(n in folded for n in needles) else masked


def _chars(
    text: str, spans: list[tuple[int, int]], read: Callable[[str], bytes], read_char: Callable[[str], bytes]
) -> list[tuple[int, int]]:
    """The spans of characters of `text` that the byte spans `spans` of `read(text)` come from."""
    if not spans:
        return []
    index = _FoldIndex(text, read, read_char)
    return [(index.char_at(a), index.char_at(b - 1) + 1) for a, b in spans if b > a]


def _cut(text: str, spans: list[tuple[int, int]], mask: str) -> str:
    """`text` with each run of overlapping `spans` (of characters) replaced by one `mask`."""
    cuts: list[list[int]] = []
    for start, end in sorted(spans):
        if cuts and start <= cuts[-1][1]:
            cuts[-1][1] = max(cuts[-1][1], end)
        else:
            cuts.append([start, end])
    out, last = [], 0
    for start, end in cuts:
        out += [text[last:start], mask]
        last = end
    out.append(text[last:])
    return "".join(out)


class _FoldIndex:
    """Where in a text the character lies that a byte of a reading of it comes from (`read`, a
    per-character reading: fold, or the ASCII reading without line breaks): read lengths of blocks
    of the text, and of the characters of a block when a byte falls in it (linear in the text
    however many bytes are asked for)."""

    BLOCK = 512

    def __init__(
        self, text: str, read: Callable[[str], bytes] = fold, read_char: Callable[[str], bytes] = fold_char
    ) -> None:
        self._text = text
        self._read_char = read_char
        lengths = (len(read(text[i : i + self.BLOCK])) for i in range(0, len(text), self.BLOCK))
        self._starts = list(itertools.accumulate(lengths, initial=0))
        self._within: dict[int, list[int]] = {}

    def char_at(self, byte: int) -> int:
        block = bisect.bisect_right(self._starts, byte) - 1
        starts = self._within.get(block)
        if starts is None:
            chars = self._text[block * self.BLOCK : (block + 1) * self.BLOCK]
            starts = list(itertools.accumulate((len(self._read_char(c)) for c in chars), initial=self._starts[block]))
            self._within[block] = starts
        return block * self.BLOCK + bisect.bisect_right(starts, byte) - 1


class KnownScan:
    """Whether a stream of bytes holds a known value: decoded as UTF-8 as it comes (an invalid
    byte is U+FFFD, which fold drops) and folded, with the end of what came before kept, so a value
    across the edge of two chunks is found, however much whitespace it is spread over; beneath an
    encoding, in the last `deep_tail` bytes of the readings and what comes (so a form beneath one
    as long as that is found across an edge however many line breaks it is spread over)."""

    def __init__(self, known: KnownValues) -> None:
        self._known = known
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._folded = b""
        self._text = ""
        self._lines = b""  # the ASCII reading without line breaks
        self._deep = b""  # the folded reading, kept longer

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
        raw = ascii_reading(text)
        folded = raw.translate(FOLD, UNSEEN)
        window = self._folded + folded
        if known.in_folded(window):
            return True
        self._folded = window[max(0, len(window) - known.longest + 1) :]
        lines, deep = self._lines + raw.translate(None, b"\r\n"), self._deep + folded
        if known.beneath(lines, deep):
            return True
        self._lines, self._deep = lines[-known.deep_tail :], deep[-known.deep_tail :]
        return False
