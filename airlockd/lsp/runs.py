"""A run in the background, in its own process: work-done progress for staging, running and
inspecting (cancel = stop), its status events relayed, and a message when it is proposed or ends
badly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from lsprotocol import types
from pydantic import ValidationError
from pygls.capabilities import get_capability

from airlockd.errors import AirlockError
from airlockd.interpreter import module_command
from airlockd.lsp import status
from airlockd.lsp.server import AirlockServer
from airlockd.protocol import ProgressEvent, RunDone, RunEvent, RunStatusEvent
from airlockd.protocol import RunProgress as ProgressNote
from airlockd.records import FileState, RunRecord, RunState
from airlockd.runs import ahead, carrier, execution, launcher

log = logging.getLogger(__name__)

BAD_ENDINGS = {RunState.FAILED, RunState.LIMIT_EXCEEDED, RunState.KILLED, RunState.STOPPED}
_PERCENT = {"staging": 10, "running": 40, "inspecting": 80}
PROGRESS = "airlock/progress"  # control clients only: {runId, stage, message}
RUN_DONE = "airlock/runDone"  # control clients only: {runId, state}, once the run's process said all


def outcome(rec: RunRecord) -> tuple[types.MessageType, str] | None:
    """What to tell the person when a run stops moving, if anything."""
    detail = rec.transitions[-1].detail if rec.transitions else ""
    if rec.state is RunState.PROPOSED:
        n = {s: sum(1 for f in rec.files if f.state is s) for s in FileState}
        changes = f"{len(rec.files)} change{'' if len(rec.files) == 1 else 's'}"
        return (
            types.MessageType.Info,
            f"airlock: run {rec.id} ({rec.agent}) proposes {changes}: "
            f"{n[FileState.PENDING]} to review, {n[FileState.ACCEPTED]} applied, {n[FileState.DENIED]} denied",
        )
    if rec.state is RunState.APPLIED:
        return types.MessageType.Info, f"airlock: run {rec.id} ({rec.agent}) applied: {detail}"
    if rec.state in BAD_ENDINGS:
        kind = types.MessageType.Error if rec.state is RunState.FAILED else types.MessageType.Warning
        return kind, f"airlock: run {rec.id} ({rec.agent}) {rec.state.value}: {detail or rec.error or ''}".rstrip()
    return None


class RunProgress:
    """Work-done progress of one run, when the client supports it; cancelling it stops the run."""

    def __init__(self, ls: AirlockServer, run_id: str) -> None:
        self.ls, self.run_id = ls, run_id
        self.token = f"airlock-run-{run_id}"
        self.on = bool(get_capability(ls.client_capabilities, "window.work_done_progress", False))

    async def begin(self) -> None:
        if not self.on:
            return
        try:
            await self.ls.work_done_progress.create_async(self.token)
        except Exception as exc:  # a client that refuses progress still gets its run
            log.warning("progress for run %s refused by the client: %s", self.run_id, exc)
            self.on = False
            return
        self.ls.work_done_progress.begin(
            self.token,
            types.WorkDoneProgressBegin(
                title=f"airlock run {self.run_id}", cancellable=True, message="admitted", percentage=0
            ),
        )
        cancel = self.ls.work_done_progress.tokens.get(self.token)
        if cancel is not None:
            cancel.add_done_callback(self._on_done)

    def _on_done(self, fut: Any) -> None:
        if fut.cancelled():
            self.ls.from_thread(self._cancelled)

    def _cancelled(self) -> None:
        svc = self.ls.service
        # a worker thread waits for the end (delivering again should the container start late);
        # the run's end is announced by its status as always
        self.ls.spawn(self.ls.call(_stop_quietly, svc, self.run_id), name=f"stop {self.run_id}")

    def report(self, stage: str, message: str) -> None:  # on the loop
        note = ProgressNote(runId=self.run_id, stage=RunState(stage), message=message)
        self.ls.tell_control(PROGRESS, note.wire())
        if self.on:
            self.ls.work_done_progress.report(
                self.token,
                types.WorkDoneProgressReport(message=f"{stage}: {message}", percentage=_PERCENT.get(stage)),
            )

    def end(self, message: str) -> None:
        if self.on:
            self.ls.work_done_progress.end(self.token, types.WorkDoneProgressEnd(message=message))
            self.ls.work_done_progress.tokens.pop(self.token, None)


def _stop_quietly(svc: Any, run_id: str) -> None:
    """A cancelled progress: stop the run, unless it has ended meanwhile."""
    try:
        svc.stop(run_id)
    except AirlockError as exc:  # ended already, or still ending past the wait: its status says
        log.info("stopping run %s on cancel: %s", run_id, exc.message)


async def execute(ls: AirlockServer, run_id: str) -> None:
    """Carry a run (`carry`); the control clients waiting on it hear that it is done as soon as its
    process has said its last word (or, if it never said how it ended, from the store)."""
    told: list[RunState] = []

    def done(state: RunState) -> None:
        told.append(state)
        ls.tell_control(RUN_DONE, RunDone(runId=run_id, state=state).wire())

    try:
        await carry(ls, run_id, done)
    finally:
        if not told:
            state = None
            with contextlib.suppress(Exception):
                state = (await ls.call(ls.service.store.get_run, run_id)).state
            ls.tell_control(RUN_DONE, RunDone(runId=run_id, state=state).wire())


async def carry(ls: AirlockServer, run_id: str, done: Callable[[RunState], None] | None = None) -> None:
    """Take an admitted run to its end in the background; the client hears of every step.

    The run is carried by its own process (`runs/carrier.py`, with `--events`): copying, hashing and
    the container's watch never compete with this loop for the interpreter, so requests stay fast
    while a big workspace is staged. Its Service events and progress come back as JSON lines and
    are relayed as if they were this process's own."""
    progress = RunProgress(ls, run_id)
    await progress.begin()
    svc = ls.service
    argv = launcher.argv_for(svc.workspace, run_id)
    proc: Any = await ls.launcher.spawn(argv) if ls.launcher is not None else None  # forked: no start-up
    if proc is None:
        proc = await asyncio.create_subprocess_exec(
            *module_command(carrier.MODULE, *argv),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    ls.run_processes[run_id] = proc
    assert proc.stdin is not None  # what this daemon has learned to mask, in memory only
    proc.stdin.write(_known(svc))
    # the process makes itself ready and claims the run meanwhile; READY on its stdin lets it stage
    gate = ls.spawn(_prepare(ls, run_id, proc.stdin), name=f"prepare {run_id}")
    errors = ls.spawn(_drain_stderr(proc, run_id), name=f"stderr {run_id}")
    last: RunState | None = None  # the state the run process last announced
    spare: Any = None
    try:
        assert proc.stdout is not None
        async for raw in bounded_lines(proc.stdout, EVENT_LINE_LIMIT, run_id):
            try:
                ev = RunEvent.of_line(raw)
            except ValidationError:
                log.warning("run %s: not an event line: %r", run_id, raw[:200])
                continue
            if isinstance(ev, ProgressEvent):
                progress.report(ev.stage, ev.message)
            else:
                if isinstance(ev, RunStatusEvent) and ev.payload.runId == run_id:
                    last = ev.payload.state
                status.on_event(ls, ev)
        # its output closed: the next run's spare is made now (its holder goes meanwhile), and
        # a waiting CLI may go on (it has nothing more to do)
        spare = ls.spawn(_spare_after(ls, run_id, gate), name=f"spare after {run_id}")
        if done is not None and last is not None and not last.live:
            done(last)
        code = await proc.wait()
    finally:
        if not gate.done():  # (the process ended before its stdin did: nothing waits for it)
            await asyncio.wait([gate])
        ls.run_processes.pop(run_id, None)
        if spare is None:
            ls.spawn(_spare_after(ls, run_id, gate), name=f"spare after {run_id}")
    tail = await errors
    rec = await ls.call(svc.store.get_run, run_id)
    progress.end(rec.state.value)
    said = outcome(rec)
    if said is not None:
        ls.show(said[1], said[0])
    elif code != 0:
        ls.show(
            f"airlock: run {run_id} ended with an error: {svc.redactor.text(tail) or code}", types.MessageType.Error
        )
    if rec.state is not RunState.PROPOSED:  # proposed was pushed when the state changed
        ls.spawn(status.push_proposal(ls, run_id), name=f"proposal {run_id}")


EVENT_LINE_LIMIT = 8 << 20  # a run process's event line longer than this is dropped, said in the log


async def bounded_lines(stream: asyncio.StreamReader, limit: int, run_id: str) -> AsyncIterator[bytes]:
    """The lines of `stream` (without their newline), however long the process made one: a
    line over `limit` bytes is dropped whole and logged, never read into memory whole, and never
    ends the reading (asyncio's own line reader raises at its 64 KiB limit, which would leave a
    waiting client told of a run "done" while it still runs)."""
    pending = bytearray()
    skipping = False
    while chunk := await stream.read(1 << 16):
        start = 0
        while (nl := chunk.find(b"\n", start)) >= 0:
            if not skipping:
                pending += chunk[start:nl]
                yield bytes(pending)
            pending.clear()
            skipping = False
            start = nl + 1
        if not skipping:
            pending += chunk[start:]
            if len(pending) > limit:
                log.warning("run %s: a line of its process longer than %d bytes was dropped", run_id, limit)
                pending.clear()
                skipping = True
    if pending and not skipping:
        yield bytes(pending)


def _known(svc: Any) -> bytes:
    """One line of what this daemon has learned to mask, for a run's process (runs/carrier.py)."""
    return json.dumps(svc.redactor.export()).encode() + b"\n"


async def _prepare(ls: AirlockServer, run_id: str, stdin: asyncio.StreamWriter) -> None:
    """What the run's staging uses, made ready while its process starts, each beside the other:
    the mirror brought up to date and a spare holder set aside; then a line of what was learned
    meanwhile and the word READY, the process's word to stage, and its stdin ends. What fails
    here the run's process does itself."""
    svc = ls.service

    async def view() -> None:
        try:  # the daemon's keeper refreshes the mirror in proportion to what changed
            await ls.call(execution.prepare_view, svc, run_id)
        except Exception:  # the run's own process refreshes it then, and records what fails
            log.exception("run %s: the mirror could not be prepared; the run walks the workspace", run_id)

    async def spare() -> None:
        try:  # a holder of its capped upper layer, made ahead (none: the run's process makes one)
            await ls.call(ahead.reserve, svc, run_id)
        except Exception:
            log.exception("run %s: no spare holder set aside", run_id)

    word = b""
    try:
        await asyncio.gather(view(), spare())
        word = carrier.READY.encode() + b"\n"
    finally:  # (cancelled, the daemon handing over: no word, and the process learns the values itself)
        with contextlib.suppress(OSError, RuntimeError):  # (a process that already ended)
            stdin.write(_known(svc) + word)
        stdin.close()


async def _spare_after(ls: AirlockServer, run_id: str, gate: asyncio.Task[None]) -> None:
    await asyncio.wait([gate])  # a spare set aside for a process that ended before it took it goes
    try:
        await ls.call(ahead.after, ls.service, run_id)
    except Exception:  # the next run's process makes its own holder
        log.exception("run %s: no spare holder made for the next run", run_id)


async def _drain_stderr(proc: asyncio.subprocess.Process, run_id: str) -> str:
    """The run process's log lines go to this daemon's log; the last one explains a failure."""
    last = ""
    assert proc.stderr is not None
    async for raw in bounded_lines(proc.stderr, EVENT_LINE_LIMIT, run_id):
        text = raw.decode("utf-8", "replace").rstrip()
        if text:
            log.info("run %s: %s", run_id, text)
            last = text
    return last


def live_runs(ls: AirlockServer) -> list[Any]:
    return [t for t in ls.tasks if t.get_name().startswith("run ")]
