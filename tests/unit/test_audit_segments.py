"""The audit log in segments: sealed past a size and listed in a manifest, a run's events read from
the segments that hold it only, the chain verified across files, old segments dropped under
anchors, and a crash at any filesystem step of a seal or a drop losing and doubling nothing."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import airlockd.evidence.audit as audit_mod
import airlockd.evidence.segments as segments_mod
import airlockd.fsutil as fsutil_mod
from airlockd.errors import AirlockError
from airlockd.evidence import signing
from airlockd.evidence.audit import AuditLog, ChainBreak
from airlockd.evidence.chain import digest as chain_digest
from airlockd.evidence.segments import Segment
from airlockd.redact import Redactor

SEGMENT = 2000  # bytes: about 8 events a segment
EVERY = 16


def _log(root: Path, **kw: Any) -> AuditLog:
    kw.setdefault("fsync", False)
    kw.setdefault("segment_bytes", SEGMENT)
    return AuditLog(root / "audit.jsonl", Redactor(), **kw)


def _fill(log: AuditLog, n: int, *, per_run: int = 10, start: int = 0) -> None:
    for i in range(start, start + n):
        log.append("event", run=f"r{i // per_run:03d}", agent="bot", n=i)


def _manifest(log: AuditLog) -> list[Segment]:
    if not log.segments.manifest.exists():
        return []
    return [Segment.parse(raw) for raw in log.segments.manifest.read_bytes().splitlines()]


def _line(ev: dict[str, Any]) -> bytes:
    return (json.dumps(ev, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _ns(log: AuditLog) -> list[Any]:
    return [ev["data"]["n"] for ev in log.events()]


# -- sealing --


def test_appends_past_the_size_seal_segments_the_manifest_lists(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _fill(log, 200)
    entries = _manifest(log)
    assert len(entries) > 10
    assert (log.segments.dir.stat().st_mode & 0o777) == 0o700
    expect = 0
    for seg in entries:
        assert seg.first_seq == expect and seg.file == f"{seg.first_seq:012d}-{seg.last_seq:012d}.jsonl"
        events = [json.loads(raw) for raw in (log.segments.dir / seg.file).read_bytes().splitlines()]
        assert (
            [e["seq"] for e in events]
            == list(range(seg.first_seq, seg.last_seq + 1))
            == list(range(seg.first_seq, seg.first_seq + seg.count))
        )
        assert seg.runs == tuple(sorted({e["run"] for e in events}))
        assert (seg.prev, seg.hash) == (events[0]["prev"], events[-1]["hash"])
        assert (seg.first_at, seg.last_at) == (events[0]["at"], events[-1]["at"])
        expect = seg.last_seq + 1
    active = [json.loads(raw) for raw in log.path.read_bytes().splitlines()]
    assert active[0]["seq"] == expect and active[0]["prev"] == entries[-1].hash  # the chain goes on
    assert _ns(log) == list(range(200))
    assert log.verify() is None
    assert json.loads(log.head.read_bytes())["seq"] == 199


def test_a_log_older_than_segments_is_cut_into_segments_of_the_size(tmp_path: Path, opened: list[str]) -> None:
    _fill(_log(tmp_path, segment_bytes=1 << 40), 100)  # one file, as before segments
    log = _log(tmp_path)
    log.append("event", run="new", n=100)
    entries = _manifest(log)
    assert len(entries) >= 5 and not log.path.read_bytes().count(b"\n") - 1
    sizes = [(log.segments.dir / s.file).stat().st_size for s in entries]
    assert all(SEGMENT <= size < SEGMENT + 400 for size in sizes[:-1])
    assert log.verify() is None and _ns(log) == list(range(101))
    opened.clear()
    assert [ev["data"]["n"] for ev in log.events(run="r005")] == list(range(50, 60))
    assert len({name for name in opened if name.endswith(".jsonl") and "-" in name}) <= 2


def test_a_segment_with_more_runs_than_it_lists_is_read_for_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segments_mod, "MAX_RUNS", 3)
    log = _log(tmp_path)
    _fill(log, 40, per_run=1)  # a run an event: every segment holds more than 3
    assert all(seg.runs is None for seg in _manifest(log))
    assert [ev["seq"] for ev in log.events(run="r005")] == [5]
    assert log.verify() is None


def _appender(root: str, who: int, n: int) -> None:
    log = _log(Path(root))
    for i in range(n):
        log.append("event", run=f"p{who}", n=i)


def test_processes_appending_and_sealing_at_once_keep_one_chain(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_appender, args=(str(tmp_path), who, 60)) for who in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    log = _log(tmp_path)
    assert log.verify() is None and len(_manifest(log)) > 10
    assert [ev["seq"] for ev in log.events()] == list(range(240))
    for who in range(4):
        assert [ev["data"]["n"] for ev in log.events(run=f"p{who}")] == list(range(60))


# -- events(run) --


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the files read (the active segment is opened, a sealed one read)."""
    seen: list[str] = []
    read_bytes, open_ = Path.read_bytes, Path.open

    def spy_read(self: Path) -> bytes:
        seen.append(self.name)
        return read_bytes(self)

    def spy_open(self: Path, *a: Any, **kw: Any) -> Any:
        seen.append(self.name)
        return open_(self, *a, **kw)

    monkeypatch.setattr(Path, "read_bytes", spy_read)
    monkeypatch.setattr(Path, "open", spy_open)
    yield seen


def test_events_of_a_run_read_only_the_segments_that_hold_it(tmp_path: Path, opened: list[str]) -> None:
    log = _log(tmp_path)
    _fill(log, 300)
    entries = _manifest(log)
    holding = [s for s in entries if s.holds("r012")]
    assert 1 <= len(holding) <= 3 < len(entries)
    opened.clear()
    assert [ev["data"]["n"] for ev in log.events(run="r012")] == list(range(120, 130))
    segment_files = {s.file for s in entries}
    assert {name for name in opened if name in segment_files} == {s.file for s in holding}
    opened.clear()
    assert [ev["seq"] for ev in log.events(run="r029")] == list(range(290, 300))  # partly in the active one
    assert {name for name in opened if name in segment_files} == {s.file for s in entries if s.holds("r029")}
    assert list(log.events(run="nobody")) == []
    # the others cannot be read at all, and it makes no difference
    for seg in entries:
        if seg not in holding:
            (log.segments.dir / seg.file).unlink()
            (log.segments.dir / seg.file).mkdir()
    assert [ev["data"]["n"] for ev in log.events(run="r012")] == list(range(120, 130))


def test_events_are_in_seq_order_for_a_run_across_a_seal(tmp_path: Path) -> None:
    log = _log(tmp_path)
    for i in range(60):
        log.append("event", run="long" if i % 3 == 0 else f"other{i}", n=i)
    seqs = [ev["seq"] for ev in log.events(run="long")]
    assert seqs == list(range(0, 60, 3))
    assert sum(1 for s in _manifest(log) if s.holds("long")) == len(_manifest(log))
    assert [ev["seq"] for ev in log.events()] == list(range(60))


def test_a_seal_while_a_reader_opens_the_log_loses_and_doubles_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader opened the active segment, then another process sealed it and appended before
    the reader read the manifest."""
    log = _log(tmp_path)
    _fill(log, 30)
    other = _log(tmp_path)
    kept = segments_mod.Segments.kept
    fired: list[bool] = []

    def sealing_meanwhile(self: segments_mod.Segments, run: str | None = None) -> list[Segment]:
        if not fired:
            fired.append(True)
            before = len(_manifest(other))
            while len(_manifest(other)) == before:
                other.append("event", run="r002", n=-1)
        return kept(self, run)

    monkeypatch.setattr(segments_mod.Segments, "kept", sealing_meanwhile)
    seen = [ev["seq"] for ev in log.events(run="r002")]
    fired.append(True)  # no more seals
    truth = [ev["seq"] for ev in log.events(run="r002")]
    new_active = _manifest(log)[-1].last_seq + 1
    assert seen == [seq for seq in truth if seq < new_active] and seen[:10] == list(range(20, 30))
    assert truth[-1] >= new_active  # what came after the seal went to the new active segment
    fired.clear()
    seen = [ev["seq"] for ev in log.events()]
    fired.append(True)
    new_active = _manifest(log)[-1].last_seq + 1
    assert seen == list(range(new_active))


# -- verify across segments --


@pytest.fixture
def sealed(tmp_path: Path) -> AuditLog:
    log = _log(tmp_path)
    _fill(log, 60)
    assert len(_manifest(log)) >= 5 and log.verify() is None
    return log


def _seg(log: AuditLog, i: int) -> Path:
    return log.segments.dir / _manifest(log)[i].file


def _where(brk: ChainBreak | None) -> tuple[str | None, int]:
    assert brk is not None
    return brk.file, brk.line


def test_a_break_names_the_file_and_its_line(sealed: AuditLog) -> None:
    assert ChainBreak(1, 0, "x").file is None  # what callers that build one themselves get
    lines = sealed.path.read_bytes().splitlines(keepends=True)
    ev = json.loads(lines[1])
    ev["data"]["n"] = "edited"
    sealed.path.write_bytes(b"".join([lines[0], _line(ev), *lines[2:]]))
    assert _where(sealed.verify()) == ("audit.jsonl", 2)


def test_an_edited_sealed_segment_is_named(sealed: AuditLog) -> None:
    path = _seg(sealed, 2)
    lines = path.read_bytes().splitlines(keepends=True)
    ev = json.loads(lines[3])
    ev["data"]["n"] = "edited"
    path.write_bytes(b"".join([*lines[:3], _line(ev), *lines[4:]]))
    brk = sealed.verify()
    assert _where(brk) == (f"audit/{path.name}", 4) and brk is not None and "edited" in brk.problem


def test_a_sealed_segment_rewritten_whole_is_caught(sealed: AuditLog) -> None:
    """Its own chain recomputed: the next file no longer follows it, and its bytes differ."""
    path = _seg(sealed, 1)
    events = [json.loads(raw) for raw in path.read_bytes().splitlines()]
    prev = events[0]["prev"]
    for ev in events:
        ev["data"]["n"], ev["prev"] = "forged", prev
        ev["hash"] = prev = chain_digest(ev)
    path.write_bytes(b"".join(_line(ev) for ev in events))
    brk = sealed.verify()
    assert brk is not None and brk.file == f"audit/{path.name}" and "not the ones sealed" in brk.problem


def test_a_sealed_segment_reformatted_is_caught_by_its_bytes(sealed: AuditLog) -> None:
    path = _seg(sealed, 1)
    path.write_bytes(b"".join(json.dumps(json.loads(raw)).encode() + b"\n" for raw in path.read_bytes().splitlines()))
    brk = sealed.verify()
    assert brk is not None and brk.file == f"audit/{path.name}" and "SHA-256" not in brk.problem
    assert "not the ones sealed" in brk.problem


def test_a_removed_middle_segment_is_named(sealed: AuditLog) -> None:
    path = _seg(sealed, 2)
    path.unlink()
    brk = sealed.verify()
    assert _where(brk) == (f"audit/{path.name}", 1) and brk is not None and "missing" in brk.problem


def test_a_removed_middle_segment_and_its_manifest_line_are_caught(sealed: AuditLog) -> None:
    path = _seg(sealed, 2)
    path.unlink()
    lines = sealed.segments.manifest.read_bytes().splitlines(keepends=True)
    sealed.segments.manifest.write_bytes(b"".join(lines[:2] + lines[3:]))
    assert _where(sealed.verify()) == ("audit/segments.jsonl", 3)


def test_a_swapped_pair_of_segments_is_caught(sealed: AuditLog) -> None:
    a, b = _seg(sealed, 1), _seg(sealed, 2)
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    assert _where(sealed.verify()) == (f"audit/{a.name}", 1)


def test_events_swapped_across_a_segment_boundary_are_caught(sealed: AuditLog) -> None:
    a, b = _seg(sealed, 1), _seg(sealed, 2)
    la, lb = a.read_bytes().splitlines(keepends=True), b.read_bytes().splitlines(keepends=True)
    a.write_bytes(b"".join([*la[:-1], lb[0]]))
    b.write_bytes(b"".join([la[-1], *lb[1:]]))
    assert _where(sealed.verify()) == (f"audit/{a.name}", len(la))


def test_events_cut_from_the_end_of_a_segment_or_of_the_log_are_caught(sealed: AuditLog) -> None:
    path = _seg(sealed, 1)
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))
    brk = sealed.verify()
    assert _where(brk) == (f"audit/{path.name}", len(lines)) and brk is not None and "cut" in brk.problem
    path.write_bytes(data)
    assert sealed.verify() is None
    active = sealed.path.read_bytes().splitlines(keepends=True)
    sealed.path.write_bytes(b"".join(active[:-2]))
    brk = sealed.verify()
    assert brk is not None and brk.file == "audit.jsonl" and "deleted" in brk.problem
    sealed.path.unlink()  # the whole active segment
    brk = sealed.verify()
    assert brk is not None and "deleted" in brk.problem


# -- dropping --


def _dropped_log(tmp_path: Path, **kw: Any) -> tuple[AuditLog, list[str], float]:
    log = _log(tmp_path, **kw)
    _fill(log, 40)
    cut = time.time()
    time.sleep(0.01)
    _fill(log, 40, start=40)
    entries = _manifest(log)
    expect = [s.file for s in entries if s.last_at < cut]
    assert expect and len(expect) < len(entries)
    return log, expect, cut


def test_drop_before_drops_the_old_prefix_and_the_rest_verifies(tmp_path: Path) -> None:
    log, expect, cut = _dropped_log(tmp_path)
    entries = _manifest(log)
    assert log.droppable_before(cut) == expect and len(_manifest(log)) == len(entries)
    assert log.drop_before(cut) == expect
    assert log.drop_before(cut) == [] == log.droppable_before(cut)
    assert all(not (log.segments.dir / name).exists() for name in expect)
    anchors = [json.loads(raw) for raw in log.segments.anchors.read_bytes().splitlines()]
    assert [a["file"] for a in anchors] == expect
    dropped = entries[: len(expect)]
    assert [(a["first_seq"], a["last_seq"], a["hash"], a["sha256"], a["count"]) for a in anchors] == [
        (s.first_seq, s.last_seq, s.hash, s.sha256, s.count) for s in dropped
    ]
    assert log.verify() is None
    first = dropped[-1].last_seq + 1
    assert [ev["seq"] for ev in log.events()] == list(range(first, 80))
    _fill(log, 30, start=80)
    assert log.verify() is None
    assert log.drop_before(time.time() + 1) == [s.file for s in _manifest(log)[len(expect) :]]
    assert log.path.exists() and log.verify() is None  # the active segment stays


def test_only_a_prefix_is_dropped(tmp_path: Path) -> None:
    log = _log(tmp_path)
    _fill(log, 60)
    entries = _manifest(log)
    assert log.drop_before(entries[3].last_at) == [s.file for s in entries[:3]]
    assert log.drop_before(entries[1].last_at + 1e-6) == []  # already gone: nothing older is left
    assert log.verify() is None


def test_after_a_drop_tampering_is_still_caught(tmp_path: Path) -> None:
    log, expect, cut = _dropped_log(tmp_path)
    saved = {name: (log.segments.dir / name).read_bytes() for name in expect}
    log.drop_before(cut)
    # a dropped segment put back
    (log.segments.dir / expect[0]).write_bytes(saved[expect[0]])
    brk = log.verify()
    assert _where(brk) == (f"audit/{expect[0]}", 1) and brk is not None and "there again" in brk.problem
    (log.segments.dir / expect[0]).unlink()
    assert log.verify() is None
    # the first kept segment removed: the chain no longer takes up after the anchors
    first_kept = _seg(log, len(expect))
    data = first_kept.read_bytes()
    first_kept.unlink()
    assert _where(log.verify()) == (f"audit/{first_kept.name}", 1)
    first_kept.write_bytes(data)
    # a kept segment edited
    lines = data.splitlines(keepends=True)
    ev = json.loads(lines[0])
    ev["kind"] = "edited"
    first_kept.write_bytes(b"".join([_line(ev), *lines[1:]]))
    assert _where(log.verify()) == (f"audit/{first_kept.name}", 1)
    first_kept.write_bytes(data)
    # an anchor edited or removed
    anchors = log.segments.anchors.read_bytes()
    log.segments.anchors.write_bytes(anchors.replace(b'"count":', b'"count":1', 1))
    assert log.verify() is not None
    log.segments.anchors.write_bytes(b"".join(anchors.splitlines(keepends=True)[1:]))
    assert log.verify() is not None
    log.segments.anchors.write_bytes(anchors)
    assert log.verify() is None


def test_drop_refuses_a_segment_that_is_not_the_one_sealed(tmp_path: Path) -> None:
    log, expect, cut = _dropped_log(tmp_path)
    path = log.segments.dir / expect[0]
    path.write_bytes(path.read_bytes().replace(b'"n":0', b'"n":9', 1))
    with pytest.raises(AirlockError, match="not dropped"):
        log.drop_before(cut)
    assert path.exists() and not log.segments.anchors.exists()
    assert _where(log.verify()) == (f"audit/{expect[0]}", 1)


# -- crashes --


class Crash(Exception):
    pass


class FaultyOs(ModuleType):
    """`os` for the modules under test, whose filesystem changes count: the Nth raises (with
    `torn`, a write first writes half its bytes, as a crash mid-write leaves it)."""

    STEPS = ("open", "write", "fsync", "rename", "replace", "unlink", "mkdir", "ftruncate", "link")

    def __init__(self, at: int, torn: bool) -> None:
        super().__init__("os")
        self.at, self.torn, self.calls = at, torn, 0

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        if name not in self.STEPS:
            return real

        def step(*a: Any, **kw: Any) -> Any:
            self.calls += 1
            if self.calls == self.at:
                if name == "write" and self.torn:
                    os.write(a[0], a[1][: len(a[1]) // 2])
                raise Crash(f"{name} #{self.calls}")
            return real(*a, **kw)

        return step


def _crash_every_step(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    build: Callable[[Path], None],
    operation: Callable[[Path], None],
    check: Callable[[Path, bool], None],
    torn: bool,
) -> int:
    """Run `operation` on a copy of the log `build` made, crashing at its 1st, 2nd, ...
    filesystem step until it completes; `check` each copy after (crashed: True). Returns the
    number of steps the operation took."""
    pristine = tmp_path / "pristine"
    pristine.mkdir()
    build(pristine)
    for at in range(1, 500):
        root = tmp_path / f"crash-{at}"
        shutil.copytree(pristine, root)
        faulty = FaultyOs(at, torn)
        with monkeypatch.context() as m:
            for mod in (audit_mod, segments_mod, fsutil_mod):
                m.setattr(mod, "os", faulty)
            try:
                operation(root)
                crashed = False
            except Crash:
                crashed = True
        check(root, crashed)
        shutil.rmtree(root)
        if not crashed:
            return at - 1
    raise AssertionError("the operation never completed")


def _seal_next(root: Path) -> None:
    log = _log(root, fsync=True)
    while not log.path.exists() or log.path.stat().st_size < SEGMENT:
        log.append("event", run="r", n=len(_ns(log)))


@pytest.mark.parametrize("which", ["first", "later", "split"])
@pytest.mark.parametrize("torn", [False, True], ids=["raise", "torn-write"])
def test_a_crash_at_any_step_of_a_seal_loses_and_doubles_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torn: bool, which: str
) -> None:
    """The first seal (no `audit/` yet), a later one, and a log older than segments cut in three."""

    def build(root: Path) -> None:
        if which == "later":
            _fill(_log(root, fsync=True), 20)
        if which == "split":
            _fill(_log(root, fsync=True, segment_bytes=1 << 40), 24)
            assert log_size(root) > 2 * SEGMENT
        else:
            _seal_next(root)
        assert os.path.isdir(root / "audit") == (which == "later")

    def log_size(root: Path) -> int:
        return (root / "audit.jsonl").stat().st_size

    def seal(root: Path) -> None:
        log = _log(root, fsync=True)
        before = len(_manifest(log))
        log.append("event", run="r", n="crash")
        assert len(_manifest(log)) == before + (3 if which == "split" else 1)

    def check(root: Path, crashed: bool) -> None:
        before = list(range(len(_ns(_log(tmp_path / "pristine")))))
        log = _log(root, fsync=True)
        assert _ns(log) in (before, [*before, "crash"])  # a reader, before anything finishes the seal
        log.append("event", run="r", n="after")
        assert log.verify() is None
        ns = _ns(log)  # the crashed event is there once or not at all (it was never acknowledged)
        assert ns in (([*before, "after"], [*before, "crash", "after"]) if crashed else ([*before, "crash", "after"],))
        assert [ev["seq"] for ev in log.events()] == list(range(len(ns)))
        assert len(list(log.segments.dir.glob("*-*.jsonl"))) == len(_manifest(log))

    steps = _crash_every_step(tmp_path, monkeypatch, build, seal, check, torn)
    assert steps >= 12  # the manifest line and its sync, the rename and the syncs, the event, the head


@pytest.mark.parametrize("torn", [False, True], ids=["raise", "torn-write"])
def test_a_crash_at_any_step_of_a_drop_loses_and_doubles_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torn: bool
) -> None:
    key = Ed25519PrivateKey.generate()
    cut: list[float] = []

    def build(root: Path) -> None:
        log = _log(root, fsync=True, signer=key.sign, checkpoint_every=EVERY)
        _fill(log, 40)
        cut.append(time.time())
        time.sleep(0.01)
        _fill(log, 20, start=40)

    def drop(root: Path) -> None:
        assert _log(root, fsync=True, signer=key.sign).drop_before(cut[0])

    def check(root: Path, crashed: bool) -> None:
        log = _log(root, fsync=True, signer=key.sign, checkpoint_every=EVERY)
        entries = _manifest(log)
        first_kept = next(s.first_seq for s in entries if s.last_at >= cut[0])
        seqs = [ev["seq"] for ev in log.events()]  # a reader before anything finishes the drop
        assert seqs == list(range(seqs[0], 60)) and seqs[0] in {0, *(s.last_seq + 1 for s in entries)}
        assert seqs[0] <= first_kept
        log.append("event", run="r", n="after")
        assert log.verify() is None
        seqs = [ev["seq"] for ev in log.events()]
        assert seqs in (list(range(61)), list(range(first_kept, 61)))
        assert crashed or seqs[0] == first_kept
        assert signing.verify_checkpoints(log, key.public_key()).ok
        assert not log.segments.pending.exists()

    steps = _crash_every_step(tmp_path, monkeypatch, build, drop, check, torn)
    assert steps >= 6  # the pending file (write, sync, rename), the anchors, the unlinks, the syncs


# -- signed checkpoints --


def test_checkpoints_verify_across_segments_and_after_a_drop(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    log, _, cut = _dropped_log(tmp_path, signer=key.sign, checkpoint_every=EVERY)
    check = signing.verify_checkpoints(log, key.public_key())
    assert check.ok and check.checkpoints == 5 and check.last_seq == 79 and check.events == 80
    log.drop_before(cut)
    check = signing.verify_checkpoints(log, key.public_key())
    assert check.ok and check.checkpoints == 5 and check.dropped + check.events == 80 and check.dropped > 0
    lines = (log.segments.anchors).read_bytes()
    assert b'"sig":"' in lines


def test_a_log_cut_below_its_last_checkpoint_is_caught_across_segments(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    log = _log(tmp_path, signer=key.sign, checkpoint_every=EVERY)
    _fill(log, 64)
    last = json.loads(log.checkpoints.read_bytes().splitlines()[-1])["seq"]
    assert last == 63
    events = list(log.events())
    keep = [ev for ev in events if ev["seq"] < 60]
    active_first = json.loads(log.path.read_bytes().splitlines()[0])["seq"]
    assert active_first < 60
    log.path.write_bytes(b"".join(_line(ev) for ev in keep if ev["seq"] >= active_first))
    log.head.write_text(json.dumps({"seq": keep[-1]["seq"], "hash": keep[-1]["hash"]}))
    assert log.verify() is None  # the chain and the head agree
    check = signing.verify_checkpoints(log, key.public_key())
    assert not check.ok and "covers seq 63" in (check.problem or "")


def test_segments_removed_without_the_key_are_not_a_drop(tmp_path: Path) -> None:
    """Anchors written by hand (or by a log without the signer) for events that a checkpoint covers."""
    key = Ed25519PrivateKey.generate()
    log, _, cut = _dropped_log(tmp_path, signer=key.sign, checkpoint_every=EVERY)
    unsigned = _log(tmp_path)
    assert unsigned.drop_before(cut)
    assert log.verify() is None
    check = signing.verify_checkpoints(log, key.public_key())
    assert not check.ok and "not signed by this key" in (check.problem or "")


# -- export --


def test_an_export_holds_every_kept_segment_and_verifies(tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    log, expect, cut = _dropped_log(tmp_path)
    dest = tmp_path / "export.jsonl"
    assert signing.export(log, key, dest) == 80
    assert [json.loads(raw)["seq"] for raw in dest.read_bytes().splitlines()] == list(range(80))
    check = signing.verify_export(dest, key.public_key())
    assert check.ok and check.events == 80 and check.first_seq == 0
    log.drop_before(cut)
    first = _manifest(log)[len(expect)].first_seq
    assert signing.export(log, key, dest) == 80 - first
    check = signing.verify_export(dest, key.public_key())
    assert check.ok and check.events == 80 - first and check.first_seq == first
    lines = dest.read_bytes().splitlines(keepends=True)
    dest.write_bytes(b"".join(lines[:3] + lines[4:]))
    signing.sig_path(dest).write_bytes(key.sign(dest.read_bytes()))
    check = signing.verify_export(dest, key.public_key())
    assert not check.ok and check.brk is not None and check.brk.line == 4
