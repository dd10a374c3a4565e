"""A withheld value is found, and masked, in the forms an agent that learnt it could pass it on in
(airlockd/knownvalues.py): base64 at every alignment in both alphabets, hex, percent-encoded,
split by whitespace or unseen characters, full-width, look-alike letters, another case, reversed,
rot13; beneath an encoding (airlockd/decodings.py): hex with its bytes held apart, UTF-16, JSON and
HTML escapes, an encoding of an encoding; a near miss (another value's encoding, a word split
across lines, a near value's forms, ordinary text) is not. Folding is per character, so a stream
folded in chunks is the whole folded; the values of a withheld file are its real values."""

from __future__ import annotations

import base64
import codecs
import json
import random
import string
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest
from foldtables import lookalikes as computed_lookalikes
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import airlockd
from airlockd import foldtable, knownvalues
from airlockd.filevalues import file_values, name_values
from airlockd.knownvalues import LEAST_FOLDED, KnownValues, ValueForms, fold
from airlockd.pipeline.classify import WITHHELD_VALUE
from airlockd.redact import MASK, Redactor
from airlockd.runs.content import scan_file
from airlockd.staging.secretscan import SecretScanner

VALUE = "Zq8-withheld-value-xK31"
OTHER = "Pw4-another-secret-Lm90"
CYRILLIC = str.maketrans("aceopxy", "асеорху")  # each letter's Cyrillic look-alike


def _b64_inside(value: str, before: bytes) -> str:
    return base64.b64encode(before + value.encode() + b"-tail").decode()


def _fullwidth(value: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in value)


def _b64(v: str) -> str:
    return base64.b64encode(v.encode()).decode()


def _utf16_b64(v: str) -> str:  # PowerShell's -EncodedCommand
    return base64.b64encode(v.encode("utf-16-le")).decode()


def _hex_apart(sep: str, each: str = "{:02x}") -> Callable[[str], str]:
    return lambda v: sep.join(each.format(b) for b in v.encode())


def _json(v: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in v)


def _html(v: str) -> str:
    return "".join(f"&#{ord(c)};" for c in v)


# The forms beneath an encoding (airlockd/decodings.py), and the value reversed and in rot13.
BENEATH: dict[str, Callable[[str], str]] = {
    "base64 of UTF-16LE": _utf16_b64,
    "base64 of UTF-16BE inside a stream": lambda v: base64.b64encode(
        b"\xfe\xff" + v.encode("utf-16-be") + b"\0."
    ).decode(),
    "base64 of UTF-16LE wrapped and indented": lambda v: "\n    ".join(
        _utf16_b64(v)[i : i + 16] for i in range(0, len(_utf16_b64(v)), 16)
    ),
    "hex of UTF-16LE": lambda v: v.encode("utf-16-le").hex(),
    "hex of UTF-16BE": lambda v: v.encode("utf-16-be").hex().upper(),
    "hex with colons": _hex_apart(":"),
    "hex with dashes": _hex_apart("-", "{:02X}"),
    "hex in a 0x list": _hex_apart(", ", "0x{:02x}"),
    "hex in \\x escapes": _hex_apart("", "\\x{:02x}"),
    "base64 of base64": lambda v: _b64(_b64(v)),
    "base64 of base64 of base64": lambda v: _b64(_b64(_b64(v))),
    "base64 of hex": lambda v: _b64(v.encode().hex()),
    "hex of base64": lambda v: _b64(v).encode().hex(),
    "base64 of a 0x list": lambda v: _b64(_hex_apart(",", "0x{:02x}")(v)),
    "JSON \\u escapes": _json,
    "JSON \\u escapes of some": lambda v: "".join(_json(c) if i % 3 else c for i, c in enumerate(v)),
    "HTML decimal entities": _html,
    "HTML hex entities": lambda v: "".join(f"&#x{ord(c):X};" for c in v),
    "reversed": lambda v: v[::-1],
    "rot13": lambda v: codecs.encode(v, "rot13"),
}


ENCODINGS: dict[str, Callable[[str], str]] = {
    "base64 at offset 0": lambda v: _b64_inside(v, b""),
    "base64 at offset 1": lambda v: _b64_inside(v, b"x"),
    "base64 at offset 2": lambda v: _b64_inside(v, b"xy"),
    "base64url": lambda v: base64.urlsafe_b64encode(b"\xfb\xff" + v.encode()).decode(),
    "base64 wrapped at 8 columns": lambda v: "\n".join(
        _b64_inside(v, b"p")[i : i + 8] for i in range(0, len(_b64_inside(v, b"p")), 8)
    ),
    "hex": lambda v: v.encode().hex(),
    "HEX": lambda v: v.encode().hex().upper(),
    "hex with spaces": lambda v: " ".join(f"{b:02x}" for b in v.encode()),
    "percent, every byte": lambda v: "".join(f"%{b:02X}" for b in v.encode()),
    "percent, lower case": lambda v: "".join(f"%{b:02x}" for b in v.encode()),
    "URL-quoted": lambda v: urllib.parse.quote(v + " & more"),
    "split across lines": lambda v: v[:7] + "\n" + v[7:15] + "\r\n    " + v[15:],
    "split by tabs and spaces": lambda v: " \t ".join(v),
    "soft hyphens": lambda v: "\u00ad".join(v),
    "zero-width characters": lambda v: "".join(c + "\u200b\u200c\u200d\u2060\ufeff"[i % 5] for i, c in enumerate(v)),
    "bidirectional controls": lambda v: "\u202e".join(v[:6]) + v[6:],
    "combining marks": lambda v: "\u0301".join(v),
    "emoji between": lambda v: v[:9] + "\N{ROCKET}" + v[9:],
    "full-width": _fullwidth,
    "Cyrillic look-alikes": lambda v: v.translate(CYRILLIC),
    "upper case": str.upper,
    **BENEATH,
}


@pytest.mark.parametrize("encode", ENCODINGS.values(), ids=ENCODINGS.keys())
def test_an_encoded_value_is_found_and_masked(encode: Callable[[str], str]) -> None:
    red = Redactor([VALUE, OTHER])
    text = f"the agent says: {encode(VALUE)} (end)\n"
    assert red.known_in(text)
    shown = red.text(text)
    assert MASK in shown and not red.known_in(shown), shown
    assert shown.startswith("the agent says: ") and shown.endswith(" (end)\n")  # only the value is masked


@pytest.mark.parametrize("encode", ENCODINGS.values(), ids=ENCODINGS.keys())
def test_another_values_encoding_is_no_hit(encode: Callable[[str], str]) -> None:
    red = Redactor([VALUE])
    text = f"the agent says: {encode(OTHER)} (end)"
    assert not red.known_in(text)
    assert red.text(text) == text


@pytest.mark.parametrize(
    "text",
    [
        "Zq8-with\ndrawn-value-xK31",  # the value's start, then other letters
        "Zq8-withheld-valu\ne-xK32",  # one character off, split
        "pass\nword and user\nname, split across lines",  # ordinary words split
        base64.b64encode(b"Zq8-withheld-valve-xK31").decode(),  # the base64 of a near value
        "Zq8-with.held-value-xK31",  # held apart by a visible character
        "Zq8-withheld-valve-xK31"[::-1],  # a near value reversed
        _b64(_b64(_b64(_b64(VALUE)))),  # 4 layers of encoding: past the depth decoded
        "de:ad:be:ef:00:11 aa-bb-cc-dd-ee-ff 0x00, 0x01, 0xff \\x7f\\x45\\x4c\\x46",  # hex held apart
        "123e4567-e89b-12d3-a456-426614174000, 00000000-0000-0000-0000-000000000000",  # UUIDs
        '{"name": "caf\\u00e9", "note": "&#60;b&#62;bold&#x3C;/b&#x3e; &amp; more"}',  # escapes of other text
        "the quick brown fox jumps over the lazy dog"[::-1],  # ordinary text reversed
        codecs.encode("the quick brown fox jumps over the lazy dog", "rot13"),
    ],
)
def test_a_near_miss_is_no_hit(text: str) -> None:
    red = Redactor([VALUE])
    assert not red.known_in(text)
    assert red.text(text) == text


NEAR = "Zq8-withheld-valve-xK31"  # one character off


@pytest.mark.parametrize("encode", BENEATH.values(), ids=BENEATH.keys())
def test_a_near_values_form_beneath_an_encoding_is_no_hit(encode: Callable[[str], str]) -> None:
    red = Redactor([VALUE, OTHER])
    text = f"the agent says: {encode(NEAR)} (end)"
    assert not red.known_in(text)
    assert red.text(text) == text


def test_hex_held_apart_keeps_the_least_length() -> None:
    """A value is sought in hex from its 6 bytes on, as before: 5 of its bytes held apart are not it."""
    red = Redactor(["hunter"])
    assert red.known_in("0x68, 0x75, 0x6e, 0x74, 0x65, 0x72") and red.known_in("68:75:6e:74:65:72")
    assert not red.known_in("0x68, 0x75, 0x6e, 0x74, 0x65") and not red.known_in("75:6e:74:65:72:73")


def test_ordinary_code_finds_no_turned_or_decoded_form() -> None:
    """The sources of this package (identifiers, escapes, hex, base64 in tests' data) hold no form
    of 30 random values: reversed and rot13 make no ordinary word, runs decoded make no value."""
    rnd = random.Random(3)
    alphabet = string.ascii_letters + string.digits + "-_"
    values = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(12, 40))) for _ in range(30)]
    red = Redactor([VALUE, *values])
    for path in sorted(Path(airlockd.__file__).parent.rglob("*.py")):
        text = path.read_text()
        assert not red.known_in(text), path


def test_decoding_past_its_budget_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A text made to decode to ever more (more than 8 bytes for each of its own) is held to hold a value."""
    red = Redactor([VALUE])
    blob = base64.b64encode(bytes(range(256))).decode()
    assert not red.known_in(blob)
    monkeypatch.setattr(knownvalues._Budget, "__init__", lambda self, size: setattr(self, "left", 100))
    assert red.known_in(blob) and red.text(blob) == MASK
    assert not red.known_in("no run of base64 or hex in these words")


def test_a_value_short_once_folded_is_sought_only_as_written() -> None:
    """Two ordinary words can join into a short value once whitespace is dropped ("data base")."""
    red = Redactor(["hunter", "a b c d e f", "  spaced  "])
    assert red.known_in("hunter") and red.known_in("a b c d e f") and red.known_in("spaced")
    assert not red.known_in("hun\nter") and not red.known_in("HUNTER") and not red.known_in("abcdef")
    assert red.text("x a b c d e f y") == f"x {MASK} y"
    assert red.known_in(base64.b64encode(b"hunter").decode())  # its encodings are no ordinary words
    long_enough = "h" * LEAST_FOLDED
    assert Redactor([long_enough]).known_in(long_enough[:3] + "\n" + long_enough[3:])


def test_a_value_fold_takes_characters_from_is_sought_only_as_written() -> None:
    red = Redactor(["密码12345678", "Кириллица-Ключ-42"])
    assert red.known_in("密码12345678") and red.known_in(base64.b64encode("密码12345678".encode()).decode())
    assert not red.known_in("order 12345678") and not red.known_in("12345678")
    assert red.known_in("x Кириллица-Ключ-42 y") and not red.known_in("-42")


def test_a_value_shorter_than_the_least_is_not_registered() -> None:
    red = Redactor(["abcde"])
    assert not red.masks_more_than_patterns and not red.known_in("abcde")


@pytest.mark.parametrize("pad", [0, 480, 489, 490, 491, 500, 600, 5000])
def test_a_value_is_found_in_a_short_text_and_a_long_one_alike(pad: int) -> None:
    """Up to 512 folded bytes the needles are looked up by their first bytes, past that found one by one."""
    red = Redactor([VALUE])
    for _ in range(2):  # the second time a clean short text is answered at once
        assert red.text("x" * pad) == "x" * pad
    for text in ("x" * pad + VALUE, VALUE + "x" * pad, "x" * pad + VALUE[:5] + "\n" + VALUE[5:]):
        assert red.known_in(text) and not red.known_in(red.text(text))


def test_every_occurrence_is_masked_and_the_rest_kept() -> None:
    red = Redactor([VALUE])
    split = VALUE[:10] + "\n" + VALUE[10:]
    text = f"a {VALUE} b {split} c {_b64_inside(VALUE, b'')} d " + "\u200b".join(VALUE)
    shown = red.text(text)
    assert shown.startswith(f"a {MASK} b {MASK} c ") and shown.endswith(f" d {MASK}")
    assert not red.known_in(shown)


# -- properties -------------------------------------------------------------------------------

_VALUES = st.text(alphabet=string.ascii_letters + string.digits + "-_.+/=:@!", min_size=8, max_size=40)
_UNSEEN = st.sampled_from([" ", "\n", "\t", "\r\n", "\u00ad", "\u200b", "\u200d", "\u2060", "\ufeff", "\u0301"])


@st.composite
def _disguised(draw: st.DrawFn, value: str) -> str:
    """`value` in a random one of the encodings, or split at random places by unseen characters."""
    how = draw(st.sampled_from([*ENCODINGS, "split at random"]))
    if how != "split at random":
        return ENCODINGS[how](value)
    cuts = sorted(draw(st.lists(st.integers(1, len(value) - 1), min_size=1, max_size=6)))
    pieces = [value[a:b] for a, b in zip([0, *cuts], [*cuts, len(value)], strict=True)]
    return "".join(p + draw(_UNSEEN) for p in pieces[:-1]) + pieces[-1]


@settings(max_examples=300, deadline=None)
@given(st.data(), _VALUES, st.text(max_size=30), st.text(max_size=30))
def test_a_disguised_value_is_always_found_and_masked(data: st.DataObject, value: str, before: str, after: str) -> None:
    red = Redactor([value])
    disguised = data.draw(_disguised(value))
    text = f"{before} {disguised} {after}"
    assert red.known_in(text)
    assert not red.known_in(red.text(text))


# what one encoding of a value can be wrapped in again (JSON escapes of escapes are read once only);
# of 12 characters or more, as a run of base64 is decoded from 16 characters on
_INNER = ["base64 at offset 1", "hex", "hex with colons", "hex in a 0x list", "base64 of UTF-16LE", "JSON \\u escapes"]
_INNER += ["HTML hex entities", "reversed", "rot13", "percent, every byte", "split across lines"]
_OUTER = [
    "base64 at offset 2",
    "base64url",
    "hex",
    "HEX",
    "hex with dashes",
    "hex in \\x escapes",
    "base64 of UTF-16LE",
]


_LONGER = st.text(alphabet=string.ascii_letters + string.digits + "-_.+/=:@!", min_size=12, max_size=40)


@settings(max_examples=200, deadline=None)
@given(_LONGER, st.sampled_from(_INNER), st.sampled_from([*_OUTER, "JSON \\u escapes"]), st.text(max_size=20))
@example("000000000000", "percent, every byte", "hex", "X1")  # `...30` then ` X1`: a `0x` across the edge
@example("000000000000", "hex", "hex", "XA")
def test_a_value_encoded_twice_is_always_found_and_masked(value: str, inner: str, outer: str, around: str) -> None:
    assume(not (outer == "JSON \\u escapes" and inner in ("JSON \\u escapes", "HTML hex entities")))
    red = Redactor([value])
    text = f"{around} {ENCODINGS[outer](ENCODINGS[inner](value))} {around}"
    assert red.known_in(text)
    assert not red.known_in(red.text(text))


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(0, 2**64))
def test_a_random_value_never_finds_another_random_values_forms(data: st.DataObject, seed: int) -> None:
    rnd = random.Random(seed)  # random values, not ones hypothesis shrinks towards each other
    alphabet = string.ascii_letters + string.digits + "-_"
    value, other = ("".join(rnd.choice(alphabet) for _ in range(rnd.randint(12, 40))) for _ in range(2))
    red = Redactor([value])
    assert not red.known_in(data.draw(_disguised(other)))


_ANY = st.text(alphabet=st.sampled_from("aZ9 -_\n\t\x00\u00ad\u200bé\u0301ａаΑ\N{ROCKET}\ud800ﬁ\ufffd中"), max_size=20)


@settings(max_examples=300, deadline=None)
@given(_ANY, _ANY)
def test_folding_is_per_character(a: str, b: str) -> None:
    """What lets a stream be folded chunk by chunk, and a folded match be mapped back."""
    assert fold(a + b) == fold(a) + fold(b)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data(), _VALUES, st.integers(0, 3000))
def test_a_disguised_value_is_found_across_any_chunk_edge(
    tmp_path: Path, data: st.DataObject, value: str, pad: int
) -> None:
    known = KnownValues([ValueForms.of(value, Redactor.MIN_VALUE)])
    blob = ("é" * pad + data.draw(_disguised(value)) + " tail").encode()
    cut = data.draw(st.integers(0, len(blob)))
    scan = known.scan()
    assert scan.feed(blob[:cut]) or scan.feed(blob[cut:])


# -- the proposal's file, read in chunks --------------------------------------------------------


def test_a_value_spread_over_megabytes_of_whitespace_is_found_in_a_file(tmp_path: Path) -> None:
    red = Redactor([VALUE])
    path = tmp_path / "spread.txt"
    path.write_bytes(VALUE[:9].encode() + b" " * (3 << 20) + VALUE[9:].encode())
    assert scan_file(path, SecretScanner([]), red) == WITHHELD_VALUE
    path.write_bytes(b"x" * ((1 << 20) - 5) + _b64_inside(VALUE, b"").encode())  # across the 1 MiB edge
    assert scan_file(path, SecretScanner([]), red) == WITHHELD_VALUE
    path.write_bytes(b"\xff".join(c.encode() for c in VALUE))  # invalid bytes between the characters
    assert scan_file(path, SecretScanner([]), red) == WITHHELD_VALUE
    path.write_bytes(b"x" * (2 << 20))
    assert scan_file(path, SecretScanner([]), red) is None


# -- what a withheld file's values are ----------------------------------------------------------

DOCKER_AUTH = base64.b64encode(b"deploy-bot:Hx7-registry-pass-Q2").decode()


@pytest.mark.parametrize(
    "text",
    [
        '{\n  "auths": {\n    "registry.example": {\n      "auth": "' + DOCKER_AUTH + '"\n    }\n  }\n}\n',
        '{"auths": {"registry.example": {"auth": "' + DOCKER_AUTH + '"}}}',
        "_auth=" + DOCKER_AUTH + "\n",
        "  auth: " + DOCKER_AUTH + "\n",
        "  'auth': '" + DOCKER_AUTH + "',\n",
    ],
    ids=["docker config.json", "minified", "npmrc _auth", "yaml", "single quotes"],
)
def test_a_base64_credential_is_registered_whole_and_decoded(text: str) -> None:
    values = file_values(text)
    assert DOCKER_AUTH in values
    assert "deploy-bot:Hx7-registry-pass-Q2" in values and "Hx7-registry-pass-Q2" in values
    assert "deploy-bot" not in values  # a user name alone is no secret
    assert not any(v.endswith(("==", '="', "='")) and v != DOCKER_AUTH for v in values)


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ('"auth": "dXNlcjpwYXNzd29yZA==",', "dXNlcjpwYXNzd29yZA=="),  # was cut at its first '='
        ("DB_PASSWORD=Zq8:with=signs", "Zq8:with=signs"),
        ("export API_TOKEN='Kd9-exported-value'", "Kd9-exported-value"),
        ('SECRET="quoted \\" value"   # a comment', 'quoted " value'),
        ("TOKEN=Nv3-unquoted-value # a comment", "Nv3-unquoted-value"),
        ("//registry.example/:_authToken=Tk5-npm-token-value", "Tk5-npm-token-value"),
        ("password: Yp2=with:colons", "Yp2=with:colons"),
        ('- "password": "listed-Jq4-value"', "listed-Jq4-value"),
        ("user:Hw8-after-a-colon", "Hw8-after-a-colon"),
        ("ALLOWED=[not-json-Rb6", "[not-json-Rb6"),
        ("a-whole-line-token-Vx3", "a-whole-line-token-Vx3"),
        ('PASS="Gk2"joined-by-a-shell', "Gk2joined-by-a-shell"),  # a shell joins the two
        ('PASS="Gk2"joined-by-a-shell', '"Gk2"joined-by-a-shell'),  # and as written
    ],
)
def test_a_lines_value_is_the_real_one(line: str, value: str) -> None:
    assert value in file_values(line + "\n")


def test_the_values_of_a_docker_config_are_masked_and_denied_in_every_form() -> None:
    red = Redactor()
    red.add_file_values('{\n  "auths": {\n    "r.example": {\n      "auth": "' + DOCKER_AUTH + '"\n    }\n  }\n}\n')
    for text in (DOCKER_AUTH, "Hx7-registry-pass-Q2", base64.b64encode(b"Hx7-registry-pass-Q2").decode()):
        shown = red.text(f"x {text} y")
        assert red.known_in(f"x {text} y") and shown.startswith(f"x {MASK}") and not red.known_in(shown)


# -- the tables, threads and cost ---------------------------------------------------------------


def test_the_lookalike_table_is_the_one_its_source_gives() -> None:
    assert foldtable.lookalikes() == computed_lookalikes(), "regenerate: python tests/foldtables.py"


def test_values_added_while_others_mask_are_all_found() -> None:
    red = Redactor()
    values = [f"Kq{i:03d}-concurrent-value" for i in range(200)]
    errors: list[BaseException] = []

    def mask() -> None:
        try:
            for _ in range(200):
                red.text(" ".join(values[:50]))
                red.known_in("nothing here")
        except BaseException as exc:  # pragma: no cover - the assertion below shows it
            errors.append(exc)

    readers = [threading.Thread(target=mask) for _ in range(3)]
    for t in readers:
        t.start()
    for v in values:
        red.add(v)
    for t in readers:
        t.join()
    assert not errors and all(red.known_in(v) for v in values)


@pytest.mark.parametrize(
    "text",
    [
        "\u0301" * 1_000_000,  # combining marks only
        ("a\u200b" * 250_000),  # zero-width characters between letters
        "а" * 1_000_000,  # one Cyrillic look-alike, over and over
        (VALUE[:10] + "\n" + VALUE[10:] + " ") * 30_000,  # a split value, 30,000 times
        " ".join(f"{b:02x}" for b in (VALUE * 12_000).encode())[: 1 << 20],  # hex of the value, repeated
        base64.b64encode(random.Random(1).randbytes(3 << 18)).decode(),  # one run of base64: 4 readings
        _b64(random.Random(2).randbytes(9 << 16).hex()),  # base64 of hex: decoded twice
        ((_b64(_b64(VALUE)) + " ") * 24_000)[: 1 << 20],  # a value 2 layers deep, 24,000 times
        ("QUJDREVGR0hJSktMTU5P " * 50_000)[: 1 << 20],  # 50,000 runs of base64
        ("0x41, " * 175_000)[: 1 << 20],  # hex held apart, one run
        (_hex_apart(", ", "0x{:02x}")(VALUE) + "\n") * 7_400,  # the value in 0x lists
        ("&#97;" * 210_000)[: 1 << 20],  # escapes only
        (_json(VALUE) + " ") * 7_500,  # the value in JSON escapes
        "A" * (1 << 20),  # base64 of zeros: NULs, read as UTF-16
    ],
    ids=[
        "marks",
        "zero-width",
        "look-alikes",
        "split-values",
        "hex-values",
        "base64",
        "base64-of-hex",
        "nested-values",
        "base64-runs",
        "hex-apart",
        "hex-apart-values",
        "entities",
        "escaped-values",
        "zeros",
    ],
)
def test_finding_and_masking_take_linear_time_on_a_hostile_megabyte(text: str) -> None:
    red = Redactor([VALUE, *(f"Mv{i:02d}-other-registered-value" for i in range(29))])
    t0 = time.process_time()
    red.known_in(text)
    shown = red.text(text)
    assert time.process_time() - t0 < 5  # a bound, not a benchmark
    assert not red.known_in(shown)


def test_only_credentials_and_generated_values_are_sought_in_file_names() -> None:
    text = (
        "APP_NAME=shop\nDB_HOST=db01.internal\nBRANCH=feature-1234-login-page\nDB_PASSWORD=hunter2hunter\n"
        "export PLAIN=a plain sentence here\nclient_secret: short\nauth: dXNlcjpQdzlxUmV4N2Jhc2U=\n"
        "sk9f8Q2mZx7Lp4VtR3\n"  # a line that is a token alone
        "ADMIN_PASS=lettersonlypass\nROOT_PW=rootpw123\nSIGNING_KEY=signing-key-value\nSALT=saltysalt\n"
        "OTHER=Xk29fQ8vLmP3zR7wT1b\nBUILD=2024a-build-0001-linux\nKEY_PATH=./keys/dev.key\n"
    )
    names = name_values(text)
    assert {"hunter2hunter", "dXNlcjpQdzlxUmV4N2Jhc2U=", "Pw9qRex7base", "sk9f8Q2mZx7Lp4VtR3"} <= set(names)
    assert {"rootpw123", "Xk29fQ8vLmP3zR7wT1b"} <= set(names)
    plain = {"shop", "db01.internal", "feature-1234-login-page", "a plain sentence here", "short"}
    words = {"lettersonlypass", "signing-key-value", "saltysalt"}  # words under a credential's key
    assert not (plain | words | {"2024a-build-0001-linux", "./keys/dev.key"}) & set(names)
    # the second attack review: a Laravel `.env` and other ordinary settings withheld project folders
    laravel = "SESSION_DRIVER=database\nKEYCLOAK_REALM=storefront\nPOSTGRES_PASSWORD=postgres\nDB_PASSWORD=password\n"
    assert name_values(laravel) == []
    tricky = "DB_PASSWORD=Winter2024.Prod\nCREDS=admin:hunter2hunter2\nWIFI_PSK=c0rrect-horse-battery\n"
    assert {"Winter2024.Prod", "hunter2hunter2", "c0rrect-horse-battery"} <= set(name_values(tricky))
    account = json.dumps({"type": "service_account", "project_id": "shop-prod-2024", "private_key_id": "9f3ac1" * 7})
    assert name_values(account) == ["9f3ac1" * 7]
    red = Redactor()
    red.add_file_values(text)
    assert red.in_name("src/shop/db01.internal/feature-1234-login-page.md") is False
    assert red.in_name("cache/hunter2hunter.json") and red.in_name("x/SK9F8Q2MZX7LP4VTR3")
    again = Redactor()
    again.restore(json.loads(json.dumps(red.export())))  # as a daemon hands it to a run process
    assert again.in_name("cache/hunter2hunter.json") and not again.in_name("shop/")
    assert again.known_in("connecting to db01.internal") and again.names_known == red.names_known
