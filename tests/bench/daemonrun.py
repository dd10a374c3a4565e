"""Runs through the daemon, as the CLI and the editor have them: `airlockd run` starts one in the
background for the workspace (client.start_background), which admits each run and carries it in a
process of its own (runs/carrier.py, forked by its launcher). A run is timed from the request to
the daemon's word that it is done, over a connection already open (the editor's is)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from airlockd.lsp.client import Daemon, start_background
from airlockd.state import StateDir
from airlockd.store import Store

RUN_DONE = "airlock/runDone"


def start(ws: Path) -> Daemon:
    daemon = start_background(ws, StateDir.for_workspace(ws).ensure().root)
    daemon.subscribe(RUN_DONE)
    return daemon


def run(daemon: Daemon, ws: Path, agent: str, prompt: str = "go") -> tuple[float, Any]:
    """(seconds from the request to the daemon's word that it is done, the run's record)."""
    t0 = time.perf_counter()
    run_id = daemon.command("airlock.runTask", {"agent": agent, "prompt": prompt})["runId"]
    daemon.wait_for(lambda n: n["method"] == RUN_DONE and n["params"]["runId"] == run_id, timeout=600)
    took = time.perf_counter() - t0
    return took, Store(StateDir.for_workspace(ws)).get_run(run_id)


def stop(daemon: Daemon, ws: Path) -> None:
    """The daemon asked to leave (its spares go with it), and waited for."""
    with contextlib.suppress(Exception):  # it may be gone already
        daemon.request("airlock/handover")
    daemon.close()
    info = StateDir.for_workspace(ws).root / "serve.json"
    deadline = time.monotonic() + 60
    while info.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
