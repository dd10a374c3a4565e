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
from airlockd.records import RunState

log = logging.getLogger(__name__)

RUN_STATUS = "airlock/runStatus"
AGENT_STATUS = "airlock/agentStatus"
PROPOSAL = "airlock/proposal"


def setup(server: AirlockServer) -> None:
    def listener(event: str, payload: dict[str, Any]) -> None:  # any thread
        server.from_thread(on_event, server, event, payload)

    server.service.subscribe(listener)


def on_event(ls: AirlockServer, event: str, payload: dict[str, Any]) -> None:
    """On the loop: forward a Service event; a run that became proposed gets its proposal pushed."""
    if event == "runStatus":
        ls.notify(RUN_STATUS, payload)
        if payload.get("state") == RunState.PROPOSED.value:
            ls.spawn(push_proposal(ls, payload["runId"]), name=f"proposal {payload['runId']}")
            ls.proposal_changed(payload["runId"])
    elif event == "agentStatus":
        ls.notify(AGENT_STATUS, payload)


def proposal_for(ls: AirlockServer, run_id: str) -> dict[str, Any]:
    """The proposal of a run for this client (blocking: reads the store and the run's files)."""
    svc = ls.service
    rec = svc.store.get_run(run_id)
    return proposal.build(svc.review, rec, svc.workspace, proposal.EditSupport.of(ls.client_capabilities))


async def push_proposal(ls: AirlockServer, run_id: str) -> None:
    try:
        payload = await ls.call(proposal_for, ls, run_id)
    except AirlockError as exc:
        log.warning("no proposal to push for %s: %s", run_id, exc.message)
        return
    ls.notify(PROPOSAL, payload)
