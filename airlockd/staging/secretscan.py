"""Content detectors over bytes, fast: which withheld-content detector fires on a buffer, with a
byte pre-search so a clean file costs a few passes, never a regex per detector.

Text detectors are redact.DETECTORS (also the Redactor's patterns), run on the buffer decoded as
UTF-8 and, when the buffer is UTF-16 or UTF-32 text (`wide_texts`: a PowerShell script, a .reg
export), on it decoded as such too. Detectors of bytes live here (redact.BYTE_DETECTORS names them):
private keys in DER, PEM private keys written in UTF-16, and the base64 of a DER private key
without PEM lines (read in UTF-16 too). A workspace's own detectors
(`[[withhold.custom]]`) run as text detectors, anchored on their regex's literal prefix or on
their keywords.
"""

from __future__ import annotations

import binascii
import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from airlockd.policy import Withhold
from airlockd.redact import DETECTORS, PEM_BEGIN_B64, ExtraDetector
from airlockd.staging import prefilter as one_pass

# Bytes every match of a detector contains, with the digest of the detector's pattern they were
# derived from. A byte search for these decides whether the full regexes need to run at all;
# anchors are chosen to share first bytes (A, g, s, S, h, d, k, x, -, :) because each distinct
# first byte costs one pass over the data, and to be rare in code ("k-" would be one pass fewer,
# but kebab-case is everywhere). An anchor is literal where it can be: one that opens with a class
# costs a pass many times slower than a literal's. If redact.py changes a pattern, its
# digest no longer matches and that detector's regex runs on every file instead: slower, never
# unsound (tests/unit/test_staging.py says so when that happens).
_ANCHORS: dict[str, tuple[str, bytes]] = {
    "private-key": ("3cc1ffc36e87de82", rb"-----[Bb][Ee][Gg][Ii][Nn]"),
    "putty-private-key": ("0934ab77b9c91e2a", rb"-User-Key-File-"),
    "ssh2-private-key": ("ee8f0e33f09372bd", rb"---- [Bb][Ee][Gg][Ii][Nn] [Ss][Ss][Hh]2 "),
    # 'LS0t' is in the base64 of '-----BEGIN ' at all 3 alignments (redact.PEM_BEGIN_B64).
    "private-key-base64": (
        "f7adf45b098d95a5",
        b"|".join(re.escape(s[s.index("LS0t") :].encode()) for s in PEM_BEGIN_B64),
    ),
    "aws-access-key": ("727795ee3eaf9378", rb"A(?:KIA|SIA|GPA|IDA|ROA|NPA|NVA|IPA)"),
    "google-api-key": ("0427d531b30efad8", rb"AIza"),
    "age-secret-key": ("abf8b5a7c831eabf", rb"AGE-SECRET-KEY-1"),
    # in "pypi-AgEIcHlwaS5vcmc" (TestPyPI: "pypi-AgENdGVzdC5weXBpLm9yZw"); the 'A' pass
    "pypi-token": ("548f0549441e5210", rb"AgE(?:IcHlwaS5vcmc|NdGVzdC5weXBpLm9yZw)"),
    "azure-connection-string": ("44799d1787f1c2d1", rb"AccountKey|AccessKey"),
    "github-token": ("757c4200279c3eb3", rb"gh[pousr]_|github_pat_"),
    "gitlab-token": ("aa6f977e13e24910", rb"gl(?:pat|rt|dt|ptt|ft|soat|imt|cbt|agent)-"),
    "openai-key": ("6e1338a1e18fd390", rb"sk-"),
    "anthropic-key": ("76071ca8c52d7c1a", rb"sk-ant-"),
    "stripe-key": ("863b156ae6772cd1", rb"k_(?:live|test)_"),
    "stripe-webhook-secret": ("1ebd260a25783d1b", rb"whsec_"),
    "shopify-token": ("cbd69c3624b44e06", rb"shp(?:at|ca|pa|ss)_"),
    "sendgrid-key": ("3de13be719f8c8a1", rb"SG\."),
    "twilio-key": ("7fe931898fc56aa4", rb"SK[0-9a-fA-F]{32}"),
    "google-oauth-secret": ("713e49680abd656c", rb"SPX-"),  # in "GOCSPX-"; shares the 'S' pass
    "vault-token": ("d9789a51838266d3", rb"hv[sb]\."),
    "huggingface-token": ("4182014396011810", rb"hf_[A-Za-z]{34}"),
    "dockerhub-token": ("4e9f93fd1c21d6b0", rb"dckr_"),
    "digitalocean-token": ("5ef55bfd23ba33d1", rb"do[opr]_v1_"),
    "npm-token": ("c4123c58826f1813", rb"npm_|NPM_"),
    # the header's name as it is written (Authorization, authorization, AUTHORIZATION): literals,
    # where one class per letter made a scan of its own 20 times slower than the others
    "http-basic-auth": ("bfbd232db90c9542", rb"uthorization|UTHORIZATION"),
    "slack-token": ("8f8f54641dbaa767", rb"xox[abposr]-|xapp-"),
    "slack-webhook": ("4de5c9bf2e2b38c2", rb"hooks\.slack\.com/"),
    "kubeconfig-credential": ("645549db45d33a37", rb"ser:"),  # in "user:"; shares the 's' pass
    "jwt": ("9d5e853d31750eb6", rb"eyJ"),
    # the whole pattern as bytes: a search for it is as cheap as one for '://'
    "url-credentials": ("ee20fb3d76e90476", rb"://[^:/?#\[\]@!$&'()*+,;=\s]+:[^:/?#\[\]@!$&'()*+,;=\s]+@"),
    "pgpass": ("5e3844df120937e0", rb":(?:[0-9]{1,5}|\*):"),  # the port field
    "airlock-run-token": ("29083fd9c47eddd2", rb"alrt_"),
}

# -- detectors of bytes --------------------------------------------------------------------------

_ANY = rb"[\x00-\xff]"
_DER_LEN = rb"(?:[\x00-\x7f]|\x81[\x80-\xff]|\x82[\x00-\xff]{2})"
# Private keys in DER, recognised by their ASN.1 opening (RFC 8017 A.1.2, RFC 5208/5958, RFC 5915)
# and OpenSSH's binary key format (PROTOCOL.key). Every alternative holds a zero byte, so a buffer
# without one is never searched. Public keys (SubjectPublicKeyInfo, RSAPublicKey) and
# certificates have no version INTEGER 0 before their algorithm or modulus, so they do not match.
_DER_KEY = re.compile(
    # PKCS#1 RSAPrivateKey: SEQUENCE { version 0, modulus INTEGER (positive: a leading 0x00) ...
    rb"\x30\x82" + _ANY + rb"{2}\x02\x01\x00\x02(?:\x81" + _ANY + rb"|\x82" + _ANY + rb"{2})\x00"
    # PKCS#8 PrivateKeyInfo v1: SEQUENCE { version 0, AlgorithmIdentifier { OID of RSA, RSA-PSS,
    # EC, DSA, X25519, X448, Ed25519, Ed448 } ...
    rb"|\x30" + _DER_LEN + rb"\x02\x01\x00\x30[\x00-\x7f]\x06(?:\x09\x2a\x86\x48\x86\xf7\x0d\x01\x01[\x01\x0a]"
    rb"|\x07\x2a\x86\x48(?:\xce\x3d\x02\x01|\xce\x38\x04\x01)|\x03\x2b\x65[\x6e-\x71])"
    # SEC1 ECPrivateKey: SEQUENCE { version 1, OCTET STRING key (P-256/384/521), [0] curve,
    # [1] public key BIT STRING (0 unused bits, uncompressed point) }
    rb"|\x30" + _DER_LEN + rb"\x02\x01\x01\x04(?:\x20" + _ANY + rb"{32}|\x30" + _ANY + rb"{48}|\x42" + _ANY + rb"{66})"
    rb"\xa0[\x00-\x7f]\x06[\x05-\x09]" + _ANY + rb"{5,9}\xa1" + _DER_LEN + rb"\x03" + _DER_LEN + rb"\x00\x04"
    rb"|openssh-key-v1\x00"
)
# the version INTEGER (0 or 1) of the ASN.1 forms, and OpenSSH's magic: two groups, since a regex
# whose branches open with different bytes has no literal to scan for (20 times slower on binary)
_DER_ANCHORS = {b"der": rb"\x02\x01[\x00\x01]", b"der-openssh": rb"openssh-key-v1\x00"}
_UTF16_ANCHOR = rb"-\x00-\x00-\x00-\x00-\x00[Bb]\x00[Ee]\x00[Gg]"  # LE; BE from its second byte


def _utf16_private_key(span: bytes) -> bool:
    """A PEM private key in UTF-16 (LE or BE, with or without a byte-order mark): BE read as LE
    from one byte on is the same text, so both parities are read as LE."""
    pem = DETECTORS["private-key"]
    return any(pem.search(span[parity:].decode("utf-16-le", "replace")) for parity in (0, 1))


def _der_private_key(span: bytes) -> bool:
    return _DER_KEY.search(span) is not None


# The base64 of a DER private key without PEM lines (a YAML, properties or JSON value: `MIIEvQIB...`,
# `MC4CAQAw...`, `b3BlbnNzaC1rZXktdjE...`): what every such value opens with, the base64 of the
# SEQUENCE and its version INTEGER (0 or 1) for each length form of _DER_KEY, or of
# 'openssh-key-v1\0'. A certificate (`MIIB..zCCA`) or a public key (`MIIBIjAN`, `MIGfMA0G`) has
# no INTEGER there. Base64url characters are read as base64's.
_B64_CHAR = rb"[A-Za-z0-9+/_-]"
_DER_B64_ANCHOR = (
    rb"M[A-H][AEIMQUYcgkosw048]CAQ"  # 30 len 02 01 ..
    rb"|MI[E-H]" + _B64_CHAR + rb"AgE[AB]"  # 30 81 len 02 01 0v
    rb"|MI[I-L]" + _B64_CHAR + rb"{2}[AQgw]IB"  # 30 82 len len 02 01
    rb"|b3BlbnNzaC1rZXktdjEA"
)
_DER_B64_GROUPS = {
    b"der-base64": b"|".join(p for p in _DER_B64_ANCHOR.split(b"|") if p.startswith(b"M")),
    b"der-base64-openssh": b"|".join(p for p in _DER_B64_ANCHOR.split(b"|") if not p.startswith(b"M")),
}
# where one starts: not inside a run of base64, or after a `\n` escape (a JSON string)
_DER_B64_START = re.compile(rb"(?:(?<![A-Za-z0-9+/])|(?<=\\[nr]))(?:" + _DER_B64_ANCHOR + rb")")
_DER_B64_LEAST = 40  # base64 characters on a value's first line (a wrapped one has 64 or 76)
_DER_B64_READ = 160  # characters decoded: 120 bytes, past the opening _DER_KEY reads of any key
_DER_B64_WINDOW = 400  # bytes read on over the breaks of a wrapped value, for its characters
_B64_BREAKS = re.compile(rb"(?:\r?\n|\\r|\\n)[ \t]*")  # a line break (or its escape) and indent
_B64_CHARS = re.compile(_B64_CHAR + rb"{0,%d}" % _DER_B64_READ)
_B64URL_TO_B64 = bytes.maketrans(b"-_", b"+/")


def _b64_chars(data: bytes, at: int = 0) -> bytes:
    m = _B64_CHARS.match(data, at)
    return m.group() if m else b""


def _der_base64_private_key(span: bytes) -> bool:
    """A run of base64 (at least _DER_B64_LEAST characters on its first line, read on over line
    breaks) that decodes, from its first character, to what _DER_KEY finds at the start: a private
    key in DER. Each start costs a bounded read (an opening on a short line, none)."""
    for start in _DER_B64_START.finditer(span):
        at = start.start()
        chars = _b64_chars(span, at)
        if len(chars) < _DER_B64_LEAST:
            continue
        if len(chars) < _DER_B64_READ:  # a wrapped value, or a short one
            window = _B64_BREAKS.sub(b"", span[at : at + _DER_B64_WINDOW])
            chars = _b64_chars(window)
        der = binascii.a2b_base64(chars[: len(chars) // 4 * 4].translate(_B64URL_TO_B64))
        if _DER_KEY.match(der):
            return True
    return False


# -- text in UTF-16 ------------------------------------------------------------------------------

_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
# Bytes as classes, to count with bytes.count: a printable ASCII byte (or tab, newline, carriage
# return) is "a", NUL stays NUL, any other byte is "b"; "a\0" is an ASCII character in UTF-16 (LE;
# BE from its second byte).
_CLASSES = bytes(0x61 if chr(b) in "\t\n\r" or 0x20 <= b < 0x7F else 0 if b == 0 else 0x62 for b in range(256))
_SAMPLE = 1024  # bytes around the first NUL of each eighth of a buffer: what says it is UTF-16


def utf16_texts(data: bytes) -> list[str]:
    """What `data` reads as if it is UTF-16 text, or [] when it is not (judged by its NULs: a
    byte-order mark, or NULs that sit where the high bytes of ASCII characters would). Read in
    both byte orders from both of its first two bytes, since a streamed window may start inside
    a character (reading big-endian text as little-endian one byte on garbles the character
    beside a non-ASCII one, so both orders are read). A buffer without a NUL byte is never UTF-16
    text (an ASCII character has one there) and costs one search for it."""
    if b"\x00" not in data or (data[:2] not in _UTF16_BOMS and not _looks_utf16(data)):
        return []
    return [data[at:].decode(codec, "replace") for codec in ("utf-16-le", "utf-16-be") for at in (0, 1)]


_UTF32_BOMS = (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")


def wide_texts(data: bytes) -> list[str]:
    """What `data` reads as if it is UTF-16 or UTF-32 text (utf16_texts, utf32_texts); a buffer
    without a NUL is neither, and costs one search for it."""
    if b"\x00" not in data:
        return []
    return utf16_texts(data) + utf32_texts(data)


def utf32_texts(data: bytes) -> list[str]:
    """What `data` reads as if it is UTF-32 text, or [] when it is not (a byte-order mark, or
    ASCII characters with their three NULs, judged as utf16_texts judges UTF-16: rare, but an
    encoder writes it and a detector reading UTF-8 or UTF-16 sees nothing of it). Read in both
    byte orders from each of its first four bytes (a streamed window may start anywhere)."""
    if b"\x00\x00\x00" not in data or (data[:4] not in _UTF32_BOMS and not _looks_utf32(data)):
        return []
    return [
        data[at : at + (len(data) - at) // 4 * 4].decode(codec, "replace")
        for codec in ("utf-32-le", "utf-32-be")
        for at in range(4)
    ]


def _looks_utf32(data: bytes) -> bool:
    """As _looks_utf16, for ASCII characters of four bytes (`a\\0\\0\\0`; big-endian from the
    fourth byte): a window holds at least 4 runs of two, and such characters account for at least
    half its NULs (three each) and a fiftieth of its bytes."""
    return _looks_wide(data, b"\x00\x00\x00", 4)


def _looks_utf16(data: bytes) -> bool:
    """Whether `data` holds UTF-16 text with ASCII in it, judged on windows: the whole of a small
    buffer, else the bytes around the first NUL of each eighth. A window is UTF-16 text when at
    least half its NULs follow a printable ASCII byte, as the high bytes of ASCII characters in
    UTF-16 do, and such pairs are at least 8 and a fiftieth of the window: in UTF-16 text about
    half the bytes are, in a random or compiled binary about one in 700 (its NULs come in runs or
    after any byte), so sampling noise never passes one off as text (it did for one chunk in
    seven of random data, each then read four times); and some come two in a row (a table of
    little-endian integers has a printable byte before each high NUL, never two such pairs
    running). Not seen: UTF-16 big-endian text whose first NUL in each eighth is not near ASCII
    (CJK text with spaces, a token elsewhere)."""
    return _looks_wide(data, b"\x00", 2)


def _looks_wide(data: bytes, nuls: bytes, width: int) -> bool:
    """Whether `data` holds text of `width`-byte units with ASCII in it (an ASCII character is
    its byte and `nuls`), judged on the whole of a small buffer or around the first `nuls` of
    each eighth of a larger one."""
    if len(data) <= 8 * _SAMPLE:
        return _wide_window(data, nuls, width)
    step = len(data) // 8
    for lo in range(0, 8 * step, step):
        at = data.find(nuls, lo, lo + step)
        if at >= 0 and _wide_window(data[max(0, at - _SAMPLE // 2) : at + _SAMPLE // 2], nuls, width):
            return True
    return False


def _wide_window(window: bytes, nuls: bytes, width: int) -> bool:
    classes = window.translate(_CLASSES)
    char = b"a" + nuls
    chars = classes.count(char)
    runs = classes.count(char + char)  # two ASCII characters in a row: text, not a table of ints
    return runs >= 4 and 2 * (width - 1) * chars >= window.count(b"\x00") and 50 * chars >= len(window)


@dataclass
class _Group:
    """Detectors whose anchors are searched as one regex (they share a first byte)."""

    anchors: list[bytes] = field(default_factory=list)
    text: list[tuple[str, Callable[[str], bool]]] = field(default_factory=list)
    raw: list[tuple[str, Callable[[bytes], bool]]] = field(default_factory=list)
    gate: bytes = b""  # a byte string every match holds: without it the group is not searched
    flags: int = 0
    regex: re.Pattern[bytes] = field(init=False)

    def compile(self) -> _Group:
        self.regex = re.compile(b"|".join(self.anchors), self.flags)
        return self


def _searcher(pattern: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda text: pattern.search(text) is not None


def _digest(pattern: str) -> str:
    return hashlib.sha256(pattern.encode()).hexdigest()[:16]


def literal_prefix(pattern: re.Pattern[str]) -> str:
    """The literal text every match of `pattern` starts with ("" if none is certain)."""
    from re import _constants as c  # type: ignore[attr-defined]
    from re import _parser  # type: ignore[attr-defined]

    if pattern.flags & (re.IGNORECASE | re.VERBOSE):
        return ""
    out = []
    for op, arg in _parser.parse(pattern.pattern):
        if op is not c.LITERAL:
            break
        out.append(chr(arg))
    return "".join(out)


# Characters outside ASCII that Python's `re`, ignoring case, takes for an ASCII letter: a match
# of a detector ignoring case may hold them where its keyword has i, k or s.
_OTHER_CASES = {"i": "\u0130\u0131", "k": "\u212a", "s": "\u017f"}


def keyword_anchor(word: str) -> bytes | None:
    """What a byte search ignoring ASCII case finds wherever a text holds `word` in any case as
    `re` ignores case (its i, k and s in their other Unicode forms too); None when `word` has a
    character outside ASCII, whose other cases no such search finds (then the detector runs on
    every buffer)."""
    if not word.isascii():
        return None
    out = []
    for ch in word:
        lit = re.escape(ch.encode())
        others = _OTHER_CASES.get(ch.lower(), "")
        out.append(b"(?:" + b"|".join([lit, *(o.encode() for o in others)]) + b")" if others else lit)
    return b"".join(out)


class SecretScanner:
    """Finds one of `names` (redact.DETECTORS and BYTE_DETECTORS) or of a policy's `extra`
    detectors that fires on a buffer, or None. Anchors sharing a first byte are searched as one
    regex, so a clean text buffer costs a few byte searches with the default detectors (with
    Hyperscan, `prefilter.Prefilter`, one pass says which groups to search at all). Where
    anchors occur, the detectors they stand for run on the lines around them (MARGIN bytes each
    side, widened to whole lines; overlapping spans merged, so never more than the whole buffer).
    Every built-in match is shorter than MARGIN from its anchor or ends within its line, so a span
    finds what the detector finds on the whole buffer. A buffer that is UTF-16 text
    or UTF-32 (`wide_texts`) is searched again the same way, as that text in UTF-8, by the text detectors."""

    MARGIN = 1024
    overlap = 65536  # bytes carried between chunks of a streamed file: a secret up to this long is
    # found whole in one of the windows whichever chunk boundary it straddles

    def __init__(
        self, names: Iterable[str], extra: Iterable[ExtraDetector] = (), *, prefilter: bool | None = None
    ) -> None:
        """`prefilter`: True compiles Hyperscan's pass now, False never (`re` alone), None (the
        default) once the scanner has been given PREFILTER_AFTER bytes, or at once when this
        process has compiled it for these detectors already."""
        self.names = list(dict.fromkeys(names))
        groups: dict[bytes, _Group] = {}
        self._unanchored: list[tuple[str, Callable[[str], bool]]] = []
        for name in self.names:
            if name == "private-key-der":
                for key, anchor in _DER_ANCHORS.items():
                    group = groups.setdefault(key, _Group(gate=b"\x00"))
                    group.anchors.append(anchor)
                    group.raw.append((name, _der_private_key))
                continue
            if name == "private-key-utf16":
                group = groups.setdefault(b"utf16", _Group(gate=b"\x00"))
                group.anchors.append(_UTF16_ANCHOR)
                group.raw.append((name, _utf16_private_key))
                continue
            if name == "private-key-der-base64":  # text, so read in UTF-16 too (no gate)
                # two groups, the openings with 'M' and OpenSSH's: a regex whose branches open
                # with two bytes has no literal to scan for (6 times slower on binary files)
                for key, anchors in _DER_B64_GROUPS.items():
                    group = groups.setdefault(key, _Group())
                    group.anchors.append(anchors)
                    group.raw.append((name, _der_base64_private_key))
                continue
            search = _searcher(DETECTORS[name])
            digest, anchor = _ANCHORS.get(name, ("", b""))
            if not anchor or digest != _digest(DETECTORS[name].pattern):
                self._unanchored.append((name, search))
            else:
                # alternatives of plain literals that open differently go to their own groups: a
                # regex whose branches open with two bytes has no literal to scan for, and is slow
                parts = anchor.split(b"|") if b"(" not in anchor and b"[" not in anchor else [anchor]
                for part in parts:
                    group = groups.setdefault(part[:1], _Group())
                    group.anchors.append(part)
                    group.text.append((name, search))
        for det in extra:
            self.names.append(det.name)
            # a lone surrogate (written as an escape in the regex) is never in decoded text: any
            # bytes stand for it
            prefix = literal_prefix(det.pattern).encode("utf-8", "surrogatepass")
            words = [keyword_anchor(k) for k in det.keywords]
            if prefix:
                group = groups.setdefault(prefix[:1], _Group())
                group.anchors.append(re.escape(prefix))
            elif words and None not in words:  # the policy's word: one of them, in any case, is in every match
                group = groups.setdefault(b"custom:" + det.name.encode(), _Group(flags=re.IGNORECASE))
                group.anchors.extend(w for w in words if w is not None)
            else:
                self._unanchored.append((det.name, det.search))
                continue
            group.text.append((det.name, det.search))
        self.groups = [g.compile() for g in groups.values()]
        self._key = tuple((g.regex.pattern, g.flags) for g in self.groups)
        self.prefilter: one_pass.Prefilter | None = None
        self._until_prefilter = -1  # bytes to scan before compiling it; -1: never
        if prefilter or (prefilter is None and self._key in one_pass.PREFILTERS):
            self.prefilter = one_pass.prefilter_for(self._key)
        elif prefilter is None:
            self._until_prefilter = one_pass.PREFILTER_AFTER
        self.unanchored = [name for name, _ in self._unanchored]  # each runs on every buffer
        # worth a UTF-16 read: a text detector, or one of bytes that reads text (no gate)
        self._texts = bool(self._unanchored) or any(g.text or (g.raw and not g.gate) for g in self.groups)

    def first_hit(self, data: bytes) -> str | None:
        hit = self._hit(data, None)
        if hit is None and self._texts:
            for text in wide_texts(data):  # [] unless `data` holds a NUL: only then does this cost
                hit = self._hit(text.encode(), text)  # the same anchors, on the text as UTF-8
                if hit is not None:
                    break
        return hit

    def _hit(self, data: bytes, text: str | None) -> str | None:
        """The first detector that fires on `data`; when `text` is given, `data` is that text in
        UTF-8 and only the text detectors run."""
        fired: Any = range(len(self.groups))
        if self._until_prefilter >= 0:
            self._until_prefilter -= len(data)
            if self._until_prefilter < 0:
                self.prefilter = one_pass.prefilter_for(self._key)
        if self.prefilter is not None and len(data) < one_pass.PREFILTER_MAX:
            fired = self.prefilter.fired(data)
        for at, group in enumerate(self.groups):
            if at not in fired or (group.gate and (text is not None or group.gate not in data)):
                continue
            first = group.regex.search(data)
            if first is None:
                continue
            spans = [data[lo:hi] for lo, hi in self._spans(group.regex, data, first)]
            for name, search_raw in group.raw:
                if any(search_raw(s) for s in spans):
                    return name
            if group.text:
                texts = [s.decode("utf-8", "replace") for s in spans]
                for name, search in group.text:
                    if any(search(t) for t in texts):
                        return name
        if self._unanchored:
            whole = data.decode("utf-8", "replace") if text is None else text
            return next((n for n, search in self._unanchored if search(whole)), None)
        return None

    def _spans(self, anchor: re.Pattern[bytes], data: bytes, first: re.Match[bytes]) -> list[tuple[int, int]]:
        m, end = self.MARGIN, len(data)

        def line_end(at: int) -> int:
            if at >= end:
                return end
            nl = data.find(b"\n", at)
            return end if nl < 0 else nl

        spans = []
        lo = data.rfind(b"\n", 0, max(0, first.start() - m)) + 1
        hi = line_end(first.end() + m)
        for found in anchor.finditer(data, first.end()):
            at = found.start()
            if at < hi:
                continue
            if at - m > hi:
                spans.append((lo, hi))
                lo = data.rfind(b"\n", hi, at - m) + 1 or hi
            hi = line_end(found.end() + m)
            if hi == end:
                break
        spans.append((lo, hi))
        return spans


_SCANNERS: OrderedDict[tuple[tuple[str, ...], tuple[ExtraDetector, ...]], SecretScanner] = OrderedDict()
_SCANNERS_LOCK = threading.Lock()
SCANNERS_KEPT = 16


def policy_scanner(withhold: Withhold) -> SecretScanner:
    """The scanner of every detector a policy uses, the built-in and the workspace's own
    (`[[withhold.custom]]`): staging, the proposal's checks and the learning walk all ask this."""
    return scanner_for(withhold.detectors, withhold.extra_detectors)


def scanner_for(names: Iterable[str], extra: Iterable[ExtraDetector] = ()) -> SecretScanner:
    """A scanner of these detectors, the same one for the same detectors (the last
    SCANNERS_KEPT kept): building one costs about a millisecond, which every refresh of a
    mirror and every proposed file would pay again. A scanner is never changed by a scan but
    for when its prefilter compiles, which is safe to share."""
    key = (tuple(names), tuple(extra))
    with _SCANNERS_LOCK:
        got = _SCANNERS.get(key)
        if got is not None:
            _SCANNERS.move_to_end(key)
            return got
    made = SecretScanner(*key)
    with _SCANNERS_LOCK:
        got = _SCANNERS.setdefault(key, made)
        _SCANNERS.move_to_end(key)
        while len(_SCANNERS) > SCANNERS_KEPT:
            _SCANNERS.popitem(last=False)
    return got
