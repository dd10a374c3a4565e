"""Retention: finished runs past the policy's `[retention]` are compacted to their summary (the
record the evidence and the audit need, in the run's record file) and lose their folder (staging,
base blobs, output), their backups and their record file; sealed audit segments past
`audit_days` are dropped with an anchor that keeps the chain checkable (docs/state.md).

What is never touched: a live or proposed run, an applied run inside its undo window, a commit
journal (crash recovery's), anything of a run that is not compacted. A compaction is announced in
the audit trail before anything goes, and each step is one atomic move or removal that a later
`gc` finishes when a crash cut it short (AIRLOCK_GC_CRASH_AT kills the process at a step, for the
crash test).
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airlockd.errors import AirlockError
from airlockd.fsutil import remove_tree, tree_bytes
from airlockd.records import RunRecord
from airlockd.staging import capfs

if TYPE_CHECKING:
    from airlockd.runs.service import Service

log = logging.getLogger(__name__)

DAY = 86400.0
BATCH = 500  # runs compacted per store transaction
MARGIN_S = 3600.0  # an applied run stays whole this long past its undo window
_steps = itertools.count(1)


def _step() -> None:
    crash_at = os.environ.get("AIRLOCK_GC_CRASH_AT")
    if crash_at and next(_steps) == int(crash_at):
        os.kill(os.getpid(), signal.SIGKILL)  # the crash test's kill point


def undo_open_until(svc: Service, rec: RunRecord) -> float | None:
    """Until when the run's applied changes can be undone (None: nothing to undo)."""
    landed = [a.at for a in rec.applied if not a.undone]  # an expired proposal may have landed some
    if not landed:
        return None
    return max(landed) + svc.policy.retention.undo_days * DAY


def _size(path: Path) -> int:
    """Bytes under `path` by allocated blocks, links not followed (bounded by what is there)."""
    return tree_bytes(path)


def journals(svc: Service, run_id: str) -> list[str]:
    """The run's commit journals still in progress (their backups are what recovery needs)."""
    try:
        return [n for n in os.listdir(svc.state.journal) if n.startswith(f"{run_id}-")]
    except FileNotFoundError:
        return []


def _backups(svc: Service, run_id: str) -> list[Path]:
    """The run's committed transactions' backups (`<id>-<n>`, `<id>-<n>-undo`)."""
    try:
        names = os.listdir(svc.state.backups)
    except FileNotFoundError:
        return []
    return [svc.state.backups / n for n in sorted(names) if n.startswith(f"{run_id}-")]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        staging = path / "staging"
        if capfs.is_mount(staging):
            capfs.unmount(staging)
        remove_tree(path)  # a kept staging copy may be as deep as an agent made it
    else:
        path.unlink(missing_ok=True)


def collect(svc: Service, *, apply: bool, now: float | None = None) -> dict[str, Any]:
    """What retention would compact (apply=False) or compacts (True): a report for the CLI,
    the daemon's log and the audit."""
    now = time.time() if now is None else now
    ret = svc.policy.retention
    finished = [line for line in svc.store.lines() if line.state.final]
    chosen: list[tuple[RunRecord, str]] = []
    kept: list[dict[str, str]] = []
    for position, line in enumerate(finished):
        if line.compacted:
            continue
        old = now - line.created_at > ret.keep_days * DAY
        if not old and position < ret.keep_runs:
            continue
        rec = svc.store.get_run_exact(line.id)
        if journals(svc, rec.id):
            kept.append({"id": rec.id, "why": "a commit of it was interrupted: recovery must finish it first"})
            continue
        until = undo_open_until(svc, rec)
        if until is not None and until + MARGIN_S > now:  # an undo may be starting just now
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(until))
            kept.append({"id": rec.id, "why": f"can be undone until {when}"})
            continue
        why = f"older than {ret.keep_days:g} days" if old else f"beyond the last {ret.keep_runs} finished runs"
        chosen.append((rec, why))
    runs = []
    for rec, why in chosen:
        parts = [svc.state.run_dir(rec.id), *_backups(svc, rec.id), svc.state.record(rec.id)]
        runs.append({"id": rec.id, "state": rec.state.value, "why": why, "bytes": sum(_size(p) for p in parts)})
    report: dict[str, Any] = {
        "applied": apply,
        "runs": runs,
        "bytes": sum(r["bytes"] for r in runs),
        "kept": kept,
        "audit_segments": [],
        "leftovers": 0,
        "relinked": [],
        "retention": ret.model_dump(),
    }
    if apply:
        report["relinked"] = svc.store.relink()  # a day's lines lost: back from the records
        if chosen:
            svc.audit.append(
                "retention.compacting",
                policy=svc.loaded.revision,
                runs=[r["id"] for r in runs],
                bytes=report["bytes"],
            )
        for at in range(0, len(chosen), BATCH):
            compact(svc, [rec for rec, _ in chosen[at : at + BATCH]], now)
        report["leftovers"] = sweep_compacted(svc)
        report["swept"] = svc.sweep()
        if ret.audit_days > 0:
            report["audit_segments"] = list(svc.audit.drop_before(now - ret.audit_days * DAY))
            if report["audit_segments"]:
                svc.audit.append("audit.dropped", policy=svc.loaded.revision, segments=report["audit_segments"])
        if chosen:
            svc.audit.append("retention.compacted", policy=svc.loaded.revision, runs=[r["id"] for r in runs])
    else:
        report["audit_segments"] = [s for s in _droppable(svc, now, ret.audit_days)]
    return report


def _droppable(svc: Service, now: float, audit_days: float) -> list[str]:
    if audit_days <= 0:
        return []
    sealed = getattr(svc.audit, "droppable_before", None)
    return list(sealed(now - audit_days * DAY)) if sealed else []


def compact(svc: Service, recs: list[RunRecord], now: float) -> None:
    """Runs to their summaries in one store transaction, then their folders and backups gone, each step atomic."""
    _step()
    svc.store.compact([rec.id for rec in recs], now, _step)  # the summaries, before any folder goes
    _step()
    for rec in recs:
        for part in [svc.state.run_dir(rec.id), *_backups(svc, rec.id)]:
            _remove(part)
            _step()


def _compacted(svc: Service, run_id: str) -> bool:
    try:
        return svc.store.get_run_exact(run_id).compacted_at is not None
    except AirlockError:  # no such run (a stray folder: recovery's sweep), or a broken record
        return False


def sweep_compacted(svc: Service) -> int:
    """Folders and backups of compacted runs a crash left behind; the number removed."""
    names: list[Path] = []
    for folder in (svc.state.runs, svc.state.backups):
        try:
            names += [folder / n for n in sorted(os.listdir(folder))]
        except FileNotFoundError:
            continue
    removed = 0
    gone: dict[str, bool] = {}
    for path in names:
        run_id = path.name if path.parent == svc.state.runs else path.name.split("-", 1)[0]
        if run_id not in gone:
            gone[run_id] = _compacted(svc, run_id)
        if gone[run_id]:
            _remove(path)
            removed += 1
            _step()
    return removed
