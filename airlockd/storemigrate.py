"""The first store layout (one `store.json` holding every run and agent) converted to today's
(airlockd/store.py), once, under the store's lock, so that a crash at any point leaves either the
old layout whole or the new one whole.

The old file is the truth until the new index exists: records and the days' lines are written
first (a crash there leaves them unreferenced, and the next start writes them again from the same
`store.json`), the index last and atomically, and `store.json` is removed only after that (a crash
between the two: the next start sees the index and removes the old file).
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from airlockd.errors import StateError
from airlockd.fsutil import atomic_write_bytes, fsync_dir, syncfs
from airlockd.records import AgentUsage, RunRecord
from airlockd.state import StateDir
from airlockd.storefiles import RUN_ID, day_of, line_of, read_record, settled

log = logging.getLogger(__name__)


def migrate(state: StateDir) -> int:
    """Convert a first-layout store; the number of runs converted (0: nothing to do). The caller
    holds the store's lock."""
    old = state.store
    if not old.exists():
        return 0
    if state.index_file.exists():  # converted; the crash came before the old file went
        old.unlink()
        fsync_dir(state.root)
        return 0
    try:
        data = json.loads(old.read_bytes())
        runs = [RunRecord.model_validate(doc) for doc in _table(data, "runs")]
        agents = [AgentUsage.model_validate(doc) for doc in _table(data, "agents")]
    except (ValueError, ValidationError) as exc:  # JSONDecodeError is a ValueError
        raise StateError(
            f"the store {old} cannot be converted to the current layout: {str(exc).splitlines()[0]}",
            hint="it is left as it was; restore it from a backup, or move it aside to start afresh",
        ) from None
    seen: set[str] = set()
    for rec in runs:
        if not RUN_ID.fullmatch(rec.id) or rec.id in seen:
            why = "is not a run id (letters, digits, - and _)" if rec.id not in seen else "is there twice"
            raise StateError(
                f"the store {old} cannot be converted to the current layout: the run {rec.id[:80]!r} {why}",
                hint="it is left as it was; correct or remove that run in it, or restore it from a backup",
            )
        seen.add(rec.id)
    for d in (state.records, state.history):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    days: dict[str, dict[str, Any]] = defaultdict(dict)
    opened: dict[str, Any] = {}
    for rec in sorted(runs, key=lambda r: r.created_at):
        doc = rec.model_dump(mode="json")
        put(state.record(rec.id), json.dumps({"run": {"1": doc}}, separators=(",", ":")).encode())
        line = line_of(rec)
        if settled(rec.state):
            days[day_of(rec.id)][str(len(days[day_of(rec.id)]) + 1)] = line
        else:
            opened[str(len(opened) + 1)] = line
    for day, rows in days.items():
        put(state.history / f"{day}.json", json.dumps({"runs": rows}, separators=(",", ":")).encode())
    syncfs(state.root)  # one barrier for them all, before the index that makes them the store
    index = {
        "open": opened,
        "agents": {str(n): a.model_dump(mode="json") for n, a in enumerate(agents, 1)},
        "meta": {"1": {"serial": 1, "recent": []}},
    }
    put(state.index_file, json.dumps(index, separators=(",", ":")).encode(), sync=True)
    old.unlink()
    fsync_dir(state.root)
    log.info("store converted to the current layout: %d runs, %d agents", len(runs), len(agents))
    return len(runs)


def rebuild(state: StateDir) -> int:
    """The index and the days' lines written again from the records (the index
    was lost, or moved aside because it could not be read). The agents' usage and quarantine are
    not in any record: they start afresh, and the log says so. The caller holds the lock."""
    days: dict[str, dict[str, Any]] = defaultdict(dict)
    opened: dict[str, Any] = {}
    recs = []
    for name in sorted(os.listdir(state.records)) if state.records.is_dir() else []:
        if name.endswith(".json") and not name.endswith(".live.json") and not name.startswith("."):
            try:
                recs.append(read_record(state, name[: -len(".json")]))
            except StateError as exc:
                log.warning("not in the rebuilt lines: %s", exc.message)
    for rec in recs:
        line = line_of(rec)
        if settled(rec.state):
            days[day_of(rec.id)][str(len(days[day_of(rec.id)]) + 1)] = line
        else:
            opened[str(len(opened) + 1)] = line
    state.history.mkdir(mode=0o700, exist_ok=True)
    for day, rows in days.items():
        put(state.history / f"{day}.json", json.dumps({"runs": rows}, separators=(",", ":")).encode())
    syncfs(state.root)
    index = {"open": opened, "agents": {}, "meta": {"1": {"serial": 1, "recent": []}}}
    put(state.index_file, json.dumps(index, separators=(",", ":")).encode(), sync=True)
    log.warning(
        "the store's index was missing: rebuilt the lines of %d runs from their records; the agents' usage and"
        " quarantine start afresh (see `airlockd agents`)",
        len(recs),
    )
    return len(recs)


def put(path: Path, data: bytes, sync: bool = False) -> None:
    """Replace `path` with `data` (readers see the old or the new file); fsynced only with `sync`:
    the records and lines are flushed together by one `syncfs` before the index is written."""
    if sync:
        atomic_write_bytes(path, data)
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _table(data: Any, name: str) -> list[Any]:
    if not isinstance(data, dict):
        raise ValueError("the file does not hold a JSON object")
    table = data.get(name) or {}
    if not isinstance(table, dict):
        raise ValueError(f"its {name!r} table is not a JSON object")
    return list(table.values())
