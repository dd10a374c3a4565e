"""Following the store, the one truth: what changed a run outside this daemon's own requests — a
run carried by another process (started with `--no-daemon`, re-attached after a crash, or left by
a background daemon that handed the workspace over), a decision made by `airlockd --no-daemon` —
reaches the editor within `FOLLOW_S` as `airlock/runStatus` and `airlock/proposal`. A live run
whose process died is reconciled then too (re-attached to its container, or recorded as failed),
as a new command's start-up would.

The store's index is replaced atomically on every write of a run, so (inode, mtime, size) names
one version: an idle store costs one `stat` per period, and a changed one a read of the index,
which names the runs changed since the last look (store.changes), and of their lines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from airlockd.lsp import status
from airlockd.lsp.server import AirlockServer
from airlockd.records import LIVE_STATES, RunState

OPEN_STATES = LIVE_STATES | {RunState.PROPOSED}

log = logging.getLogger(__name__)

FOLLOW_S = float(os.environ.get("AIRLOCK_FOLLOW_S", "1"))
QUIET_S = 3.0  # how long a change this daemon made itself is not announced again


class StoreFollower:
    """What this daemon last announced or saw of each run: (state, review counts)."""

    def __init__(self, ls: AirlockServer) -> None:
        self.ls = ls
        self.key: tuple[int, int, int] | None = None
        self.serial = 0
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
        (blocking: reads the index when its file changed, and the lines of what it names)."""
        svc = self.ls.service
        try:
            st = os.stat(svc.state.index_file)
        except FileNotFoundError:
            return []
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key == self.key:
            return []
        self.key = key
        serial, ids = svc.store.changes(self.serial)
        self.serial = serial
        opened = svc.store.lines(states=OPEN_STATES)
        self.owners = {
            line.id: (line.owner_pid, line.owner_start)
            for line in opened
            if line.state.live and line.owner_pid is not None
        }
        if not self.primed:
            lines = opened
        elif ids is None:  # more changes than the index keeps: look at the open and the newest runs
            lines = opened + svc.store.lines(limit=100)
        else:
            lines = [line for run_id in ids if run_id and (line := svc.store.line(run_id)) is not None]
        out = []
        for line in lines:
            counts = tuple(sorted(line.review.items()))
            sig = (line.state.value, counts)
            old = self.seen.get(line.id)
            self.seen[line.id] = sig
            if not self.primed or old == sig or line.id in self.ls.run_processes:
                continue  # at start-up, or announced already, or relayed from the process we carry
            if time.monotonic() - self.quiet.pop(line.id, -QUIET_S) < QUIET_S:
                continue
            out.append((line.id, line.state.value, old is None or old[1] != counts))
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
