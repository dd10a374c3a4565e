"""Inspection: what the agent left in its staging, read from the staging itself (never the
agent's word), bounded by the policy's change-set bounds, scanned for secrets and hidden
characters, classified, recorded with its marks, and proposed (or landed, in auto mode)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airlockd import names
from airlockd.pipeline.classify import Secret, classify
from airlockd.pipeline.manifest import ChangeSet, Entry
from airlockd.policy import Decision, Mode
from airlockd.records import FileReview, FileState, LimitHit, RunRecord, RunState
from airlockd.runs import execution, screening
from airlockd.runs.content import find_secrets_in, hidden_in
from airlockd.runs.execution import count_violation
from airlockd.staging import stagers
from airlockd.staging.base import Base
from airlockd.staging.bounds import ChangeBounds, ChangeSetTooLarge
from airlockd.staging.records import StagingError
from airlockd.staging.secretscan import policy_scanner
from airlockd.staging.withheld import learn as learn_withheld
from airlockd.staging.withheld import learn_since

if TYPE_CHECKING:
    from airlockd.runs.service import Progress, Service


def inspect(svc: Service, rec: RunRecord, progress: Progress) -> RunRecord:
    rec = svc.lifecycle.transition(rec, RunState.INSPECTING)
    progress("inspecting", "hashing the staging copy")
    run_dir = svc.state.run_dir(rec.id)
    stager = stagers.for_run(run_dir)
    base = stager.base(run_dir)  # the lower layer (overlay), or the saved manifest (copy)
    bounds = ChangeBounds.of(svc.policy.agent(rec.agent).limits)
    try:  # from the upper layer, or a full rescan; stopped at the policy's bounds
        read_back(svc, rec, base, bounds)
        changes = stager.inspect(run_dir, base, bounds)
    except ChangeSetTooLarge as over:
        return _too_large(svc, rec, over)
    withheld = {w["path"] for w in rec.withheld}
    secrets = carried_secrets(svc, rec, changes)
    hidden = hidden_in(
        run_dir, (c for c in changes if c.path not in secrets), max_bytes=svc.policy.defaults.max_file_bytes
    )
    files = []
    twins = base.twins([c.path for c in changes])
    rest: dict[tuple[str, str], int] = {}  # (decision, rule) -> changes past CLASSIFY_EVENTS
    for c in classify(changes, svc.policy, withheld, base=twins, secrets=secrets, hidden=hidden):
        state = FileState.DENIED if c.decision is Decision.DENY else FileState.PENDING
        files.append(
            FileReview(
                path=c.change.path,
                change=c.change.change.value,
                decision=c.decision,
                rule=c.rule,
                reason=svc.redactor.text(c.reason),  # a reason may quote a symlink's target
                state=state,
                before=c.change.before.to_json() if c.change.before else None,
                after=_stored_entry(svc, c.change.after, c.change.path in secrets),
                marks=_marks(svc, c.change.path, hidden.get(c.change.path)),
            )
        )
        if len(files) <= CLASSIFY_EVENTS:
            svc.audit.append(
                "classify",
                run=rec.id,
                agent=rec.agent,
                policy=rec.policy_revision,
                path=c.change.path,
                change=c.change.change.value,
                decision=c.decision.value,
                rule=c.rule,
            )
        else:
            rest[(c.decision.value, c.rule)] = rest.get((c.decision.value, c.rule), 0) + 1
    if rest:
        _classify_summary(svc, rec, rest)
    drop_secrets(run_dir, secrets)
    files = screening.screen_changes(svc, rec, files)
    svc.content.keep_base_blobs(rec.id, files)
    for f in files:
        if f.state is FileState.CONFLICTED:
            svc.audit.append(
                "conflict",
                run=rec.id,
                agent=rec.agent,
                policy=rec.policy_revision,
                path=f.path,
                why="the live file changed between staging and inspection",
            )
    svc.store.update_agent(rec.agent, lambda u: setattr(u, "consecutive_violations", 0))
    summary = f"{len(files)} changes: " + ", ".join(
        f"{sum(1 for f in files if f.decision is d)} {d.value}" for d in Decision
    )
    rec = svc.lifecycle.transition(rec, RunState.PROPOSED, summary, proposed_at=time.time(), files=files)
    if rec.mode == Mode.AUTO.value:
        auto = [f.path for f in rec.files if f.decision is Decision.AUTO and f.state is FileState.PENDING]
        if auto:
            rec = svc.review.approve(rec.id, auto, actor="policy:auto-mode", allow_conflict=True).run
    return svc.lifecycle.settle(rec.id)


def read_back(svc: Service, rec: RunRecord, base: Base, bounds: ChangeBounds) -> None:
    """An upper layer the engine held comes back into the run's folder (once), streamed and
    counted against `bounds`; the engine then lets go of it, whatever happened."""
    run_dir = svc.state.run_dir(rec.id)
    if not stagers.held_run(run_dir):
        return
    held = execution.held_upper(svc, rec.agent)
    if held is None:
        raise StagingError(f"run {rec.id}'s upper layer is held by an engine this process cannot reach")
    try:
        stagers.read_back(run_dir, held.dump(rec.id), base, bounds)
    finally:  # the daemon's goes off the proposal's path (its spares wait for it at close)
        held.release(rec.id, later=svc.keeper is not None or svc.for_daemon)


def _classify_summary(svc: Service, rec: RunRecord, rest: Mapping[tuple[str, str], int]) -> None:
    """One event for the changes past the first CLASSIFY_EVENTS (each is in the run's record):
    how many, by decision and by rule, so a change set of any size makes a bounded trail."""
    by_decision: dict[str, int] = {}
    for (decision, _), n in rest.items():
        by_decision[decision] = by_decision.get(decision, 0) + n
    rules = sorted(rest.items(), key=lambda kv: -kv[1])[: CLASSIFY_EVENTS // 10]
    svc.audit.append(
        "classify.summary",
        run=rec.id,
        agent=rec.agent,
        policy=rec.policy_revision,
        changes=sum(rest.values()),
        decisions=by_decision,
        rules=[{"decision": d, "rule": r, "changes": n} for (d, r), n in rules],
        rules_left_out=max(0, len(rest) - len(rules)),
    )


def _too_large(svc: Service, rec: RunRecord, over: ChangeSetTooLarge) -> RunRecord:
    """A change set over a bound: a limit violation, recorded like the container's (audit,
    quarantine count); nothing of it is proposed, and the staging is kept for inspection."""
    hit = LimitHit(
        limit=over.limit,
        measured=over.measured,
        allowed=over.allowed,
        source="inspection of the staging copy, stopped at the bound",
    )
    svc.audit.append("limit.exceeded", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **hit.model_dump())
    rec = svc.lifecycle.transition(rec, RunState.LIMIT_EXCEEDED, f"{hit.limit}: {over!s}", limit=hit)
    count_violation(svc, rec)
    svc.keep_for_inspection(rec)
    return rec


def carried_secrets(svc: Service, rec: RunRecord, changes: ChangeSet) -> dict[str, Secret]:
    """The secret each change of the run carries (path -> Secret), in its name or its proposed
    content. The values of withheld files are read again from the live workspace first (into
    memory only, never stored): this process may not be the one that staged the run (a daemon
    restarted, a run re-attached), and a withheld file may have changed while the agent ran. A
    keeper watching the workspace (the daemon) knows which paths were withheld at its last
    refresh and which may have changed since: only those are looked at. Without one that vouches
    for this clearance and policy, a walk finds them (0.2-0.6 s on a 20,000-file tree, once per
    inspection). A run that changed nothing carries nothing: nothing is read."""
    if not changes:
        return {}
    clearance = svc.policy.clearance_for(rec.agent)
    also = [w["path"] for w in rec.withheld]  # what this run's staging withheld for its content too
    since = svc.keeper.withheld_since(svc.policy, clearance) if svc.keeper is not None else None
    if since is None:
        learn_withheld(svc.workspace, svc.policy, clearance, svc.redactor, also=also)
    else:
        learn_since(svc.workspace, svc.policy, clearance, svc.redactor, *since, also=also)
    return find_secrets_in(
        svc.state.run_dir(rec.id),
        changes,
        policy_scanner(svc.policy.withhold),
        svc.redactor,
        max_bytes=svc.policy.defaults.max_file_bytes,
    )


def _stored_entry(svc: Service, entry: Entry | None, secret: bool) -> dict[str, Any] | None:
    """The proposed entry as the store keeps it: a symlink target that carries a secret masked
    (the change is denied, so nothing ever lands from it)."""
    if entry is None:
        return None
    doc = entry.to_json()
    return dict(svc.redactor.value(doc)) if secret else doc


# Per-change `classify` events of one run; the changes past them are counted in one
# `classify.summary` event (the run's record keeps every change).
CLASSIFY_EVENTS = 500


def _marks(svc: Service, path: str, hidden: str | None) -> list[str]:
    """What a reviewer is told beside the path (names.marks, and what hides in its text)."""
    out = [svc.redactor.text(m) for m in names.marks(path)]
    if hidden is not None:
        out.append(f"the proposed text holds {hidden}: shown escaped, never as a terminal would act on it")
    return out


def drop_secrets(run_dir: Path, secrets: Mapping[str, Secret]) -> None:
    """Remove what carries a secret from the staging copy: it can never land and is never shown,
    so the state dir keeps no copy of it (deepest first, so a directory named with a secret goes
    once it is empty). Best effort: the deny holds either way."""
    for path in sorted(secrets, key=lambda p: p.count("/"), reverse=True):
        node = stagers.proposed_path(run_dir, path)
        with contextlib.suppress(OSError):
            if node.is_dir() and not node.is_symlink():
                node.rmdir()
            else:
                node.unlink()
    stagers.forget_scanned(run_dir, secrets)
