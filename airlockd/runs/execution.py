"""Executing one admitted run: stage the workspace, contain the agent (sampling it live) and
record how it ended; what it changed is inspected next (runs/inspection.py). The service
sequences these steps; every change of the run's state goes through `svc.lifecycle`, which owns the state machine."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airlockd.agents import command
from airlockd.agents import wiring as agent_wiring
from airlockd.errors import EngineError
from airlockd.evidence.document import live_tree
from airlockd.fsutil import atomic_write_bytes
from airlockd.gateway import runs as gateway_runs
from airlockd.records import RunRecord, RunState
from airlockd.runs import screening
from airlockd.runs.containment import RunMonitor
from airlockd.runs.liveoutput import LiveOutput
from airlockd.runs.runtime import agent_image
from airlockd.sandbox import layers
from airlockd.sandbox.base import ContainerSpec, ExitInfo, OverlayVolume
from airlockd.staging import capfs, stagers
from airlockd.staging.base import HeldUpper, StageRequest
from airlockd.staging.mirror import MirrorView, RefreshStats, mirror_for, policy_digest
from airlockd.staging.records import StageResult, Withheld

if TYPE_CHECKING:
    from airlockd.runs.service import Progress, Service

log = logging.getLogger(__name__)

AGENT_UID = (1000, 1000)  # the agent's user in the runtime image; staging copies are given to it as root
OUTPUT_TAIL_BYTES = 64 * 1024


def mirror_owner() -> tuple[int, int] | None:
    """Who the staged nodes belong to: the agent's user when we can chown (root), else us."""
    return AGENT_UID if os.getuid() == 0 else None


def stage(svc: Service, rec: RunRecord, progress: Progress) -> RunRecord:
    """Stage the run (which `Service.execute` moved to staging as it claimed it)."""
    progress("staging", "copying the workspace without withheld files")
    run_dir = svc.state.run_dir(rec.id)
    held = held_upper(svc, rec.agent)
    stager = stagers.choose(svc.state.root, held)
    capped = capfs.available() is None or (held is not None and stager.name == stagers.OVERLAY)
    if not capped:
        svc.audit.append(
            "stage.growth_uncapped", run=rec.id, agent=rec.agent, policy=rec.policy_revision, why=capfs.available()
        )
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
            # the agent's home is copied beside the upper layer, under the same cap (agents/homes.py)
            growth=svc.policy.agent(rec.agent).limits.workspace_growth_mb * 2**20 + agent_wiring.home_bytes(svc, rec),
            capped=capped,
            refresh=refresh,
            screen=lambda tree, result, hide: screening.classify_labels(svc, rec, tree, result, hide=hide),
            run_id=rec.id,
            held=held,
            spare=svc.keeper is not None,
            claimed=claimed_spare(svc, rec.id),
        )
    )
    result = staged.result
    tree = staged.live_tree or live_tree(svc.workspace, [w.path for w in result.withheld])
    withheld = [{"path": w.path, "rule": w.rule} for w in result.withheld]
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
        r.live_tree = {"before": tree}
        r.withheld, r.staged_bytes, r.growth_capped = withheld, staged.staged_bytes, capped
        r.staged_entries = staged.staged_entries
        r.stager = stager.name

    return svc.store.update_run(rec.id, record)


def asked_before_staging(svc: Service, rec: RunRecord) -> ExitInfo | None:
    """A stop or kill asked for while the run was claimed and waiting for what the daemon
    prepares (nothing staged, no container): how it ended, for `ending`; else None."""
    asked = svc.store.get_run(rec.id).stop_kind
    if asked is None:
        return None
    return ExitInfo(
        container_id="",
        exit_code=None,
        oom_killed=False,
        timed_out=False,
        output_limited=False,
        stopped=asked,
        duration_s=0.0,
        output_bytes=0,
        output_tail=b"",
        effective={},
    )


def held_upper(svc: Service, agent: str | None = None) -> HeldUpper | None:
    """The engine's holder of capped upper layers when this process cannot mount one (not
    root) and the engine can serve the run's overlay; else None. Its holders run the agent's
    image (any image of ours will do without an agent: they need its python3)."""
    from airlockd.sandbox.image import image_tag
    from airlockd.sandbox.projectsource import is_project_image

    project = agent is not None and is_project_image(svc.policy.agent(agent).image)
    # a project's image may have no python3 of its own: the runtime image holds for it
    image = image_tag() if agent is None or project else svc.image_for(agent)
    held = svc.sandbox.held_upper(image, str(svc.workspace))
    if held is not None and not held.remote and capfs.available() is None:
        return None  # root mounts its own capped filesystem, here
    return held


def settle(svc: Service) -> None:
    """Wait for the engine's holders this process lets go of off the runs' path."""
    held = held_upper(svc)
    if held is not None:
        held.settle()


def uses_mirror(svc: Service) -> bool:
    """Whether the next runs are staged from the workspace's mirror (the overlay stager)."""
    return stagers.choose(svc.state.root, held_upper(svc)).uses_mirror


def used_bytes(svc: Service, rec: RunRecord) -> Callable[[], int | None]:
    """What the run's capped filesystem holds now (None: it has none), for the monitor."""
    run_dir = svc.state.run_dir(rec.id)
    staging = run_dir / "staging"
    if stagers.held_run(run_dir):
        held = held_upper(svc, rec.agent)
        if held is None:
            return lambda: None
        return lambda: held.used(rec.id)[0]
    return lambda: capfs.used_bytes(staging) if capfs.is_mount(staging) else None


_PREPARED = "mirror-view.json"
SPARE = "spare.json"  # the spare holder the daemon set aside for the run (runs/ahead.py)
AHEAD = "ahead.json"  # the files the daemon wrote into that spare: {name: sha256} (runs/ahead.py)


def claimed_spare(svc: Service, run_id: str) -> str | None:
    """The id of the engine's holder the daemon set aside for this run, once (runs/ahead.py)."""
    path = svc.state.run_dir(run_id) / SPARE
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    path.unlink(missing_ok=True)
    cid = doc.get("id") if isinstance(doc, dict) else None
    return cid if isinstance(cid, str) and cid else None


def stdin_ahead(svc: Service, rec: RunRecord) -> bytes | None:
    """What the run's agent will read on its standard input, for the daemon to write ahead into
    the spare it sets aside: a `command` agent's (`agents/command.py`; the run's process compares
    before it trusts it); else None."""
    cfg = svc.policy.agents.get(rec.agent)
    if cfg is None or agent_wiring.cli_of(cfg) is not None:
        return None
    try:
        return command.stdin_bytes(cfg, (svc.state.run_dir(rec.id) / "prompt.raw").read_text())
    except (OSError, ValueError):
        return None


def _written_ahead(run_dir: Path, name: str) -> str | None:
    """The sha256 of the file `name` the daemon wrote into the spare it set aside for the run."""
    try:
        doc = json.loads((run_dir / AHEAD).read_bytes())
    except (OSError, ValueError):
        return None
    digest = doc.get(name) if isinstance(doc, dict) else None
    return digest if isinstance(digest, str) else None


def prepare_view(svc: Service, run_id: str) -> None:
    """In the daemon, while the process that carries an admitted run starts (before it stages): refresh the
    mirror with the daemon's keeper (in proportion to what changed), reference the generation
    for the run, and leave the view in the run's folder for `stage` to take."""
    rec = svc.store.get_run(run_id)
    keeper = svc.keeper
    if keeper is None or keeper.why is not None or screening.labels_on(svc):
        return  # the run's process walks (a label classifier needs the whole base manifest)
    if not stagers.choose(svc.state.root, held_upper(svc, rec.agent)).uses_mirror:
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
        "serial": view.serial,
    }
    atomic_write_bytes(svc.state.run_dir(rec.id) / _PREPARED, json.dumps(doc).encode())
    held = held_upper(svc, rec.agent)
    if held is not None and held.remote:  # the engine's copy brought up to date by this process,
        # which keeps what it knows of it in memory: the run's process finds it synced at this version
        held.lower(view.tree, stagers.view_version(view))


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
    serial = doc.get("serial")
    return MirrorView(
        doc["generation"], Path(doc["tree"]), res, stats, serial=serial if isinstance(serial, int) else None,
        live_tree=doc["live_tree"],
    )  # fmt: skip


def _walk_mirror(svc: Service) -> Callable[..., MirrorView]:
    """A mirror refresh by a walk (a process without a keeper: the CLI, a re-attached run)."""

    def refresh(policy: Any, clearance: Any, **kw: Any) -> MirrorView:
        return mirror_for(svc.state.root, clearance).refresh(svc.workspace, policy, clearance, **kw)

    return refresh


def contain(svc: Service, rec: RunRecord, prompt: str, progress: Progress) -> ExitInfo:
    cfg = svc.policy.agent(rec.agent)
    run_dir = svc.state.run_dir(rec.id)
    image = agent_image(svc, rec.agent, lambda message: progress("staging", message))  # builds a project's
    held = held_upper(svc, rec.agent) if stagers.held_run(run_dir) else None
    inv = agent_wiring.prepare(svc, rec, cfg, prompt, held)  # opens the run's model gateway if it has one
    lent_home = cfg.adapter != "command"  # an agent CLI's home: its copy is staged, not grown (agents/homes.py)
    if lent_home and rec.growth_capped and (used := used_bytes(svc, rec)()) is not None:
        rec = svc.store.update_run(rec.id, lambda r: setattr(r, "staged_bytes", max(r.staged_bytes, used)))
    uid, gid = AGENT_UID if os.getuid() == 0 else (os.getuid(), os.getgid())
    user = f"{uid}:{gid}"
    stdin_file = inv.stdin_file
    ahead = False  # the prompt on its standard input written by the daemon into the spare it set aside
    if held is not None and held.remote and stdin_file is not None:  # the engine's host cannot see it
        data = stdin_file.read_bytes()
        ahead = held.took_claim(rec.id) and _written_ahead(run_dir, "stdin") == hashlib.sha256(data).hexdigest()
        if not ahead:  # (else the daemon wrote it into the spare it set aside: no service to wait for)
            held.put_file(rec.id, "stdin", data)  # read-only for all: the agent reads it
        stdin_file = Path(held.where(rec.id, "stdin"))
    spec = ContainerSpec(
        run_id=rec.id,
        image=image,
        argv=inv.argv,
        workspace=stagers.for_run(run_dir).staged_root(run_dir),
        limits=cfg.limits,
        stdin_file=stdin_file,
        env=inv.env,
        mounts=inv.mounts,
        user=user,
        labels={"airlockd.workspace": str(svc.workspace), "airlockd.agent": rec.agent},
        workspace_overlay=overlay_volume(svc, run_dir),
        runtime=svc.policy.runtime_for(rec.agent),
        engine_paths=held is not None and held.remote,
        network_of=layers.holder_name(rec.id) if held is not None else None,
    )
    svc.lifecycle.transition(
        rec, RunState.RUNNING, container={"image": spec.image, "runtime": spec.runtime, "owner_pid": os.getpid()}
    )
    under = "" if spec.runtime == "runc" else f" under {spec.runtime}"
    progress("running", f"agent {rec.agent} running in {spec.image}{under}")
    svc.audit.append(
        "container.starting",
        run=rec.id,
        agent=rec.agent,
        policy=rec.policy_revision,
        image=spec.image,
        runtime=spec.runtime,
        network=spec.network,
        user=spec.user,
        limits=spec.limits.model_dump(),
        **({"stdin": "written ahead into the spare holder"} if ahead else {}),
    )
    asked = svc.store.get_run(rec.id).stop_kind  # a stop from another process while this one staged
    if asked == "kill":
        svc.sandbox.kill(rec.id)  # no container yet: the sandbox then never starts it
    elif asked == "stop":
        svc.sandbox.stop(rec.id, cfg.limits.grace_s)
    try:
        return watch(svc, rec, lambda on_output: svc.sandbox.run(spec, on_output))
    finally:
        agent_wiring.finish(svc, rec, held)  # the run's token stops working with its container


def finish_agent(svc: Service, rec: RunRecord) -> None:
    """`agent_wiring.finish` for a run whose container this process did not start (re-attached)."""
    run_dir = svc.state.run_dir(rec.id)
    agent_wiring.finish(svc, rec, held_upper(svc, rec.agent) if stagers.held_run(run_dir) else None)


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
        used_bytes=used_bytes(svc, rec),
        staged_bytes=rec.staged_bytes,
        tokens_left=max(0, budget - usage.tokens_used) if budget else None,
        publish=_publisher(svc, rec),
        tokens_from="gateway" if gateway_runs.uses_gateway(cfg) else "agent",
    ).start()
    gateway_runs.attach(rec.id, monitor)
    live = LiveOutput(
        lambda text, dropped: svc.emit("runOutput", {"runId": rec.id, "text": text, "dropped": dropped}),
        redact=svc.redactor.text,  # each line whole, before its escapes (runs/liveoutput.py)
    )

    def on_output(chunk: bytes) -> None:
        monitor.on_output(chunk)  # the limits first: a viewer's trouble never delays them
        try:
            live.feed(chunk)
        except Exception:
            log.exception("run %s: its output could not be shown live", rec.id)

    try:
        found = start(on_output)
    finally:
        live.close()
        monitor.finish()  # no sample is published after this
        svc.store.drop_sample(rec.id)
    if found is None:
        raise EngineError(f"the container of run {rec.id} is gone; what it did before is not known")
    info = found
    svc._monitors[rec.id] = monitor
    tail = svc.redactor.text(info.output_tail[-OUTPUT_TAIL_BYTES:].decode("utf-8", "replace"))
    (run_dir / "output.log").write_text(tail)
    container = {
        "id": info.container_id[:12],
        "image": rec.container.get("image"),
        # what the engine ran it under (its record), else what was asked
        "runtime": info.effective.get("runtime") or rec.container.get("runtime") or "runc",
        "exit_code": info.exit_code,
        "oom_killed": info.oom_killed,
        "duration_s": round(info.duration_s, 3),
        "effective": info.effective,
    }

    def record(r: RunRecord) -> None:
        r.container, r.output_bytes = container, info.output_bytes

    record_usage(svc, rec, monitor, record)
    # what the engine says the container really ran with: network, capabilities, limits
    svc.audit.append("container.effective", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **info.effective)
    svc.audit.append("container.exited", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **container)
    return info


def publish_sample(svc: Service, run_id: str, sample: dict[str, Any]) -> RunRecord:
    """Persist one live sample (peaks, output, tokens) and announce it; the run as stored."""

    keys = ("peak", "output_bytes", "tokens", "growth_bytes")
    svc.store.put_sample(run_id, {k: sample[k] for k in keys})  # the run's own small file, no lock
    rec = svc.store.get_run(run_id)
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


def record_usage(
    svc: Service, rec: RunRecord, monitor: RunMonitor, also: Callable[[RunRecord], None] = lambda r: None
) -> None:
    """Final figures of a run (with `also`, in the same write), and its tokens counted against
    the agent's budget."""

    def keep(r: RunRecord) -> None:
        r.peak = dict(monitor.peak)
        r.tokens = monitor.tokens
        r.tokens_source = "gateway" if monitor.tokens_from == "gateway" else "agent adapter report"
        r.growth_bytes = monitor.growth_bytes
        also(r)

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
