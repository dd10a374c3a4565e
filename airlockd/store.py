"""Persistence: tinydb files laid out so that what one run reads or writes is that run and a small
index, never the whole history (docs/state.md).

    index.json             the lines of the runs still open (live, proposed), the agents' usage,
                           and a serial with the ids of the last changes (what a follower reads)
    history/<day>.json     the lines of the settled runs admitted that day
    records/<id>.json      one run's full record
    records/<id>.live.json the last sample of a live run (written each second, never fsynced)

A compacted run (runs/retention.py) keeps its record file, as its summary (`compacted_at` set).

A line is what a listing prints (`RunLine`); records are the truth and lines are derived from them.
Every write holds one exclusive file lock for its read-modify-write and replaces each file it
changes atomically: records first, the lines next, the index last, so a reader that sees a new
serial sees what it names. A crash between two files of one write leaves a line behind its record;
the next process to open the store brings the open lines, and the runs a write named pending in
the index before it began, back in line with their records.
Reads take no lock. A state directory of the first layout (one store.json) is converted on first
use (airlockd/storemigrate.py). The files' formats, the line and the transaction are in
airlockd/storefiles.py; reading lines with `json` alone in airlockd/runlines.py.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock
from tinydb import Query, TinyDB

from airlockd import runlines
from airlockd.errors import NotFoundError, StateError, UsageError
from airlockd.fsutil import LOCK_POLL_S
from airlockd.records import AgentUsage, RunRecord, RunState, Transition
from airlockd.state import StateDir
from airlockd.storefiles import (
    LINE_PATHS,
    NOT_READ,
    RUN_ID,
    RunLine,
    Tx,
    _open,
    line_of,
    read_record,
    settled,
)

log = logging.getLogger(__name__)


class Store:
    def __init__(self, state: StateDir) -> None:
        self.state = state
        self._lock = FileLock(str(state.lock), timeout=30)
        self._ready = False

    @contextmanager
    def tx(self, checkpoint: Callable[[], None] = lambda: None) -> Iterator[Tx]:
        """An exclusive transaction: what it writes lands when it ends (not if it raises)."""
        with self._lock.acquire(poll_interval=LOCK_POLL_S):
            self._prepare()
            tx = Tx(self.state)
            if self._ready and (left := _pending(tx)):  # another process died inside a write since
                self._repair(tx, left, {})
            yield tx
            tx.commit(checkpoint)

    def _prepare(self) -> None:
        """Under the lock, once per Store: convert a store of the first layout, and bring the open
        lines, and the runs a crashed write named pending, back in line with their records."""
        if self._ready:
            return
        from airlockd.storemigrate import migrate, rebuild

        migrate(self.state)
        if not self.state.index_file.exists() and _names(self.state.records):
            rebuild(self.state)  # the index was lost or moved aside: the lines come back from the records
        if self.state.index_file.exists():
            tx = Tx(self.state)
            opened = {str(r["id"]): dict(r) for r in tx.index.table("open").all()}
            self._repair(tx, _pending(tx), opened)
            tx._records.clear()  # the records are right; only the lines move
            tx.commit()
        self._ready = True

    def _repair(self, tx: Tx, pending: set[str], opened: dict[str, dict[str, Any]]) -> None:
        """The lines of `pending` runs, and of open ones that differ, written again from their
        records; a line whose run is gone leaves the open lines. Records untouched."""
        for run_id in sorted(pending | set(opened)):
            try:
                rec = read_record(self.state, run_id)
            except NotFoundError:
                if tx.index.table("open").contains(Query().id == run_id):
                    tx.index.table("open").remove(Query().id == run_id)
                    tx.touched = True
                    tx.changed.append(run_id)
                continue
            except StateError as exc:  # a broken record: its line stays; the error names it when it is read
                log.warning("%s", exc.message)
                continue
            if run_id in pending or line_of(rec) != opened.get(run_id):
                tx.put(rec)
        for run_id in pending | set(opened):
            tx._records.pop(run_id, None)  # only the lines move

    def _read_prepared(self) -> None:
        """A reader's first look: a store to convert, or runs a crash left pending, are taken care
        of under the lock first; else nothing is written."""
        if not self._ready and runlines.to_prepare(self.state):
            with self.tx():
                pass
        self._ready = True

    # runs -----------------------------------------------------------------------------------

    def put_run(self, rec: RunRecord) -> None:
        with self.tx() as tx:
            tx.put(rec)

    def get_run(self, run_id: str) -> RunRecord:
        """A run by its id or an unambiguous prefix of it (a compacted run: its summary)."""
        if not RUN_ID.fullmatch(run_id):
            raise NotFoundError(f"no run {run_id[:80]!r} in this workspace", hint="`airlockd runs` lists them")
        self._read_prepared()
        try:
            return read_record(self.state, run_id)
        except NotFoundError:
            return read_record(self.state, self._resolve(run_id))

    def get_run_exact(self, run_id: str) -> RunRecord:
        return read_record(self.state, run_id)

    def _resolve(self, prefix: str) -> str:
        if not prefix or not prefix.startswith("r"):
            raise NotFoundError(f"no run {prefix!r} in this workspace", hint="`airlockd runs` lists them")
        found = set()
        if self.state.records.is_dir():
            found |= {
                n[: -len(".json")]
                for n in os.listdir(self.state.records)
                if n.startswith(prefix) and n.endswith(".json") and not n.endswith(".live.json")
            }
        if len(found) > 1:
            raise UsageError(f"run id {prefix!r} is ambiguous: {', '.join(sorted(found))}")
        if not found:
            raise NotFoundError(f"no run {prefix!r} in this workspace", hint="`airlockd runs` lists them")
        return found.pop()

    def update_run(self, run_id: str, fn: Callable[[RunRecord], None]) -> RunRecord:
        """Read, change with `fn`, write back, all under one lock."""
        with self.tx() as tx:
            rec = self.get_run(run_id)
            if rec.compacted_at is None:
                rec = tx.get(rec.id)
            else:
                raise StateError(
                    f"run {rec.id} was compacted (retention): only its summary is kept, and it cannot change",
                    hint="see [retention] in the policy; `airlockd show` still shows it",
                )
            fn(rec)
            tx.put(rec)
            return rec

    def compact(self, run_ids: list[str], now: float, checkpoint: Callable[[], None] = lambda: None) -> list[RunRecord]:
        """Finished runs reduced to their summaries (retention), in one transaction: each record
        is replaced by its summary (`compacted_at` set, the blobs it named dropped: they go with
        the run's folder, which the caller removes after), and its line says so."""
        with self.tx(checkpoint) as tx:
            out = []
            for run_id in run_ids:
                rec = self.get_run_exact(run_id)
                if not settled(rec.state):
                    raise StateError(f"run {rec.id} is {rec.state.value}: only a finished run can be compacted")
                if rec.compacted_at is None:
                    rec = rec.model_copy(deep=True)
                    rec.compacted_at = now
                    rec.owner_pid = rec.owner_start = None
                    for f in rec.files:
                        f.base_blob = None
                out.append(rec)
            for rec in out:  # nothing a follower announces changed: state and review are as they were
                tx.put(rec, announce=False)
            return out

    def relink(self) -> list[str]:
        """Lines written again for the records that have none (a day's file lost or moved aside);
        the runs whose lines came back. Reads the names of the records and every line."""
        have = {line.id for line in self.lines()}
        names = sorted(n[: -len(".json")] for n in _names(self.state.records) if not n.startswith("."))
        missing = [run_id for run_id in names if run_id not in have]
        if not missing:
            return []
        with self.tx() as tx:
            for run_id in missing:
                try:
                    tx.put(read_record(self.state, run_id), announce=False)
                except StateError as exc:  # a broken record: named; the others come back
                    log.warning("no line for run %s: %s", run_id, exc.message)
                tx._records.pop(run_id, None)  # only the line moves
        log.warning("lines written again from their records for %d run(s)", len(missing))
        return missing

    def put_sample(self, run_id: str, sample: dict[str, Any]) -> None:
        """A live run's latest figures: its own small file, replaced, never fsynced (a sample lost
        to a crash is the one before it, and the run's end writes the figures to its record)."""
        path = self.state.live_sample(run_id)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_bytes(json.dumps(sample, separators=(",", ":")).encode())
        os.replace(tmp, path)

    def drop_sample(self, run_id: str) -> None:
        """The run's figures are final: its record holds them from now on, and no older sample
        may stand in for them (a live run's sample is read over its record)."""
        self.state.live_sample(run_id).unlink(missing_ok=True)

    def lines(
        self,
        *,
        limit: int | None = None,
        states: frozenset[RunState] | None = None,
        agent: str | None = None,
        since: float | None = None,
        before: str | None = None,
    ) -> list[RunLine]:
        """Runs, newest first, filtered, at most `limit`; `before` (a run id) pages on. Reads the
        open lines and the days' lines from the newest until it has enough, never a record."""
        self._read_prepared()
        cursor = None
        if before:
            row = runlines.find(self.state.index_file, self.state.history, before)
            prev = RunLine.model_validate(row) if row else self.get_run(before)
            cursor = (prev.created_at, prev.id)
        rows = runlines.select(
            self.state.index_file,
            self.state.history,
            limit=limit,
            states=frozenset(s.value for s in states) if states is not None else None,
            agent=agent,
            since=since,
            before=cursor,
        )
        return [RunLine.model_validate(r) for r in rows]

    def line(self, run_id: str) -> RunLine | None:
        """One run's line: from the open lines, else from its day's."""
        self._read_prepared()
        row = runlines.find(self.state.index_file, self.state.history, run_id)
        return RunLine.model_validate(row) if row else None

    def _open_rows(self) -> list[dict[str, Any]]:
        return runlines.table(self.state.index_file, "open")

    def open_runs(self, states: frozenset[RunState] | None = None) -> list[RunRecord]:
        """The full records of the runs still open (live or proposed), oldest first."""
        self._read_prepared()
        out = []
        for row in self._open_rows():
            if states is not None and RunState(row["state"]) not in states:
                continue
            try:
                out.append(read_record(self.state, str(row["id"])))
            except NotFoundError:
                continue
        return sorted(out, key=lambda r: r.created_at)

    def changes(self, since: int) -> tuple[int, list[str] | None]:
        """(the store's serial, the ids changed after serial `since`; None when the index no
        longer reaches back that far)."""
        if not self.state.index_file.exists():
            return 0, []
        row: dict[str, Any] = dict(
            _open(self.state.index_file).table("meta").get(doc_id=1) or {"serial": 0, "recent": []}
        )
        serial, recent = int(row["serial"]), row["recent"]
        if serial == since:
            return serial, []
        if since > serial or (recent and recent[0][0] > since + 1) or (not recent and serial):
            return serial, None
        return serial, list(dict.fromkeys(r for s, r in recent if s > since))

    def recent_withheld(self, runs: int = 10) -> list[str]:
        """The paths the last `runs` staged runs withheld (as recorded: masked where the path
        held a value; withheld.learn matches those against the tree), for a process that did not
        stage them to read their values again."""
        staged = [line for line in self.lines(limit=200) if line.withheld][:runs]
        out = set()
        for line in staged:
            out |= set(line.withheld_paths)
            if len(line.withheld_paths) < LINE_PATHS or line.compacted:
                continue  # the line holds them all (a compacted run's record is not read for this)
            try:  # more than a line keeps: its record
                rec = read_record(self.state, line.id)
            except (NotFoundError, StateError) as exc:
                log.warning("withheld paths of run %s not read: %s", line.id, getattr(exc, "message", exc))
                continue
            out |= {
                w["path"] for w in rec.withheld if isinstance(w, dict) and "path" in w and w.get("rule") not in NOT_READ
            }
        return sorted(out)

    def admit(self, rec: RunRecord, decide: Callable[[int, AgentUsage], str | None]) -> str | None:
        """Store a new run, asking `decide(live runs of its agent, the agent's usage)` under the
        same lock whether it is refused (the reason) or admitted (None: a run of the agent's
        budget is spent). Two requests racing for the last slot cannot both win."""
        with self.tx() as tx:
            live = sum(1 for r in tx.index.table("open").all() if r["agent"] == rec.agent and RunState(r["state"]).live)
            usage = _agent_in(tx.index, rec.agent)
            reason = decide(live, usage)
            if reason is None:
                update_agent_in(tx.index, rec.agent, lambda u: setattr(u, "runs_used", u.runs_used + 1))
            else:
                rec.state = RunState.REJECTED_AT_ADMISSION
            rec.transitions.append(Transition(state=rec.state, at=time.time(), detail=reason or ""))
            tx.put(rec)
            return reason

    # agents ---------------------------------------------------------------------------------

    def get_agent(self, name: str) -> AgentUsage:
        self._read_prepared()
        if not self.state.index_file.exists():
            return AgentUsage(name=name)
        return _agent_in(_open(self.state.index_file), name)

    def list_agents(self) -> list[AgentUsage]:
        self._read_prepared()
        if not self.state.index_file.exists():
            return []
        return [AgentUsage.model_validate(r) for r in _open(self.state.index_file).table("agents").all()]

    def update_agent(self, name: str, fn: Callable[[AgentUsage], None]) -> AgentUsage:
        """Change the agent's usage with `fn` under the lock; one that changes nothing writes nothing."""
        with self.tx() as tx:
            before = _agent_row(tx.index, name)
            usage = update_agent_in(tx.index, name, fn)
            if usage.model_dump(mode="json") != before:
                tx.changed.append("")  # a change a follower reads the agents for
            return usage


def _agent_in(db: TinyDB, name: str) -> AgentUsage:
    row = db.table("agents").get(Query().name == name)
    return AgentUsage.model_validate(row) if row else AgentUsage(name=name)


def update_agent_in(db: TinyDB, name: str, fn: Callable[[AgentUsage], None]) -> AgentUsage:
    usage = _agent_in(db, name)
    fn(usage)
    row = usage.model_dump(mode="json")
    if _agent_row(db, name) != row:  # (unchanged: the index is not written again)
        db.table("agents").upsert(row, Query().name == name)
    return usage


def _agent_row(db: TinyDB, name: str) -> dict[str, Any] | None:
    found = db.table("agents").get(Query().name == name)
    return dict(found) if isinstance(found, dict) else None


def _pending(tx: Tx) -> set[str]:
    meta: dict[str, Any] = dict(tx.index.table("meta").get(doc_id=1) or {})
    return set(meta.get("pending") or [])


def _names(folder: Path) -> list[str]:
    try:
        return [n for n in os.listdir(folder) if n.endswith(".json") and not n.endswith(".live.json")]
    except FileNotFoundError:
        return []
