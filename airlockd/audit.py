"""The audit trail: one JSON line per decision, redacted, hash-chained, appended under a lock.

Each event holds the digest of the one before it, so editing, deleting, inserting or reordering
any event breaks the chain at that event, which `verify` names.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from airlockd.redact import Redactor

GENESIS = "0" * 64


def _digest(event: dict[str, Any]) -> str:
    body = {k: v for k, v in event.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _last_line(path: Path) -> bytes | None:
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        end = fh.tell()
        pos, buf = end, b""
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            fh.seek(pos)
            buf = fh.read(step) + buf
            lines = buf.rstrip(b"\n").rsplit(b"\n", 1)
            if len(lines) == 2 or pos == 0:
                return lines[-1] or None
    return None


@dataclass(frozen=True)
class ChainBreak:
    line: int
    seq: int | None
    problem: str


class AuditLog:
    def __init__(self, path: Path, redactor: Redactor, *, fsync: bool = True, chain: bool = True) -> None:
        self.path = path
        self.redactor = redactor
        self.fsync = fsync
        self.chain = chain
        self._lock = FileLock(str(path) + ".lock", timeout=30)

    def append(
        self,
        kind: str,
        *,
        run: str | None = None,
        agent: str | None = None,
        policy: str | None = None,
        **data: Any,
    ) -> dict[str, Any]:
        """Record one event; every string in it is redacted first."""
        with self._lock:
            prev, seq = GENESIS, 0
            if self.path.exists() and (last := _last_line(self.path)):
                tail = json.loads(last)
                prev, seq = tail.get("hash", GENESIS), int(tail["seq"]) + 1
            event: dict[str, Any] = {
                "seq": seq,
                "at": round(time.time(), 6),
                "kind": kind,
                "run": run,
                "agent": agent,
                "policy": policy,
                "data": self.redactor.value(data),
                "prev": prev,
            }
            if self.chain:
                event["hash"] = _digest(event)
            line = (json.dumps(event, sort_keys=True, separators=(",", ":")) + "\n").encode()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            return event

    def events(self, run: str | None = None) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with self.path.open("rb") as fh:
            for raw in fh:
                if raw.strip():
                    ev = json.loads(raw)
                    if run is None or ev.get("run") == run:
                        yield ev

    def verify(self) -> ChainBreak | None:
        """None when the whole chain holds; else the first event that does not fit."""
        if not self.path.exists():
            return None
        prev, expect_seq = GENESIS, 0
        with self.path.open("rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                try:
                    ev = json.loads(raw)
                except json.JSONDecodeError:
                    return ChainBreak(lineno, None, "not valid JSON")
                seq = ev.get("seq")
                if ev.get("prev") != prev:
                    return ChainBreak(
                        lineno,
                        seq,
                        "does not follow the event before it (deleted, inserted or reordered)",
                    )
                if ev.get("hash") != _digest(ev):
                    return ChainBreak(lineno, seq, "content does not match its hash (edited)")
                if seq != expect_seq:
                    return ChainBreak(lineno, seq, f"sequence number {seq}, expected {expect_seq}")
                prev, expect_seq = ev["hash"], expect_seq + 1
        return None
