"""Persistence: tinydb over one JSON file, atomic on disk and safe with several processes.

Every access holds an exclusive file lock for its whole read-modify-write, and the file is
replaced atomically, so the CLI and a daemon can run at once and a crash leaves the old or the
new file, never half of one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock
from tinydb import Query, TinyDB
from tinydb.storages import Storage

from airlockd.errors import NotFoundError, UsageError
from airlockd.fsutil import LOCK_POLL_S, atomic_write_bytes
from airlockd.records import AgentUsage, RunRecord
from airlockd.state import StateDir


class _SnapshotStorage(Storage):
    """The whole file read once under the lock; written back atomically on close if changed."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._data: dict[str, Any] | None = json.loads(path.read_bytes()) if path.exists() else None
        self._dirty = False

    def read(self) -> dict[str, Any] | None:
        return self._data

    def write(self, data: dict[str, Any]) -> None:
        self._data = data
        self._dirty = True

    def close(self) -> None:
        if self._dirty and self._data is not None:
            atomic_write_bytes(self._path, json.dumps(self._data, separators=(",", ":")).encode())


# Withheld for what they are, not what they hold: a repository's history (git's own files, hook
# samples: their lines are no values, and "delete" masked every "deleted" after), a link that
# leads out of the workspace.
NOT_READ = frozenset({"git-history", "symlink-escape"})


class Store:
    def __init__(self, state: StateDir) -> None:
        self.state = state
        self._lock = FileLock(str(state.lock), timeout=30)

    @contextmanager
    def tx(self) -> Iterator[TinyDB]:
        """An exclusive transaction: what it writes lands atomically when it ends."""
        with self._lock.acquire(poll_interval=LOCK_POLL_S):
            db = TinyDB(self.state.store, storage=_SnapshotStorage)
            try:
                yield db
            finally:
                db.close()

    # runs -----------------------------------------------------------------------------------

    def put_run(self, rec: RunRecord) -> None:
        with self.tx() as db:
            db.table("runs").upsert(rec.model_dump(mode="json"), Query().id == rec.id)

    def get_run(self, run_id: str) -> RunRecord:
        with self.tx() as db:
            return _resolve(db, run_id)

    def list_runs(self) -> list[RunRecord]:
        with self.tx() as db:
            rows = db.table("runs").all()
        return sorted((RunRecord.model_validate(r) for r in rows), key=lambda r: r.created_at)

    def recent_withheld(self, runs: int = 10) -> list[str]:
        """The paths the last `runs` staged runs withheld (as recorded: masked where the path
        held a value; withheld.learn matches those against the tree), for a process that did not
        stage them to read their values again."""
        with self.tx() as db:
            rows = [r for r in db.table("runs").all() if r.get("withheld")]  # staged: queued, refused ones not
        rows = sorted(rows, key=lambda r: str(r.get("created_at", "")))[-runs:]
        out = {
            w["path"]
            for r in rows
            for w in r.get("withheld") or []
            if isinstance(w, dict) and "path" in w and w.get("rule") not in NOT_READ
        }
        return sorted(out)

    def update_run(self, run_id: str, fn: Callable[[RunRecord], None]) -> RunRecord:
        """Read, change with `fn`, write back, all under one lock."""
        with self.tx() as db:
            rec = _resolve(db, run_id)
            fn(rec)
            db.table("runs").upsert(rec.model_dump(mode="json"), Query().id == rec.id)
            return rec

    # agents ---------------------------------------------------------------------------------

    def get_agent(self, name: str) -> AgentUsage:
        with self.tx() as db:
            row = db.table("agents").get(Query().name == name)
        return AgentUsage.model_validate(row) if row else AgentUsage(name=name)

    def list_agents(self) -> list[AgentUsage]:
        with self.tx() as db:
            return [AgentUsage.model_validate(r) for r in db.table("agents").all()]

    def update_agent(self, name: str, fn: Callable[[AgentUsage], None]) -> AgentUsage:
        with self.tx() as db:
            return update_agent_in(db, name, fn)


def update_agent_in(db: TinyDB, name: str, fn: Callable[[AgentUsage], None]) -> AgentUsage:
    table = db.table("agents")
    row = table.get(Query().name == name)
    usage = AgentUsage.model_validate(row) if row else AgentUsage(name=name)
    fn(usage)
    table.upsert(usage.model_dump(mode="json"), Query().name == name)
    return usage


def _resolve(db: TinyDB, run_id: str) -> RunRecord:
    """A run by its id or an unambiguous prefix of it."""
    table = db.table("runs")
    row = table.get(Query().id == run_id)
    if row is None:
        rows = [r for r in table.all() if str(r["id"]).startswith(run_id)] if run_id else []
        if len(rows) > 1:
            raise UsageError(f"run id {run_id!r} is ambiguous: {', '.join(r['id'] for r in rows)}")
        if not rows:
            raise NotFoundError(f"no run {run_id!r} in this workspace", hint="`airlockd runs` lists them")
        row = rows[0]
    return RunRecord.model_validate(row)
