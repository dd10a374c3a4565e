"""Following the store, the one truth: what changed a run outside this daemon's own requests — a
run carried by another process (started with `--no-daemon`, re-attached after a crash, or left by
a background daemon that handed the workspace over), a decision made by `airlockd --no-daemon` —
reaches the editor within `FOLLOW_S` as `airlock/runStatus` and `airlock/proposal`. A live run
whose process died is reconciled then too (re-attached to its container, or recorded as failed),
as a new command's start-up would.

The store file is replaced atomically on every write, so (inode, mtime, size) names one version:
an idle store costs one `stat` per period.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from airlockd.lsp import status
from airlockd.lsp.server import AirlockServer
from airlockd.records import RunState

log = logging.getLogger(__name__)

FOLLOW_S = float(os.environ.get("AIRLOCK_FOLLOW_S", "1"))
QUIET_S = 3.0  # how long a change this daemon made itself is not announced again


class StoreFollower:
    """What this daemon last announced or saw of each run: (state, review counts)."""

    def __init__(self, ls: AirlockServer) -> None:
        self.ls = ls
        self.key: tuple[int, int, int] | None = None
        self.seen: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = {}
        self.quiet: dict[str, float] = {}  # changed by this daemon's own decisions: announced already
        self.primed = False
        self.owners: dict[str, tuple[int, int | None]] = {}  # live runs -> the process carrying them
        self.reconciled: set[tuple[str, int]] = set()  # (run, dead process) handed to recovery

    def announced(self, method: str, payload: Any) -> None:
        """This daemon told the editor about a run itself (on the loop)."""
        if method == status.RUN_STATUS and isinstance(payload, dict) and "runId" in payload:
            old = self.seen.get(payload["runId"])
            self.seen[payload["runId"]] = (str(payload.get("state")), old[1] if old else ())

    def decided(self, run_id: str) -> None:
        self.quiet[run_id] = time.monotonic()

    def _changed(self) -> list[tuple[str, str, bool]]:
        """(run, state, whether its review moved) of the runs that changed since the last look
        (blocking: reads the store when its file changed)."""
        from airlockd.records import FileState

        svc = self.ls.service
        try:
            st = os.stat(svc.state.store)
        except FileNotFoundError:
            return []
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self.key:
            return []
        self.key = key
        out = []
        self.owners = {}
        for rec in svc.store.list_runs():
            if rec.state.live and rec.owner_pid is not None:
                self.owners[rec.id] = (rec.owner_pid, rec.owner_start)
            counts = tuple(sorted((s.value, n) for s in FileState if (n := sum(1 for f in rec.files if f.state is s))))
            sig = (rec.state.value, counts)
            old = self.seen.get(rec.id)
            self.seen[rec.id] = sig
            if not self.primed or old == sig or rec.id in self.ls.run_processes:
                continue  # at start-up, or announced already, or relayed from the process we carry
            if time.monotonic() - self.quiet.pop(rec.id, -QUIET_S) < QUIET_S:
                continue
            out.append((rec.id, rec.state.value, old is None or old[1] != counts))
        self.primed = True
        return out

    def orphans(self) -> list[tuple[str, int]]:
        """Live runs whose process died (killed, crashed) and that this daemon does not carry."""
        from airlockd.runs.recovery import alive

        return [
            (run_id, pid)
            for run_id, (pid, start) in self.owners.items()
            if run_id not in self.ls.run_processes and (run_id, pid) not in self.reconciled and not alive(pid, start)
        ]

    async def step(self) -> None:
        ls = self.ls
        if dead := self.orphans():  # re-attached to their container, or recorded as failed
            self.reconciled.update(dead)
            log.info("runs whose process died: %s; reconciling", ", ".join(run_id for run_id, _ in dead))
            await ls.call(ls.service.recover)
            self.key = None  # read again: they changed
        for run_id, state, review_moved in await ls.call(self._changed):
            rec = await ls.call(ls.service.store.get_run, run_id)
            ls.notify(status.RUN_STATUS, ls.service.run_status(rec))
            if state == RunState.PROPOSED.value or review_moved or not RunState(state).live:
                await status.push_proposal(ls, run_id)
                ls.proposal_changed(run_id)
                self.quiet.pop(run_id, None)  # that was us relaying, not a decision of ours


async def follow(ls: AirlockServer) -> None:
    follower = ls.follower = StoreFollower(ls)
    ls.on_proposal_change.append(follower.decided)
    while True:
        try:
            await follower.step()
        except Exception:  # a bad read now is retried at the next period
            log.exception("following the store failed")
        await asyncio.sleep(FOLLOW_S)
