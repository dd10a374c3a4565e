"""Cost of finding and masking the known values (airlockd/knownvalues.py: every value in base64,
hex, percent-encoded, folded, and beneath an encoding) on 1 MB of text with 30 registered values,
against the exact search it replaced, measured in the same run: one regular expression alternating
the values (`search` for known_in, `sub` for the mask); and Redactor.text whole against
Redactor.text with no values (the patterns alone, most of its cost). Python source and a megabyte
of base64 are where what is beneath an encoding costs most (runs and escapes to decode)."""

from __future__ import annotations

import base64
import random
import re
import string
import time
from collections.abc import Callable
from pathlib import Path

import airlockd
from airlockd.knownvalues import KnownValues, ValueForms
from airlockd.redact import MASK, Redactor

SIZE = 1 << 20
WORDS = ["def", "return", "import", "self", "value", "print", "for", "in", "range", "if", "else", "the", "quick", "fox"]


def _text(rnd: random.Random, extra: list[str]) -> str:
    lines, size = [], 0
    while size < SIZE:
        line = " ".join(rnd.choice(WORDS + extra) for _ in range(10)) + "\n"
        lines.append(line)
        size += len(line)
    return "".join(lines)[:SIZE]


def _source() -> str:
    """1 MB of this package's own source."""
    code = "".join(p.read_text() for p in sorted(Path(airlockd.__file__).parent.rglob("*.py")))
    return (code * (SIZE // len(code) + 1))[:SIZE]


def _best(fn: Callable[[], object], n: int = 5) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def test_bench_known_values() -> None:
    rnd = random.Random(7)
    alphabet = string.ascii_letters + string.digits + "-_"
    values = ["".join(rnd.choice(alphabet) for _ in range(rnd.randint(12, 40))) for _ in range(30)]
    red = Redactor()
    red.add_file_values("".join(f"KEY_{i}={v}\n" for i, v in enumerate(values)))
    known = KnownValues(ValueForms.of(v, Redactor.MIN_VALUE) for v in values)
    exact = re.compile("|".join(re.escape(v) for v in sorted(values, key=len, reverse=True)))
    patterns_only = Redactor()
    plain = _text(rnd, [])
    texts = {
        "ASCII, no value": plain,
        "some non-ASCII, no value": _text(rnd, ["café", "naïve", "—", "“quoted”"]),
        "ASCII, 10 values": "".join(plain[i * (SIZE // 10) : (i + 1) * (SIZE // 10)] + values[i] for i in range(10)),
        "Python source": _source(),
        "base64": base64.b64encode(rnd.randbytes(SIZE * 3 // 4)).decode(),
    }
    print("\nknown values, 1 MB, 30 values, ms (best of 5); baseline: one regex alternating the values")
    for name, text in texts.items():
        found = _best(lambda text=text: red.known_in(text))
        search = _best(lambda text=text: exact.search(text))
        mask = _best(lambda text=text: known.mask(text, MASK))
        sub = _best(lambda text=text: exact.sub(MASK, text))
        whole = _best(lambda text=text: red.text(text), 3)
        patterns = _best(lambda text=text: patterns_only.text(text), 3)
        print(
            f"{name:25s} known_in {found:5.1f} / regex search {search:5.1f} = {found / search:4.2f}"
            f" | mask {mask:5.1f} / regex sub {sub:5.1f} = {mask / sub:4.2f}"
            f" | Redactor.text {whole:5.0f} / patterns alone {patterns:5.0f} = {whole / patterns:4.2f}"
        )
        assert red.known_in(text) == (exact.search(text) is not None)
