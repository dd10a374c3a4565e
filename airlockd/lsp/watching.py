"""Watching the live workspace (watchdog) and the clock.

- `policies.toml` at the workspace root is always watched: an edit reloads the policy; a bad file
  keeps the last good one in force and the server says so.
- While any run is proposed the whole tree is watched: a live edit to a file a pending change
  touches marks that change conflicted at once (`airlock/runStatus`, `airlock/proposal`), and a
  conflicted file put back as it was (and not dirty in the editor) is pending again; both are
  the run lifecycle's rules (RunLifecycle.on_disk_change), this module only feeds it. When
  the mirror keeper watches the workspace (pipeline/keeper.py), its inotify queue is followed
  instead (drained as soon as it is readable): one set of watches, none made per proposal.
- Every few seconds, proposals older than the policy's `proposal_ttl_s` become `expired`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lsprotocol import types
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver, ObservedWatch

from airlockd.errors import AirlockError, PolicyError
from airlockd.lsp import documents, status
from airlockd.lsp.server import AirlockServer
from airlockd.names import display
from airlockd.policy import POLICY_FILE
from airlockd.protocol import RunStatus
from airlockd.records import RunRecord, RunState
from airlockd.runs.service import Service

log = logging.getLogger(__name__)

EXPIRY_CHECK_S = float(os.environ.get("AIRLOCK_EXPIRY_CHECK_S", "2"))
DEBOUNCE_S = 0.1


class Watch:
    """The observer and its two watches; lives on the server."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.observer: BaseObserver | None = None
        self.tree: ObservedWatch | None = None
        self.changed: set[str] = set()
        self.trees: set[str] = set()  # directories whose whole subtree may have changed ("": all)
        self.flushing = False
        self.following: int | None = None  # the keeper's watcher fd, while followed


class _Events(FileSystemEventHandler):
    def __init__(self, ls: AirlockServer, workspace: Path) -> None:
        self.ls, self.workspace = ls, workspace

    def on_any_event(self, event: FileSystemEvent) -> None:  # the observer's thread
        if event.event_type in ("opened", "closed_no_write"):
            return
        rels = []
        for p in (event.src_path, getattr(event, "dest_path", "")):
            if not p:
                continue
            try:
                rels.append(Path(os.fsdecode(p)).relative_to(self.workspace).as_posix())
            except ValueError:
                continue
        if rels:
            self.ls.from_thread(_changed, self.ls, rels)


def _watch(ls: AirlockServer) -> Watch:
    w: Watch | None = getattr(ls, "_airlock_watch", None)
    if w is None:
        w = Watch(ls.service.workspace)
        ls._airlock_watch = w  # type: ignore[attr-defined]
    return w


def setup(server: AirlockServer) -> None:
    @server.feature(types.INITIALIZED)
    def initialized(ls: AirlockServer, params: types.InitializedParams) -> None:
        start(ls)

    def on_change(run_id: str) -> None:
        server.spawn(refresh(server), name="watch refresh")

    server.on_proposal_change.append(on_change)


def start(ls: AirlockServer) -> None:
    """Watch the policy file (and the tree while proposals wait), and expire proposals (once)."""
    w = _watch(ls)
    if w.observer is not None:
        return
    w.observer = Observer()
    w.observer.daemon = True
    w.observer.schedule(_Events(ls, w.workspace), str(w.workspace), recursive=False)
    w.observer.start()
    ls.spawn(_expiry_loop(ls), name="expiry")
    ls.spawn(refresh(ls), name="watch refresh")


def stop(ls: AirlockServer) -> None:
    w = _watch(ls)
    if w.following is not None and ls.loop is not None:
        ls.loop.remove_reader(w.following)
        w.following = None
    if w.observer is not None:
        w.observer.stop()
        w.observer = None


async def refresh(ls: AirlockServer) -> None:
    """Watch the whole tree while any run is proposed, and only then."""
    w = _watch(ls)
    if w.observer is None:
        return
    keeper = ls.service.keeper
    if keeper is not None and keeper.watcher is not None and keeper.why is None:
        _follow(ls, w, keeper)
        wanted = False  # the keeper's watches cover the tree
    else:
        proposed = await ls.call(ls.service.store.lines, states=frozenset({RunState.PROPOSED}), limit=1)
        wanted = bool(proposed)
    if wanted and w.tree is None:
        w.tree = await ls.call(w.observer.schedule, _Events(ls, w.workspace), str(w.workspace), recursive=True)
    elif not wanted and w.tree is not None:
        w.observer.unschedule(w.tree)
        w.tree = None


def _follow(ls: AirlockServer, w: Watch, keeper: Any) -> None:
    """Hear of every change the keeper's watcher queues, as soon as its queue is readable."""
    if w.following is not None:
        return
    loop = asyncio.get_running_loop()
    fd = keeper.watcher.fileno()
    keeper.listeners.append(lambda got: ls.from_thread(_changed, ls, sorted(got.paths), sorted(got.trees)))

    def readable() -> None:  # on the loop: drain in a thread (the keeper's lock may be held)
        loop.remove_reader(fd)

        async def drain() -> None:
            try:
                await ls.call(keeper.drain)
            finally:
                if w.following == fd and keeper.watcher is not None:
                    loop.add_reader(fd, readable)

        ls.spawn(drain(), name="keeper drain")

    loop.add_reader(fd, readable)
    w.following = fd


def _changed(ls: AirlockServer, rels: list[str], trees: Iterable[str] = ()) -> None:  # on the loop
    w = _watch(ls)
    w.changed.update(rels)
    w.trees.update(trees)
    if not w.flushing:
        w.flushing = True
        ls.spawn(_flush(ls, w), name="watch flush")


async def _flush(ls: AirlockServer, w: Watch) -> None:
    await asyncio.sleep(DEBOUNCE_S)
    changed, trees, w.changed, w.trees, w.flushing = w.changed, w.trees, set(), set(), False
    if POLICY_FILE in changed or "" in trees:
        await reload_policy(ls)
    hits = await ls.decide(on_disk_change, ls.service, changed, trees, documents.snapshot(ls))
    for rec, moved, cleared in hits:
        if moved:
            names = ", ".join(display(p) for p in moved)
            said = RunStatus.model_validate({**ls.service.run_status(rec), "conflicts": moved})
            ls.notify(status.RUN_STATUS, said.wire())
            ls.show(
                f"airlock: run {rec.id}: {names} changed on disk while the proposal was pending; marked conflicted",
                types.MessageType.Warning,
            )
        if cleared:
            names = ", ".join(display(p) for p in cleared)
            said = RunStatus.model_validate({**ls.service.run_status(rec), "cleared": cleared})
            ls.notify(status.RUN_STATUS, said.wire())
            ls.show(f"airlock: run {rec.id}: {names} is back as it was; pending again", types.MessageType.Info)
        await status.push_proposal(ls, rec.id)
        ls.proposal_changed(rec.id)


async def reload_policy(ls: AirlockServer) -> None:
    svc = ls.service
    old = svc.loaded.revision
    try:
        loaded = await ls.call(svc.reload_policy)
    except PolicyError as exc:
        ls.show(
            f"airlock: {POLICY_FILE} is invalid; the last good policy ({old}) stays in force: {exc.message}",
            types.MessageType.Error,
        )
        return
    if loaded.revision != old:
        ls.show(f"airlock: policy reloaded (revision {loaded.revision})", types.MessageType.Info)


def on_disk_change(
    svc: Service, changed: Iterable[str], trees: Iterable[str], buffers: dict[str, str]
) -> list[tuple[RunRecord, list[str], list[str]]]:
    """The lifecycle's re-check of what changed on disk, with the editor's unsaved buffers
    (blocking; call it holding the decisions lock)."""
    dirty = documents.dirty_paths(svc.workspace, buffers)
    return svc.lifecycle.on_disk_change(changed, trees, dirty)


async def _expiry_loop(ls: AirlockServer) -> None:
    while True:
        await asyncio.sleep(EXPIRY_CHECK_S)
        try:
            expired = await ls.decide(ls.service.lifecycle.expire_due)
        except AirlockError as exc:
            log.warning("expiry check failed: %s", exc.message)
            continue
        for rec in expired:
            ls.show(
                f"airlock: run {rec.id}: its proposal expired (not decided within the policy's TTL); nothing written",
                types.MessageType.Warning,
            )
            await status.push_proposal(ls, rec.id)
            ls.proposal_changed(rec.id)
