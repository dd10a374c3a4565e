"""What the daemon keeps ready for runs: the mirror keeper and the launcher (started at
`initialize`, off the loop), and the mirrors' periodic walk, made between runs."""

from __future__ import annotations

import asyncio
import logging

from airlockd.lsp.server import AirlockServer

log = logging.getLogger(__name__)


async def prime(ls: AirlockServer) -> None:
    """Start the keeper (off the loop), let the live-edit watch follow its watcher, and keep the
    mirrors' periodic walks off the runs' path: they are made here, between runs."""
    from airlockd.lsp import watching
    from airlockd.runs import mirrors

    if not await ls.call(mirrors.keep, ls.service):
        return
    await watching.refresh(ls)
    while True:
        await asyncio.sleep(mirrors.UPKEEP_EVERY_S)
        try:
            await ls.call(mirrors.refresh_all, ls.service, True)
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


RETAIN_FIRST_S = 120.0  # after start-up, when the first run has had its chance
RETAIN_EVERY_S = 3600.0


async def retain(ls: AirlockServer) -> None:
    """Compact what the retention policy lets go, a while after start-up and hourly (off the
    loop; nothing a live, proposed or undoable run needs is touched: runs/retention.py)."""
    from airlockd.runs import retention

    await asyncio.sleep(RETAIN_FIRST_S)
    while True:
        if ls.service.policy.retention.auto:
            try:
                report = await ls.call(retention.collect, ls.service, apply=True)
                if report["runs"] or report["audit_segments"] or report["leftovers"]:
                    log.info(
                        "retention: %d run(s) compacted (%d bytes), %d audit segment(s) dropped",
                        len(report["runs"]),
                        report["bytes"],
                        len(report["audit_segments"]),
                    )
            except Exception:  # tried again at the next period; a run is never held up by it
                log.exception("retention failed")
        await asyncio.sleep(RETAIN_EVERY_S)
