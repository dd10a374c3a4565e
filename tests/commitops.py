"""FileOps from an inspected change set, for tests and benchmarks that commit a diff directly (the
daemon builds its ops from the run's review, runs/review.py)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from airlockd.pipeline.commit import FileOp
from airlockd.pipeline.manifest import Change, Kind


def ops_from_changes(changes: Iterable[Change], staging: Path) -> list[FileOp]:
    """FileOps for an inspected change set, new content read from `staging`. Touches nothing."""
    return [
        FileOp(
            c.path,
            c.before,
            c.after,
            staging / c.path if c.after is not None and c.after.kind is Kind.FILE else None,
        )
        for c in changes
    ]
