"""The audit trail: one JSON line per decision, redacted, hash-chained, appended under a lock.

Each event holds the digest of the one before it, so editing, deleting, inserting or reordering
any event breaks the chain at that event, which `verify` names. A head file beside the log
(`audit.jsonl.head`: the last seq and hash, replaced atomically on each append) catches what a
chain alone cannot: events cut from, or added to, the end. With a `signer`, every
CHECKPOINT_EVERY events a signed checkpoint (seq, hash, time) is appended to
`audit.jsonl.checkpoints`; someone holding only the public key can then tell a log cut below, or
rewritten at or before, its last checkpoint (signing.verify_checkpoints), even when the head file
was rewritten to match. `docs/audit.md` has the format.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from airlockd.fsutil import LOCK_POLL_S
from airlockd.redact import Redactor

GENESIS = "0" * 64
CHECKPOINT_EVERY = 64
MAX_STRING = 4096  # characters of one string in an event's data
MAX_ITEMS = 200  # entries of one list or object in an event's data
Signer = Callable[[bytes], bytes]


def checkpoint_message(seq: int, digest: str, at: float) -> bytes:
    """The exact bytes a checkpoint's signature covers."""
    return f"airlockd-audit-checkpoint\n{seq}\n{digest}\n{at:.6f}\n".encode()


def bounded(value: Any, depth: int = 0) -> Any:
    """`value` with every string cut to MAX_STRING characters and every list or object to
    MAX_ITEMS entries, each cut saying how much went (an agent's output or change set, however
    large or deep, makes an event of bounded size). Cuts happen before redaction sees the text."""
    if isinstance(value, str):
        if len(value) <= MAX_STRING:
            return value
        return value[:MAX_STRING] + f"… [{len(value) - MAX_STRING} more characters]"
    if depth > 8:
        return "[nested too deep]"
    if isinstance(value, dict):
        items = list(value.items())
        out = {str(k)[:200]: bounded(v, depth + 1) for k, v in items[:MAX_ITEMS]}
        if len(items) > MAX_ITEMS:
            out["…"] = f"{len(items) - MAX_ITEMS} more entries"
        return out
    if isinstance(value, list | tuple):
        head = [bounded(v, depth + 1) for v in value[:MAX_ITEMS]]
        return head + ([f"… {len(value) - MAX_ITEMS} more"] if len(value) > MAX_ITEMS else [])
    return value


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
    def __init__(
        self,
        path: Path,
        redactor: Redactor,
        *,
        fsync: bool = True,
        chain: bool = True,
        signer: Signer | None = None,
        checkpoint_every: int = CHECKPOINT_EVERY,
    ) -> None:
        self.path = path
        self.redactor = redactor
        self.fsync = fsync
        self.chain = chain
        self.signer = signer
        self.checkpoint_every = checkpoint_every
        self.head = Path(str(path) + ".head")
        self.checkpoints = Path(str(path) + ".checkpoints")
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
        with self._lock.acquire(poll_interval=LOCK_POLL_S):
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
                "data": self.redactor.value(bounded(data)),
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
            if self.chain:
                self._write_head(seq, event["hash"])
                if self.signer is not None and (seq + 1) % self.checkpoint_every == 0:
                    self._checkpoint(seq, event["hash"])
            return event

    def _checkpoint(self, seq: int, digest: str) -> None:
        assert self.signer is not None
        at = round(time.time(), 6)
        sig = base64.b64encode(self.signer(checkpoint_message(seq, digest, at))).decode()
        line = json.dumps({"seq": seq, "hash": digest, "at": at, "sig": sig}, sort_keys=True) + "\n"
        fd = os.open(self.checkpoints, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _write_head(self, seq: int, digest: str) -> None:
        """Replace the head file atomically: readers see the old head or the new one."""
        tmp = self.head.with_name(f".{self.head.name}.tmp-{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, json.dumps({"seq": seq, "hash": digest}).encode())
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.head)

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
        """None when the whole chain holds and ends where the head says; else the first event
        that does not fit."""
        if not self.path.exists():
            return None
        # an append between reading the log and its head is not a break
        with self._lock.acquire(poll_interval=LOCK_POLL_S):
            with self.path.open("rb") as fh:
                brk, last = verify_lines(fh)
            if brk is not None or (last[0] == 0 and not self.head.exists()):
                return brk
            if not self.head.exists():
                return ChainBreak(
                    last[0],
                    last[1],
                    f"the head file {self.head.name} is missing: events cut from or added to the end "
                    "cannot be ruled out",
                )
            try:
                head = json.loads(self.head.read_bytes())
                head_seq, head_hash = int(head["seq"]), str(head["hash"])
            except (ValueError, KeyError, TypeError):
                return ChainBreak(last[0] + 1, None, f"the head file {self.head.name} is unreadable")
        count, last_seq, last_hash = last
        if last_seq is None or last_seq < head_seq:
            return ChainBreak(
                count + 1,
                (last_seq + 1) if last_seq is not None else 0,
                f"the log ends before seq {head_seq}, the last event written: events at its end were deleted",
            )
        if last_seq > head_seq:
            return ChainBreak(
                head_seq + 2,
                head_seq + 1,
                f"events after seq {head_seq} were not written by airlockd (appended to the log afterwards)",
            )
        if last_hash != head_hash:
            return ChainBreak(count, last_seq, "the last event is not the one airlockd wrote (replaced)")
        return None


def verify_lines(
    lines: Iterable[bytes], keep: dict[int, str] | None = None
) -> tuple[ChainBreak | None, tuple[int, int | None, str]]:
    """Check a hash chain from its first event: (the first break or None, (events read, last
    seq, last hash)). Used for the live log and for exports, which need nothing else. With
    `keep`, the hash of each seq in it is filled in as the chain passes it."""
    prev, expect_seq, count = GENESIS, 0, 0
    last_seq: int | None = None
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            return ChainBreak(lineno, None, "empty line"), (count, last_seq, prev)
        try:
            ev = json.loads(raw)
        except json.JSONDecodeError:
            return ChainBreak(lineno, None, "not valid JSON"), (count, last_seq, prev)
        if not isinstance(ev, dict):
            return ChainBreak(lineno, None, "not a JSON object"), (count, last_seq, prev)
        seq = ev.get("seq")
        if ev.get("prev") != prev:
            return (
                ChainBreak(lineno, seq, "does not follow the event before it (deleted, inserted or reordered)"),
                (count, last_seq, prev),
            )
        if ev.get("hash") != _digest(ev):
            return ChainBreak(lineno, seq, "content does not match its hash (edited)"), (count, last_seq, prev)
        if seq != expect_seq:
            return ChainBreak(lineno, seq, f"sequence number {seq}, expected {expect_seq}"), (count, last_seq, prev)
        prev, expect_seq, count, last_seq = ev["hash"], expect_seq + 1, count + 1, seq
        if keep is not None and seq in keep:
            keep[seq] = prev
    return None, (count, last_seq, prev)
