"""Recovery: commits interrupted by a crash, runs whose process died (re-attached or recorded as
failed), and what no live run owns (containers, run folders, staging copies)."""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from airlockd.agents import homes
from airlockd.errors import AirlockError, EngineError, NotFoundError, UsageError
from airlockd.fsutil import remove_tree
from airlockd.interpreter import module_command
from airlockd.pipeline.commit import recover
from airlockd.records import LIVE_STATES, RunRecord, RunState
from airlockd.runs import execution
from airlockd.staging import capfs, stagers
from airlockd.staging.bounds import ChangeBounds, ChangeSetTooLarge

if TYPE_CHECKING:
    from airlockd.runs.service import Service

log = logging.getLogger(__name__)


def recover_journals(svc: Service) -> None:
    for r in recover(svc.workspace, svc.state.journal, svc.state.backups):
        svc.audit.append(
            "commit.recovered",
            policy=svc.loaded.revision,
            outcome=r.outcome,
            txid=r.txid,
            paths=r.paths,
            verified=r.verified,
        )


def reconcile(svc: Service) -> None:
    """A live run whose executing process is gone is reaped and recorded as failed; never
    silently forgotten. Its staging copy is kept for inspection."""
    for rec in svc.store.open_runs(LIVE_STATES):
        if rec.owner_pid is None and rec.state is RunState.ADMITTED and time.time() - rec.created_at > UNCLAIMED_S:
            fail_unclaimed(svc, rec)  # admitted, and no process ever took it: it holds an agent's slot
            continue
        if rec.owner_pid is None or alive(rec.owner_pid, rec.owner_start):
            continue
        reaped = "no container was started"
        if rec.state is RunState.RUNNING and reattach(svc, rec):
            continue
        if rec.state is RunState.RUNNING:
            try:
                n = svc.sandbox.reap(rec.id)
                reaped = f"{n} container(s) killed and removed" if n else "its container was already gone"
            except EngineError as exc:
                reaped = f"its container could not be reaped: {exc.message}"
        why = f"the airlockd process running it (pid {rec.owner_pid}) ended while it was {rec.state.value}; {reaped}"
        svc.audit.append(
            "recovery.reconciled",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            was=rec.state.value,
            pid=rec.owner_pid,
            reaped=reaped,
        )
        for name in ("prompt.raw", "prompt"):  # the unredacted prompt of a run that will never run
            (svc.state.run_dir(rec.id) / name).unlink(missing_ok=True)
        keep_for_inspection(svc, svc.lifecycle.transition(rec, RunState.FAILED, why, error=why))


UNCLAIMED_S = 300.0  # an admitted run no process claimed within this long never will be


def fail_unclaimed(svc: Service, rec: RunRecord) -> None:
    why = f"admitted {time.time() - rec.created_at:.0f} s ago and never claimed by a process (it died before)"
    svc.audit.append(
        "recovery.reconciled", run=rec.id, agent=rec.agent, policy=rec.policy_revision, was=rec.state.value, why=why
    )
    for name in ("prompt.raw", "prompt"):  # the unredacted prompt of a run that will never run
        (svc.state.run_dir(rec.id) / name).unlink(missing_ok=True)
    try:
        svc.lifecycle.transition(rec, RunState.FAILED, why, error=why)
    except AirlockError as exc:  # claimed meanwhile after all
        log.info("run %s not failed: %s", rec.id, exc.message)


def sweep(svc: Service, folders: bool = True) -> dict[str, int]:
    """Reap what no live run owns: airlockd's containers of runs that are over (or unknown),
    and (`folders`) staging copies of decided runs and run folders without a run. The
    containers before a new run starts; everything when the daemon starts and at each `gc`
    (the folders cost a look at each run's folder, which a run should not pay). A stopped or
    failed run keeps its staging for inspection."""
    live = {r.id for r in svc.store.lines(states=LIVE_STATES)}
    containers = 0
    try:
        for run_id in svc.sandbox.labelled_runs(str(svc.workspace)):
            if run_id not in live:
                containers += svc.sandbox.reap(run_id)
    except EngineError as exc:
        log.warning("could not look for orphaned containers: %s", exc.message)
    decided = {RunState.APPLIED, RunState.REJECTED, RunState.EXPIRED, RunState.UNDONE}
    swept_folders = staging = 0
    for run_dir in sorted(svc.state.runs.iterdir()) if folders and svc.state.runs.is_dir() else []:
        staged = (run_dir / "staging").exists()
        if not staged and svc.state.record(run_dir.name).exists():
            continue  # a run's folder, nothing to release: no record is read (two stats a folder)
        rec = _admitted_since(svc, run_dir.name)
        if rec is None or rec.compacted_at is not None:
            if capfs.is_mount(run_dir / "staging"):
                capfs.unmount(run_dir / "staging")
            homes.drop(run_dir)  # a copy of the agent's home a crash left mounted
            remove_tree(run_dir)
            swept_folders += 1
        elif rec.state in decided and staged:
            try:
                cleanup_staging(svc, rec)
            except AirlockError as exc:  # a decision releasing the same copy meanwhile; the next sweep looks again
                log.warning("staging of run %s not released by the sweep: %s", rec.id, exc.message)
                continue
            staging += 1
    swept = {"containers": containers, "run_folders": swept_folders, "staging_copies": staging}
    if any(swept.values()):
        svc.audit.append("recovery.swept", policy=svc.loaded.revision, swept=swept)
    return swept


def _admitted_since(svc: Service, run_id: str) -> RunRecord | None:
    """A run admitted after the sweep listed the runs (a daemon sweeps while it admits): its
    record is stored before its folder is made, so a folder whose record exists now is not stray."""
    try:
        rec = svc.store.get_run(run_id)
    except (NotFoundError, UsageError):  # no such run; or a prefix of several: not a run's folder
        return None
    return rec if rec.id == run_id else None


def reattach(svc: Service, rec: RunRecord) -> bool:
    """Hand the container of a dead process to a new background process that keeps enforcing
    its limits, or reads how it ended, and proposes the result (`runs/carrier.py --resume`).
    False when the run has no container."""
    try:
        # the agent's container: a holder of its upper layer alone is no agent to re-attach to
        exists = rec.id in svc.sandbox.labelled_runs(str(svc.workspace), holders=False)
    except EngineError:
        return False
    if not exists:
        return False

    log_file = svc.state.run_dir(rec.id) / "daemon.log"
    with log_file.open("ab") as err:
        child = subprocess.Popen(
            module_command("airlockd.runs.carrier", "--workspace", str(svc.workspace), "--resume", rec.id),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )

    def claim(r: RunRecord) -> None:  # the new process's from now on, before it claims it itself
        r.owner_pid, r.owner_start = child.pid, process_start(child.pid)

    # Claimed for the child, not for this process: a short-lived command that claimed it for
    # itself would be gone before the child started, and the next command would re-attach a
    # second process to the same run (two carriers, one dumping what the other released).
    svc.store.update_run(rec.id, claim)
    return True


def keep_for_inspection(svc: Service, rec: RunRecord) -> None:
    """A run that ended badly keeps its staging copy, moved off its capped tmpfs to disk so
    it costs no memory (`cp -a`: it may hold fifos, which a Python copy would block on) — when
    what the agent added is within the policy's change-set bounds. A larger one (a flood of
    files, a disk filler) would cost the host what the agent chose to write: it is dropped, and
    `staging.dropped` in the run's folder and the audit trail say how large it was."""
    staging = svc.state.run_dir(rec.id) / "staging"
    homes.drop(staging.parent)  # the agent's home was brought back when its container ended
    stagers.for_run(staging.parent).release(staging.parent, lambda run_id: execution.run_live(svc, run_id))
    if stagers.held_run(staging.parent):
        _keep_held(svc, rec)
        return
    if not capfs.is_mount(staging):
        return
    limits = svc.policy.agent(rec.agent).limits
    added_entries = capfs.used_entries(staging) - rec.staged_entries
    added_bytes = capfs.used_bytes(staging) - rec.staged_bytes
    if added_entries > limits.changed_files or added_bytes > limits.changed_mb * 2**20:
        why = (
            f"the agent added {added_entries} entries and {added_bytes} bytes to its copy, over the"
            f" policy's changed_files ({limits.changed_files}) or changed_mb ({limits.changed_mb}):"
            " not copied to disk for inspection"
        )
        svc.audit.append(
            "stage.dropped", run=rec.id, agent=rec.agent, policy=rec.policy_revision,
            entries=added_entries, bytes=added_bytes, why=why,
        )  # fmt: skip
        cleanup_staging(svc, rec)
        (staging.parent / "staging.dropped").write_text(why + "\n")
        return
    kept = staging.with_name("staging.kept")
    kept.mkdir(exist_ok=True)
    subprocess.run(["cp", "-a", f"{staging}/.", str(kept)], check=False, capture_output=True)
    capfs.unmount(staging)
    staging.rmdir()
    kept.rename(staging)


def _keep_held(svc: Service, rec: RunRecord) -> None:
    """`keep_for_inspection` of an upper layer the engine held: read back into the run's folder
    within the policy's change-set bounds (a larger one is dropped, and said so), then let go."""
    run_dir = svc.state.run_dir(rec.id)
    held = execution.held_upper(svc, rec.agent)
    if held is None:
        return
    try:
        stager = stagers.for_run(run_dir)
        stagers.read_back(
            run_dir, held.dump(rec.id), stager.base(run_dir), ChangeBounds.of(svc.policy.agent(rec.agent).limits)
        )
    except ChangeSetTooLarge as over:
        why = f"{over}: not read back from the engine for inspection"
        svc.audit.append(
            "stage.dropped", run=rec.id, agent=rec.agent, policy=rec.policy_revision,
            entries=over.measured if over.limit == "changed_files" else 0,
            bytes=over.measured if over.limit == "changed_mb" else 0, why=why,
        )  # fmt: skip
        remove_tree(run_dir / "staging" / "upper")
        (run_dir / "staging.dropped").write_text(why + "\n")
    except AirlockError as exc:
        log.warning("the upper layer of run %s could not be kept for inspection: %s", rec.id, exc.message)
    finally:
        held.release(rec.id)


def cleanup_staging(svc: Service, rec: RunRecord) -> None:
    """Drop a finished run's staging copy (and its capped filesystem, and its copy of the agent's
    home if a crash left one)."""
    staging = svc.state.run_dir(rec.id) / "staging"
    homes.drop(staging.parent)
    stagers.for_run(staging.parent).release(staging.parent, lambda run_id: execution.run_live(svc, run_id))
    if stagers.held_run(staging.parent) and (held := execution.held_upper(svc, rec.agent)) is not None:
        held.release(rec.id)
    if capfs.is_mount(staging):
        capfs.unmount(staging)
    remove_tree(staging)


def process_start(pid: int) -> int | None:
    """The start time of a process in clock ticks since boot (None if there is no such process):
    with the pid, it names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])  # a zombie has ended


def alive(pid: int, start: int | None) -> bool:
    now = process_start(pid)
    return now is not None and (start is None or now == start)
