"""The run lifecycle: every state change of a run and what follows from it, in one place.

`RunLifecycle.transition` is the only code that changes a run's `state`: it checks the move
against the state machine (records.TRANSITIONS), persists it, lets the agent's conversation
follow it, audits it, then announces it. Expiry, marking and clearing conflicts, and settling a
proposal once nothing is pending live here too, whichever door (CLI, editor, the daemon's watch
and clock) asked. It is handed narrow collaborators, never the whole Service.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

from airlockd.agents import sessions as agent_sessions
from airlockd.errors import AirlockError, StateError
from airlockd.evidence.audit import AuditLog
from airlockd.names import under
from airlockd.pipeline.manifest import Entry, Kind
from airlockd.records import ConflictCause, FileReview, FileState, RunRecord, RunState, Transition, allowed
from airlockd.redact import Redactor
from airlockd.runs.content import keep_base_blob
from airlockd.state import StateDir
from airlockd.store import Store

log = logging.getLogger(__name__)

# conflicts whose cause can go away; any of them stays while the file is not back to its base
CLEARABLE = frozenset(ConflictCause)
DECIDED = frozenset({RunState.APPLIED, RunState.REJECTED, RunState.EXPIRED, RunState.UNDONE})


def at_base(workspace: Path, f: FileReview) -> bool:
    """Whether the live node is what the change was made against (what landed hunks left, else
    its base; absent for a created file). Never follows a link."""
    from airlockd.pipeline.manifest import entry_for

    expected = Entry.from_json_or_none(f.base)
    try:
        live = entry_for(workspace / f.path)
    except FileNotFoundError:
        return expected is None
    except OSError:
        return False
    return expected is not None and live.same_content(expected)


class RunLifecycle:
    """Owns every run state transition and its side effects (persist, agent session, audit,
    announce), expiry, conflict marking and clearing, and settling a decided proposal."""

    def __init__(
        self,
        *,
        workspace: Path,
        state: StateDir,
        store: Store,
        audit: AuditLog,
        redactor: Redactor,
        announce: Callable[[RunRecord], None],
        release_staging: Callable[[RunRecord], None],
        proposal_ttl_s: Callable[[], float],
    ) -> None:
        self.workspace = workspace
        self.state = state  # (and `audit`) also what agents.sessions.settle reads
        self.store = store
        self.audit = audit
        self.redactor = redactor
        self._announce = announce
        self._release_staging = release_staging
        self._ttl = proposal_ttl_s

    # -- transitions ----------------------------------------------------------------------------

    def transition(
        self, rec: RunRecord, dst: RunState, detail: str = "", *, expect: RunState | None = None, **fields: object
    ) -> RunRecord:
        """Persist a state change (checked against the run state machine; with `expect`, only
        from that state), let the agent's conversation follow it, audit it, then announce it.
        Raises StateError when not allowed."""
        detail = self.redactor.text(detail)

        def change(r: RunRecord) -> None:
            if expect is not None and r.state is not expect:
                raise StateError(f"run {r.id} is {r.state.value}, not {expect.value}")
            if r.state != dst and not allowed(r.state, dst):
                raise StateError(f"run {r.id} is {r.state.value}; it cannot become {dst.value}")
            r.state = dst
            r.transitions.append(Transition(state=dst, at=time.time(), detail=detail))
            for k, v in fields.items():
                setattr(r, k, v)

        rec = self.store.update_run(rec.id, change)
        agent_sessions.settle(self, rec, dst)  # the agent's conversation follows the run's fate
        self.audit.append(f"run.{dst.value}", run=rec.id, agent=rec.agent, policy=rec.policy_revision, detail=detail)
        self._announce(rec)
        return rec

    # -- expiry (the decision path and the daemon's clock both come here) --------------------------

    def expire_if_due(self, rec: RunRecord, now: float | None = None) -> RunRecord | None:
        """A proposal older than the policy's TTL becomes expired (nothing is written); the
        expired run, or None when it is not due (or was decided meanwhile)."""
        now = time.time() if now is None else now
        ttl = self._ttl()
        if rec.state is not RunState.PROPOSED or rec.proposed_at is None or now - rec.proposed_at <= ttl:
            return None
        try:
            rec = self.transition(rec, RunState.EXPIRED, f"not decided within {ttl:.0f} s")
        except AirlockError as exc:  # decided meanwhile
            log.info("run %s not expired: %s", rec.id, exc.message)
            return None
        self._release_staging(rec)
        return rec

    def expire_due(self, now: float | None = None) -> list[RunRecord]:
        """Every proposal past its TTL, expired; the daemon's clock calls this."""
        proposed = self.store.open_runs(frozenset({RunState.PROPOSED}))
        return [e for rec in proposed if (e := self.expire_if_due(rec, now)) is not None]

    def open_for_decision(self, run_id: str) -> RunRecord:
        """The run, when it is proposed and not past its TTL (then it expires here); else StateError."""
        rec = self.store.get_run(run_id)
        if self.expire_if_due(rec) is not None:
            raise StateError(f"run {rec.id} expired: its proposal was not decided within {self._ttl():.0f} s")
        if rec.state is not RunState.PROPOSED:
            raise StateError(f"run {rec.id} is {rec.state.value}; only a proposed run can be decided")
        return rec

    # -- conflicts ------------------------------------------------------------------------------

    def mark_conflicted(self, run_id: str, paths: Collection[str], cause: ConflictCause, why: str) -> RunRecord:
        """Mark pending changes conflicted, with their cause. Writes nothing in the workspace."""
        hit: list[str] = []

        def mark(r: RunRecord) -> None:
            for f in r.files:
                if f.path in paths and f.state is FileState.PENDING:
                    f.state, f.conflict = FileState.CONFLICTED, cause
                    hit.append(f.path)

        rec = self.store.update_run(run_id, mark)
        if hit:
            self.audit.append(
                "review.conflicted",
                run=rec.id,
                agent=rec.agent,
                policy=rec.policy_revision,
                paths=hit,
                cause=cause.value,
                why=why,
            )
        return rec

    def clear_conflicts(
        self, run_id: str, paths: Collection[str] | None = None, dirty: Collection[str] = ()
    ) -> list[str]:
        """Conflicts whose cause is gone become pending again: the live file is back to the
        change's base and the editor holds no unsaved changes of it (`dirty`). `paths`: files or
        folders to look at (None: all). Returns the cleared paths; audited."""
        rec = self.store.get_run(run_id)
        if rec.state is not RunState.PROPOSED:
            return []
        dirty = set(dirty)
        ready = []
        for n, f in enumerate(rec.files):
            if f.state is not FileState.CONFLICTED or (f.conflict or ConflictCause.LIVE_EDIT) not in CLEARABLE:
                continue
            if paths is not None and not any(under(f.path, p.strip("/")) for p in paths):
                continue
            if f.path in dirty or not at_base(self.workspace, f):
                continue
            if not keep_base_blob(self.workspace, self.state.run_dir(rec.id), n, f):
                continue
            ready.append((f.path, f.conflict, f.base_blob))
        if not ready:
            return []
        cleared: list[str] = []

        def clear(r: RunRecord) -> None:
            for path, cause, blob in ready:
                g = r.file(path)
                if g is not None and g.state is FileState.CONFLICTED and g.conflict == cause:
                    g.state, g.conflict, g.base_blob = FileState.PENDING, None, blob
                    cleared.append(path)

        rec = self.store.update_run(rec.id, clear)
        if cleared:
            self.audit.append(
                "review.conflict_cleared",
                run=rec.id,
                agent=rec.agent,
                policy=rec.policy_revision,
                paths=cleared,
                causes=sorted({str(c) for p, c, _ in ready if p in cleared}),
            )
        return cleared

    def on_disk_change(
        self, changed: Iterable[str], trees: Iterable[str] = (), dirty: Collection[str] = ()
    ) -> list[tuple[RunRecord, list[str], list[str]]]:
        """Files that may have changed on disk (`changed`; `trees`: folders anything under which
        may have, "" is the workspace): pending changes whose file moved off its base become
        conflicted; conflicted ones whose file is back (and not dirty in the editor) are pending
        again. Returns (run, newly conflicted, cleared) for each run touched. Blocking."""
        changed = set(changed)
        tops = list(trees)
        out = []
        for rec in self.store.open_runs(frozenset({RunState.PROPOSED})):
            touched = {f.path for f in rec.files if f.path in changed or any(under(f.path, t) or not t for t in tops)}
            if not touched:
                continue
            moved = [
                f.path
                for f in rec.files
                if f.state is FileState.PENDING
                and f.kind == Kind.FILE.value
                and f.path in touched
                and not at_base(self.workspace, f)
            ]
            if moved:
                rec = self.mark_conflicted(rec.id, moved, ConflictCause.LIVE_EDIT, "the live file changed")
            back = [p for p in touched if p not in moved]
            cleared = self.clear_conflicts(rec.id, back, dirty) if back else []
            if moved or cleared:
                out.append((self.store.get_run(rec.id), moved, cleared))
        return out

    # -- settling -------------------------------------------------------------------------------

    def settle(self, run_id: str) -> RunRecord:
        """Close the run when no change is pending or conflicted: applied if anything landed,
        else rejected (a proposal without changes counts as applied)."""
        rec = self.store.get_run(run_id)
        if rec.state is not RunState.PROPOSED:
            return rec

        # a deleted directory whose contents were partly kept can no longer be deleted
        def drop_dirs(r: RunRecord) -> None:
            for f in r.pending:
                if f.kind == Kind.DIR.value:
                    inside = [g for g in r.files if g.path != f.path and under(g.path, f.path)]
                    if inside and all(g.state is not FileState.PENDING for g in inside):
                        f.state = (
                            FileState.ACCEPTED
                            if all(g.state is FileState.ACCEPTED for g in inside) and f.change == "created"
                            else FileState.REJECTED
                        )

        if any(f.kind == Kind.DIR.value for f in rec.pending):  # (else a write that changes nothing)
            rec = self.store.update_run(rec.id, drop_dirs)
        if rec.pending or any(f.state is FileState.CONFLICTED for f in rec.files):
            return rec
        landed = any(f.state is FileState.ACCEPTED for f in rec.files) or not rec.files
        counts = {s: sum(1 for f in rec.files if f.state is s) for s in FileState}
        detail = ", ".join(f"{n} {s.value}" for s, n in counts.items() if n) or "no changes"
        rec = self.transition(rec, RunState.APPLIED if landed else RunState.REJECTED, detail)
        self._release_staging(rec)
        return rec
