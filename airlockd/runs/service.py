"""The orchestrator: the one place that sequences admit -> stage -> contain -> inspect ->
classify -> propose -> commit. The CLI and the LSP server are two doors into this class; every
run state change goes through its `lifecycle` (airlockd/runs/lifecycle.py), decisions through `review`.
Constructing it changes nothing on disk but its state dir; `recover()` is the explicit start-up
step of the processes that may write.

Blocking work (copying, hashing, Docker) happens in the caller's thread; the LSP server calls
these methods from worker threads, never from its event loop.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from airlockd.errors import AdmissionRejected, AirlockError, EngineError, PolicyError, StateError
from airlockd.evidence.audit import AuditLog
from airlockd.evidence.document import live_tree, schemes_differ
from airlockd.gateway.runs import uses_socket
from airlockd.pipeline import admission
from airlockd.policy import Level, LoadedPolicy, Mode, Policy, load_policy
from airlockd.protocol import AgentInfo, AgentStatus, RunStatus
from airlockd.records import RunRecord, RunState
from airlockd.redact import Redactor, install_log_redaction
from airlockd.runs import execution, inspection, recovery
from airlockd.runs.containment import RunMonitor
from airlockd.runs.content import ProposalContent
from airlockd.runs.lifecycle import RunLifecycle
from airlockd.runs.review import Review
from airlockd.runs.stopping import RunStopper
from airlockd.sandbox.base import ExitInfo, Sandbox
from airlockd.staging import stagers
from airlockd.staging.keeper import MirrorKeeper
from airlockd.staging.withheld import learn as learn_withheld
from airlockd.state import StateDir
from airlockd.store import Store

log = logging.getLogger(__name__)

Progress = Callable[[str, str], None]  # (stage, message)
Listener = Callable[[str, dict[str, Any]], None]  # (event, payload): "runStatus", "agentStatus"
LEARN_FRESH_S = 5.0


def _noop(stage: str, message: str) -> None:
    pass


_ACTING: contextvars.ContextVar[str | None] = contextvars.ContextVar("airlock_actor", default=None)


@contextlib.contextmanager
def acting_as(actor: str) -> Iterator[None]:
    """What is decided inside (and in the threads it hops to) is audited as `actor`: the daemon
    acts for the CLI that asked it over the control socket."""
    token = _ACTING.set(actor)
    try:
        yield
    finally:
        _ACTING.reset(token)


class Service:
    """One workspace's airlockd: policy, store, audit, sandbox and the run lifecycle."""

    def __init__(
        self,
        workspace: Path,
        *,
        sandbox: Sandbox | None = None,
        actor: str = "cli",
        known_values: dict[str, list[str]] | list[str] | None = None,
    ) -> None:
        """`known_values`: the withheld values the daemon that starts this process has learned
        (handed over a pipe); they stand in for this process's own walk of the workspace."""
        self.workspace = workspace.resolve()
        if not self.workspace.is_dir():
            from airlockd.errors import UsageError

            raise UsageError(f"workspace {self.workspace} is not a directory")
        self.state = StateDir.for_workspace(self.workspace).ensure()
        self._actor = actor
        self.redactor = Redactor()
        install_log_redaction()  # every log line of this process is masked with what it knows
        self.store = Store(self.state)
        self.audit = AuditLog(self.state.audit, self.redactor, signer=self._sign)
        self._sandbox = sandbox
        self._listeners: list[Listener] = []
        self._monitors: dict[str, RunMonitor] = {}
        self.loaded = self._load_policy()
        self.redactor.add_detectors(*(d.detector for d in self.policy.withhold.custom))
        self._learn_gateway_key()
        # withheld values are masked in whatever this process prints, even input echoed in an error
        lowest = self._lowest()
        self._learned: tuple[float, Any] | None = None  # (when, at which clearance)
        self.keeper: MirrorKeeper | None = None  # set by keep_mirrors() in a long-lived process
        # a run's process a daemon started: the daemon made ready what it could (execution.prepare)
        self.for_daemon = known_values is not None
        if known_values is None:
            self.learn_withheld(lowest)
        else:
            self.redactor.restore(known_values)
            self._learned = (time.monotonic(), lowest)
        self.lifecycle = RunLifecycle(
            workspace=self.workspace,
            state=self.state,
            store=self.store,
            audit=self.audit,
            redactor=self.redactor,
            announce=lambda rec: self.emit("runStatus", self.run_status(rec)),
            release_staging=self.cleanup_staging,
            proposal_ttl_s=lambda: self.policy.defaults.proposal_ttl_s,
        )
        self.stopper = RunStopper(
            state=self.state,
            store=self.store,
            audit=self.audit,
            lifecycle=self.lifecycle,
            sandbox=lambda: self.sandbox,
            policy=lambda: self.policy,
            actor=lambda: self.actor,
        )
        self.content = ProposalContent(
            workspace=self.workspace, state=self.state, store=self.store, redactor=self.redactor
        )
        self.review = Review(
            workspace=self.workspace,
            state=self.state,
            store=self.store,
            audit=self.audit,
            lifecycle=self.lifecycle,
            policy=lambda: self.policy,
            actor=lambda: self.actor,
            seal=self.seal_live_tree,
            content=self.content,
        )

    def _sign(self, message: bytes) -> bytes:
        """The state directory's audit key signs a checkpoint (loaded each time: rare, and a key
        rotated by hand is picked up)."""
        from airlockd.evidence.signing import signing_key

        return signing_key(self.state.root).sign(message)

    def recover(self) -> Service:
        """The start-up step of a process that may write (a run, a decision, the daemon):
        keep the policy revision in force, finish or roll back commits a crash interrupted (the
        journal), and reconcile runs whose process died (re-attached, or recorded as failed).
        Constructing a Service never does this, so reading commands (`runs`, `show`, `diff`) leave
        the workspace, the runs and the state alone."""
        self.keep_revision()
        recovery.recover_journals(self)
        recovery.reconcile(self)
        return self

    @property
    def actor(self) -> str:
        """Who decisions are audited as: this door ("cli", "lsp"), or who `acting_as` names."""
        return _ACTING.get() or self._actor

    # -- policy -------------------------------------------------------------------------------

    def _load_policy(self) -> LoadedPolicy:
        return load_policy(self.workspace)

    def keep_revision(self) -> None:
        """Keep the text of the policy revision in force (once per revision), so past decisions can
        be replayed: done by what decides under it (a run's admission, a daemon, a reload), never
        by merely constructing the service."""
        loaded = self.loaded
        kept = self.state.policies / f"{loaded.revision}.json"
        if not kept.exists():
            kept.write_text(loaded.text)
            self.audit.append("policy.revision_kept", policy=loaded.revision, sources=list(loaded.sources))

    def reload_policy(self) -> LoadedPolicy:
        """Re-read the policy; a bad file keeps the last good one in force and says so."""
        old = self.loaded.revision
        try:
            self.loaded = self._load_policy()
            self.redactor.add_detectors(*(d.detector for d in self.policy.withhold.custom))
            self.keep_revision()
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
        keeper = self.keeper
        if keeper is not None and keeper.why is None and execution.uses_mirror(self):
            # the keeper's refresh reads exactly the withheld files that changed since the last one
            keeper.refresh(self.policy, clearance, owner=execution.mirror_owner(), redactor=self.redactor)
            return
        if self._learned is not None:
            when, level = self._learned
            if now - when < LEARN_FRESH_S and level.rank <= clearance.rank:
                return
        learn_withheld(self.workspace, self.policy, clearance, self.redactor, also=self.store.recent_withheld())
        self._learned = (now, clearance)

    def learn_withheld_again(self) -> None:
        """Read the withheld values afresh, at the lowest clearance of any agent (a run's process
        whose daemon left before it said all it knows)."""
        self._learned = None
        self.learn_withheld(self._lowest())

    def _lowest(self) -> Level:
        return min(
            (self.policy.clearance_for(a) for a in self.policy.agents),
            key=lambda lvl: lvl.rank,
            default=self.policy.defaults.clearance,
        )

    def keep_mirrors(self, walker: Callable[[Level], None] | None = None) -> str | None:
        """Keep this workspace's mirrors up to date from file events, for a process that serves
        many runs (the daemon): a run's staging then costs what changed since the last one, not
        a walk of the tree. None when watching, else why every run walks the tree."""
        if self.keeper is None:
            self.keeper = MirrorKeeper(self.workspace, self.state.root, walker=walker)
            why = self.keeper.start()
            self.audit.append("mirror.keeper", watching=why is None, why=why)
            self._drop_spares()  # a daemon that died left them
        return self.keeper.why

    def close(self) -> None:
        if self.keeper is not None:
            self.keeper.close()
            self.keeper = None
            self._drop_spares()
        elif self.for_daemon:
            try:
                execution.settle(self)  # the holders it lets go of off the run's path
            except AirlockError as exc:
                log.warning("holders let go of off the run's path not waited for: %s", exc.message)

    def _drop_spares(self) -> None:
        """The engine's holders made ahead for this workspace's runs (layers.py, "Spares"): only
        the process that keeps the mirrors makes them, and they go with it."""
        try:
            held = execution.held_upper(self)
            if held is not None:
                held.drop_spares()
        except AirlockError as exc:
            log.warning("spare holders not looked for: %s", exc.message)

    @property
    def policy(self) -> Policy:
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
        if cfg.adapter != "command":  # the runtime image with the agent's CLI (`runtime build --with NAME`)
            from airlockd.sandbox.image import agent_image_tag

            return agent_image_tag(cfg.adapter)
        return image_tag()

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
        return RunStatus(
            runId=rec.id,
            agent=rec.agent,
            state=rec.state,
            elapsedS=round(time.time() - rec.created_at, 1),
            cpuPct=sample.get("cpu_pct", 0.0),
            memBytes=int(sample.get("mem_bytes", 0)),
            outputBytes=rec.output_bytes,
            tokens=rec.tokens,
        ).wire()

    def agent_status(self, agent: str) -> dict[str, Any]:
        """The `airlock/agentStatus` payload: usage and quarantine of one agent."""
        u = self.store.get_agent(agent)
        return AgentStatus(
            agent=agent, quarantined=u.quarantined, reason=u.reason, runsUsed=u.runs_used, tokensUsed=u.tokens_used
        ).wire()

    # -- admit --------------------------------------------------------------------------------

    def submit(self, agent: str, prompt: str, *, mode: str | None = None, follow_up: str | None = None) -> RunRecord:
        """Admit a run or refuse it (AdmissionRejected) before anything is spent."""
        self.keep_revision()  # the run's evidence names it
        cfg = self.policy.agent(agent)
        run_mode = Mode(mode) if mode else self.policy.mode_for(agent)
        if follow_up:
            prev = self.store.get_run(follow_up)
            if prev.compacted_at is not None:
                raise StateError(
                    f"run {prev.id} was compacted by retention: its session snapshot is gone",
                    hint="start a new run (without --follow-up), or follow up on a more recent one",
                )
            if prev.agent != agent:
                raise StateError(f"run {prev.id} belongs to agent {prev.agent!r}, not {agent!r}")
            follow_up = prev.id
        screened = admission.screen_prompt(prompt)
        # withheld values are masked before anything is stored, and a prompt quoting one is refused
        self.learn_withheld(self.policy.clearance_for(agent))
        if self.redactor.known_in(prompt):
            screened.secrets.append("withheld-value")
        self.redactor.learn(prompt)  # a bare copy of a secret it holds is masked from here on
        run_id = "r" + time.strftime("%y%m%d", time.gmtime()) + secrets.token_hex(3)  # the UTC day: docs/state.md
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
        if reason is None:  # a runtime the engine lacks is refused before anything is spent
            runtime = self.policy.runtime_for(agent)
            reason = self.sandbox.runtime_refusal(runtime, host_sockets=uses_socket(self.policy, agent))
            if reason:
                reason = f'runtime "{runtime}": {reason}'
        refused = reason
        reason = self.store.admit(rec, lambda live, usage: refused or admission.refusal(cfg, usage, prompt, live))
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

    def execute(self, run_id: str, progress: Progress = _noop, ready: Callable[[], None] = lambda: None) -> RunRecord:
        """Take an admitted run to `proposed` (or to the state that ended it). Blocking. `ready`
        waits, once the run is claimed, for what the starting daemon prepares for its staging."""
        me, started = os.getpid(), recovery.process_start(os.getpid())  # claimed and staging in one write
        rec = self.lifecycle.transition(
            self.store.get_run(run_id), RunState.STAGING, expect=RunState.ADMITTED, owner_pid=me, owner_start=started
        )
        prompt = (self.state.run_dir(rec.id) / "prompt.raw").read_text()
        self.redactor.learn(prompt)

        def run() -> ExitInfo:  # (a failure of `ready` fails the run, and its prompt goes with it)
            ready()
            asked = execution.asked_before_staging(self, rec)  # while the daemon prepared
            if asked is not None:
                return asked
            staged = execution.stage(self, rec, progress)
            return execution.contain(self, staged, prompt, progress)

        return self._carry(rec, run, progress)

    def resume(self, run_id: str, progress: Progress = _noop) -> RunRecord:
        """Take over a running run whose process died: keep enforcing its limits on the live
        container, then inspect and propose it as `execute` would have. Blocking."""
        rec = self._claim(run_id, RunState.RUNNING)
        self.audit.append("recovery.reattached", run=rec.id, agent=rec.agent, policy=rec.policy_revision)
        limits = self.policy.agent(rec.agent).limits

        def run() -> ExitInfo:
            try:
                return execution.watch(
                    self,
                    rec,
                    lambda on_output: self.sandbox.attach(
                        rec.id, limits, output_so_far=rec.output_bytes, on_output=on_output
                    ),
                )
            finally:
                execution.finish_agent(self, rec)  # its home comes back from the run's copy

        return self._carry(rec, run, progress)

    def _claim(self, run_id: str, expected: RunState) -> RunRecord:
        """This process carries the run from now on (so a later start knows whether it lives).
        (`execute` claims the admitted run as it moves it to staging, in the same write.)"""
        me, started = os.getpid(), recovery.process_start(os.getpid())

        def own(r: RunRecord) -> None:  # checked and claimed in one transaction
            if r.state is not expected:
                raise StateError(f"run {r.id} is {r.state.value}, not {expected.value}")
            r.owner_pid, r.owner_start = me, started

        return self.store.update_run(run_id, own)

    def _carry(self, rec: RunRecord, run: Callable[[], ExitInfo], progress: Progress) -> RunRecord:
        """Run the container part, then end the run (stopped, killed, over a limit) or inspect
        and propose it. A failure is recorded on the run; the unredacted prompt never outlives it."""
        try:
            info = run()
            rec = self.store.get_run(rec.id)
            ended = execution.ending(self, rec, info)
            if ended is not None:
                self.keep_for_inspection(ended)
                return ended
            return inspection.inspect(self, rec, progress)
        except Exception as exc:
            rec = self.store.get_run(rec.id)
            if rec.state.live:
                msg = self.redactor.text(str(exc))
                log.exception("run %s failed", rec.id)
                rec = self.lifecycle.transition(rec, RunState.FAILED, msg, error=msg)
                self.keep_for_inspection(rec)
            if isinstance(exc, EngineError | PolicyError):
                raise
            return rec
        finally:
            for name in ("prompt.raw", "prompt"):
                (self.state.run_dir(rec.id) / name).unlink(missing_ok=True)
            # the container and its overlay are gone, and inspection (which reads the mirror
            # generation as the run's base) is done: the generation may be collected
            run_dir = self.state.run_dir(rec.id)
            stagers.for_run(run_dir).release(run_dir, lambda run_id: execution.run_live(self, run_id))

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
        # a run staged by an older airlockd has a digest of another scheme: not comparable
        why = schemes_differ(rec.live_tree["before"], tree)
        self.audit.append(
            "workspace.sealed",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            before=before,
            after=tree["sha256"],
            unchanged=None if why else before == tree["sha256"],
            **({"note": why} if why else {}),
        )

    # -- stop / kill (runs/stopping.py) --------------------------------------------------------

    def stop(self, run_id: str, *, kill: bool = False, wait: bool = True) -> RunRecord:
        """Stop (or kill) a live run; by default return its record once it has ended."""
        return self.stopper.stop(run_id, kill=kill, wait=wait)

    # -- agents -------------------------------------------------------------------------------

    def agents(self) -> list[dict[str, Any]]:
        out = []
        for name, cfg in sorted(self.policy.agents.items()):
            u = self.store.get_agent(name)
            info = AgentInfo(
                agent=name,
                adapter=cfg.adapter,
                mode=cfg.mode or self.policy.defaults.mode,
                quarantined=u.quarantined,
                reason=u.reason,
                runsUsed=u.runs_used,
                tokensUsed=u.tokens_used,
                consecutiveViolations=u.consecutive_violations,
                limits=cfg.limits,
                admission=cfg.admission,
            )
            out.append(info.wire())
        return out

    def release(self, agent: str) -> dict[str, Any]:
        self.policy.agent(agent)

        def lift(u: Any) -> None:
            u.quarantined, u.reason, u.consecutive_violations = False, None, 0

        self.store.update_agent(agent, lift)
        self.audit.append("agent.released", agent=agent, policy=self.loaded.revision, by=self.actor)
        self.emit("agentStatus", self.agent_status(agent))
        return next(a for a in self.agents() if a["agent"] == agent)

    # -- recovery (airlockd/runs/recovery.py) ------------------------------------------------------

    def sweep(self, folders: bool = True) -> dict[str, int]:
        """Reap what no live run owns; see `recovery.sweep`."""
        return recovery.sweep(self, folders)

    def keep_for_inspection(self, rec: RunRecord) -> None:
        recovery.keep_for_inspection(self, rec)

    def cleanup_staging(self, rec: RunRecord) -> None:
        recovery.cleanup_staging(self, rec)
