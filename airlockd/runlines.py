"""Reading the runs' lines (what a listing shows) from the store's files, with nothing heavier than
`json`: `airlockd runs` answers from here without importing the store's models, so a listing costs
the interpreter's start and the lines it reads (docs/state.md). The store (airlockd/store.py)
writes these files and reads them through the same functions.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airlockd.state import StateDir

# The run states (airlockd.records.RunState, checked equal by tests/unit/test_state_growth.py),
# kept here as names so a listing does not import the models.
LIVE = ("admitted", "staging", "running", "inspecting")
STATES = (
    *LIVE,
    "proposed",
    "applied",
    "rejected",
    "expired",
    "undone",
    "rejected_at_admission",
    "stopped",
    "killed",
    "failed",
    "limit_exceeded",
)
OPEN = frozenset((*LIVE, "proposed"))  # the states whose lines live in the index

_DAY = re.compile(r"r(\d{6})[0-9a-f]+")


def to_prepare(state: StateDir) -> bool:
    """Whether the store must be looked at under its lock before it is read: a first-layout store
    to convert, an index to rebuild from the records, or runs a crash left pending."""
    if state.store.exists():
        return True
    meta = table(state.index_file, "meta")
    if meta:
        return bool(meta[0].get("pending"))
    return not state.index_file.exists() and (state.records.is_dir() and any(os.scandir(state.records)))


def day_of(run_id: str) -> str:
    """The file a run's line and summary live in: the day in its id (`r` yymmdd hex)."""
    m = _DAY.fullmatch(run_id)
    return f"r{m.group(1)}" if m else "other"


def table(path: Path, name: str) -> list[dict[str, Any]]:
    """The documents of one tinydb table of `path` (none when the file is absent)."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return []
    except ValueError as exc:  # not JSON, or not UTF-8
        from airlockd.errors import StateError
        from airlockd.storefiles import unreadable_hint

        raise StateError(f"the store file {path} is unreadable: {exc}", hint=unreadable_hint(path)) from None
    rows = data.get(name) if isinstance(data, dict) else None
    return [r for r in rows.values() if isinstance(r, dict)] if isinstance(rows, dict) else []


def days(history: Path) -> list[str]:
    """The days with lines, newest first."""
    try:
        names = os.listdir(history)
    except FileNotFoundError:
        return []
    return sorted((n[: -len(".json")] for n in names if n.endswith(".json")), reverse=True)


def find(index: Path, history: Path, run_id: str) -> dict[str, Any] | None:
    """One run's line: from the open lines, else from its day's."""
    for path, name in ((index, "open"), (history / f"{day_of(run_id)}.json", "runs")):
        for row in table(path, name):
            if row.get("id") == run_id:
                return row
    return None


def select(
    index: Path,
    history: Path,
    *,
    limit: int | None = None,
    states: frozenset[str] | None = None,
    agent: str | None = None,
    since: float | None = None,
    before: tuple[float, str] | None = None,
) -> list[dict[str, Any]]:
    """Lines, newest first, filtered, at most `limit`; `before` (created_at, id) pages on. Reads
    the open lines and the days' lines from the newest until it has enough, and one day more: a
    run's day is the UTC day in its id, so a day's runs are newer than an earlier day's (the day
    more covers ids made in local time by earlier versions)."""

    def keep(row: dict[str, Any]) -> bool:
        return "id" in row and (
            (states is None or row.get("state") in states)
            and (agent is None or row.get("agent") == agent)
            and (since is None or float(row.get("created_at", 0)) >= since)
            and (before is None or (float(row.get("created_at", 0)), str(row.get("id"))) < before)
        )

    out: dict[str, dict[str, Any]] = {}
    for row in table(index, "open"):
        if keep(row):
            out[str(row["id"])] = row
    settled, extra = 0, False
    floor = _day(since - 86400) if since is not None else None  # a day around: clocks and zones move
    ceiling = _day(before[0] + 86400) if before is not None else None
    for day in days(history) if states is None or states - OPEN else []:
        if limit is not None and settled >= limit:
            if extra:  # one day past the page: a run whose id's day is not its creation day (ids
                break  # made in local time before, a clock moved) is still placed
            extra = True
        if floor is not None and day != "other" and day < floor:
            break
        if ceiling is not None and day != "other" and day > ceiling:
            continue  # a whole day after the cursor: none of it is on this page
        rows = [row for row in table(history / f"{day}.json", "runs") if keep(row)]
        for row in rows:
            out.setdefault(str(row["id"]), row)
        settled += len(rows)
    ordered = sorted(out.values(), key=lambda r: (float(r.get("created_at", 0)), str(r.get("id"))), reverse=True)
    return ordered[:limit] if limit is not None else ordered


def _day(at: float) -> str:
    return "r" + time.strftime("%y%m%d", time.gmtime(at))
