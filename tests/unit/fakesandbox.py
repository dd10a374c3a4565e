"""A Sandbox without an engine: `act(workspace)` plays the agent on the staging copy."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airlockd.pipeline import overlay
from airlockd.sandbox.base import ContainerSpec, ExitInfo

EFFECTIVE = {
    "image": "fake",
    "image_id": "sha256:fake",
    "user": "1000:1000",
    "network_mode": "none",
    "read_only_root": True,
    "cap_drop": ["ALL"],
    "cap_add": None,
    "privileged": False,
    "security_opt": ["no-new-privileges"],
    "init": True,
    "memory_bytes": 1 << 30,
    "memory_swap_bytes": 1 << 30,
    "pids_limit": 256,
    "cpus": 1.0,
    "tmpfs": {"/tmp": "size=256m"},
    "mounts": [],
}


@dataclass
class FakeSandbox:
    act: Callable[[Path], bytes | None] = lambda ws: None
    timed_out: bool = False
    seen: list[ContainerSpec] = field(default_factory=list)

    def run(self, spec: ContainerSpec, on_output: Callable[[bytes], None] | None = None) -> ExitInfo:
        self.seen.append(spec)
        ov = spec.workspace_overlay
        if ov is None:
            out = self.act(spec.workspace) or b""
        else:  # what the engine does with the run's overlay volume, done here with the kernel
            merged = ov.upper.parent.parent / "merged"
            overlay.mount(ov.lower, ov.upper, ov.work, merged)
            try:
                out = self.act(merged) or b""
            finally:
                overlay.unmount(merged)
                merged.rmdir()
        return ExitInfo("f" * 64, 0, False, self.timed_out, False, None, 0.1, len(out), out, dict(EFFECTIVE))

    def stop(self, run_id: str, grace_s: float) -> None:
        pass

    def kill(self, run_id: str) -> None:
        pass

    def stats(self, run_id: str) -> dict[str, float] | None:
        return None

    def ping(self) -> None:
        pass

    def labelled_runs(self, workspace: str) -> list[str]:
        return []

    def reap(self, run_id: str) -> int:
        return 0


def workspace(root: Path, extra_policy: str = "") -> Path:
    ws = root / "project"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("A = 1\n")
    (ws / "notes.txt").write_text("plain notes\n")
    (ws / ".env").write_text("DB_PASSWORD=Zq8-withheld-value-xK31\n")
    (ws / "policies.toml").write_text('[agents.bot]\ncommand = ["true"]\n' + extra_policy)
    return ws


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


@pytest.fixture(autouse=True)
def _unmount_staging(_state_dir: Path) -> Iterator[None]:
    """Runs left proposed keep their staging copy on a tmpfs (when root): unmount them after."""
    yield
    for line in Path("/proc/mounts").read_text().splitlines():
        target = line.split()[1]
        if target.startswith(str(_state_dir)):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
