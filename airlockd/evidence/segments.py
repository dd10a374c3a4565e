"""The audit log's sealed segments: the manifest that lists them, the anchors that stand for the
dropped ones, and the two steps that change them (seal, drop), each safe against a crash between
any two of its filesystem operations.

A log of every past run would be one file every reader scans, so the active segment
(`audit.jsonl`) is sealed once it passes a size: moved to `audit/<first>-<last>.jsonl` and listed
in `audit/segments.jsonl` with its seq range, the hashes at its ends, the SHA-256 of its bytes and
the runs it holds, so a run's timeline reads only the segments that hold it. Old segments can then
be dropped, oldest first: each leaves an anchor in `audit/anchors.jsonl` (its range, last hash,
SHA-256), from which verification takes up the chain at the first kept segment.

Each step writes what it is about to do before doing it, and the next append (or verify) finishes
what a crash left half done: the manifest line comes before the rename (a manifest that lists
events the active segment still holds is finished by renaming it, or by writing the files of a
segment cut in several); a drop's anchors go to `audit/anchors.pending` before anything else (when
it exists the drop is rolled forward). A line a crash cut short (no newline) is skipped by readers
and cut off before the next line is appended. `docs/audit.md` has the format. Nothing here takes
the log's lock: the callers in audit.py hold it for every change.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from airlockd.fsutil import atomic_write_bytes, fsync_dir

MANIFEST = "segments.jsonl"
ANCHORS = "anchors.jsonl"
PENDING = "anchors.pending"
MAX_RUNS = 5000  # distinct runs listed for one segment; past that it says "any" (null)


def _dumps(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n").encode()


def segment_name(first_seq: int, last_seq: int) -> str:
    return f"{first_seq:012d}-{last_seq:012d}.jsonl"


def _named(d: dict[str, Any]) -> str:
    """A line's file name, which must be the one its range gives: a manifest or anchor line
    never makes a reader open, or a drop delete, any other file."""
    name = str(d["file"])
    if name != segment_name(int(d["first_seq"]), int(d["last_seq"])):
        raise ValueError(f"{name!r} is not the file of seq {d['first_seq']}-{d['last_seq']}")
    return name


def anchor_message(first_seq: int, last_seq: int, digest: str | None, sha256: str, at: float) -> bytes:
    """The exact bytes an anchor's signature covers."""
    return f"airlockd-audit-anchor\n{first_seq}\n{last_seq}\n{digest}\n{sha256}\n{at:.6f}\n".encode()


@dataclass(frozen=True)
class Segment:
    """One manifest line: a sealed segment as it was when sealed."""

    file: str
    first_seq: int
    last_seq: int
    first_at: float
    last_at: float
    prev: str | None  # `prev` of its first event
    hash: str | None  # `hash` of its last event
    sha256: str  # of the file's bytes
    count: int
    runs: tuple[str, ...] | None  # sorted; None: too many to list, read it for any run

    def holds(self, run: str) -> bool:
        if self.runs is None:
            return True
        i = bisect.bisect_left(self.runs, run)
        return i < len(self.runs) and self.runs[i] == run

    def line(self) -> bytes:
        d = asdict(self)
        d["runs"] = None if self.runs is None else list(self.runs)
        return _dumps(d)

    @classmethod
    def parse(cls, raw: bytes) -> Segment:
        """Raises ValueError (or KeyError, TypeError) for a line that is not a manifest entry."""
        d = json.loads(raw)
        runs = d["runs"]
        return cls(
            file=_named(d),
            first_seq=int(d["first_seq"]),
            last_seq=int(d["last_seq"]),
            first_at=float(d["first_at"]),
            last_at=float(d["last_at"]),
            prev=d["prev"],
            hash=d["hash"],
            sha256=str(d["sha256"]),
            count=int(d["count"]),
            runs=None if runs is None else tuple(str(r) for r in runs),
        )


@dataclass(frozen=True)
class Anchor:
    """One anchors line: what verification needs of a dropped segment to take up the chain after it."""

    file: str
    first_seq: int
    last_seq: int
    hash: str | None
    sha256: str
    count: int
    dropped_at: float
    sig: str | None = None  # base64 Ed25519 over anchor_message, when the log has a signer

    def message(self) -> bytes:
        return anchor_message(self.first_seq, self.last_seq, self.hash, self.sha256, self.dropped_at)

    def line(self) -> bytes:
        return _dumps(asdict(self))

    @classmethod
    def parse(cls, raw: bytes) -> Anchor:
        d = json.loads(raw)
        return cls(
            file=_named(d),
            first_seq=int(d["first_seq"]),
            last_seq=int(d["last_seq"]),
            hash=d["hash"],
            sha256=str(d["sha256"]),
            count=int(d["count"]),
            dropped_at=float(d["dropped_at"]),
            sig=d.get("sig"),
        )


def complete_lines(path: Path) -> list[bytes]:
    """The lines of `path` that end in a newline (a last line without one is a write a crash cut
    short, or one still being written); [] when there is no such file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return data[: data.rfind(b"\n") + 1].splitlines()


def last_line(path: Path, *, heal: bool = False) -> bytes | None:
    """The last complete, non-empty line of `path`, found by seeking (the file can be large).
    With `heal` (under the log's lock, before appending to it) a torn last line is cut off, so
    the next line does not join it."""
    try:
        fd = os.open(path, os.O_RDWR if heal else os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        pos, buf = end, b""
        while pos > 0:
            step = min(65536, pos)
            pos -= step
            buf = os.pread(fd, step, pos) + buf
            nl = buf.rfind(b"\n")
            if nl >= 0 and b"\n" in buf[:nl].rstrip(b"\n"):
                break
        complete = pos + buf.rfind(b"\n") + 1  # where the complete lines end
        if heal and complete < end:
            os.ftruncate(fd, complete)
            os.fsync(fd)
        return buf[: complete - pos].rstrip(b"\n").rsplit(b"\n", 1)[-1] or None
    finally:
        os.close(fd)


def append_lines(path: Path, data: bytes, *, fsync: bool) -> None:
    """Append complete lines in one write, after cutting off a torn last line a crash left."""
    last_line(path, heal=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    """`data` cut at the first line end at or past each `size` bytes; whole when under twice it."""
    if len(data) < 2 * size:
        yield data
        return
    start = 0
    while start < len(data):
        end = data.find(b"\n", start + size - 1) + 1 or len(data)
        yield data[start:end]
        start = end


def describe(name_for: Callable[[int, int], str], data: bytes) -> Segment:
    """The manifest entry of a segment's bytes (at least one complete event)."""
    lines = data.splitlines()
    first, last = json.loads(lines[0]), json.loads(lines[-1])
    return Segment(
        file=name_for(int(first["seq"]), int(last["seq"])),
        first_seq=int(first["seq"]),
        last_seq=int(last["seq"]),
        first_at=float(first["at"]),
        last_at=float(last["at"]),
        prev=first.get("prev"),
        hash=last.get("hash"),
        sha256=hashlib.sha256(data).hexdigest(),
        count=len(lines),
        runs=_runs(lines),
    )


def _runs(lines: list[bytes]) -> tuple[str, ...] | None:
    """The sorted runs with events in `lines`; None past MAX_RUNS, or for a line that is not an
    event (verification names it): read it for any run."""
    runs = set()
    for raw in lines:
        try:
            run = json.loads(raw).get("run")
        except (ValueError, AttributeError):
            return None
        if isinstance(run, str):
            runs.add(run)
    return run_list(runs)


def run_list(runs: set[str]) -> tuple[str, ...] | None:
    """How a manifest entry lists the runs of its segment: sorted, or None past MAX_RUNS."""
    return None if len(runs) > MAX_RUNS else tuple(sorted(runs))


class Segments:
    """The sealed segments beside an active segment: `audit/` next to `audit.jsonl`."""

    def __init__(self, active: Path, *, fsync: bool) -> None:
        self.active = active
        self.dir = active.with_suffix("") if active.suffix else active.with_name(active.name + ".d")
        self.manifest = self.dir / MANIFEST
        self.anchors = self.dir / ANCHORS
        self.pending = self.dir / PENDING
        self.fsync = fsync
        self._last: tuple[tuple[int, int, int], Segment | None] | None = None

    def rel(self, name: str) -> str:
        """How a break names a file: relative to the directory holding the active segment."""
        return f"{self.dir.name}/{name}"

    # -- reading (no lock: every change is a whole line appended, or a rename) --

    def entries(self, run: str | None = None) -> list[Segment]:
        """The manifest's entries, oldest first; with `run`, only those that may hold it (found
        by the run's JSON string, before a line is parsed). Unreadable lines are left out here;
        verification names them."""
        needle = json.dumps(run).encode() if run is not None else None
        out = []
        for raw in complete_lines(self.manifest):
            if needle is not None and needle not in raw and b'"runs":null' not in raw:
                continue
            try:
                out.append(Segment.parse(raw))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def anchor_list(self) -> list[Anchor]:
        out = []
        for raw in complete_lines(self.anchors):
            try:
                out.append(Anchor.parse(raw))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def kept(self, run: str | None = None) -> list[Segment]:
        """The entries not dropped, oldest first (with `run`: those that may hold it)."""
        done = self.dropped_to()
        return [s for s in self.entries(run) if s.first_seq > done]

    def dropped_to(self) -> int:
        """The last seq the anchors cover (-1: nothing dropped)."""
        raw = last_line(self.anchors)
        try:
            return Anchor.parse(raw).last_seq if raw else -1
        except (ValueError, KeyError, TypeError):
            return max((a.last_seq for a in self.anchor_list()), default=-1)

    def last_entry(self) -> Segment | None:
        """The manifest's last entry; kept while the manifest's stat says it is unchanged, since
        every append asks and a line lists up to MAX_RUNS runs."""
        try:
            st = os.stat(self.manifest)
        except FileNotFoundError:
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._last is None or self._last[0] != key:
            raw = last_line(self.manifest)
            try:
                entry = Segment.parse(raw) if raw else None
            except (ValueError, KeyError, TypeError):
                entry = None
            self._last = (key, entry)
        return self._last[1]

    # -- changing (under the log's lock) --

    def recover(self) -> None:
        """Finish a drop or a seal a crash interrupted. Costs two stats and a short read when
        nothing is half done (it runs before every append)."""
        if os.path.exists(self.pending):
            self._finish_drop()
        entry = self.last_entry()
        if entry is None or (tail := last_line(self.active, heal=True)) is None:
            return
        try:
            last = int(json.loads(tail)["seq"])
        except (ValueError, KeyError, TypeError):
            return  # not an event: verification names it
        if last <= entry.last_seq:  # the manifest lists what the active segment still holds
            self._finish_seal()

    def seal(self, segment_bytes: int) -> None:
        """Move the active segment (complete lines only: the caller healed it) into `audit/`, its
        manifest line first. One past twice the size (a log older than segments) is cut into
        segments of about that size, so that a run's timeline reads only a part of its history."""
        data = self.active.read_bytes()
        if not data.strip():
            return
        entries = [describe(segment_name, chunk) for chunk in _chunks(data, segment_bytes)]
        if not os.path.isdir(self.dir):
            os.mkdir(self.dir, 0o700)
            if self.fsync:
                fsync_dir(self.dir.parent)
        prior = self.last_entry()
        new = [e for e in entries if prior is None or e.first_seq > prior.last_seq]  # a retry writes each once
        if new:
            append_lines(self.manifest, b"".join(e.line() for e in new), fsync=self.fsync)
        self._finish_seal()

    def _finish_seal(self) -> None:
        """Give each manifest entry of events the active segment holds its file (the segment
        itself, renamed, when one entry is all of it), then remove the active segment. An entry
        whose bytes are not in the active segment is left to verification."""
        data = self.active.read_bytes()
        lines = data.splitlines(keepends=True)
        if not lines:
            return
        first, last = int(json.loads(lines[0])["seq"]), int(json.loads(lines[-1])["seq"])
        entries = [e for e in self.kept() if e.last_seq >= first]
        if not entries or entries[0].first_seq != first or entries[-1].last_seq < last:
            return
        if len(entries) == 1 and not os.path.exists(self.dir / entries[0].file):
            if hashlib.sha256(data).hexdigest() == entries[0].sha256:
                self._move(entries[0])
            return
        for e in entries:
            chunk = b"".join(lines[e.first_seq - first : e.last_seq - first + 1])
            if hashlib.sha256(chunk).hexdigest() != e.sha256:
                return
            if not os.path.exists(self.dir / e.file):
                atomic_write_bytes(self.dir / e.file, chunk)
        os.unlink(self.active)
        if self.fsync:
            fsync_dir(self.active.parent)

    def _move(self, entry: Segment) -> None:
        os.rename(self.active, self.dir / entry.file)
        if self.fsync:
            fsync_dir(self.dir)
            fsync_dir(self.active.parent)

    def drop(self, segments: Iterable[Segment], sign: Callable[[bytes], str] | None) -> None:
        """Anchor then delete `segments` (a prefix of the kept ones, oldest first): the anchors
        go to the pending file first, so a crash anywhere after that is rolled forward."""
        at = round(time.time(), 6)
        anchors = []
        for s in segments:
            a = Anchor(s.file, s.first_seq, s.last_seq, s.hash, s.sha256, s.count, at)
            anchors.append(replace(a, sig=sign(a.message())) if sign else a)
        atomic_write_bytes(self.pending, b"".join(a.line() for a in anchors))
        self._finish_drop()

    def _finish_drop(self) -> None:
        try:
            pending = [Anchor.parse(raw) for raw in complete_lines(self.pending)]
        except (ValueError, KeyError, TypeError):
            pending = []  # not a file this code wrote (it writes it whole, by rename): nothing to do
        done = self.dropped_to()
        todo = [a for a in pending if a.last_seq > done]
        if todo:
            append_lines(self.anchors, b"".join(a.line() for a in todo), fsync=self.fsync)
        for a in pending:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dir / a.file)
        if self.fsync:
            fsync_dir(self.dir)
        os.unlink(self.pending)
        if self.fsync:
            fsync_dir(self.dir)
