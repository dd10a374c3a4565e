"""Executing one admitted run: stage the workspace, contain the agent (sampling it live),
record how it ended, then inspect and classify what it changed. The service sequences these
steps; every change of the run's state goes through `svc.lifecycle`, which owns the state machine."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airlockd import names
from airlockd.agents import wiring as agent_wiring
from airlockd.errors import EngineError
from airlockd.evidence.document import live_tree
from airlockd.fsutil import atomic_write_bytes
from airlockd.gateway import runs as gateway_runs
from airlockd.pipeline.classify import Secret, classify
from airlockd.pipeline.manifest import Change, Entry
from airlockd.policy import Decision, Mode
from airlockd.records import FileReview, FileState, LimitHit, RunRecord, RunState
from airlockd.runs import screening
from airlockd.runs.containment import RunMonitor
from airlockd.runs.content import find_secrets_in, hidden_in
from airlockd.sandbox.base import ContainerSpec, ExitInfo, OverlayVolume
from airlockd.staging import capfs, stagers
from airlockd.staging.base import StageRequest
from airlockd.staging.bounds import ChangeBounds, ChangeSetTooLarge
from airlockd.staging.copy import StageResult, Withheld
from airlockd.staging.mirror import MirrorView, RefreshStats, mirror_for, policy_digest
from airlockd.staging.withheld import learn as learn_withheld

if TYPE_CHECKING:
    from airlockd.runs.service import Progress, Service

log = logging.getLogger(__name__)

AGENT_UID = (1000, 1000)  # the agent's user in the runtime image; staging copies are given to it as root
OUTPUT_TAIL_BYTES = 64 * 1024


def mirror_owner() -> tuple[int, int] | None:
    """Who the staged nodes belong to: the agent's user when we can chown (root), else us."""
    return AGENT_UID if os.getuid() == 0 else None


def stage(svc: Service, rec: RunRecord, progress: Progress) -> RunRecord:
    rec = svc.lifecycle.transition(rec, RunState.STAGING)
    progress("staging", "copying the workspace without withheld files")
    run_dir = svc.state.run_dir(rec.id)
    capped = capfs.available() is None
    if not capped:
        svc.audit.append(
            "stage.growth_uncapped", run=rec.id, agent=rec.agent, policy=rec.policy_revision, why=capfs.available()
        )
    stager = stagers.choose(svc.state.root)
    clearance = svc.policy.clearance_for(rec.agent)

    def refresh() -> MirrorView:
        view = prepared_view(svc, rec, clearance)  # the daemon refreshed it before starting us
        if view is not None:
            return view
        walk = svc.keeper.refresh if svc.keeper is not None else _walk_mirror(svc)
        return walk(
            svc.policy,
            clearance,
            owner=mirror_owner(),
            redactor=svc.redactor,
            run_id=rec.id,
            is_live=lambda run_id: run_live(svc, run_id),
        )

    staged = stager.stage(
        StageRequest(
            run_dir=run_dir,
            workspace=svc.workspace,
            policy=svc.policy,
            clearance=clearance,
            owner=mirror_owner(),
            redactor=svc.redactor,
            growth=svc.policy.agent(rec.agent).limits.workspace_growth_mb * 2**20,
            capped=capped,
            refresh=refresh,
            screen=lambda tree, result, hide: screening.classify_labels(svc, rec, tree, result, hide=hide),
        )
    )
    result = staged.result
    tree = staged.live_tree or live_tree(svc.workspace, [w.path for w in result.withheld])
    withheld = [{"path": w.path, "rule": w.rule} for w in result.withheld]
    svc.store.update_run(rec.id, lambda r: setattr(r, "live_tree", {"before": tree}))
    withheld = svc.redactor.value(withheld)
    for w in withheld:
        svc.audit.append("stage.withheld", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **w)
    svc.audit.append(
        "stage.done",
        run=rec.id,
        agent=rec.agent,
        policy=rec.policy_revision,
        files=result.files,
        bytes=result.bytes,
        withheld=len(withheld),
        skipped=[{"path": s.path, "rule": s.rule} for s in result.skipped],
        stager=stager.name,
        stager_why=stager.why,
        mirror=staged.mirror or None,
    )

    def record(r: RunRecord) -> None:
        r.withheld, r.staged_bytes, r.growth_capped = withheld, staged.staged_bytes, capped
        r.staged_entries = staged.staged_entries
        r.stager = stager.name

    return svc.store.update_run(rec.id, record)


_PREPARED = "mirror-view.json"


def prepare_view(svc: Service, run_id: str) -> None:
    """In the daemon, before it starts the process that carries an admitted run: refresh the
    mirror with the daemon's keeper (in proportion to what changed), reference the generation
    for the run, and leave the view in the run's folder for `stage` to take."""
    rec = svc.store.get_run(run_id)
    keeper = svc.keeper
    if keeper is None or keeper.why is not None or screening.labels_on(svc):
        return  # the run's process walks (a label classifier needs the whole base manifest)
    if not stagers.choose(svc.state.root).uses_mirror:
        return
    clearance = svc.policy.clearance_for(rec.agent)
    view = keeper.refresh(
        svc.policy,
        clearance,
        owner=mirror_owner(),
        redactor=svc.redactor,
        run_id=rec.id,
        is_live=lambda r: run_live(svc, r),
    )
    res = view.result
    doc = {
        "policy": policy_digest(svc.policy, clearance),
        "generation": view.generation,
        "tree": str(view.tree),
        "files": res.files,
        "bytes": res.bytes,
        "withheld": [[w.path, w.rule] for w in res.withheld],
        "skipped": [[s.path, s.rule] for s in res.skipped],
        "live_tree": view.live_tree,
        "stats": vars(view.stats),
    }
    atomic_write_bytes(svc.state.run_dir(rec.id) / _PREPARED, json.dumps(doc).encode())


def prepared_view(svc: Service, rec: RunRecord, clearance: Any) -> MirrorView | None:
    """The view `prepare_view` left for this run, when it still holds (same policy, no label
    classifier); else None and the run refreshes the mirror itself."""
    path = svc.state.run_dir(rec.id) / _PREPARED
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    path.unlink(missing_ok=True)
    if doc.get("policy") != policy_digest(svc.policy, clearance) or screening.labels_on(svc):
        return None  # the reference it took goes with the generation's collection
    res = StageResult(base={}, files=doc["files"], bytes=doc["bytes"])
    res.withheld = [Withheld(p, r) for p, r in doc["withheld"]]
    res.skipped = [Withheld(p, r) for p, r in doc["skipped"]]
    stats = RefreshStats(**doc["stats"])
    return MirrorView(doc["generation"], Path(doc["tree"]), res, stats, live_tree=doc["live_tree"])


def _walk_mirror(svc: Service) -> Callable[..., MirrorView]:
    """A mirror refresh by a walk (a process without a keeper: the CLI, a re-attached run)."""

    def refresh(policy: Any, clearance: Any, **kw: Any) -> MirrorView:
        return mirror_for(svc.state.root, clearance).refresh(svc.workspace, policy, clearance, **kw)

    return refresh


def contain(svc: Service, rec: RunRecord, prompt: str, progress: Progress) -> ExitInfo:
    cfg = svc.policy.agent(rec.agent)
    run_dir = svc.state.run_dir(rec.id)
    inv = agent_wiring.prepare(svc, rec, cfg, prompt)  # opens the run's model gateway if it has one
    uid, gid = AGENT_UID if os.getuid() == 0 else (os.getuid(), os.getgid())
    user = f"{uid}:{gid}"
    spec = ContainerSpec(
        run_id=rec.id,
        image=svc.image_for(rec.agent),
        argv=inv.argv,
        workspace=stagers.for_run(run_dir).staged_root(run_dir),
        limits=cfg.limits,
        stdin_file=inv.stdin_file,
        env=inv.env,
        mounts=inv.mounts,
        user=user,
        labels={"airlockd.workspace": str(svc.workspace), "airlockd.agent": rec.agent},
        workspace_overlay=overlay_volume(svc, run_dir),
    )
    svc.lifecycle.transition(rec, RunState.RUNNING, container={"image": spec.image, "owner_pid": os.getpid()})
    progress("running", f"agent {rec.agent} running in {spec.image}")
    svc.audit.append(
        "container.starting",
        run=rec.id,
        agent=rec.agent,
        policy=rec.policy_revision,
        image=spec.image,
        network=spec.network,
        user=spec.user,
        limits=spec.limits.model_dump(),
    )
    asked = svc.store.get_run(rec.id).stop_kind  # a stop from another process while this one staged
    if asked == "kill":
        svc.sandbox.kill(rec.id)  # no container yet: the sandbox then never starts it
    elif asked == "stop":
        svc.sandbox.stop(rec.id, cfg.limits.grace_s)
    try:
        return watch(svc, rec, lambda on_output: svc.sandbox.run(spec, on_output))
    finally:
        agent_wiring.finish(svc, rec)  # the run's token stops working with its container


def watch(svc: Service, rec: RunRecord, start: Callable[[Callable[[bytes], None]], ExitInfo | None]) -> ExitInfo:
    """Run or re-attach to the container with live sampling, then record what it did."""
    cfg = svc.policy.agent(rec.agent)
    run_dir = svc.state.run_dir(rec.id)
    usage = svc.store.get_agent(rec.agent)
    budget = cfg.admission.max_tokens
    monitor = RunMonitor(
        svc.sandbox,
        rec.id,
        cfg.limits,
        staging=run_dir / "staging",
        staged_bytes=rec.staged_bytes,
        tokens_left=max(0, budget - usage.tokens_used) if budget else None,
        publish=_publisher(svc, rec),
        tokens_from="gateway" if gateway_runs.uses_gateway(cfg) else "agent",
    ).start()
    gateway_runs.attach(rec.id, monitor)
    try:
        found = start(monitor.on_output)
    finally:
        monitor.finish()
    if found is None:
        raise EngineError(f"the container of run {rec.id} is gone; what it did before is not known")
    info = found
    svc._monitors[rec.id] = monitor
    record_usage(svc, rec, monitor)
    tail = svc.redactor.text(info.output_tail[-OUTPUT_TAIL_BYTES:].decode("utf-8", "replace"))
    (run_dir / "output.log").write_text(tail)
    container = {
        "id": info.container_id[:12],
        "image": rec.container.get("image"),
        "exit_code": info.exit_code,
        "oom_killed": info.oom_killed,
        "duration_s": round(info.duration_s, 3),
        "effective": info.effective,
    }

    def record(r: RunRecord) -> None:
        r.container, r.output_bytes = container, info.output_bytes

    svc.store.update_run(rec.id, record)
    # what the engine says the container really ran with: network, capabilities, limits
    svc.audit.append("container.effective", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **info.effective)
    svc.audit.append("container.exited", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **container)
    return info


def publish_sample(svc: Service, run_id: str, sample: dict[str, Any]) -> RunRecord:
    """Persist one live sample (peaks, output, tokens) and announce it; the run as stored."""

    def keep(r: RunRecord) -> None:
        r.peak = sample["peak"]
        r.output_bytes, r.tokens, r.growth_bytes = sample["output_bytes"], sample["tokens"], sample["growth_bytes"]

    rec = svc.store.update_run(run_id, keep)
    svc.emit("runStatus", svc.run_status(rec, sample))
    return rec


def _publisher(svc: Service, run: RunRecord) -> Callable[[dict[str, Any]], None]:
    """Each sample published; and a stop or kill asked from another process (recorded on the run)
    carried out here, by the process that holds the container, should the asker's own delivery
    have come before the container existed (`airlockd stop --no-wait`, a cancelled progress)."""
    carried_out = False

    def publish(sample: dict[str, Any]) -> None:
        nonlocal carried_out
        rec = publish_sample(svc, run.id, sample)
        if rec.stop_kind and not carried_out:
            carried_out = True
            if rec.stop_kind == "kill":
                svc.sandbox.kill(rec.id)
            else:
                svc.sandbox.stop(rec.id, svc.policy.agent(rec.agent).limits.grace_s)

    return publish


def record_usage(svc: Service, rec: RunRecord, monitor: RunMonitor) -> None:
    """Final figures of a run, and its tokens counted against the agent's budget."""

    def keep(r: RunRecord) -> None:
        r.peak = dict(monitor.peak)
        r.tokens = monitor.tokens
        r.tokens_source = "gateway" if monitor.tokens_from == "gateway" else "agent adapter report"
        r.growth_bytes = monitor.growth_bytes

    svc.store.update_run(rec.id, keep)
    if monitor.tokens:
        svc.store.update_agent(rec.agent, lambda u: setattr(u, "tokens_used", u.tokens_used + monitor.tokens))
        svc.emit("agentStatus", svc.agent_status(rec.agent))


def ending(svc: Service, rec: RunRecord, info: ExitInfo) -> RunRecord | None:
    """The run's end when the container was stopped, killed or hit a limit; else None."""
    monitor = svc._monitors.pop(rec.id, None)
    hit = monitor.limit_hit(info) if monitor else None
    asked = info.stopped or rec.stop_kind  # the request may have come from another process
    if asked and (hit is None or rec.stop_kind):  # a person's request, not our token stop
        state = RunState.STOPPED if asked == "stop" else RunState.KILLED
        return svc.lifecycle.transition(rec, state, f"{asked} requested by {rec.stopped_by or 'a user'}")
    if hit is not None:
        svc.audit.append("limit.exceeded", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **hit.model_dump())
        rec = svc.lifecycle.transition(
            rec,
            RunState.LIMIT_EXCEEDED,
            f"{hit.limit}: {hit.measured} > {hit.allowed}",
            limit=hit,
        )
        count_violation(svc, rec)
        return rec
    return None  # the streak of violations ends once the change set passed inspection too


def count_violation(svc: Service, rec: RunRecord) -> None:
    threshold = svc.policy.agent(rec.agent).admission.quarantine_after

    def bump(u: Any) -> None:
        u.consecutive_violations += 1
        if u.consecutive_violations >= threshold and not u.quarantined:
            u.quarantined = True
            u.reason = f"{u.consecutive_violations} consecutive limit violations, the last in run {rec.id}"

    usage = svc.store.update_agent(rec.agent, bump)
    svc.emit("agentStatus", svc.agent_status(rec.agent))
    if usage.quarantined:
        svc.audit.append(
            "agent.quarantined",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            reason=usage.reason,
        )


def inspect(svc: Service, rec: RunRecord, progress: Progress) -> RunRecord:
    rec = svc.lifecycle.transition(rec, RunState.INSPECTING)
    progress("inspecting", "hashing the staging copy")
    run_dir = svc.state.run_dir(rec.id)
    stager = stagers.for_run(run_dir)
    base = stager.base(run_dir)  # the lower layer (overlay), or the saved manifest (copy)
    try:  # from the upper layer, or a full rescan; stopped at the policy's bounds
        changes = stager.inspect(run_dir, base, ChangeBounds.of(svc.policy.agent(rec.agent).limits))
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
    rec = svc.store.update_run(rec.id, lambda r: setattr(r, "files", files))
    svc.store.update_agent(rec.agent, lambda u: setattr(u, "consecutive_violations", 0))
    summary = f"{len(files)} changes: " + ", ".join(
        f"{sum(1 for f in files if f.decision is d)} {d.value}" for d in Decision
    )
    rec = svc.lifecycle.transition(rec, RunState.PROPOSED, summary, proposed_at=time.time())
    if rec.mode == Mode.AUTO.value:
        auto = [f.path for f in rec.files if f.decision is Decision.AUTO and f.state is FileState.PENDING]
        if auto:
            rec = svc.review.approve(rec.id, auto, actor="policy:auto-mode", allow_conflict=True).run
    return svc.lifecycle.settle(rec.id)


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


def carried_secrets(svc: Service, rec: RunRecord, changes: Iterable[Change]) -> dict[str, Secret]:
    """The secret each change of the run carries (path -> Secret), in its name or its proposed
    content. The values of withheld files are read again from the live workspace first (into
    memory only, never stored): this process may not be the one that staged the run (a daemon
    restarted, a run re-attached), and a withheld file may have changed while the agent ran
    (a walk: 0.2 s on a 20,000-file tree, once per inspection)."""
    learn_withheld(svc.workspace, svc.policy, svc.policy.clearance_for(rec.agent), svc.redactor)
    return find_secrets_in(
        svc.state.run_dir(rec.id),
        changes,
        svc.policy.withhold.detectors,
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


def run_live(svc: Service, run_id: str) -> bool:
    """Whether a run may still have its overlay mounted (its mirror generation is in use)."""
    try:
        return svc.store.get_run(run_id).state.live
    except Exception:
        return False


def overlay_volume(svc: Service, run_dir: Path) -> OverlayVolume | None:
    """The run's layers as the volume the engine mounts at `/workspace`; None: a bind mount."""
    lay = stagers.for_run(run_dir).layers(run_dir)
    return None if lay is None else OverlayVolume(lay.lower, lay.upper, lay.work, lay.options)
