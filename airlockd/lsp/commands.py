"""`workspace/executeCommand`: the airlock.* commands. Handlers validate, hop to a thread, answer.

The logic they call is the Service's and Review's; the functions here only shape selections and
results. Errors are AirlockErrors turned into JSON-RPC errors with stable codes and a `data` object.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from lsprotocol import types

from airlockd.errors import AirlockError, ConflictError
from airlockd.evidence import evidence as run_evidence
from airlockd.lsp import documents, runs, status
from airlockd.lsp.args import AgentArgs, DecideArgs, DiffArgs, NoArgs, RunArgs, RunTaskArgs, StopArgs, parse, rpc_error
from airlockd.lsp.server import AirlockServer
from airlockd.pipeline.manifest import display
from airlockd.records import FileState, RunRecord
from airlockd.review import Review
from airlockd.service import Service

log = logging.getLogger(__name__)
ACTOR = "lsp"

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


def run_summary(rec: RunRecord) -> dict[str, Any]:
    counts = {s.value: sum(1 for f in rec.files if f.state is s) for s in FileState}
    return {
        "runId": rec.id,
        "agent": rec.agent,
        "mode": rec.mode,
        "state": rec.state.value,
        "createdAt": rec.created_at,
        "prompt": rec.prompt[:200],
        "files": len(rec.files),
        "review": {k: v for k, v in counts.items() if v},
        "detail": rec.transitions[-1].detail if rec.transitions else "",
    }


def evidence(svc: Service, run_id: str) -> dict[str, Any]:
    """`airlock.getEvidence`: the run's evidence document (airlockd.evidence, the same one
    `airlockd show RUN --json` gives), plus the shapes the editors read (runId, the policy text,
    per-file rules, resources with peaks, transitions, applied transactions)."""
    full = run_evidence(svc, run_id)
    rec = svc.store.get_run(run_id)
    policy_file = svc.state.policies / f"{rec.policy_revision}.json"
    return {
        **full,
        "runId": rec.id,
        "policy": {**full["policy"], "snapshot": policy_file.read_text() if policy_file.exists() else None},
        "rules": [
            {"path": f.path, "change": f.change, "decision": f.decision.value, "rule": f.rule, "reason": f.reason}
            for f in rec.files
        ],
        "rulesFired": full["rules"],
        "resources": {
            **full["resources"],
            "container": rec.container,
            "outputBytes": rec.output_bytes,
            "tokens": rec.tokens,
            "limit": rec.limit.model_dump() if rec.limit else None,
        },
        "transitions": [t.model_dump(mode="json") for t in rec.transitions],
        "applied": [a.model_dump(mode="json") for a in rec.applied],
    }


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


def split_selection(
    review: Review, rec: RunRecord, paths: Collection[str] | None
) -> tuple[dict[str, list[str]], list[str]]:
    """Files some of whose hunks are already decided go hunk by hunk (their pending hunks), so a
    rejected hunk never lands with the rest; the others go by path."""
    chosen = [f for f in rec.pending if not paths or any(_under(f.path, p.strip("/")) for p in paths)]
    by_hunk: dict[str, list[str]] = {}
    for f in chosen:
        if not f.hunks:
            continue
        states = review.hunk_states(rec, f) or []
        by_hunk[f.path] = [h.id for h, s in states if s == "pending"]
    rest = [f.path for f in chosen if f.path not in by_hunk]
    return by_hunk, rest


def approve(svc: Service, args: DecideArgs, dirty: set[str]) -> dict[str, Any]:
    """One approval: chosen hunks, chosen paths, or everything pending."""
    review = svc.review
    applied: list[str] = []
    conflicts: list[str] = []
    if args.hunks:
        result = review.approve_hunks(args.runId, args.hunks, actor=ACTOR, dirty=dirty)
        applied += result.applied
    if args.paths or not args.hunks:
        rec = svc.store.get_run(args.runId)
        by_hunk, rest = split_selection(review, rec, args.paths)
        if by_hunk:
            applied += review.approve_hunks(rec.id, by_hunk, actor=ACTOR, dirty=dirty).applied
        if rest or not by_hunk:
            result = review.approve(rec.id, rest or args.paths, actor=ACTOR, dirty=dirty)
            applied += result.applied
            conflicts += result.conflicts
    rec = svc.store.get_run(args.runId)
    return {"runId": rec.id, "state": rec.state.value, "applied": sorted(set(applied)), "conflicts": conflicts}


def reject(svc: Service, args: DecideArgs) -> dict[str, Any]:
    review = svc.review
    if args.hunks:
        review.reject_hunks(args.runId, args.hunks, actor=ACTOR)
    if args.paths or not args.hunks:
        rec = svc.store.get_run(args.runId)
        by_hunk, rest = split_selection(review, rec, args.paths)
        if by_hunk:
            review.reject_hunks(rec.id, by_hunk, actor=ACTOR)
        rec = svc.store.get_run(rec.id)
        conflicted = any(f.state is FileState.CONFLICTED for f in rec.files)
        if rest or (not args.paths and (rec.pending or conflicted)):
            review.reject(rec.id, rest or args.paths, actor=ACTOR)
    rec = svc.store.get_run(args.runId)
    return {"runId": rec.id, "state": rec.state.value}


# -- handlers -----------------------------------------------------------------------------------


async def run_task(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    a = parse(RunTaskArgs, arguments)
    svc = ls.service
    rec = await ls.call(svc.submit, a.agent, a.prompt, mode=a.mode, follow_up=a.followUp)
    ls.spawn(runs.execute(ls, rec.id), name=f"run {rec.id}")
    return {"runId": rec.id, "state": rec.state.value}


async def _stop(ls: AirlockServer, arguments: tuple[Any, ...], kill: bool) -> dict[str, Any]:
    a = parse(StopArgs, arguments)  # waits for the run's end in a worker thread, never on the loop
    rec = await ls.call(ls.service.stop, a.runId, kill=kill, wait=a.wait)
    return {"runId": rec.id, "state": rec.state.value}


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
    try:
        return await ls.decide(reject, ls.service, a)
    finally:
        ls.spawn(status.push_proposal(ls, a.runId), name=f"proposal {a.runId}")
        ls.proposal_changed(a.runId)


async def undo(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    a = parse(RunArgs, arguments)
    try:
        rec = await ls.decide(ls.service.review.undo, a.runId, actor=ACTOR)
    finally:
        ls.spawn(status.push_proposal(ls, a.runId), name=f"proposal {a.runId}")
    return {"runId": rec.id, "state": rec.state.value}


class RunList:
    """Run summaries, parsed again only when the store file changed (it is replaced atomically on
    every write, so inode, mtime and size name one version): listing stays cheap while a run works."""

    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.key: tuple[int, int, int] | None = None
        self.value: list[dict[str, Any]] = []

    def get(self) -> list[dict[str, Any]]:
        try:
            st = os.stat(self.svc.state.store)
        except FileNotFoundError:
            return []
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self.key:
            self.value = [run_summary(r) for r in self.svc.store.list_runs()]
            self.key = key  # read after the stat: a newer write only makes the next call re-read
        return self.value


async def list_runs(ls: AirlockServer, *arguments: Any) -> list[dict[str, Any]]:
    parse(NoArgs, arguments)
    cache = ls.run_list = getattr(ls, "run_list", None) or RunList(ls.service)
    return await ls.call(cache.get)


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
    text = await ls.call(ls.service.review.diff, a.runId, a.path)
    return {"runId": a.runId, "path": a.path, "diff": text}


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
