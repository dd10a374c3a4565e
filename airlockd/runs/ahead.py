"""What the daemon makes ready for runs that other processes carry (runs/carrier.py): the
engine's capped upper layers made ahead (sandbox/layers.py, "Spares").

A spare is made by the daemon, which lives across runs, with the cap the last run's holder had;
while a run's process starts, the daemon sets one aside for that run (renamed after it, so no
other run and no sweep of spares takes it) and tells the run's process its id in the run's
folder; that process takes it when the cap is the one it needs (a rename: 0.01 s, where making a
holder costs 0.2–0.4 s), or removes it and makes its own. When the run's process has ended (its
holder let go of), the daemon makes the next spare. The last cap is kept in the state directory,
so a daemon that starts makes one before its first run.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import TYPE_CHECKING

from airlockd.fsutil import atomic_write_bytes
from airlockd.runs.execution import AHEAD, SPARE, held_upper, stdin_ahead
from airlockd.staging import stagers

if TYPE_CHECKING:
    from airlockd.runs.service import Service

log = logging.getLogger(__name__)

LAST_CAP = "spare-cap.json"


def reserve(svc: Service, run_id: str) -> bool:
    """In the daemon, while the run's process starts (before it stages): set one of its spares aside for the run;
    whether it had one. On a remote engine the prompt a `command` agent reads on its standard input
    is written into it first, through the daemon's service in the spare, which runs already: the
    run's process would otherwise start one of its own and wait for it (0.05 s of its path)."""
    if svc.keeper is None:
        return False
    rec = svc.store.get_run(run_id)
    held = held_upper(svc, rec.agent)
    if held is None:
        return False
    stdin = stdin_ahead(svc, rec) if held.remote else None  # (an engine here reads the local file)
    files = {"stdin": stdin} if stdin is not None else {}
    cid = held.reserve_spare(run_id, files)
    if cid is None:
        return False
    run_dir = svc.state.run_dir(run_id)
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    atomic_write_bytes(run_dir / AHEAD, json.dumps(digests).encode())
    atomic_write_bytes(run_dir / SPARE, json.dumps({"id": cid}).encode())
    return True


def after(svc: Service, run_id: str) -> None:
    """In the daemon, once the run's process has ended (its holder let go of): the next spare, of
    the cap that run's holder had, made in the background. A spare set aside for it that it never
    took goes."""
    if svc.keeper is None:
        return
    agent = svc.store.get_run(run_id).agent
    held = held_upper(svc, agent)
    if held is None:
        return
    held.drop_claim(run_id)  # one it never took (it failed before: its holder was never asked for)
    cap = stagers.held_cap(svc.state.run_dir(run_id))
    if cap is None:
        return
    held.make_spare(*cap)
    doc = {"agent": agent, "cap": [cap[0], cap[1], list(cap[2]), cap[3]]}
    atomic_write_bytes(svc.state.root / LAST_CAP, json.dumps(doc).encode())


def at_start(svc: Service) -> None:
    """In a daemon that starts: a spare of the cap the last run had, for its first run."""
    try:
        doc = json.loads((svc.state.root / LAST_CAP).read_bytes())
        agent = str(doc["agent"])
        size, inodes, (uid, gid), mode = doc["cap"]
        cap = (int(size), int(inodes), (int(uid), int(gid)), int(mode))
    except (OSError, ValueError, KeyError, TypeError):
        return
    if agent not in svc.policy.agents:
        return
    held = held_upper(svc, agent)
    if held is not None:
        held.make_spare(*cap)
