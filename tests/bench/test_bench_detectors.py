"""Benchmark: the content detectors' scan with Hyperscan's one pass ÷ with `re` alone, same buffers.

    .venv/bin/pytest tests/bench/test_bench_detectors.py -s -q

What staging scans (staging/secretscan.py, `SecretScanner.first_hit`), with the default policy's
detectors: 150 MiB of random bytes (treegen's large binary files) in 1 MiB windows carried over by
the scanner's overlap, as a streamed file is; and 20,000 files of pseudo source (treegen's pool,
its size distribution: 70-odd MB), each a buffer. Both contenders give the same verdict on every
buffer (asserted: none fires). Rounds alternate (re alone, prefilter, ...), one untimed round of
each first; reported: min and median of ROUNDS timed rounds, and ratios. Printed, never asserted.
"""

from __future__ import annotations

import functools
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from treegen import _text_pool

from airlockd.policy import load_policy
from airlockd.staging.secretscan import SecretScanner

ROUNDS = 3
CHUNK = 1 << 20
pytestmark = pytest.mark.slow


def _buffers() -> tuple[bytes, list[bytes]]:
    rnd = random.Random(20_240_601)
    binary = rnd.randbytes(150 * CHUNK)
    pool = _text_pool(rnd, 4 * CHUNK)
    texts = []
    for i in range(20_000):
        size = 0 if rnd.random() < 0.02 else min(int(rnd.lognormvariate(7.6, 1.1)), 256 * 1024)
        off = rnd.randrange(0, len(pool) - size - 1)
        texts.append(f"# f{i:05d}.py\n".encode() + pool[off : off + size])
    return binary, texts


def _binary(scanner: SecretScanner, data: bytes) -> None:
    tail = b""
    for at in range(0, len(data), CHUNK):
        window = tail + data[at : at + CHUNK]
        assert scanner.first_hit(window) is None
        tail = window[-scanner.overlap :]


def _texts(scanner: SecretScanner, texts: list[bytes]) -> None:
    for t in texts:
        assert scanner.first_hit(t) is None


def _timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def test_bench_detectors() -> None:
    detectors = load_policy(Path("/nonexistent")).policy.withhold.detectors
    binary, texts = _buffers()
    scanners = {
        "re alone": SecretScanner(detectors, prefilter=False),
        "prefilter": SecretScanner(detectors, prefilter=True),
    }
    if scanners["prefilter"].prefilter is None:
        pytest.skip("Hyperscan is not installed here: nothing to compare")
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(ROUNDS + 1):
        for label, scanner in scanners.items():
            for kind, took in (
                ("binary", _timed(functools.partial(_binary, scanner, binary))),
                ("text", _timed(functools.partial(_texts, scanner, texts))),
            ):
                if r:  # round 0 is the warm-up
                    times.setdefault((label, kind), []).append(took)
    mb_text = sum(map(len, texts)) / 1e6
    print(f"\n=== detectors ({len(detectors)}): Hyperscan's pass ÷ re alone, {ROUNDS} rounds after 1 untimed ===")
    kinds = (("binary", f"{len(binary) / 1e6:.0f} MB of random bytes"), ("text", f"{mb_text:.0f} MB of source"))
    for kind, what in kinds:
        row = {label: times[(label, kind)] for label in scanners}
        for label, ts in row.items():
            print(f"  {what:28} {label:10} min {min(ts):6.3f} s, median {statistics.median(ts):6.3f} s")
        ratio = min(row["prefilter"]) / min(row["re alone"])
        print(f"  {what:28} prefilter ÷ re alone: {ratio:.2f} of mins")
