"""`airlockd runs` (a page of run lines, never a full record) and `airlockd gc`'s report."""

from __future__ import annotations

import argparse
import re
import time
from datetime import datetime
from typing import Any

from airlockd import runlines
from airlockd.errors import UsageError
from airlockd.state import StateDir

_SPAN = re.compile(r"(\d+(?:\.\d+)?)([dhm])")
_UNIT = {"d": 86400, "h": 3600, "m": 60}


def parse_since(text: str, now: float | None = None) -> float:
    """`3d`, `12h`, `30m` ago, or a local date / date and time (ISO 8601)."""
    if m := _SPAN.fullmatch(text.strip()):
        return (time.time() if now is None else now) - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise UsageError(
            f"--since {text!r} is neither a span nor a date",
            hint="write 3d, 12h or 30m, or a date such as 2026-12-01 or 2026-12-01T09:30",
        ) from None


def parse_states(values: list[str] | None) -> frozenset[str] | None:
    if not values:
        return None
    names = frozenset(v.strip() for value in values for v in value.split(",") if v.strip())
    if wrong := sorted(names - set(runlines.STATES)):
        raise UsageError(
            f"--state {','.join(wrong)!r}: not a run state", hint=f"the states: {', '.join(runlines.STATES)}"
        )
    return names


def list_runs(args: argparse.Namespace, state: StateDir) -> Any:
    """A page of lines read with `json` alone (airlockd/runlines.py): no model, no record."""
    if runlines.to_prepare(state):  # a store to convert, lines to rebuild or repair: by the store
        from airlockd.cli.decide import log_to_stderr
        from airlockd.store import Store

        log_to_stderr(args)
        Store(state).lines(limit=1)
    limit = None if args.all else args.limit
    cursor = None
    if args.before:
        row = runlines.find(state.index_file, state.history, args.before)
        if row is None:
            raise UsageError(f"--before {args.before!r}: no such run", hint="give a full run id from a listing")
        cursor = (float(row["created_at"]), str(row["id"]))
    rows = runlines.select(
        state.index_file,
        state.history,
        limit=None if limit is None else limit + 1,  # one more: whether there is a next page
        states=parse_states(args.state),
        agent=args.agent,
        since=parse_since(args.since) if args.since else None,
        before=cursor,
    )
    more = limit is not None and len(rows) > limit
    rows = rows[:limit] if limit is not None else rows
    if args.json:
        return [{k: v for k, v in r.items() if k not in ("owner_pid", "owner_start")} for r in rows]
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(r["created_at"])))
        kept = "  (compacted)" if r.get("compacted") else ""
        print(f"{r['id']}  {when}  {r['agent']:12} {r['state']:22} {r['files']:3} changes  {r['prompt'][:50]!r}{kept}")
    if more:
        print(f"… older runs: airlockd runs --before {rows[-1]['id']}")
    return None


def print_gc(report: dict[str, Any]) -> None:
    verb = "compacted" if report["applied"] else "would compact"
    runs = report["runs"]
    print(f"{verb} {len(runs)} run(s), freeing {report['bytes']:,} bytes", end="")
    print(f"; audit segments {'dropped' if report['applied'] else 'to drop'}: {len(report['audit_segments'])}")
    for r in runs[:50]:
        print(f"  {r['id']}  {r['state']:10} {r['why']}  ({r['bytes']:,} bytes)")
    if len(runs) > 50:
        print(f"  … and {len(runs) - 50} more (--json lists all)")
    if report.get("relinked"):
        print(f"  lines written again from their records: {len(report['relinked'])} run(s)")
    for k in report["kept"]:
        print(f"  kept {k['id']}: {k['why']}")
    print(f"  retention: {report['retention']}")
    if not report["applied"] and runs:
        print("  run `airlockd gc --apply` to do it")
