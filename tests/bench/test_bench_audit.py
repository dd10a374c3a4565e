"""Cost of the audit trail: events/s appended with the hash chain and fsync, against plain
appends (no chain, no head, no fsync) measured in the same run; also chain without fsync."""

from __future__ import annotations

import time
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
