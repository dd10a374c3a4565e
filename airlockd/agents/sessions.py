"""Transactional agent sessions: an agent's home (its conversation state) follows its runs' fate.

Before a run, the agent's home is copied aside (small: a Codex home is about a megabyte). When the
run is approved (applied), the home stays as the run left it: the conversation is committed with
the files, and the copy is kept while the run can be undone. When it is rejected, expires, or ends
without a proposal (stopped, killed, failed, over a limit), the copy is put back, so the next turn
does not assume changes that never landed; when an applied run is undone, likewise. Only the
latest run to start on a home can roll it back: an older run's copy would also erase the turns
that came after it, so that case is recorded and left alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from airlockd.agents import homes
from airlockd.records import RunRecord, RunState

SNAPSHOT = "agent-home.before"
APPLIED = "agent-home.applied"  # the same copy, once the run landed: what its undo puts back
_ROLLBACK = frozenset(
    {
        RunState.REJECTED,
        RunState.EXPIRED,
        RunState.STOPPED,
        RunState.KILLED,
        RunState.FAILED,
        RunState.LIMIT_EXCEEDED,
    }
)


def agent_dir(state_root: Path, agent: str) -> Path:
    return state_root / "agents" / agent


def home(state_root: Path, agent: str, owner: tuple[int, int] | None) -> Path:
    """The agent's private home (created on first use, owned by the container's user)."""
    h = agent_dir(state_root, agent) / "home"
    if not h.is_dir():
        h.mkdir(parents=True, mode=0o700)
        if owner is not None:
            os.chown(h, *owner)
    return h


def snapshot(state_root: Path, rec: RunRecord, run_dir: Path) -> None:
    """Copy the agent's home aside for this run and mark the run as the home's latest."""
    h = agent_dir(state_root, rec.agent) / "home"
    if not h.is_dir():
        return
    dst = run_dir / SNAPSHOT
    shutil.rmtree(dst, ignore_errors=True)
    _copy(h, dst)
    (agent_dir(state_root, rec.agent) / "last-run").write_text(rec.id)


def settle(service: Any, rec: RunRecord, dst: RunState) -> None:
    """Commit or roll back the agent's conversation as the run's fate is decided."""
    run_dir = service.state.run_dir(rec.id)
    fields = {"run": rec.id, "agent": rec.agent, "policy": rec.policy_revision}
    if dst is RunState.UNDONE:
        if (run_dir / APPLIED).is_dir():
            _roll_back(service, rec, run_dir / APPLIED, dst, fields)
        return
    snap = run_dir / SNAPSHOT
    if not snap.is_dir() or (dst is not RunState.APPLIED and dst not in _ROLLBACK):
        return
    if dst is RunState.APPLIED:
        shutil.rmtree(run_dir / APPLIED, ignore_errors=True)
        os.replace(snap, run_dir / APPLIED)  # kept for an undo (compacted with the run)
        service.audit.append("session.committed", **fields)
        return
    _roll_back(service, rec, snap, dst, fields)


def _roll_back(service: Any, rec: RunRecord, snap: Path, dst: RunState, fields: dict[str, Any]) -> None:
    """Put the copy `snap` back as the agent's home, when `rec` is the latest run on it."""
    adir = agent_dir(service.state.root, rec.agent)
    try:
        latest = (adir / "last-run").read_text().strip()
    except OSError:
        latest = ""
    if latest != rec.id:
        shutil.rmtree(snap, ignore_errors=True)
        service.audit.append("session.rollback_skipped", **fields, why=f"run {latest} continued from it")
        return
    h = adir / "home"
    old = adir / f"home.rolled-back.{rec.id}"
    try:
        with homes.locked(h):  # not while another run's copy replaces it
            if h.exists():
                os.replace(h, old)
            os.replace(snap, h)
    except OSError as exc:  # the run's fate stands; the conversation could not follow it
        service.audit.append("session.rollback_failed", **fields, error=str(exc))
        return
    shutil.rmtree(old, ignore_errors=True)
    service.audit.append("session.rolled_back", **fields, to_state=dst.value)


def _copy(src: Path, dst: Path) -> None:
    # cp -a keeps owners (the container's user) and never follows the agent's symlinks
    done = subprocess.run(["cp", "-a", "--", str(src), str(dst)], capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"copying the agent home failed: {done.stderr.strip()}")
