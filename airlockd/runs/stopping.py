"""Stopping and killing a run, from any process: the request is recorded on the run (the process
carrying it honours it too), delivered to its container, and, by default, waited for in the store
until the run has ended, as `docker stop` returns once the container has stopped."""

from __future__ import annotations

import time
from collections.abc import Callable

from airlockd.errors import StateError, StillEnding
from airlockd.evidence.audit import AuditLog
from airlockd.gateway import runs as gateway_runs
from airlockd.policy import Policy
from airlockd.records import RunRecord, RunState
from airlockd.runs import recovery
from airlockd.runs.lifecycle import RunLifecycle
from airlockd.sandbox.base import Sandbox
from airlockd.state import StateDir
from airlockd.store import Store

STOP_POLL_S = 0.1  # how often a waiting stop reads the run's state
STOP_REDELIVER_S = 3.0  # still running this long past the grace: the stop is delivered again
STOP_MARGIN_S = 30.0  # past grace + this, a stop gives up waiting (the run may be staging a big tree)


class RunStopper:
    """Stop and kill, with what they use: the run's record, the audit trail, the lifecycle (a run
    no process carries yet ends here), the sandbox, the policy (the agent's grace), who asks."""

    def __init__(
        self,
        *,
        state: StateDir,
        store: Store,
        audit: AuditLog,
        lifecycle: RunLifecycle,
        sandbox: Callable[[], Sandbox],
        policy: Callable[[], Policy],
        actor: Callable[[], str],
    ) -> None:
        self.state, self.store, self.audit, self.lifecycle = state, store, audit, lifecycle
        self.sandbox, self.policy, self.actor = sandbox, policy, actor

    def stop(self, run_id: str, *, kill: bool = False, wait: bool = True) -> RunRecord:
        """Ask a live run to stop (SIGTERM, the agent's grace, then SIGKILL) or be killed, and
        return its record once it has ended (`wait`, the default), as `docker stop` does; with
        `wait=False` at once, in whatever state it is then. The run may be carried by another
        process: the end is watched in the store. Raises StillEnding past grace + a margin."""
        rec = self.store.get_run(run_id)
        if not rec.state.live:
            raise StateError(f"run {rec.id} is {rec.state.value}; only a live run can be stopped")

        def mark(r: RunRecord) -> None:
            r.stopped_by, r.stop_kind = self.actor(), "kill" if kill else "stop"

        self.store.update_run(rec.id, mark)
        gateway_runs.revoke(rec.id)  # its model token stops working now (if this process serves it)
        self.audit.append(
            "run.kill_requested" if kill else "run.stop_requested",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            by=self.actor(),
        )
        kind = "kill" if kill else "stop"
        if rec.state is RunState.ADMITTED and rec.owner_pid is None:  # no process carries it yet: ends here
            state = RunState.KILLED if kill else RunState.STOPPED
            why = f"{kind} requested by {self.actor()} before the run started"
            try:  # unless its process claims it meanwhile (then that process ends it, before it stages)
                ended = self.lifecycle.transition(rec, state, why, expect=RunState.ADMITTED)
            except StateError:
                ended = None
            if ended is not None:
                for name in ("prompt.raw", "prompt"):  # the unredacted prompt of a run that will never run
                    (self.state.run_dir(rec.id) / name).unlink(missing_ok=True)
                return ended
        grace = 0.0 if kill else self.policy().agent(rec.agent).limits.grace_s
        deliver = (lambda: self.sandbox().kill(rec.id)) if kill else (lambda: self.sandbox().stop(rec.id, grace))
        reached = deliver()
        if not wait:
            return self.store.get_run(rec.id)
        return self._await_end(rec.id, grace, deliver, reached)

    def _await_end(self, run_id: str, grace: float, deliver: Callable[[], bool], reached: bool) -> RunRecord:
        """Poll the store until the run is no longer live. While the run is `running` and no
        container of it was reached (the request came between the run's record and its container's
        start), the request is delivered again at each poll; once one was, again only when the run
        is still running a grace later."""
        started = time.monotonic()
        deadline = started + grace + STOP_MARGIN_S
        again = started + grace + STOP_REDELIVER_S
        while True:
            rec = self.store.get_run(run_id)
            if not rec.state.live:
                return rec
            now = time.monotonic()
            gone = rec.owner_pid is not None and not recovery.alive(rec.owner_pid, rec.owner_start)
            if now >= deadline or gone:
                why = "the process carrying it is gone" if gone else "it is still ending"
                raise StillEnding(
                    f"run {run_id} is still {rec.state.value} {now - started:.0f} s after the"
                    f" {rec.stop_kind or 'stop'} request; {why}",
                    hint=f"follow it with `airlockd show {run_id}` (the next run reconciles one whose process died)",
                    run_id=run_id,
                    state=rec.state.value,
                )
            if rec.state is RunState.RUNNING and (not reached or now >= again):
                reached = deliver() or reached
                again = time.monotonic() + grace + STOP_REDELIVER_S
            time.sleep(STOP_POLL_S)
