"""Checking the audit log's hash chain: a run of lines (an export, one file), and the whole log
across its anchors, sealed segments and active segment, as one chain.

Each event names the hash of the one before it, so a break is found at the first event that does
not fit; across files the first event of each must follow the last of the one before, and each
sealed file must still be the bytes its manifest entry recorded. Dropped segments are known only by
their anchors: the chain is taken up after the last one (its hash and next seq).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from airlockd.evidence.segments import ANCHORS, MANIFEST, Anchor, Segment, Segments, complete_lines, run_list

GENESIS = "0" * 64


def digest(event: dict[str, Any]) -> str:
    body = {k: v for k, v in event.items() if k != "hash"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class ChainBreak:
    line: int  # within `file`
    seq: int | None
    problem: str
    file: str | None = None  # relative to the log's directory ("audit/...jsonl"); None: lines given


@dataclass(frozen=True)
class ChainEnd:
    """Where a chain that holds ends."""

    events: int  # events checked: those of the kept segments and the active one
    dropped: int  # events before them, dropped, which the anchors stand for
    last_seq: int | None
    last_hash: str
    file: str | None  # the file holding the last event
    line: int  # its line there


def verify_lines(
    lines: Iterable[bytes],
    keep: dict[int, str] | None = None,
    *,
    start: tuple[str, int] = (GENESIS, 0),
    runs: set[str] | None = None,
) -> tuple[ChainBreak | None, tuple[int, int | None, str]]:
    """Check a hash chain from its first event: (the first break or None, (events read, last
    seq, last hash)). Used for the live log and for exports, which need nothing else. With
    `keep`, the hash of each seq in it is filled in as the chain passes it; `start` is the
    `prev` and `seq` the first event must have (a segment's, or an export's after a drop);
    `runs` collects the run of each event."""
    prev, expect_seq = start
    count = 0
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
        if ev.get("hash") != digest(ev):
            return ChainBreak(lineno, seq, "content does not match its hash (edited)"), (count, last_seq, prev)
        if seq != expect_seq:
            return ChainBreak(lineno, seq, f"sequence number {seq}, expected {expect_seq}"), (count, last_seq, prev)
        prev, expect_seq, count, last_seq = ev["hash"], expect_seq + 1, count + 1, seq
        if keep is not None and seq in keep:
            keep[seq] = prev
        if runs is not None and isinstance(ev.get("run"), str):
            runs.add(ev["run"])
    return None, (count, last_seq, prev)


def _hashing(lines: Iterable[bytes], sha: Any) -> Iterator[bytes]:
    for raw in lines:
        sha.update(raw)
        yield raw


class Checker:
    """One pass over the whole log (under its lock, after a half-done seal or drop was finished)."""

    def __init__(self, segments: Segments, keep: dict[int, str] | None) -> None:
        self.segs = segments
        self.keep = keep
        self.prev, self.seq, self.dropped, self.events = GENESIS, 0, 0, 0
        self.last_seq: int | None = None
        self.file: str | None = None
        self.line = 0

    def end(self) -> ChainEnd:
        return ChainEnd(self.events, self.dropped, self.last_seq, self.prev, self.file, self.line)

    def run(self) -> tuple[ChainBreak | None, ChainEnd]:
        anchors: dict[int, Anchor] = {}
        brk = self._anchors(anchors)
        kept: list[Segment] = []
        brk = brk or self._manifest(anchors, kept)
        for seg in kept:
            brk = brk or self._sealed(seg)
        brk = brk or self._active()
        return brk, self.end()

    def _anchors(self, anchors: dict[int, Anchor]) -> ChainBreak | None:
        """The anchors, contiguous from seq 0: the chain starts after the last of them."""
        where = self.segs.rel(ANCHORS)
        for n, raw in enumerate(complete_lines(self.segs.anchors), 1):
            try:
                a = Anchor.parse(raw)
            except (ValueError, KeyError, TypeError):
                return ChainBreak(n, None, "not an anchor (unreadable)", where)
            if a.first_seq != self.seq or a.count != a.last_seq - a.first_seq + 1 or a.count < 1:
                problem = f"the anchor of seq {a.first_seq}-{a.last_seq} does not follow the one before"
                return ChainBreak(n, a.first_seq, problem, where)
            anchors[a.first_seq] = a
            self.prev, self.seq, self.last_seq = a.hash or GENESIS, a.last_seq + 1, a.last_seq
            self.dropped = self.seq
        return None

    def _manifest(self, anchors: dict[int, Anchor], kept: list[Segment]) -> ChainBreak | None:
        """The manifest lists contiguous ranges from seq 0; those the anchors cover were dropped
        (same range, hashes and bytes, and the file gone), the rest are `kept`."""
        where, expect = self.segs.rel(MANIFEST), 0
        for n, raw in enumerate(complete_lines(self.segs.manifest), 1):
            try:
                seg = Segment.parse(raw)
            except (ValueError, KeyError, TypeError):
                return ChainBreak(n, None, "not a segment entry (unreadable)", where)
            if seg.first_seq != expect or seg.last_seq < seg.first_seq:
                return ChainBreak(
                    n,
                    seg.first_seq,
                    f"{seg.file} starts at seq {seg.first_seq}, expected {expect}: an entry was removed or moved",
                    where,
                )
            expect = seg.last_seq + 1
            if seg.first_seq >= self.seq:
                kept.append(seg)
                continue
            a = anchors.get(seg.first_seq)
            if a is None or (a.last_seq, a.hash, a.sha256, a.count) != (seg.last_seq, seg.hash, seg.sha256, seg.count):
                return ChainBreak(n, seg.first_seq, f"{seg.file} was dropped, but not as its anchor says", where)
            if (self.segs.dir / seg.file).exists():
                return ChainBreak(
                    1,
                    seg.first_seq,
                    f"this segment was dropped (its anchor is in {ANCHORS}) but is there again",
                    self.segs.rel(seg.file),
                )
        if self.seq > expect:
            return ChainBreak(len(anchors), self.seq - 1, "the anchors cover seqs no segment entry lists", where)
        return None

    def _sealed(self, seg: Segment) -> ChainBreak | None:
        where = self.segs.rel(seg.file)
        sha, runs = hashlib.sha256(), set[str]()
        try:
            with (self.segs.dir / seg.file).open("rb") as fh:
                brk, (count, last_seq, last_hash) = self._lines(_hashing(fh, sha), where, runs)
        except FileNotFoundError:
            return ChainBreak(
                1, seg.first_seq, f"this sealed segment is missing: seq {seg.first_seq}-{seg.last_seq} removed", where
            )
        if brk is not None:
            return brk
        if (count, last_seq) != (seg.count, seg.last_seq):
            how = "events at its end were cut" if count < seg.count else "events were added to it after it was sealed"
            return ChainBreak(
                min(count, seg.count) + 1,
                seg.first_seq + min(count, seg.count),
                f"the segment ends at seq {last_seq}, its manifest entry at {seg.last_seq}: {how}",
                where,
            )
        if sha.hexdigest() != seg.sha256 or last_hash != seg.hash or run_list(runs) != seg.runs:
            return ChainBreak(
                count, last_seq, "the segment's bytes are not the ones sealed (its manifest entry differs)", where
            )
        return None

    def _active(self) -> ChainBreak | None:
        try:
            with self.segs.active.open("rb") as fh:
                brk, _ = self._lines(fh, self.segs.active.name, None)
        except FileNotFoundError:
            return None  # sealed, and nothing appended since
        return brk

    def _lines(
        self, lines: Iterable[bytes], where: str, runs: set[str] | None
    ) -> tuple[ChainBreak | None, tuple[int, int | None, str]]:
        brk, (count, last_seq, last_hash) = verify_lines(lines, self.keep, start=(self.prev, self.seq), runs=runs)
        if brk is not None:
            return replace(brk, file=where), (count, last_seq, last_hash)
        if count:
            self.prev, self.seq, self.last_seq = last_hash, (last_seq or 0) + 1, last_seq
            self.events, self.file, self.line = self.events + count, where, count
        return None, (count, last_seq, last_hash)


def check(segments: Segments, keep: dict[int, str] | None = None) -> tuple[ChainBreak | None, ChainEnd]:
    return Checker(segments, keep).run()
