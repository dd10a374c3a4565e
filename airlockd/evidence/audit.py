"""The audit trail: one JSON line per decision, redacted, hash-chained, appended under a lock.

Each event holds the digest of the one before it, so editing, deleting, inserting or reordering
any event breaks the chain at that event, which `verify` names. A head file beside the log
(`audit.jsonl.head`: the last seq and hash, replaced atomically on each append) catches what a
chain alone cannot: events cut from, or added to, the end. With a `signer`, every
CHECKPOINT_EVERY events a signed checkpoint (seq, hash, time) is appended to
`audit.jsonl.checkpoints`; someone holding only the public key can then tell a log cut below, or
rewritten at or before, its last checkpoint (signing.verify_checkpoints), even when the head file
was rewritten to match.

The log does not grow into one file: past `segment_bytes` the active segment is sealed into
`audit/` beside it and listed in a manifest with the runs it holds, so a run's timeline reads only
its segments, and old segments can be dropped leaving anchors the chain is taken up from
(segments.py). `docs/audit.md` has the format.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from itertools import takewhile
from pathlib import Path
from typing import IO, Any

from filelock import FileLock

from airlockd.errors import AirlockError
from airlockd.evidence.chain import GENESIS, ChainBreak, ChainEnd, check, digest, verify_lines
from airlockd.evidence.segments import Segment, Segments, last_line
from airlockd.fsutil import LOCK_POLL_S
from airlockd.redact import Redactor

CHECKPOINT_EVERY = 64
MAX_STRING = 4096  # characters of one string in an event's data
MAX_ITEMS = 200  # entries of one list or object in an event's data
SEGMENT_BYTES = 1 << 20  # the active segment is sealed once it holds this much (a timeline reads it whole)
Signer = Callable[[bytes], bytes]
__all__ = ["GENESIS", "AuditLog", "ChainBreak", "ChainEnd", "bounded", "checkpoint_message", "verify_lines"]


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
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        self.path = path
        self.redactor = redactor
        self.fsync = fsync
        self.chain = chain
        self.signer = signer
        self.checkpoint_every = checkpoint_every
        self.segment_bytes = segment_bytes
        self.head = Path(str(path) + ".head")
        self.checkpoints = Path(str(path) + ".checkpoints")
        self.segments = Segments(path, fsync=fsync)
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
            self.segments.recover()
            last = last_line(self.path, heal=True)
            if last is not None and os.stat(self.path).st_size >= self.segment_bytes:
                self.segments.seal(self.segment_bytes)
            prev, seq = self._next(last)
            if self.chain and self.signer is not None and seq and seq % self.checkpoint_every == 0:
                self._checkpoint_missed(seq - 1, prev)
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
                event["hash"] = digest(event)
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

    def _next(self, last: bytes | None) -> tuple[str, int]:
        """The `prev` and `seq` of the next event: after the active segment's last event, or,
        when the active segment is new, the last sealed one's."""
        if last is not None:
            tail = json.loads(last)
            return tail.get("hash", GENESIS), int(tail["seq"]) + 1
        sealed = self.segments.last_entry()
        if sealed is not None:
            return sealed.hash or GENESIS, sealed.last_seq + 1
        return GENESIS, 0

    def _checkpoint_missed(self, seq: int, digest: str) -> None:
        """The checkpoint of the event before, when a crash came between that event and its
        checkpoint (which would read as events removed)."""
        try:
            tail = last_line(self.checkpoints, heal=True) if self.checkpoints.exists() else None
            done = tail is not None and int(json.loads(tail)["seq"]) >= seq
        except (ValueError, KeyError, TypeError):
            done = False  # an unreadable tail: verify names it; a new checkpoint does no harm
        if not done:
            self._checkpoint(seq, digest)

    def _checkpoint(self, seq: int, digest: str) -> None:
        at = round(time.time(), 6)
        sig = self._sign(checkpoint_message(seq, digest, at))
        line = json.dumps({"seq": seq, "hash": digest, "at": at, "sig": sig}, sort_keys=True)
        fd = os.open(self.checkpoints, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _sign(self, message: bytes) -> str:
        assert self.signer is not None
        return base64.b64encode(self.signer(message)).decode()

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
        """The events in seq order; with `run`, that run's, read from the active segment and the
        sealed segments whose manifest entry lists the run, no others. Takes no lock: the active
        segment is opened first, so a seal meanwhile moves what this reads under its new name
        (the manifest entries from the one for the segment held open on are passed over) and no
        event is read twice."""
        with ExitStack() as stack:
            try:
                active: IO[bytes] | None = stack.enter_context(self.path.open("rb"))
            except FileNotFoundError:
                active = None
            start = _first_seq(active)
            for seg in self.segments.kept(run):
                if start is not None and seg.first_seq >= start:
                    break  # sealed meanwhile, or its rename still to come: these are in `active`
                if run is not None and not seg.holds(run):
                    continue
                try:
                    data = (self.segments.dir / seg.file).read_bytes()
                except FileNotFoundError:
                    continue  # dropped meanwhile
                yield from _select(data, run)
            if active is not None:
                yield from _select(active.read(), run)

    def verify(self) -> ChainBreak | None:
        """None when the whole chain holds, across every kept segment, and ends where the head
        says; else the first thing that does not fit (the file and its line)."""
        # an append between reading the log and its head is not a break
        with self._lock.acquire(poll_interval=LOCK_POLL_S):
            brk, end = self.verify_chain()
            if brk is not None or (end.last_seq is None and not self.head.exists()):
                return brk
            where = end.file or self.path.name
            if not self.head.exists():
                return ChainBreak(
                    end.line,
                    end.last_seq,
                    f"the head file {self.head.name} is missing: events cut from or added to the end "
                    "cannot be ruled out",
                    where,
                )
            try:
                head = json.loads(self.head.read_bytes())
                head_seq, head_hash = int(head["seq"]), str(head["hash"])
            except (ValueError, KeyError, TypeError):
                return ChainBreak(end.line + 1, None, f"the head file {self.head.name} is unreadable", self.head.name)
        return _against_head(end, head_seq, head_hash, where)

    def verify_chain(self, keep: dict[int, str] | None = None) -> tuple[ChainBreak | None, ChainEnd]:
        """The chain alone, head file aside (what the signed checkpoints are checked against):
        the anchors, the manifest, each kept sealed segment in order (its events, then its bytes
        against the manifest), then the active segment, as one chain. A seal or a drop a crash
        left half done is finished first. `keep` as for verify_lines."""
        with self._lock.acquire(poll_interval=LOCK_POLL_S):
            self.segments.recover()
            return check(self.segments, keep)

    def snapshot(self) -> tuple[bytes, tuple[str, int]]:
        """The lines of every kept segment and the active one, byte for byte and in order (what an
        export holds), with the `prev` and `seq` its first event follows (not the genesis once
        segments were dropped). Read under the lock: no seal or drop moves a file meanwhile."""
        with self._lock.acquire(poll_interval=LOCK_POLL_S):
            self.segments.recover()
            kept = self.segments.kept()
            parts = [(self.segments.dir / seg.file).read_bytes() for seg in kept]
            parts.append(self.path.read_bytes() if self.path.exists() else b"")
            anchors = self.segments.anchor_list()
        start = (anchors[-1].hash or GENESIS, anchors[-1].last_seq + 1) if anchors else (GENESIS, 0)
        return b"".join(parts), start

    def drop_before(self, at: float) -> list[str]:
        """Drop the oldest sealed segments whose events are all older than `at` (Unix time),
        oldest first and never the active one; an anchor stands for each, so what is kept still
        verifies. Returns the manifest names of the files dropped (oldest first; [] when none).
        Refuses (AirlockError) a segment whose bytes are not the ones sealed: a drop must not
        erase the trace of an edit. Writes no event: the caller records what it dropped."""
        with self._lock.acquire(poll_interval=LOCK_POLL_S):
            self.segments.recover()
            doomed = self._older(at)
            for seg in doomed:
                _check_sealed_bytes(self.segments, seg)
            if doomed:
                self.segments.drop(doomed, self._sign if self.signer is not None else None)
            return [seg.file for seg in doomed]

    def droppable_before(self, at: float) -> list[str]:
        """What drop_before(at) would drop now; changes nothing (a dry run)."""
        return [seg.file for seg in self._older(at)]

    def _older(self, at: float) -> list[Segment]:
        return list(takewhile(lambda s: s.last_at < at, self.segments.kept()))


def _first_seq(fh: IO[bytes] | None) -> int | None:
    if fh is None:
        return None
    first = fh.readline()
    fh.seek(0)
    return int(json.loads(first)["seq"]) if first.endswith(b"\n") else None


def _select(data: bytes, run: str | None) -> Iterator[dict[str, Any]]:
    """The events in a segment's complete lines; with `run`, only its: a line without the run's
    JSON string is passed over unparsed, which makes reading a segment for a run a byte search."""
    end = data.rfind(b"\n") + 1
    if run is None:
        yield from (json.loads(raw) for raw in data[:end].splitlines() if raw.strip())
        return
    needle = json.dumps(run).encode()
    i = data.find(needle, 0, end)
    while i >= 0:
        lo, hi = data.rfind(b"\n", 0, i) + 1, data.find(b"\n", i)
        ev = json.loads(data[lo:hi])
        if ev.get("run") == run:
            yield ev
        i = data.find(needle, hi, end)


def _check_sealed_bytes(segments: Segments, seg: Segment) -> None:
    try:
        data = (segments.dir / seg.file).read_bytes()
    except FileNotFoundError:
        raise AirlockError(
            f"not dropped: the sealed segment {segments.rel(seg.file)} is missing",
            hint="`airlockd audit --verify` says what else is wrong; keep the log as it is for investigation",
        ) from None
    if hashlib.sha256(data).hexdigest() != seg.sha256:
        raise AirlockError(
            f"not dropped: {segments.rel(seg.file)} is not the segment that was sealed (SHA-256 differs)",
            hint="`airlockd audit --verify` names the event; keep the log as it is for investigation",
        )


def _against_head(end: ChainEnd, head_seq: int, head_hash: str, where: str) -> ChainBreak | None:
    """The end of a chain that holds, against the head file's last seq and hash."""
    last_seq = end.last_seq
    if last_seq is None or last_seq < head_seq:
        return ChainBreak(
            end.line + 1,
            (last_seq + 1) if last_seq is not None else 0,
            f"the log ends before seq {head_seq}, the last event written: events at its end were deleted",
            where,
        )
    if last_seq > head_seq:
        return ChainBreak(
            max(1, end.line - (last_seq - head_seq) + 1),
            head_seq + 1,
            f"events after seq {head_seq} were not written by airlockd (appended to the log afterwards)",
            where,
        )
    if end.last_hash != head_hash:
        return ChainBreak(end.line, last_seq, "the last event is not the one airlockd wrote (replaced)", where)
    return None
