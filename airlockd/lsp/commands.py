"""`workspace/executeCommand`: the airlock.* commands. Handlers validate, hop to a thread, answer.

The logic they call is the Service's and Review's; the functions here only shape selections and
results. Errors are AirlockErrors turned into JSON-RPC errors with stable codes and a `data` object.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from lsprotocol import types

from airlockd.errors import AirlockError, ConflictError
from airlockd.evidence.document import evidence as run_evidence
from airlockd.lsp import documents, runs, status
from airlockd.lsp.args import parse, rpc_error
from airlockd.lsp.server import AirlockServer
from airlockd.names import display
from airlockd.pipeline.manifest import ChangeKind
from airlockd.policy import Mode
from airlockd.protocol import (
    AgentArgs,
    ApproveResult,
    DecideArgs,
    DiffArgs,
    DiffResult,
    EditorEvidencePolicy,
    EditorResourceEvidence,
    Evidence,
    EvidenceDocument,
    FileRule,
    ListRunsArgs,
    NoArgs,
    RunArgs,
    RunResult,
    RunSummary,
    RunTaskArgs,
    StopArgs,
)
from airlockd.records import FileState, RunRecord
from airlockd.runs.service import Service
from airlockd.store import RunLine

log = logging.getLogger(__name__)


Handler = Callable[..., Awaitable[Any]]


def _guard(fn: Handler) -> Handler:
    """AirlockErrors become JSON-RPC errors; anything else is logged and reported without a traceback."""

    async def wrapped(ls: AirlockServer, *arguments: Any) -> Any:
        try:
            return await fn(ls, *arguments)
        except AirlockError as exc:
            raise rpc_error(exc) from None

    wrapped.__name__ = fn.__name__
    wrapped.__annotations__ = {"ls": AirlockServer, "arguments": Any, "return": Any}
    return wrapped


# -- logic (no LSP in here) -----------------------------------------------------------------------


def run_summary(line: RunLine) -> dict[str, Any]:
    return RunSummary(
        runId=line.id,
        agent=line.agent,
        mode=Mode(line.mode),
        state=line.state,
        createdAt=line.created_at,
        prompt=line.prompt[:200],
        files=line.files,
        review={FileState(k): v for k, v in line.review.items() if v},
        detail=line.detail,
    ).wire()


def evidence(svc: Service, run_id: str) -> dict[str, Any]:
    """`airlock.getEvidence`: the run's evidence document (airlockd.evidence.document, the same one
    `airlockd show RUN --json` gives), plus the shapes the editors read (runId, the policy text,
    per-file rules, resources with peaks, transitions, applied transactions)."""
    full = EvidenceDocument.model_validate(run_evidence(svc, run_id))  # already redacted
    rec = svc.store.get_run(run_id)
    policy_file = svc.state.policies / f"{rec.policy_revision}.json"
    snapshot = policy_file.read_text() if policy_file.exists() else None
    resources = EditorResourceEvidence(
        **dict(full.resources),
        container=rec.container,
        outputBytes=rec.output_bytes,
        tokens=rec.tokens,
        limit=rec.limit.model_dump() if rec.limit else None,
    )
    rules = [
        FileRule(path=f.path, change=ChangeKind(f.change), decision=f.decision, rule=f.rule, reason=f.reason)
        for f in rec.files
    ]
    return Evidence.model_validate(
        {
            **dict(full),
            "runId": rec.id,
            "policy": EditorEvidencePolicy(**dict(full.policy), snapshot=snapshot),
            "rules": rules,
            "rulesFired": full.rules,
            "resources": resources,
            "transitions": rec.transitions,
            "applied": rec.applied,
        }
    ).wire()


def approve(svc: Service, args: DecideArgs, dirty: set[str]) -> dict[str, Any]:
    """One approval: chosen hunks, chosen paths, or everything pending (Review.approve)."""
    result = svc.review.approve(args.runId, args.paths, hunks=args.hunks, dirty=dirty)
    rec = result.run
    return ApproveResult(runId=rec.id, state=rec.state, applied=result.applied, conflicts=result.conflicts).wire()


def reject(svc: Service, args: DecideArgs, dirty: set[str]) -> dict[str, Any]:
    return _result(svc.review.reject(args.runId, args.paths, hunks=args.hunks, dirty=dirty))


def _result(rec: RunRecord) -> dict[str, Any]:
    return RunResult(runId=rec.id, state=rec.state).wire()


# -- handlers -----------------------------------------------------------------------------------


async def run_task(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    a = parse(RunTaskArgs, arguments)
    svc = ls.service
    rec = await ls.call(svc.submit, a.agent, a.prompt, mode=a.mode, follow_up=a.followUp)
    ls.spawn(runs.execute(ls, rec.id), name=f"run {rec.id}")
    return _result(rec)


async def _stop(ls: AirlockServer, arguments: tuple[Any, ...], kill: bool) -> dict[str, Any]:
    a = parse(StopArgs, arguments)  # waits for the run's end in a worker thread, never on the loop
    rec = await ls.call(ls.service.stop, a.runId, kill=kill, wait=a.wait)
    return _result(rec)


async def stop_run(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    return await _stop(ls, arguments, kill=False)


async def kill_run(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    return await _stop(ls, arguments, kill=True)


async def get_proposal(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    a = parse(RunArgs, arguments)
    return await ls.call(status.proposal_for, ls, a.runId)


async def approve_cmd(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    a = parse(DecideArgs, arguments)
    snap = documents.snapshot(ls)
    try:
        dirty = await ls.call(documents.dirty_paths, ls.service.workspace, snap)
        return await ls.decide(approve, ls.service, a, dirty)
    except ConflictError as exc:
        names = ", ".join(display(p) for p in exc.paths)
        ls.show(f"airlock: run {a.runId}: nothing was written, conflicted: {names}. {exc.hint or ''}".strip(), _warn())
        raise
    finally:
        ls.spawn(status.push_proposal(ls, a.runId), name=f"proposal {a.runId}")
        ls.proposal_changed(a.runId)


async def reject_cmd(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    a = parse(DecideArgs, arguments)
    snap = documents.snapshot(ls)
    try:
        dirty = await ls.call(documents.dirty_paths, ls.service.workspace, snap)
        return await ls.decide(reject, ls.service, a, dirty)
    finally:
        ls.spawn(status.push_proposal(ls, a.runId), name=f"proposal {a.runId}")
        ls.proposal_changed(a.runId)


async def undo(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    a = parse(RunArgs, arguments)
    try:
        rec = await ls.decide(ls.service.review.undo, a.runId)
    finally:
        ls.spawn(status.push_proposal(ls, a.runId), name=f"proposal {a.runId}")
    return _result(rec)


class RunList:
    """Run summaries, read again only when the store's index changed (every write of a run
    replaces it atomically, so inode, mtime and size name one version) or the question did:
    listing stays cheap while runs work (a live run's samples do not touch the index)."""

    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.key: tuple[Any, ...] | None = None
        self.value: list[dict[str, Any]] = []

    def get(self, a: ListRunsArgs) -> list[dict[str, Any]]:
        try:
            st = os.stat(self.svc.state.index_file)
            key: tuple[Any, ...] = (st.st_ino, st.st_mtime_ns, st.st_size, a)
        except FileNotFoundError:
            key = (None, a)
        if key != self.key:
            lines = self.svc.store.lines(
                limit=a.limit,
                states=frozenset(a.state) if a.state else None,
                agent=a.agent,
                since=a.since,
                before=a.before,
            )
            self.value = [run_summary(line) for line in lines]
            self.key = key  # read after the stat: a newer write only makes the next call re-read
        return self.value


async def list_runs(ls: AirlockServer, *arguments: Any) -> list[dict[str, Any]]:
    a = parse(ListRunsArgs, arguments)
    cache = ls.run_list = getattr(ls, "run_list", None) or RunList(ls.service)
    return await ls.call(cache.get, a)


async def get_evidence(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    a = parse(RunArgs, arguments)
    return await ls.call(evidence, ls.service, a.runId)


async def list_agents(ls: AirlockServer, *arguments: Any) -> list[dict[str, Any]]:
    parse(NoArgs, arguments)
    return await ls.call(ls.service.agents)


async def release_agent(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    a = parse(AgentArgs, arguments)
    return await ls.call(ls.service.release, a.agent)


async def diff(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    a = parse(DiffArgs, arguments)
    text = await ls.call(ls.service.content.diff, a.runId, a.path)
    return DiffResult(runId=a.runId, path=a.path, diff=text).wire()


def _warn() -> types.MessageType:
    return types.MessageType.Warning


COMMANDS: dict[str, Handler] = {
    "airlock.runTask": run_task,
    "airlock.stopRun": stop_run,
    "airlock.killRun": kill_run,
    "airlock.getProposal": get_proposal,
    "airlock.approve": approve_cmd,
    "airlock.reject": reject_cmd,
    "airlock.undo": undo,
    "airlock.listRuns": list_runs,
    "airlock.getEvidence": get_evidence,
    "airlock.listAgents": list_agents,
    "airlock.releaseAgent": release_agent,
    "airlock.diff": diff,
}


def setup(server: AirlockServer) -> None:
    for name, fn in COMMANDS.items():
        server.command(name)(_guard(fn))
