"""The mirrors' upkeep for a process that serves the workspace: the keeper started and each agent
clearance's mirror built, refreshed between runs, and the walk made in a process of its own
(`python -m airlockd.runs.mirrors`) so it never holds the daemon's interpreter.

The doors call this; the keeper and the mirrors themselves are staging's (staging/keeper.py,
staging/mirror.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from airlockd.interpreter import module_command
from airlockd.policy import Level, load_policy
from airlockd.runs import ahead
from airlockd.runs.execution import held_upper, mirror_owner, run_live, uses_mirror
from airlockd.runs.service import Service
from airlockd.staging import stagers
from airlockd.staging.keeper import WALK_EVERY_S
from airlockd.staging.mirror import mirror_for
from airlockd.staging.records import StagingError
from airlockd.state import StateDir
from airlockd.store import Store

log = logging.getLogger(__name__)

MODULE = "airlockd.runs.mirrors"
UPKEEP_EVERY_S = WALK_EVERY_S * 0.9  # the daemon walks a little before the keeper would itself


def keep(service: Service) -> bool:
    """Watch the workspace and build each agent clearance's mirror now (off the loop), so the
    first run stages in proportion to what changed since, not to the size of the tree. Whether
    the keeper is watching."""
    if service.keep_mirrors(walker=walk_elsewhere(service.workspace)) is not None:
        return False
    ahead.at_start(service)  # a spare holder for the first run, made while the mirrors are
    refresh_all(service)
    follow_on_engine(service)
    return True


def refresh_all(service: Service, walk: bool = False) -> None:
    """Refresh each agent clearance's mirror (with `walk`, by a walk in another process)."""
    if service.keeper is None or not uses_mirror(service):
        return
    for level in {service.policy.clearance_for(a) for a in service.policy.agents}:
        service.keeper.refresh(service.policy, level, owner=mirror_owner(), redactor=service.redactor, walk=walk)


FOLLOW_QUIET_S = 0.05  # a burst of changes is waited out this long (a save writes several times)
FOLLOW_LONGEST_S = 1.0  # but no longer than this after its first change
FOLLOW_WARN_EVERY_S = 300.0


def follow_on_engine(service: Service) -> threading.Thread | None:
    """For an engine that cannot see this machine's paths (a remote host): bring its copy of each
    agent clearance's mirror up to date as the workspace changes, so that a run finds it synced
    (only what changed travels, at once, and the run waits for none of it: the copy is taken at
    its version, sandbox/enginemirror.py). The keeper's refresh and the sync each lock what they
    change, so a run's own (in `execution.prepare_view`) waits for one under way and then has
    nothing to do. The thread ends with the keeper."""
    keeper = service.keeper
    held = held_upper(service)
    if keeper is None or held is None or not held.remote:
        return None
    poked = threading.Event()
    keeper.listeners.append(lambda _changes: poked.set())

    def follow() -> None:
        warned = 0.0
        while service.keeper is keeper:
            if not poked.wait(1.0):
                continue
            first = time.monotonic()
            while True:  # the burst waited out
                poked.clear()
                if not poked.wait(FOLLOW_QUIET_S) or time.monotonic() - first > FOLLOW_LONGEST_S:
                    break
            if service.keeper is not keeper:
                return
            try:
                sync_engine(service)
            except Exception as exc:  # a run syncs (and reports) itself
                if time.monotonic() - warned > FOLLOW_WARN_EVERY_S:
                    warned = time.monotonic()
                    log.warning("the engine's copy of the workspace did not follow its changes: %s", exc)

    thread = threading.Thread(target=follow, name="airlockd-engine-follow", daemon=True)
    thread.start()
    return thread


def sync_engine(service: Service) -> None:
    """Each agent clearance's mirror refreshed by the keeper and synced to the engine."""
    keeper = service.keeper
    if keeper is None or keeper.why is not None:
        return
    for level in {service.policy.clearance_for(a) for a in service.policy.agents}:
        held = held_upper(service)
        if held is None or not held.remote:
            return
        view = keeper.refresh(
            service.policy, level, owner=mirror_owner(), redactor=service.redactor,
            is_live=lambda r: run_live(service, r),
        )  # fmt: skip
        mirror = mirror_for(service.state.root, level)
        with mirror.locked():  # no refresh rewrites the generation (no run holds it) while it travels
            if mirror.serial() != view.serial or mirror.current() != view.generation:
                continue  # refreshed again since: the change that did it syncs it
            held.lower(view.tree, stagers.view_version(view))


def walk_elsewhere(workspace: Path) -> Callable[[Level], None]:
    """A keeper's `walker` that walks in a new process (`walk_here` there), for the daemon."""

    def walk(clearance: Level) -> None:
        cmd = module_command(MODULE, "--workspace", str(workspace), "--clearance", clearance.value)
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise StagingError(f"walking the workspace into the {clearance.value} mirror failed: {last}")

    return walk


def walk_here(workspace: Path, level: Level) -> dict[str, int]:
    """Walk the workspace into the mirror of one clearance and dump the mirror's whole state,
    for the keeper that asked (it loads the dump, and brings the generation's repository up to
    date itself: with the state it keeps of it, that costs what changed, where this process,
    which has none, would rescan the whole tree and leave the keeper's state stale)."""
    state = StateDir.for_workspace(workspace).ensure()
    store = Store(state)

    def live(run_id: str) -> bool:
        try:
            return store.get_run(run_id).state.live
        except Exception:
            return False

    policy = load_policy(workspace).policy
    view = mirror_for(state.root, level).refresh(
        workspace, policy, level, owner=mirror_owner(), is_live=live, dump=True, repo=False
    )
    return {"generation": view.generation, "serial": view.serial or 0, "files": view.result.files}


def main(argv: list[str] | None = None) -> int:
    """`python -m airlockd.runs.mirrors --workspace W --clearance LEVEL`: one walk, its summary
    as JSON on stdout."""
    p = argparse.ArgumentParser(prog="python -m " + MODULE, description="walk the workspace into a mirror")
    p.add_argument("--workspace", required=True)
    p.add_argument("--clearance", required=True, choices=[lvl.value for lvl in Level])
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="airlockd: %(levelname)s %(name)s: %(message)s"
    )
    print(json.dumps(walk_here(Path(args.workspace), Level(args.clearance))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
