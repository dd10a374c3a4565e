"""Cost of the audit trail: events/s appended with the hash chain and fsync, against plain
appends (no chain, no head, no fsync) measured in the same run; also chain without fsync. And
what a long history costs: a run's timeline and an append on a log of 100,000 events against one
of 100, measured in the same run. Prints the figures; never asserts on speed.

    .venv/bin/pytest -q -s tests/bench/test_bench_audit.py -p no:cacheprovider
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from airlockd.evidence.audit import AuditLog
from airlockd.redact import Redactor

N = 2000


def _rate(log: AuditLog, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        log.append("classify", run="r1", agent="bot", policy="abcd", path=f"src/f{i}.py", decision="auto", rule="r")
    return n / (time.perf_counter() - start)


def test_bench_audit(tmp_path: Path) -> None:
    red = Redactor()
    plain = _rate(AuditLog(tmp_path / "plain.jsonl", red, fsync=False, chain=False), N)
    plain_fsync = _rate(AuditLog(tmp_path / "plain-fsync.jsonl", red, fsync=True, chain=False), N // 4)
    chain = _rate(AuditLog(tmp_path / "chain.jsonl", red, fsync=False, chain=True), N)
    full = _rate(AuditLog(tmp_path / "full.jsonl", red, fsync=True, chain=True), N // 4)
    assert AuditLog(tmp_path / "full.jsonl", red).verify() is None
    print(
        f"\naudit append, events/s: plain {plain:,.0f} | plain+fsync {plain_fsync:,.0f} | chain {chain:,.0f}"
        f" | chain+fsync {full:,.0f}\n"
        f"chain+fsync / plain (no chain, no fsync) = {full / plain:.3f}\n"
        f"chain+fsync / plain+fsync (the chain's own cost) = {full / plain_fsync:.3f}"
    )
    assert full > 0


HISTORY = 100_000  # events of 10,000 past runs
SMALL = 100
PER_RUN = 10


def _history(path: Path, n: int) -> AuditLog:
    log = AuditLog(path, Redactor(), fsync=False)
    for i in range(n):
        log.append("classify", run=f"r{i // PER_RUN:06d}", agent="bot", policy="abcd", path=f"src/f{i}.py", rule="r")
    return log


def _median_s(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _appends(small: AuditLog, big: AuditLog, rounds: int) -> tuple[list[float], list[float]]:
    """Seconds of each append, one on each log in turn (both see the same machine load)."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(rounds):
        for log, out in zip((small, big), times, strict=True):
            start = time.perf_counter()
            log.append("classify", run="rnew", agent="bot", policy="abcd", path=f"src/g{i}.py", rule="r")
            out.append(time.perf_counter() - start)
    return times


def test_bench_audit_history(tmp_path: Path) -> None:
    """A run's timeline and an append on a log of 100,000 events (sealed into 4 MiB segments) ÷
    the same on a log of 100; also the timeline read from the same events in one file, as
    before segments."""
    small = _history(tmp_path / "small" / "audit.jsonl", SMALL)
    big = _history(tmp_path / "big" / "audit.jsonl", HISTORY)
    segments = len(big.segments.entries())
    one = tmp_path / "one" / "audit.jsonl"
    one.parent.mkdir()
    one.write_bytes(b"".join(big.snapshot()[0].splitlines(keepends=True)))
    flat = AuditLog(one, Redactor(), fsync=False, segment_bytes=1 << 40)
    run_small, run_big = f"r{SMALL // PER_RUN // 2:06d}", f"r{HISTORY // PER_RUN // 2:06d}"
    assert len(list(big.events(run=run_big))) == PER_RUN == len(list(flat.events(run=run_big)))
    t_small = _median_s(lambda: list(small.events(run=run_small)), 21)
    t_big = _median_s(lambda: list(big.events(run=run_big)), 21)
    t_flat = _median_s(lambda: list(flat.events(run=run_big)), 5)
    appends = _appends(small, big, 1000)
    (a_small, a_big), (m_small, m_big) = map(statistics.median, appends), map(statistics.mean, appends)
    assert big.verify() is None
    print(
        f"\naudit history: {HISTORY:,} events in {segments} sealed segments + the active one, against {SMALL}\n"
        f"events(run): {t_big * 1e3:.2f} ms / {t_small * 1e3:.2f} ms = {t_big / t_small:.1f}x"
        f"  (the same events in one file, as before segments: {t_flat * 1e3:.1f} ms, {t_flat / t_small:.0f}x)\n"
        f"append (median): {a_big * 1e6:.0f} us / {a_small * 1e6:.0f} us = {a_big / a_small:.2f}x"
        f"  (mean, a seal's cost spread: {m_big * 1e6:.0f} us / {m_small * 1e6:.0f} us = {m_big / m_small:.2f}x)"
    )
