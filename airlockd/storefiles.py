"""The store's files (airlockd/store.py has the layout and the API): tinydb's storage as one
atomic snapshot per file, a run's line, the transaction that writes records, lines and the index in
their order, and a record's reading."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict
from tinydb import Query, TinyDB
from tinydb.storages import Storage

from airlockd import runlines
from airlockd.errors import NotFoundError, StateError
from airlockd.fsutil import atomic_write_bytes
from airlockd.records import FileState, RunRecord, RunState
from airlockd.state import StateDir

LINE_PATHS = 64  # withheld paths a line keeps
RECENT = 1024  # ids of the last changes the index keeps for followers


class _SnapshotStorage(Storage):
    """The whole file read once; written back atomically on close if changed."""

    def __init__(self, path: Path) -> None:
        self._path = path
        try:
            data = json.loads(path.read_bytes())
        except FileNotFoundError:
            data = None
        if data is not None and not (isinstance(data, dict) and all(isinstance(t, dict) for t in data.values())):
            raise ValueError("it does not hold tinydb's tables (a JSON object of objects)")
        self._data: dict[str, Any] | None = data
        self._dirty = False

    def read(self) -> dict[str, Any] | None:
        return self._data

    def write(self, data: dict[str, Any]) -> None:
        self._data = data
        self._dirty = True

    def flush(self) -> None:
        """Write what it holds now (and again at close if it changes after)."""
        if self._data is not None:
            atomic_write_bytes(self._path, json.dumps(self._data, separators=(",", ":")).encode())

    def close(self) -> None:
        if self._dirty:
            self.flush()


def _open(path: Path) -> TinyDB:
    try:
        return TinyDB(path, storage=_SnapshotStorage)
    except ValueError as exc:  # JSONDecodeError is one
        raise StateError(f"the store file {path} is unreadable: {exc}", hint=unreadable_hint(path)) from None


def unreadable_hint(path: Path) -> str:
    if path.name == "index.json":
        return (
            "restore it from a backup, or move it aside: the next command rebuilds the runs' lines from their"
            " records (the agents' usage and quarantine then start afresh: check `airlockd agents`)"
        )
    return (
        "restore it from a backup, or move it aside: the runs' records are kept, and `airlockd gc --apply`"
        " writes their lines again"
    )


# Withheld for what they are, not what they hold: a repository's history (git's own files, hook
# samples: their lines are no values, and "delete" masked every "deleted" after), a link that
# leads out of the workspace.
NOT_READ = frozenset({"git-history", "symlink-escape"})

RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
day_of = runlines.day_of


class RunLine(BaseModel):
    """What a listing shows of a run, kept in the indexes so a listing never loads records."""

    model_config = ConfigDict(extra="ignore")

    id: str
    agent: str
    mode: str
    state: RunState
    created_at: float
    prompt: str  # its first 200 characters, redacted as stored
    files: int = 0
    review: dict[str, int] = {}
    detail: str = ""
    follow_up: str | None = None
    owner_pid: int | None = None
    owner_start: int | None = None
    withheld: int = 0
    withheld_paths: list[str] = []  # the first LINE_PATHS of them that are read for values (recent_withheld)
    compacted: bool = False


def line_of(rec: RunRecord) -> dict[str, Any]:
    counts = {s.value: n for s in FileState if (n := sum(1 for f in rec.files if f.state is s))}
    return RunLine(
        id=rec.id,
        agent=rec.agent,
        mode=rec.mode,
        state=rec.state,
        created_at=rec.created_at,
        prompt=rec.prompt[:200],
        files=len(rec.files),
        review=counts,
        detail=rec.transitions[-1].detail if rec.transitions else "",
        follow_up=rec.follow_up,
        owner_pid=rec.owner_pid if rec.state.live else None,
        owner_start=rec.owner_start if rec.state.live else None,
        withheld=len(rec.withheld),
        withheld_paths=[
            w["path"] for w in rec.withheld if isinstance(w, dict) and "path" in w and w.get("rule") not in NOT_READ
        ][:LINE_PATHS],
        compacted=rec.compacted_at is not None,
    ).model_dump(mode="json")


def settled(state: RunState) -> bool:
    return not state.live and state is not RunState.PROPOSED


class Tx:
    """One exclusive transaction: the files it opened, written when it ends."""

    def __init__(self, state: StateDir) -> None:
        self.state = state
        self.index = _open(state.index_file)
        self._days: dict[str, TinyDB] = {}
        self._records: dict[str, dict[str, Any] | None] = {}  # id -> doc to write (None: delete)
        self.changed: list[str] = []  # what followers are told of
        self.touched = False  # the index is rewritten (its serial moves) even with nothing to tell
        self.pending: list[str] = []  # runs whose lines the open lines' check would not find after a crash

    def day(self, day: str) -> TinyDB:
        if day not in self._days:
            self.state.history.mkdir(mode=0o700, exist_ok=True)
            self._days[day] = _open(self.state.history / f"{day}.json")
        return self._days[day]

    def get(self, run_id: str) -> RunRecord:
        if run_id in self._records and (doc := self._records[run_id]) is not None:
            return RunRecord.model_validate(doc)
        return read_record(self.state, run_id)

    def put(self, rec: RunRecord, announce: bool = True) -> None:
        self._records[rec.id] = rec.model_dump(mode="json")
        line, q = line_of(rec), Query().id == rec.id
        opened = self.index.table("open")
        was_open = opened.get(q)
        if settled(rec.state):
            table = self.day(day_of(rec.id)).table("runs")
            if table.get(q) != line:
                table.upsert(line, q)
            if was_open is not None:
                opened.remove(q)
            self.pending.append(rec.id)
        else:
            if was_open != line:
                opened.upsert(line, q)
            if was_open is None:
                self.pending.append(rec.id)  # a new run: no open line to compare yet
        self.touched = True
        if announce:
            self.changed.append(rec.id)

    def drop_record(self, run_id: str, announce: bool = True) -> None:
        self._records[run_id] = None
        self.pending.append(run_id)
        self.touched = True
        if announce:
            self.changed.append(run_id)

    def commit(self, checkpoint: Callable[[], None] = lambda: None) -> None:
        """Records first, then the days' lines, then the index; `checkpoint` between each (the
        crash tests' kill points). A write whose lines the next start could not check against
        the open lines (a new run, a settled one) first writes the index naming those runs
        (`pending`): a crash before the end leaves their names, and the next start rewrites
        their lines from their records."""
        meta = self.index.table("meta")
        row: dict[str, Any] = dict(meta.get(doc_id=1) or {"serial": 0, "recent": []})
        if self.pending:
            meta.upsert(_doc(1, {**row, "pending": sorted(set(self.pending) | set(row.get("pending") or []))}))
            self.index.storage.flush()  # type: ignore[attr-defined]
            checkpoint()
        self.state.records.mkdir(mode=0o700, exist_ok=True)
        for run_id, doc in self._records.items():
            path = self.state.record(run_id)
            if doc is None:
                path.unlink(missing_ok=True)
                continue
            atomic_write_bytes(path, json.dumps({"run": {"1": doc}}, separators=(",", ":")).encode())
            if doc["state"] not in _LIVE_NAMES:
                self.state.live_sample(run_id).unlink(missing_ok=True)
        checkpoint()
        for db in self._days.values():
            db.close()
        checkpoint()
        if self.touched or row.get("pending"):
            serial = int(row["serial"]) + 1
            recent = [*row["recent"], *([serial, r] for r in dict.fromkeys(self.changed))][-RECENT:]
            meta.upsert(_doc(1, {"serial": serial, "recent": recent, "pending": []}))
        self.index.close()


_LIVE_NAMES = frozenset(s.value for s in RunState if s.live)


def _doc(doc_id: int, value: dict[str, Any]) -> Any:
    from tinydb.table import Document

    return Document(value, doc_id=doc_id)


def read_record(state: StateDir, run_id: str) -> RunRecord:
    path = state.record(run_id)
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise NotFoundError(f"no run {run_id!r} in this workspace", hint="`airlockd runs` lists them") from None
    except json.JSONDecodeError as exc:
        raise StateError(
            f"the record of run {run_id} ({path}) is not valid JSON ({exc.msg})",
            hint="restore it from a backup; the other runs are not affected",
        ) from None
    try:
        rec = RunRecord.model_validate(next(iter(data["run"].values())))
    except (KeyError, TypeError, AttributeError, StopIteration, ValueError) as exc:  # ValidationError too
        raise StateError(
            f"the record of run {run_id} ({path}) is not a run record: {str(exc).splitlines()[0]}",
            hint="restore it from a backup; the other runs are not affected",
        ) from None
    if rec.state.live:
        try:
            sample = json.loads(state.live_sample(run_id).read_bytes())
        except (FileNotFoundError, json.JSONDecodeError):
            sample = None
        if isinstance(sample, dict):
            for key in ("peak", "output_bytes", "tokens", "growth_bytes"):
                if key in sample:
                    setattr(rec, key, sample[key])
    return rec
