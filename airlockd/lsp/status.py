"""Notifications: Service events -> `airlock/runStatus` / `airlock/agentStatus`, resource samples
while a run is running (at most one a second), and `airlock/proposal` pushes.

Service events arrive on whatever thread changed the state; they hop to the loop before anything
is sent (the protocol's writer is not thread-safe).
"""

from __future__ import annotations

import logging
from typing import Any

from airlockd.errors import AirlockError
from airlockd.lsp import proposal
from airlockd.lsp.server import AirlockServer
from airlockd.protocol import ProgressEvent, RunEvent, RunOutputEvent, RunStatusEvent, StatusEvent
from airlockd.records import RunState

log = logging.getLogger(__name__)

RUN_STATUS = "airlock/runStatus"
AGENT_STATUS = "airlock/agentStatus"
RUN_OUTPUT = "airlock/runOutput"
PROPOSAL = "airlock/proposal"


def setup(server: AirlockServer) -> None:
    def listener(event: str, payload: dict[str, Any]) -> None:  # any thread
        ev = RunEvent.of_service(event, payload).root
        if not isinstance(ev, ProgressEvent):
            server.from_thread(on_event, server, ev)

    server.service.subscribe(listener)


def on_event(ls: AirlockServer, ev: StatusEvent) -> None:
    """On the loop: forward a Service event; a run that became proposed gets its proposal pushed."""
    if isinstance(ev, RunStatusEvent):
        ls.notify(RUN_STATUS, ev.payload.wire())
        if ev.payload.state is RunState.PROPOSED:
            run_id = ev.payload.runId
            ls.spawn(push_proposal(ls, run_id), name=f"proposal {run_id}")
            ls.proposal_changed(run_id)
    elif isinstance(ev, RunOutputEvent):
        ls.notify(RUN_OUTPUT, ev.payload.wire())
    else:
        ls.notify(AGENT_STATUS, ev.payload.wire())


def proposal_for(ls: AirlockServer, run_id: str) -> dict[str, Any]:
    """The proposal of a run for this client (blocking: reads the store and the run's files)."""
    svc = ls.service
    rec = svc.store.get_run(run_id)
    return proposal.build(svc.content, rec, svc.workspace, proposal.EditSupport.of(ls.client_capabilities))


async def push_proposal(ls: AirlockServer, run_id: str) -> None:
    try:
        payload = await ls.call(proposal_for, ls, run_id)
    except AirlockError as exc:
        log.warning("no proposal to push for %s: %s", run_id, exc.message)
        return
    ls.notify(PROPOSAL, payload)
