"""Review of a proposal: approve / reject / undo files and hunks, and conflict detection.

Every approval is its own transaction through `pipeline.commit`; a run stays `proposed` while any
change is pending and settles (RunLifecycle.settle) to `applied` or `rejected` when none is. The
per-hunk rule lives here, for every door: a file whose hunks are decided one by one is decided by
its pending hunks only.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from airlockd.errors import CommitError, ConflictError, StateError, UsageError
from airlockd.evidence.audit import AuditLog
from airlockd.names import display, under
from airlockd.pipeline.classify import Secret, classify
from airlockd.pipeline.commit import FileOp, commit, undo_ops
from airlockd.pipeline.hunks import apply_hunks, hunks
from airlockd.pipeline.manifest import Change, ChangeKind, ChangeSet, Entry, Kind
from airlockd.policy import Decision, Policy
from airlockd.records import Applied, ConflictCause, FileReview, FileState, RunRecord, RunState
from airlockd.runs.content import ProposalContent, scan_bytes
from airlockd.runs.lifecycle import RunLifecycle
from airlockd.staging.secretscan import policy_scanner
from airlockd.staging.stagers import proposed_path
from airlockd.state import StateDir
from airlockd.store import Store


@dataclass
class ApproveResult:
    run: RunRecord
    applied: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


class Review:
    """The decisions on a proposal. Its collaborators are what it uses, not the whole Service:
    the lifecycle (opening a proposal for a decision, conflicts, settling), the store, audit and
    state dir, the policy in force, and `seal` (the live tree's digest before the first write)."""

    def __init__(
        self,
        *,
        workspace: Path,
        state: StateDir,
        store: Store,
        audit: AuditLog,
        lifecycle: RunLifecycle,
        policy: Callable[[], Policy],
        actor: Callable[[], str],
        seal: Callable[[RunRecord], None],
        content: ProposalContent,
    ) -> None:
        self.workspace, self.state, self.store, self.audit = workspace, state, store, audit
        self.lifecycle = lifecycle
        self._policy = policy
        self._actor = actor  # asked at each decision: the daemon acts for whichever door asked
        self._seal = seal
        self.content = content

    @property
    def actor(self) -> str:
        return self._actor()

    # -- selection ----------------------------------------------------------------------------

    def _select(self, rec: RunRecord, paths: Collection[str] | None, *, conflicted: bool = False) -> list[FileReview]:
        """The pending changes under `paths` (all when none); with `conflicted`, the conflicted
        ones too (a rejection may take them), else naming a conflicted file is a ConflictError."""
        wanted = {FileState.PENDING, FileState.CONFLICTED} if conflicted else {FileState.PENDING}
        if not paths:
            return [f for f in rec.files if f.state in wanted]
        chosen: dict[str, FileReview] = {}
        for p in paths:
            p = p.strip("/")
            hits = [f for f in rec.files if under(f.path, p)]
            if not hits:
                raise UsageError(
                    f"run {rec.id} has no change at {display(p)}",
                    hint=f"`airlockd show {rec.id}` lists them",
                )
            for f in hits:
                if f.state is FileState.DENIED and f.path == p:
                    raise StateError(f"{display(f.path)} is denied by {f.rule} ({f.reason}); it cannot be approved")
                if f.state is FileState.CONFLICTED and f.path == p and not conflicted:
                    raise self._conflict(rec, [f.path], unsaved=())
                if f.state in wanted:
                    chosen[f.path] = f
        return list(chosen.values())

    def _pending_hunks(self, rec: RunRecord, f: FileReview) -> list[str] | None:
        """The pending hunks of a file some of whose hunks are decided already; None for a file
        decided as a whole (none of its hunks decided yet, or a change without hunks)."""
        if not f.hunks or f.state is not FileState.PENDING:
            return None
        states = self.content.hunk_states(rec, f)
        return None if states is None else [h.id for h, s in states if s == "pending"]

    def _split(
        self,
        rec: RunRecord,
        paths: Collection[str] | None,
        hunks: Mapping[str, Collection[str]] | None,
        *,
        rejecting: bool,
    ) -> tuple[dict[str, list[str]], list[FileReview]]:
        """The per-hunk rule, for every door: a file whose hunks are decided one by one is decided
        by its pending hunks only (a rejected hunk never lands, an accepted one is never taken
        back); other files go whole. Chosen hunks (`hunks`) come first; `paths` add to them, and
        neither means everything pending."""
        by_hunk: dict[str, list[str]] = {p.strip("/"): list(ids) for p, ids in (hunks or {}).items()}
        whole: list[FileReview] = []
        if paths or not hunks:
            for f in self._select(rec, paths, conflicted=rejecting):
                pending = self._pending_hunks(rec, f)
                if pending is None:
                    whole.append(f)
                elif pending:
                    by_hunk[f.path] = sorted(set(by_hunk.get(f.path, ())) | set(pending))
        return by_hunk, whole

    def _expand(self, rec: RunRecord, chosen: list[FileReview]) -> list[FileReview]:
        """Directories follow their contents: a created parent lands with its first file; a
        deleted directory goes only once everything under it is gone."""
        names = {f.path for f in chosen}
        out = list(chosen)
        for f in rec.files:
            if f.state is not FileState.PENDING or f.path in names or f.kind != Kind.DIR.value:
                continue
            if f.change == "created" and any(under(c, f.path) for c in names):
                out.append(f)
                names.add(f.path)
        kept = []
        for f in out:
            if f.kind == Kind.DIR.value and f.change == "deleted":
                inside = [g for g in rec.files if g.path != f.path and under(g.path, f.path)]
                if any(g.path not in names and g.state is not FileState.ACCEPTED for g in inside):
                    continue  # something below it stays: the directory stays too
            kept.append(f)
        return kept

    def _ops(self, rec: RunRecord, files: list[FileReview]) -> list[list[FileOp]]:
        """The transactions that land `files`: one, or two when a path changes type (the old
        node must be gone before the new one, or anything below it, can be created)."""
        run_dir = self.state.run_dir(rec.id)
        first: list[FileOp] = []
        ops: list[FileOp] = []
        retyped = [f.path for f in files if f.change == "type_changed"]
        for f in files:
            before, new = Entry.from_json_or_none(f.base), Entry.from_json_or_none(f.after)
            src = proposed_path(run_dir, f.path) if new and new.kind is Kind.FILE else None
            if f.change == "type_changed":
                first.append(FileOp(f.path, before, None))
                before = None
            elif new is None and any(under(f.path, t) and f.path != t for t in retyped):
                first.append(FileOp(f.path, before, None))  # what the old directory held goes with it
                continue
            ops.append(FileOp(f.path, before, new, src))
        return [t for t in (first, ops) if t]

    def _open(
        self,
        run_id: str,
        paths: Collection[str] | None,
        hunks: Mapping[str, Collection[str]] | None,
        dirty: Collection[str],
    ) -> RunRecord:
        """The proposal, open for a decision (expired here when past its TTL), with the conflicts
        of the files this decision touches re-checked: those whose cause is gone are pending again."""
        rec = self.lifecycle.open_for_decision(run_id)
        touched: list[str] | None = [*(paths or ()), *(hunks or {})] or None
        if self.lifecycle.clear_conflicts(rec.id, touched, dirty):
            rec = self.store.get_run(rec.id)
        self._seal(rec)  # before anything of this proposal is written
        return rec

    def _conflict(self, rec: RunRecord, paths: Collection[str], unsaved: Collection[str]) -> ConflictError:
        """Nothing was written because of `paths`; the hint says the way forward for each cause."""
        moved = [p for p in paths if p not in set(unsaved)]
        why = []
        if moved:
            why.append(f"{', '.join(display(p) for p in moved)} changed in the workspace since the run was staged")
        if len(moved) < len(paths):
            names = ", ".join(display(p) for p in paths if p in set(unsaved))
            why.append(f"{names} has unsaved changes in the editor")
        if moved:
            hint = (
                f"put the file back as it was, or continue on the current files with a follow-up run"
                f" (`airlockd run --agent {rec.agent} --follow-up {rec.id} PROMPT`),"
                f" or reject the change (`airlockd reject {rec.id} --path {moved[0]}`)"
            )
        else:
            hint = "save or revert the editor's buffer so it matches the file on disk, then decide again"
        return ConflictError("nothing was written: " + "; ".join(why), paths=list(paths), hint=hint)

    # -- decisions ----------------------------------------------------------------------------

    def approve(
        self,
        run_id: str,
        paths: Collection[str] | None = None,
        *,
        hunks: Mapping[str, Collection[str]] | None = None,
        actor: str | None = None,
        dirty: Collection[str] = (),
        allow_conflict: bool = False,
    ) -> ApproveResult:
        """Land the chosen pending changes: `hunks` (path -> hunk ids) and `paths` (files or
        folders), or everything pending when neither. A file some of whose hunks are decided lands
        only its pending hunks, whichever door asks. Each kind lands in one transaction.

        A file whose live content moved since staging, or that has unsaved editor changes
        (`dirty`), is marked conflicted and NOTHING is written (ConflictError), unless
        `allow_conflict`, where the rest lands and the conflicted files are reported."""
        rec = self._open(run_id, paths, hunks, dirty)
        by_hunk, whole = self._split(rec, paths, hunks, rejecting=False)
        chosen = self._expand(rec, whole)
        if not chosen and not by_hunk:
            raise StateError(f"run {rec.id}: nothing pending to approve in that selection")
        actor = actor or self.actor
        result = ApproveResult(rec)
        if by_hunk:
            got = self._approve_hunks(rec, by_hunk, actor=actor, dirty=dirty)
            result.applied += got.applied
            rec = got.run
        if chosen:
            got = self._approve_files(rec, chosen, paths, actor=actor, dirty=dirty, allow_conflict=allow_conflict)
            result.applied += got.applied
            result.conflicts += got.conflicts
        result.applied = sorted(set(result.applied))
        result.run = self.lifecycle.settle(rec.id)
        return result

    def _approve_files(
        self,
        rec: RunRecord,
        chosen: list[FileReview],
        paths: Collection[str] | None,
        *,
        actor: str,
        dirty: Collection[str],
        allow_conflict: bool,
    ) -> ApproveResult:
        dirty_hits = [f.path for f in chosen if f.path in set(dirty)]
        conflicts = list(dirty_hits)
        done: list[Applied] = []
        todo = [f for f in chosen if f.path not in dirty_hits]
        used = 0
        while todo and (allow_conflict or not conflicts):
            attempt: list[Applied] = []  # the transactions of this try (two when a path changes type)
            try:
                for ops in self._ops(rec, todo):
                    used += 1  # never reused: a reversed transaction keeps its journal and backups
                    txid = self._txid(rec, len(rec.applied) + used)
                    result = commit(self.workspace, self.state.journal, self.state.backups, txid, ops)
                    attempt.append(Applied(txid=txid, paths=result.applied, at=time.time()))
            except ConflictError as exc:
                # A later transaction found a conflict: what this try landed before it goes back,
                # so "nothing was written" is true (a directory is never left removed for a file
                # that did not come); what could not be reversed stays recorded, for undo.
                done.extend(self._reverse(attempt))
                conflicts.extend(exc.paths)
                todo = [f for f in todo if f.path not in set(exc.paths)]
                continue
            except CommitError as exc:
                # That transaction was rolled back; the ones this decision landed before it are
                # reversed too, so the decision is all or nothing and the run decidable again.
                done.extend(attempt)
                kept = self._reverse(done)
                rec = self.store.update_run(
                    rec.id, functools.partial(self._mark, done=kept, conflicts=conflicts, unsaved=dirty_hits)
                )
                self.audit.append(
                    "review.commit_failed",
                    run=rec.id,
                    agent=rec.agent,
                    policy=rec.policy_revision,
                    by=actor,
                    reason=exc.message,
                    reversed=[a.txid for a in done if a not in kept],
                    kept=[a.txid for a in kept],
                )
                raise
            done.extend(attempt)
            break
        applied = sorted({p for a in done for p in a.paths})
        rec = self.store.update_run(rec.id, lambda r: self._mark(r, done, conflicts, dirty_hits))
        self.audit.append(
            "review.approve",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            by=actor,
            selection=sorted(paths) if paths else "all pending",
            applied=applied,
            conflicts=conflicts,
        )
        if conflicts and not allow_conflict:
            raise self._conflict(rec, conflicts, dirty_hits)
        return ApproveResult(rec, applied, conflicts)

    def _txid(self, rec: RunRecord, n: int) -> str:
        """The run's n-th transaction id, past any a reversed decision left on record."""
        while (self.state.backups / f"{rec.id}-{n}").exists() or (self.state.journal / f"{rec.id}-{n}.json").exists():
            n += 1
        return f"{rec.id}-{n}"

    def _reverse(self, done: list[Applied]) -> list[Applied]:
        """Undo `done`, newest first; the transactions that could not be undone (kept, recorded)."""
        kept: list[Applied] = []
        for a in reversed(done):
            try:
                commit(
                    self.workspace,
                    self.state.journal,
                    self.state.backups,
                    f"{a.txid}-undo",
                    undo_ops(self.workspace, self.state.backups, a.txid),
                )
            except (CommitError, ConflictError):
                kept.append(a)
        return kept[::-1]

    @staticmethod
    def _mark(r: RunRecord, done: list[Applied], conflicts: list[str], unsaved: list[str]) -> None:
        applied = {p for a in done for p in a.paths}
        for f in r.files:
            if f.path in applied:
                f.state = FileState.ACCEPTED
            elif f.path in conflicts and f.state is FileState.PENDING:
                f.state = FileState.CONFLICTED
                f.conflict = ConflictCause.UNSAVED if f.path in unsaved else ConflictCause.LIVE_EDIT
        r.applied.extend(done)

    def reject(
        self,
        run_id: str,
        paths: Collection[str] | None = None,
        *,
        hunks: Mapping[str, Collection[str]] | None = None,
        actor: str | None = None,
        dirty: Collection[str] = (),
    ) -> RunRecord:
        """Discard the chosen pending (or conflicted) changes: `hunks`, `paths`, or everything
        pending when neither. A file some of whose hunks are decided loses only its pending
        hunks (what landed stays accepted). The workspace is not touched."""
        rec = self._open(run_id, paths, hunks, dirty)
        by_hunk, whole = self._split(rec, paths, hunks, rejecting=True)
        actor = actor or self.actor
        if by_hunk:
            self._reject_hunks(rec, by_hunk, actor=actor)
        names = {f.path for f in whole}
        if names:

            def mark(r: RunRecord) -> None:
                for f in r.files:
                    if f.path in names:
                        f.state, f.conflict = FileState.REJECTED, None

            rec = self.store.update_run(rec.id, mark)
            self.audit.append(
                "review.reject", run=rec.id, agent=rec.agent, policy=rec.policy_revision, by=actor, paths=sorted(names)
            )
        return self.lifecycle.settle(rec.id)

    # -- per hunk -----------------------------------------------------------------------------

    def _hunk_plan(
        self, rec: RunRecord, selections: Mapping[str, Collection[str]], verdict: str
    ) -> list[tuple[FileReview, tuple[str, str], dict[str, str]]]:
        plan = []
        for path, ids in selections.items():
            f = rec.file(path.strip("/"))
            if f is None:
                raise UsageError(f"run {rec.id} has no change at {display(path)}", field="hunks")
            if f.state is FileState.DENIED:
                raise StateError(f"{display(f.path)} is denied by {f.rule} ({f.reason}); it cannot be decided")
            if f.state is FileState.CONFLICTED:
                raise self._conflict(rec, [f.path], [f.path] if f.conflict is ConflictCause.UNSAVED else ())
            if f.state is not FileState.PENDING:
                raise StateError(f"{display(f.path)} is {f.state.value}; only pending hunks can be decided")
            texts = self.content.hunk_texts(rec, f)
            if texts is None:
                raise UsageError(f"{display(f.path)} has no hunks ({f.change}); decide it by path", field="hunks")
            states = {h.id: f.hunks.get(h.id, "pending") for h in hunks(*texts)}
            for hid in ids:
                if hid not in states:
                    raise UsageError(f"{display(f.path)} has no hunk {hid!r}", field="hunks", path=f.path, hunk=hid)
                if states[hid] != "pending":
                    raise StateError(f"hunk {hid} of {display(f.path)} is already {states[hid]}")
            plan.append((f, texts, states | {hid: verdict for hid in ids}))
        if not plan:
            raise UsageError("no hunks chosen", field="hunks")
        return plan

    @staticmethod
    def _settle_hunks(f: FileReview, states: dict[str, str]) -> None:
        f.hunks = {k: v for k, v in states.items() if v != "pending"}
        if all(v != "pending" for v in states.values()):
            f.state = FileState.ACCEPTED if "accepted" in states.values() else FileState.REJECTED

    def _approve_hunks(
        self, rec: RunRecord, selections: Mapping[str, Collection[str]], *, actor: str, dirty: Collection[str]
    ) -> ApproveResult:
        """Land only the chosen hunks of each file, in one transaction of the commit engine: the
        file becomes its base with every accepted hunk applied (the rest keeps the base). The
        result is classified again as a change of its own; a file with unsaved editor changes
        (`dirty`) or whose disk content moved is marked conflicted and NOTHING is written."""
        plan = self._hunk_plan(rec, selections, "accepted")
        unsaved = [f.path for f, _, _ in plan if f.path in set(dirty)]
        conflicts = list(unsaved)
        ops: list[FileOp] = []
        partial: dict[str, dict[str, object]] = {}
        if not conflicts:
            withheld = {w["path"] for w in rec.withheld}
            out_dir = self.state.run_dir(rec.id) / "partial"
            out_dir.mkdir(exist_ok=True)
            for f, (old, new), states in plan:
                content = apply_hunks(old, new, {k for k, v in states.items() if v == "accepted"}).encode()
                base = Entry.from_json_or_none(f.base)
                after = Entry.from_json_or_none(f.after)
                mode = after.mode if after else base.mode if base else 0o644
                entry = Entry(Kind.FILE, mode, len(content), hashlib.sha256(content).hexdigest())
                policy = self._policy()
                hit = scan_bytes(content, policy_scanner(policy.withhold), self.content.redactor)
                check = classify(
                    ChangeSet([Change(f.path, ChangeKind.MODIFIED, Entry.from_json_or_none(f.before), entry)]),
                    policy,
                    withheld,
                    secrets={f.path: Secret(hit)} if hit else None,
                )
                if check[0].decision is Decision.DENY:
                    raise StateError(
                        f"the chosen hunks of {display(f.path)} are denied by {check[0].rule} ({check[0].reason});"
                        " nothing was written"
                    )
                src = out_dir / f"{entry.sha256}"
                src.write_bytes(content)
                ops.append(FileOp(f.path, base, entry, src))
                partial[f.path] = entry.to_json()
        done: list[Applied] = []
        if ops:
            txid = self._txid(rec, len(rec.applied) + 1)
            try:
                result = commit(self.workspace, self.state.journal, self.state.backups, txid, ops)
                done.append(Applied(txid=txid, paths=result.applied, at=time.time()))
            except ConflictError as exc:
                conflicts = list(exc.paths)

        def mark(r: RunRecord) -> None:
            for f, _, states in plan:
                g = r.file(f.path)
                if g is None:
                    continue
                if conflicts:
                    if g.path in conflicts:
                        g.state = FileState.CONFLICTED
                        g.conflict = ConflictCause.UNSAVED if g.path in unsaved else ConflictCause.LIVE_EDIT
                    continue
                g.partial = partial.get(g.path, g.partial)
                # it landed on its base: a conflict marked meanwhile saw this very write
                g.state, g.conflict = FileState.PENDING, None
                self._settle_hunks(g, states)
            r.applied.extend(done)

        rec = self.store.update_run(rec.id, mark)
        applied = sorted({p for a in done for p in a.paths})
        self.audit.append(
            "review.approve_hunks",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            by=actor,
            hunks={p: sorted(ids) for p, ids in selections.items()},
            applied=applied,
            conflicts=conflicts,
        )
        if conflicts:
            raise self._conflict(rec, conflicts, unsaved)
        return ApproveResult(rec, applied, [])

    def _reject_hunks(self, rec: RunRecord, selections: Mapping[str, Collection[str]], *, actor: str) -> RunRecord:
        """Discard the chosen hunks; the workspace is not touched. A file whose hunks are all
        decided becomes accepted (some landed) or rejected (none did)."""
        plan = self._hunk_plan(rec, selections, "rejected")

        def mark(r: RunRecord) -> None:
            for f, _, states in plan:
                g = r.file(f.path)
                if g is not None:
                    self._settle_hunks(g, states)

        rec = self.store.update_run(rec.id, mark)
        self.audit.append(
            "review.reject_hunks",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            by=actor,
            hunks={p: sorted(ids) for p, ids in selections.items()},
        )
        return rec

    def undo(self, run_id: str, *, actor: str | None = None) -> RunRecord:
        """Reverse everything a run applied, when those files are unchanged since."""
        rec = self.store.get_run(run_id)
        todo = [a for a in rec.applied if not a.undone]
        if not todo:
            raise StateError(f"run {rec.id} has nothing applied to undo")
        window = self._policy().retention.undo_days
        if rec.compacted_at is not None:
            raise StateError(
                f"run {rec.id} can no longer be undone: retention compacted it and removed its backups",
                hint="[retention] in the policy sets how long runs stay whole; its changes are in `airlockd show`",
            )
        if time.time() - max(a.at for a in todo) > window * 86400:
            raise StateError(
                f"run {rec.id} can no longer be undone: it landed more than {window:g} days ago, past the undo window",
                hint="[retention] undo_days in the policy sets the window; its changes are in `airlockd show`",
            )
        for a in reversed(todo):
            ops = undo_ops(self.workspace, self.state.backups, a.txid)
            commit(self.workspace, self.state.journal, self.state.backups, f"{a.txid}-undo", ops)

            def mark(r: RunRecord, txid: str = a.txid) -> None:
                for x in r.applied:
                    if x.txid == txid:
                        x.undone = True

            rec = self.store.update_run(rec.id, mark)
            self.audit.append(
                "review.undo",
                run=rec.id,
                agent=rec.agent,
                policy=rec.policy_revision,
                by=actor or self.actor,
                txid=a.txid,
                paths=a.paths,
            )
        if rec.state is RunState.APPLIED:
            rec = self.lifecycle.transition(rec, RunState.UNDONE, f"{sum(len(a.paths) for a in todo)} paths restored")
        return rec
