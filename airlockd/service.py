"""The run state machine: the one place that sequences admit -> stage -> contain -> inspect ->
classify -> propose -> commit. The CLI and the LSP server are two doors into this class.

Blocking work (copying, hashing, Docker) happens in the caller's thread; the LSP server calls
these methods from worker threads, never from its event loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airlockd import screening
from airlockd.agents import sessions as agent_sessions
from airlockd.agents import wiring as agent_wiring
from airlockd.audit import AuditLog
from airlockd.containment import RunMonitor
from airlockd.errors import AdmissionRejected, EngineError, PolicyError, StateError
from airlockd.evidence import live_tree
from airlockd.gateway import runs as gateway_runs
from airlockd.pipeline import admission, stagers
from airlockd.pipeline.classify import classify
from airlockd.pipeline.commit import recover
from airlockd.pipeline.manifest import load_manifest, save_manifest
from airlockd.pipeline.mirror import mirror_for
from airlockd.pipeline.staging import stage
from airlockd.policy import Decision, Level, LoadedPolicy, Mode, load_policy
from airlockd.records import (
    FileReview,
    FileState,
    RunRecord,
    RunState,
    Transition,
    allowed,
)
from airlockd.redact import Redactor, install_log_redaction
from airlockd.review import Review
from airlockd.sandbox import capfs
from airlockd.sandbox.base import ContainerSpec, ExitInfo, OverlayVolume, Sandbox
from airlockd.state import StateDir
from airlockd.store import Store, update_agent_in
from airlockd.withheld import learn as learn_withheld

log = logging.getLogger(__name__)

Progress = Callable[[str, str], None]  # (stage, message)
Listener = Callable[[str, dict[str, Any]], None]  # (event, payload): "runStatus", "agentStatus"
AGENT_UID = (1000, 1000)
OUTPUT_TAIL_BYTES = 64 * 1024
LEARN_FRESH_S = 5.0


def _noop(stage: str, message: str) -> None:
    pass


class Service:
    """One workspace's airlockd: policy, store, audit, sandbox and the run lifecycle."""

    def __init__(self, workspace: Path, *, sandbox: Sandbox | None = None, actor: str = "cli") -> None:
        self.workspace = workspace.resolve()
        if not self.workspace.is_dir():
            from airlockd.errors import UsageError

            raise UsageError(f"workspace {self.workspace} is not a directory")
        self.state = StateDir.for_workspace(self.workspace).ensure()
        self.actor = actor
        self.redactor = Redactor()
        install_log_redaction()  # every log line of this process is masked with what it knows
        self.store = Store(self.state)
        self.audit = AuditLog(self.state.audit, self.redactor)
        self._sandbox = sandbox
        self._listeners: list[Listener] = []
        self._monitors: dict[str, RunMonitor] = {}
        self.loaded = self._load_policy()
        self._learn_gateway_key()
        # withheld values are masked in whatever this process prints, even input echoed in an error
        lowest = min(
            (self.policy.clearance_for(a) for a in self.policy.agents),
            key=lambda lvl: lvl.rank,
            default=self.policy.defaults.clearance,
        )
        self._learned: tuple[float, Any] | None = None  # (when, at which clearance)
        self.learn_withheld(lowest)
        self.review = Review(self)
        self._recover_journals()
        self._reconcile()

    # -- policy -------------------------------------------------------------------------------

    def _load_policy(self) -> LoadedPolicy:
        loaded = load_policy(self.workspace)
        kept = self.state.policies / f"{loaded.revision}.json"
        if not kept.exists():  # every revision's text is kept so past decisions can be replayed
            kept.write_text(loaded.text)
            self.audit.append("policy.revision_kept", policy=loaded.revision, sources=list(loaded.sources))
        return loaded

    def reload_policy(self) -> LoadedPolicy:
        """Re-read the policy; a bad file keeps the last good one in force and says so."""
        old = self.loaded.revision
        try:
            self.loaded = self._load_policy()
        except PolicyError as exc:
            self.audit.append("policy.reload_failed", policy=old, error=exc.message)
            raise
        if self.loaded.revision != old:
            self.audit.append("policy.reloaded", policy=self.loaded.revision, previous=old)
        return self.loaded

    def learn_withheld(self, clearance: Level) -> None:
        """Read the values of the workspace's withheld files into the redactor (memory only).
        A walk at this clearance or a lower one (which withholds at least as much) in the last
        few seconds is current enough: a CLI command does not walk the tree twice."""
        now = time.monotonic()
        if self._learned is not None:
            when, level = self._learned
            if now - when < LEARN_FRESH_S and level.rank <= clearance.rank:
                return
        learn_withheld(self.workspace, self.policy, clearance, self.redactor)
        self._learned = (now, clearance)

    @property
    def policy(self) -> Any:
        return self.loaded.policy

    # -- sandbox ------------------------------------------------------------------------------

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            from airlockd.sandbox.docker import DockerSandbox

            self._sandbox = DockerSandbox()
        return self._sandbox

    def image_for(self, agent: str) -> str:
        from airlockd.sandbox.image import image_tag

        cfg = self.policy.agent(agent)
        if cfg.image:
            return str(cfg.image)
        if cfg.adapter == "codex":  # the runtime image with the Codex binary (`runtime build --with-codex`)
            from airlockd.sandbox.image import codex_image_tag

            return codex_image_tag()
        return image_tag()

    # -- state machine ------------------------------------------------------------------------

    def transition(self, rec: RunRecord, dst: RunState, detail: str = "", **fields: Any) -> RunRecord:
        """Persist a state change (checked against the run state machine), then audit it."""
        detail = self.redactor.text(detail)

        def change(r: RunRecord) -> None:
            if r.state != dst and not allowed(r.state, dst):
                raise StateError(f"run {r.id} is {r.state.value}; it cannot become {dst.value}")
            r.state = dst
            r.transitions.append(Transition(state=dst, at=time.time(), detail=detail))
            for k, v in fields.items():
                setattr(r, k, v)

        rec = self.store.update_run(rec.id, change)
        agent_sessions.settle(self, rec, dst)  # the agent's conversation follows the run's fate
        self.audit.append(
            f"run.{dst.value}",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            detail=detail,
        )
        self.emit("runStatus", self.run_status(rec))
        return rec

    # -- events (the LSP server subscribes; the CLI does not) ---------------------------------

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(event, payload)` after each persisted change; from any thread."""
        self._listeners.append(listener)

    def emit(self, event: str, payload: dict[str, Any]) -> None:
        payload = self.redactor.value(payload)
        for fn in list(self._listeners):
            try:
                fn(event, payload)
            except Exception:  # a listener's failure must never break a run
                log.exception("listener failed for %s", event)

    def run_status(self, rec: RunRecord, sample: dict[str, float] | None = None) -> dict[str, Any]:
        """The `airlock/runStatus` payload: state and resource use of one run."""
        sample = sample or {}
        return {
            "runId": rec.id,
            "agent": rec.agent,
            "state": rec.state.value,
            "elapsedS": round(time.time() - rec.created_at, 1),
            "cpuPct": sample.get("cpu_pct", 0.0),
            "memBytes": int(sample.get("mem_bytes", 0)),
            "outputBytes": rec.output_bytes,
            "tokens": rec.tokens,
        }

    def agent_status(self, agent: str) -> dict[str, Any]:
        u = self.store.get_agent(agent)
        return {
            "agent": agent,
            "quarantined": u.quarantined,
            "reason": u.reason,
            "runsUsed": u.runs_used,
            "tokensUsed": u.tokens_used,
        }

    # -- admit --------------------------------------------------------------------------------

    def submit(self, agent: str, prompt: str, *, mode: str | None = None, follow_up: str | None = None) -> RunRecord:
        """Admit a run or refuse it (AdmissionRejected) before anything is spent."""
        cfg = self.policy.agent(agent)
        run_mode = Mode(mode) if mode else self.policy.mode_for(agent)
        if follow_up:
            prev = self.store.get_run(follow_up)
            if prev.agent != agent:
                raise StateError(f"run {prev.id} belongs to agent {prev.agent!r}, not {agent!r}")
            follow_up = prev.id
        screened = admission.screen_prompt(prompt)
        # withheld values are masked before anything is stored, and a prompt quoting one is refused
        self.learn_withheld(self.policy.clearance_for(agent))
        if self.redactor.known_in(prompt):
            screened.secrets.append("withheld-value")
        self.redactor.learn(prompt)  # a bare copy of a secret it holds is masked from here on
        run_id = "r" + time.strftime("%y%m%d") + secrets.token_hex(3)
        rec = RunRecord(
            id=run_id,
            agent=agent,
            mode=run_mode.value,
            state=RunState.ADMITTED,
            prompt=self.redactor.text(prompt),
            prompt_sha256=hashlib.sha256(prompt.encode()).hexdigest(),
            policy_revision=self.loaded.revision,
            follow_up=follow_up,
            injection_markers=screened.injection_markers,
        )
        reason = None
        if screened.secrets and cfg.admission.prompt_secrets == "reject":
            reason = f"the prompt contains a secret ({', '.join(screened.secrets)}); remove it and ask again"
        elif screened.secrets:  # policy says redact: the agent gets the prompt with the secret masked
            prompt = self.redactor.text(prompt)
            rec.prompt_redactions = list(screened.secrets)
        with self.store.tx() as db:
            if reason is None:
                live = [r for r in db.table("runs").all() if r["agent"] == agent and RunState(r["state"]).live]
                usage = update_agent_in(db, agent, lambda u: None)
                reason = admission.refusal(cfg, usage, prompt, len(live))
            if reason is None:
                update_agent_in(db, agent, lambda u: setattr(u, "runs_used", u.runs_used + 1))
            else:
                rec.state = RunState.REJECTED_AT_ADMISSION
            rec.transitions.append(Transition(state=rec.state, at=time.time(), detail=reason or ""))
            db.table("runs").insert(rec.model_dump(mode="json"))
        self.audit.append(
            "admission." + ("refused" if reason else "admitted"),
            run=run_id,
            agent=agent,
            policy=self.loaded.revision,
            reason=reason,
            prompt_bytes=len(prompt.encode()),
            prompt_sha256=rec.prompt_sha256,
            injection_markers=screened.injection_markers,
            prompt_redactions=rec.prompt_redactions,
        )
        self.emit("agentStatus", self.agent_status(agent))
        if reason:
            raise AdmissionRejected(f"admission refused for agent {agent!r}: {reason}", run_id=run_id, reason=reason)
        (self.state.run_dir(run_id)).mkdir(mode=0o700)
        (self.state.run_dir(run_id) / "prompt.raw").write_text(prompt)
        os.chmod(self.state.run_dir(run_id) / "prompt.raw", 0o600)
        return rec

    # -- stage, contain, inspect, classify ----------------------------------------------------

    def execute(self, run_id: str, progress: Progress = _noop) -> RunRecord:
        """Take an admitted run to `proposed` (or to the state that ended it). Blocking."""
        rec = self.store.get_run(run_id)
        if rec.state is not RunState.ADMITTED:
            raise StateError(f"run {rec.id} is {rec.state.value}, not admitted")

        def own(r: RunRecord) -> None:
            r.owner_pid, r.owner_start = os.getpid(), _process_start(os.getpid())

        rec = self.store.update_run(rec.id, own)
        run_dir = self.state.run_dir(rec.id)
        prompt_file = run_dir / "prompt.raw"
        prompt = prompt_file.read_text()
        self.redactor.learn(prompt)
        try:
            rec = self._stage(rec, progress)
            exit_info = self._contain(rec, prompt, progress)
            rec = self.store.get_run(rec.id)
            ended = self._ending(rec, exit_info)
            if ended is not None:
                self.keep_for_inspection(ended)
                return ended
            return self._inspect(rec, progress)
        except Exception as exc:
            rec = self.store.get_run(rec.id)
            if rec.state.live:
                msg = self.redactor.text(str(exc))
                log.exception("run %s failed", rec.id)
                rec = self.transition(rec, RunState.FAILED, msg, error=msg)
                self.keep_for_inspection(rec)
            if isinstance(exc, EngineError | PolicyError):
                raise
            return rec
        finally:
            prompt_file.unlink(missing_ok=True)
            (run_dir / "prompt").unlink(missing_ok=True)

    def resume(self, run_id: str, progress: Progress = _noop) -> RunRecord:
        """Take over a running run whose process died: keep enforcing its limits on the live
        container, then inspect and propose it as `execute` would have. Blocking."""
        rec = self.store.get_run(run_id)
        if rec.state is not RunState.RUNNING:
            raise StateError(f"run {rec.id} is {rec.state.value}, not running")

        def own(r: RunRecord) -> None:
            r.owner_pid, r.owner_start = os.getpid(), _process_start(os.getpid())

        rec = self.store.update_run(rec.id, own)
        self.audit.append("recovery.reattached", run=rec.id, agent=rec.agent, policy=rec.policy_revision)
        limits = self.policy.agent(rec.agent).limits
        try:
            info = self._watch(
                rec,
                lambda on_output: self.sandbox.attach(
                    rec.id, limits, output_so_far=rec.output_bytes, on_output=on_output
                ),
            )
            rec = self.store.get_run(rec.id)
            ended = self._ending(rec, info)
            if ended is not None:
                self.keep_for_inspection(ended)
                return ended
            return self._inspect(rec, progress)
        except Exception as exc:
            rec = self.store.get_run(rec.id)
            if rec.state.live:
                msg = self.redactor.text(str(exc))
                rec = self.transition(rec, RunState.FAILED, msg, error=msg)
                self.keep_for_inspection(rec)
            return rec
        finally:
            for name in ("prompt.raw", "prompt"):
                (self.state.run_dir(rec.id) / name).unlink(missing_ok=True)

    def _stage(self, rec: RunRecord, progress: Progress) -> RunRecord:
        rec = self.transition(rec, RunState.STAGING)
        progress("staging", "copying the workspace without withheld files")
        staging = self.state.run_dir(rec.id) / "staging"
        owner = AGENT_UID if os.getuid() == 0 else None
        growth = self.policy.agent(rec.agent).limits.workspace_growth_mb * 2**20
        capped = capfs.available() is None
        if capped:
            capfs.mount(staging)
        else:
            self.audit.append(
                "stage.growth_uncapped", run=rec.id, agent=rec.agent, policy=rec.policy_revision, why=capfs.available()
            )
        stager, why = stagers.choose(self.state.root)
        clearance = self.policy.clearance_for(rec.agent)
        mirror: dict[str, Any] = {}
        if stager == stagers.OVERLAY:  # the mirror refreshed, a fresh upper layer on the capped tmpfs
            view = mirror_for(self.state.root, clearance).refresh(
                self.workspace,
                self.policy,
                clearance,
                owner=owner,
                redactor=self.redactor,
                run_id=rec.id,
                is_live=self._run_live,
            )
            result, lay = view.result, stagers.layout(staging, view.tree)
            stagers.prepare(lay, owner)
            stagers.write_meta(self.state.run_dir(rec.id), stager, why, view)
            mirror = {k: v for k, v in vars(view.stats).items() if k != "seconds"}
            screening.classify_labels(self, rec, lay.lower, result, hide=lambda p: stagers.hide(lay, p))
        else:
            result = stage(self.workspace, staging, self.policy, clearance, owner=owner, redactor=self.redactor)
            stagers.write_meta(self.state.run_dir(rec.id), stager, why)
            screening.classify_labels(self, rec, staging, result)
        if capped:  # the agent may add `growth` bytes to what was staged, and not one more
            capfs.resize(staging, capfs.used_bytes(staging) + growth, inodes=result.files + max(4096, growth // 4096))
        save_manifest(result.base, self.state.run_dir(rec.id) / "base.json")
        withheld = [{"path": w.path, "rule": w.rule} for w in result.withheld]
        # the live tree as the agent's copy was taken: evidence that it stays put while proposed
        if stager == stagers.OVERLAY:  # the refresh just established it: no second read of the tree
            tree = stagers.live_tree_of(self.workspace, result)
        else:
            tree = live_tree(self.workspace, [w["path"] for w in withheld])
        self.store.update_run(rec.id, lambda r: setattr(r, "live_tree", {"before": tree}))
        withheld = self.redactor.value(withheld)
        for w in withheld:
            self.audit.append("stage.withheld", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **w)
        self.audit.append(
            "stage.done",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            files=result.files,
            bytes=result.bytes,
            withheld=len(withheld),
            skipped=[{"path": s.path, "rule": s.rule} for s in result.skipped],
            stager=stager,
            stager_why=why,
            mirror=mirror or None,
        )
        staged = capfs.used_bytes(staging) if capped else result.bytes

        def record(r: RunRecord) -> None:
            r.withheld, r.staged_bytes, r.growth_capped = withheld, staged, capped
            r.stager = stager

        return self.store.update_run(rec.id, record)

    def _contain(self, rec: RunRecord, prompt: str, progress: Progress) -> ExitInfo:
        cfg = self.policy.agent(rec.agent)
        run_dir = self.state.run_dir(rec.id)
        inv = agent_wiring.prepare(self, rec, cfg, prompt)  # opens the run's model gateway if it has one
        uid, gid = AGENT_UID if os.getuid() == 0 else (os.getuid(), os.getgid())
        user = f"{uid}:{gid}"
        spec = ContainerSpec(
            run_id=rec.id,
            image=self.image_for(rec.agent),
            argv=inv.argv,
            workspace=stagers.staged_root(run_dir),
            limits=cfg.limits,
            stdin_file=inv.stdin_file,
            env=inv.env,
            mounts=inv.mounts,
            user=user,
            labels={"airlockd.workspace": str(self.workspace), "airlockd.agent": rec.agent},
            workspace_overlay=self._overlay_volume(run_dir),
        )
        self.transition(rec, RunState.RUNNING, container={"image": spec.image, "owner_pid": os.getpid()})
        progress("running", f"agent {rec.agent} running in {spec.image}")
        self.audit.append(
            "container.starting",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            image=spec.image,
            network=spec.network,
            user=spec.user,
            limits=spec.limits.model_dump(),
        )
        try:
            return self._watch(rec, lambda on_output: self.sandbox.run(spec, on_output))
        finally:
            agent_wiring.finish(self, rec)  # the run's token stops working with its container

    def _watch(self, rec: RunRecord, start: Callable[[Callable[[bytes], None]], ExitInfo | None]) -> ExitInfo:
        """Run or re-attach to the container with live sampling, then record what it did."""
        cfg = self.policy.agent(rec.agent)
        run_dir = self.state.run_dir(rec.id)
        usage = self.store.get_agent(rec.agent)
        budget = cfg.admission.max_tokens
        monitor = RunMonitor(
            self.sandbox,
            rec.id,
            cfg.limits,
            staging=run_dir / "staging",
            staged_bytes=rec.staged_bytes,
            tokens_left=max(0, budget - usage.tokens_used) if budget else None,
            publish=lambda sample: self._publish_sample(rec.id, sample),
            tokens_from="gateway" if gateway_runs.uses_gateway(cfg) else "agent",
        ).start()
        gateway_runs.attach(rec.id, monitor)
        try:
            found = start(monitor.on_output)
        finally:
            monitor.finish()
            stagers.release(run_dir, self._run_live)  # the container (and its overlay) is gone
        if found is None:
            raise EngineError(f"the container of run {rec.id} is gone; what it did before is not known")
        info = found
        self._monitors[rec.id] = monitor
        self._record_usage(rec, monitor)
        tail = self.redactor.text(info.output_tail[-OUTPUT_TAIL_BYTES:].decode("utf-8", "replace"))
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

        self.store.update_run(rec.id, record)
        # what the engine says the container really ran with: network, capabilities, limits
        self.audit.append(
            "container.effective", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **info.effective
        )
        self.audit.append("container.exited", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **container)
        return info

    def _publish_sample(self, run_id: str, sample: dict[str, Any]) -> None:
        """Persist one live sample (peaks, output, tokens) and announce it."""

        def keep(r: RunRecord) -> None:
            r.peak = sample["peak"]
            r.output_bytes, r.tokens, r.growth_bytes = sample["output_bytes"], sample["tokens"], sample["growth_bytes"]

        rec = self.store.update_run(run_id, keep)
        self.emit("runStatus", self.run_status(rec, sample))

    def _record_usage(self, rec: RunRecord, monitor: RunMonitor) -> None:
        """Final figures of a run, and its tokens counted against the agent's budget."""

        def keep(r: RunRecord) -> None:
            r.peak = dict(monitor.peak)
            r.tokens = monitor.tokens
            r.tokens_source = "gateway" if monitor.tokens_from == "gateway" else "agent adapter report"
            r.growth_bytes = monitor.growth_bytes

        self.store.update_run(rec.id, keep)
        if monitor.tokens:
            self.store.update_agent(rec.agent, lambda u: setattr(u, "tokens_used", u.tokens_used + monitor.tokens))
            self.emit("agentStatus", self.agent_status(rec.agent))

    def _ending(self, rec: RunRecord, info: ExitInfo) -> RunRecord | None:
        """The run's end when the container was stopped, killed or hit a limit; else None."""
        monitor = self._monitors.pop(rec.id, None)
        hit = monitor.limit_hit(info) if monitor else None
        asked = info.stopped or rec.stop_kind  # the request may have come from another process
        if asked and (hit is None or rec.stop_kind):  # a person's request, not our token stop
            state = RunState.STOPPED if asked == "stop" else RunState.KILLED
            return self.transition(rec, state, f"{asked} requested by {rec.stopped_by or 'a user'}")
        if hit is not None:
            self.audit.append(
                "limit.exceeded", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **hit.model_dump()
            )
            rec = self.transition(
                rec,
                RunState.LIMIT_EXCEEDED,
                f"{hit.limit}: {hit.measured} > {hit.allowed}",
                limit=hit,
            )
            self._count_violation(rec)
            return rec
        self.store.update_agent(rec.agent, lambda u: setattr(u, "consecutive_violations", 0))
        return None

    def _count_violation(self, rec: RunRecord) -> None:
        threshold = self.policy.agent(rec.agent).admission.quarantine_after

        def bump(u: Any) -> None:
            u.consecutive_violations += 1
            if u.consecutive_violations >= threshold and not u.quarantined:
                u.quarantined = True
                u.reason = f"{u.consecutive_violations} consecutive limit violations, the last in run {rec.id}"

        usage = self.store.update_agent(rec.agent, bump)
        self.emit("agentStatus", self.agent_status(rec.agent))
        if usage.quarantined:
            self.audit.append(
                "agent.quarantined",
                run=rec.id,
                agent=rec.agent,
                policy=rec.policy_revision,
                reason=usage.reason,
            )

    def _inspect(self, rec: RunRecord, progress: Progress) -> RunRecord:
        rec = self.transition(rec, RunState.INSPECTING)
        progress("inspecting", "hashing the staging copy")
        run_dir = self.state.run_dir(rec.id)
        base = load_manifest(run_dir / "base.json")
        changes = stagers.inspect_run(run_dir, base)  # from the upper layer, or a full rescan
        withheld = {w["path"] for w in rec.withheld}
        files = []
        for c in classify(changes, self.policy, withheld, base=base.keys()):
            state = FileState.DENIED if c.decision is Decision.DENY else FileState.PENDING
            files.append(
                FileReview(
                    path=c.change.path,
                    change=c.change.change.value,
                    decision=c.decision,
                    rule=c.rule,
                    reason=c.reason,
                    state=state,
                    before=c.change.before.to_json() if c.change.before else None,
                    after=c.change.after.to_json() if c.change.after else None,
                )
            )
            self.audit.append(
                "classify",
                run=rec.id,
                agent=rec.agent,
                policy=rec.policy_revision,
                path=c.change.path,
                change=c.change.change.value,
                decision=c.decision.value,
                rule=c.rule,
            )
        files = screening.screen_changes(self, rec, files)
        self.review.keep_base_blobs(rec.id, files)
        for f in files:
            if f.state is FileState.CONFLICTED:
                self.audit.append(
                    "conflict",
                    run=rec.id,
                    agent=rec.agent,
                    policy=rec.policy_revision,
                    path=f.path,
                    why="the live file changed between staging and inspection",
                )
        rec = self.store.update_run(rec.id, lambda r: setattr(r, "files", files))
        summary = f"{len(files)} changes: " + ", ".join(
            f"{sum(1 for f in files if f.decision is d)} {d.value}" for d in Decision
        )
        rec = self.transition(rec, RunState.PROPOSED, summary, proposed_at=time.time())
        if rec.mode == Mode.AUTO.value:
            auto = [f.path for f in rec.files if f.decision is Decision.AUTO and f.state is FileState.PENDING]
            if auto:
                rec = self.review.approve(rec.id, auto, actor="policy:auto-mode", allow_conflict=True).run
        return self.review.settle(rec.id)

    # -- evidence hooks -----------------------------------------------------------------------

    def _learn_gateway_key(self) -> None:
        """The gateway's real key is masked everywhere this process writes."""
        gw = self.policy.gateway
        if gw.key_env and (key := os.environ.get(gw.key_env)):
            self.redactor.add(key)
        if gw.key_file:
            with contextlib.suppress(OSError):  # a missing key file is the gateway's error to report
                self.redactor.add(Path(gw.key_file).expanduser().read_text().strip())

    def gateway_refused(self, run_id: str, reason: str, **data: Any) -> None:
        """Hook for the model gateway (issue 4): record one refused request of a run."""
        rec = self.store.get_run(run_id)
        self.audit.append(
            "gateway.refused", run=rec.id, agent=rec.agent, policy=rec.policy_revision, reason=reason, **data
        )

    def seal_live_tree(self, rec: RunRecord) -> None:
        """Digest the live tree once, before the first approve / reject of a proposal writes."""
        if rec.state is not RunState.PROPOSED or "before" not in rec.live_tree or "after" in rec.live_tree:
            return
        tree = live_tree(self.workspace, [w["path"] for w in rec.withheld])

        def keep(r: RunRecord) -> None:
            if "after" not in r.live_tree:
                r.live_tree = {**r.live_tree, "after": tree}

        self.store.update_run(rec.id, keep)
        before = rec.live_tree["before"]["sha256"]
        self.audit.append(
            "workspace.sealed",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            before=before,
            after=tree["sha256"],
            unchanged=before == tree["sha256"],
        )

    def _run_live(self, run_id: str) -> bool:
        """Whether a run may still have its overlay mounted (its mirror generation is in use)."""
        try:
            return self.store.get_run(run_id).state.live
        except Exception:
            return False

    def _overlay_volume(self, run_dir: Path) -> OverlayVolume | None:
        meta = stagers.meta(run_dir)
        if meta.get("stager") != stagers.OVERLAY:
            return None
        lay = stagers.layout(run_dir / "staging", Path(str(meta["lower"])))
        return OverlayVolume(lay.lower, lay.upper, lay.work, lay.options)

    # -- stop / kill --------------------------------------------------------------------------

    def stop(self, run_id: str, *, kill: bool = False) -> RunRecord:
        rec = self.store.get_run(run_id)
        if not rec.state.live:
            raise StateError(f"run {rec.id} is {rec.state.value}; only a live run can be stopped")

        def mark(r: RunRecord) -> None:
            r.stopped_by, r.stop_kind = self.actor, "kill" if kill else "stop"

        self.store.update_run(rec.id, mark)
        gateway_runs.revoke(rec.id)  # its model token stops working now (if this process serves it)
        self.audit.append(
            "run.kill_requested" if kill else "run.stop_requested",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            by=self.actor,
        )
        if kill:
            self.sandbox.kill(rec.id)
        else:
            self.sandbox.stop(rec.id, self.policy.agent(rec.agent).limits.grace_s)
        return self.store.get_run(rec.id)

    # -- agents -------------------------------------------------------------------------------

    def agents(self) -> list[dict[str, Any]]:
        out = []
        for name, cfg in sorted(self.policy.agents.items()):
            u = self.store.get_agent(name)
            out.append(
                {
                    "agent": name,
                    "adapter": cfg.adapter,
                    "mode": (cfg.mode or self.policy.defaults.mode).value,
                    "quarantined": u.quarantined,
                    "reason": u.reason,
                    "runsUsed": u.runs_used,
                    "tokensUsed": u.tokens_used,
                    "consecutiveViolations": u.consecutive_violations,
                    "limits": cfg.limits.model_dump(),
                    "admission": cfg.admission.model_dump(),
                }
            )
        return out

    def release(self, agent: str) -> dict[str, Any]:
        self.policy.agent(agent)

        def lift(u: Any) -> None:
            u.quarantined, u.reason, u.consecutive_violations = False, None, 0

        self.store.update_agent(agent, lift)
        self.audit.append("agent.released", agent=agent, policy=self.loaded.revision, by=self.actor)
        self.emit("agentStatus", self.agent_status(agent))
        return next(a for a in self.agents() if a["agent"] == agent)

    # -- recovery -----------------------------------------------------------------------------

    def _recover_journals(self) -> None:
        for r in recover(self.workspace, self.state.journal, self.state.backups):
            self.audit.append(
                "commit.recovered",
                policy=self.loaded.revision,
                outcome=r.outcome,
                txid=r.txid,
                paths=r.paths,
                verified=r.verified,
            )

    def _reconcile(self) -> None:
        """A live run whose executing process is gone is reaped and recorded as failed; never
        silently forgotten. Its staging copy is kept for inspection."""
        for rec in self.store.list_runs():
            if not rec.state.live or rec.owner_pid is None or _alive(rec.owner_pid, rec.owner_start):
                continue
            reaped = "no container was started"
            if rec.state is RunState.RUNNING and self._reattach(rec):
                continue
            if rec.state is RunState.RUNNING:
                try:
                    n = self.sandbox.reap(rec.id)
                    reaped = f"{n} container(s) killed and removed" if n else "its container was already gone"
                except EngineError as exc:
                    reaped = f"its container could not be reaped: {exc.message}"
            why = (
                f"the airlockd process running it (pid {rec.owner_pid}) ended while it was {rec.state.value}; {reaped}"
            )
            self.audit.append(
                "recovery.reconciled",
                run=rec.id,
                agent=rec.agent,
                policy=rec.policy_revision,
                was=rec.state.value,
                pid=rec.owner_pid,
                reaped=reaped,
            )
            for name in ("prompt.raw", "prompt"):  # the unredacted prompt of a run that will never run
                (self.state.run_dir(rec.id) / name).unlink(missing_ok=True)
            self.keep_for_inspection(self.transition(rec, RunState.FAILED, why, error=why))

    def sweep(self) -> dict[str, int]:
        """Reap what no live run owns: airlockd's containers of runs that are over (or unknown),
        staging copies of decided runs, run folders without a run. Runs before a new run starts
        and when the daemon starts; a stopped or failed run keeps its staging for inspection."""
        runs = {r.id: r for r in self.store.list_runs()}
        containers = 0
        try:
            for run_id in self.sandbox.labelled_runs(str(self.workspace)):
                if run_id not in runs or not runs[run_id].state.live:
                    containers += self.sandbox.reap(run_id)
        except EngineError as exc:
            log.warning("could not look for orphaned containers: %s", exc.message)
        decided = {RunState.APPLIED, RunState.REJECTED, RunState.EXPIRED, RunState.UNDONE}
        folders = staging = 0
        for run_dir in sorted(self.state.runs.iterdir()) if self.state.runs.is_dir() else []:
            rec = runs.get(run_dir.name)
            if rec is None:
                if capfs.is_mount(run_dir / "staging"):
                    capfs.unmount(run_dir / "staging")
                shutil.rmtree(run_dir, ignore_errors=True)
                folders += 1
            elif rec.state in decided and (run_dir / "staging").exists():
                self.cleanup_staging(rec)
                staging += 1
        swept = {"containers": containers, "run_folders": folders, "staging_copies": staging}
        if any(swept.values()):
            self.audit.append("recovery.swept", policy=self.loaded.revision, swept=swept)
        return swept

    def _reattach(self, rec: RunRecord) -> bool:
        """Hand a still-running container of a dead process to a new background process that
        keeps enforcing its limits (`airlockd _execute --resume`). False if nothing runs."""
        try:
            running = self.sandbox.stats(rec.id) is not None
        except EngineError:
            return False
        if not running:
            return False

        def claim(r: RunRecord) -> None:  # ours until the new process claims it for itself
            r.owner_pid, r.owner_start = os.getpid(), _process_start(os.getpid())

        self.store.update_run(rec.id, claim)
        log_file = self.state.run_dir(rec.id) / "daemon.log"
        with log_file.open("ab") as err:
            subprocess.Popen(
                [sys.executable, "-m", "airlockd", "--workspace", str(self.workspace), "_execute", "--resume", rec.id],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        return True

    def keep_for_inspection(self, rec: RunRecord) -> None:
        """A run that ended badly keeps its staging copy, moved off its capped tmpfs to disk so
        it costs no memory (`cp -a`: it may hold fifos, which a Python copy would block on)."""
        staging = self.state.run_dir(rec.id) / "staging"
        stagers.release(staging.parent, self._run_live)
        if not capfs.is_mount(staging):
            return
        kept = staging.with_name("staging.kept")
        kept.mkdir(exist_ok=True)
        subprocess.run(["cp", "-a", f"{staging}/.", str(kept)], check=False, capture_output=True)
        capfs.unmount(staging)
        staging.rmdir()
        kept.rename(staging)

    def cleanup_staging(self, rec: RunRecord) -> None:
        """Drop a finished run's staging copy (and its capped filesystem)."""
        staging = self.state.run_dir(rec.id) / "staging"
        stagers.release(staging.parent, self._run_live)
        if capfs.is_mount(staging):
            capfs.unmount(staging)
        shutil.rmtree(staging, ignore_errors=True)


def _process_start(pid: int) -> int | None:
    """The start time of a process in clock ticks since boot (None if there is no such process):
    with the pid, it names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])  # a zombie has ended


def _alive(pid: int, start: int | None) -> bool:
    now = _process_start(pid)
    return now is not None and (start is None or now == start)
