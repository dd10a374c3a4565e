"""Where a workspace's state lives: outside the workspace, one directory per workspace."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import NamedTuple


def state_root() -> Path:
    if env := os.environ.get("AIRLOCK_STATE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "airlockd"


class StateDir(NamedTuple):
    """The per-workspace state directory and the fixed names inside it. (A NamedTuple, not a
    dataclass: the CLI's start-up, which reads it, does not pay for importing `dataclasses`.)"""

    workspace: Path
    root: Path

    @classmethod
    def for_workspace(cls, workspace: Path) -> StateDir:
        ws = workspace.resolve()
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", ws.name)[:40] or "root"
        digest = hashlib.sha256(os.fsencode(ws)).hexdigest()[:12]
        root = state_root() / f"{slug}-{digest}"
        if root.resolve().is_relative_to(ws):
            from airlockd.errors import UsageError

            raise UsageError(
                f"the state directory {root} is inside the workspace {ws}",
                hint="set AIRLOCK_STATE_DIR (or XDG_STATE_HOME) to a folder outside the workspace",
            )
        return cls(ws, root)

    def ensure(self) -> StateDir:
        for d in (self.root, self.runs, self.records, self.history, self.journal, self.backups, self.policies):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self

    @property
    def store(self) -> Path:
        """The first layout's single store file: converted on first use (airlockd/storemigrate.py)."""
        return self.root / "store.json"

    @property
    def index_file(self) -> Path:
        return self.root / "index.json"

    @property
    def history(self) -> Path:
        return self.root / "history"

    @property
    def records(self) -> Path:
        return self.root / "records"

    def record(self, run_id: str) -> Path:
        return self.records / f"{run_id}.json"

    def live_sample(self, run_id: str) -> Path:
        return self.records / f"{run_id}.live.json"

    @property
    def lock(self) -> Path:
        return self.root / "store.lock"

    @property
    def audit(self) -> Path:
        return self.root / "audit.jsonl"

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def journal(self) -> Path:
        return self.root / "journal"

    @property
    def backups(self) -> Path:
        return self.root / "backups"

    @property
    def policies(self) -> Path:
        return self.root / "policies"

    def run_dir(self, run_id: str) -> Path:
        return self.runs / run_id
