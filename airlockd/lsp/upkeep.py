"""What the daemon keeps ready for runs: the mirror keeper and the launcher (started at
`initialize`, off the loop), and the mirrors' periodic walk, made between runs."""

from __future__ import annotations

import asyncio
import logging

from airlockd.lsp.server import AirlockServer
from airlockd.runs.service import Service

log = logging.getLogger(__name__)


def keep_mirrors(service: Service) -> bool:
    """Watch the workspace and build each agent clearance's mirror now (off the loop), so the
    first run stages in proportion to what changed since, not to the size of the tree. Whether
    the keeper is watching."""
    from airlockd.staging.keeper import walk_elsewhere

    if service.keep_mirrors(walker=walk_elsewhere(service.workspace)) is not None:
        return False
    refresh_mirrors(service)
    return True


def refresh_mirrors(service: Service, walk: bool = False) -> None:
    """Refresh each agent clearance's mirror (with `walk`, by a walk in another process)."""
    from airlockd.runs.execution import mirror_owner
    from airlockd.staging import stagers

    if service.keeper is None or stagers.choose(service.state.root)[0] != stagers.OVERLAY:
        return
    for level in {service.policy.clearance_for(a) for a in service.policy.agents}:
        service.keeper.refresh(service.policy, level, owner=mirror_owner(), redactor=service.redactor, walk=walk)


async def prime(ls: AirlockServer) -> None:
    """Start the keeper (off the loop), let the live-edit watch follow its watcher, and keep the
    mirrors' periodic walks off the runs' path: they are made here, between runs."""
    from airlockd.lsp import watching
    from airlockd.staging.keeper import WALK_EVERY_S

    if not await ls.call(keep_mirrors, ls.service):
        return
    await watching.refresh(ls)
    while True:
        await asyncio.sleep(WALK_EVERY_S * 0.9)
        try:
            await ls.call(refresh_mirrors, ls.service, True)
        except Exception:  # a run refreshes (and reports) itself; the upkeep tries again later
            log.exception("mirror upkeep failed")


async def start_launcher(ls: AirlockServer) -> None:
    from airlockd.runs.launcher import Launcher

    launcher = Launcher()
    try:
        await launcher.start(ls.service.workspace)
    except OSError as exc:
        log.warning("no launcher (each run process starts anew): %s", exc)
        return
    ls.launcher = launcher


async def sweep(ls: AirlockServer) -> None:
    """Reap what no live run owns (orphaned containers, stray run folders, leftover staging) when
    the daemon starts, as the CLI does before a run it carries itself."""
    try:
        swept = await ls.call(ls.service.sweep)
    except Exception:  # the next start tries again; a run is never held up by it
        log.exception("sweep at start-up failed")
        return
    if any(swept.values()):
        log.info("swept at start-up: %s", swept)
