"""Persisted records: runs with their state machine, per-file review state, agent usage."""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from airlockd.policy import Decision


class RunState(StrEnum):
    ADMITTED = "admitted"
    STAGING = "staging"
    RUNNING = "running"
    INSPECTING = "inspecting"
    PROPOSED = "proposed"
    APPLIED = "applied"
    REJECTED = "rejected"
    EXPIRED = "expired"
    UNDONE = "undone"
    REJECTED_AT_ADMISSION = "rejected_at_admission"
    STOPPED = "stopped"
    KILLED = "killed"
    FAILED = "failed"
    LIMIT_EXCEEDED = "limit_exceeded"

    @property
    def live(self) -> bool:
        return self in LIVE_STATES

    @property
    def final(self) -> bool:
        return self not in LIVE_STATES and self is not RunState.PROPOSED


LIVE_STATES = frozenset({RunState.ADMITTED, RunState.STAGING, RunState.RUNNING, RunState.INSPECTING})

# state -> states it may move to; one transition function (RunLifecycle.transition) enforces this.
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.ADMITTED: frozenset({RunState.STAGING}),
    RunState.STAGING: frozenset({RunState.RUNNING}),
    RunState.RUNNING: frozenset({RunState.INSPECTING}),
    RunState.INSPECTING: frozenset({RunState.PROPOSED, RunState.APPLIED, RunState.REJECTED}),
    RunState.PROPOSED: frozenset({RunState.PROPOSED, RunState.APPLIED, RunState.REJECTED, RunState.EXPIRED}),
    RunState.APPLIED: frozenset({RunState.UNDONE}),
}
_ENDINGS = frozenset({RunState.STOPPED, RunState.KILLED, RunState.FAILED, RunState.LIMIT_EXCEEDED})
for _live in LIVE_STATES:
    TRANSITIONS[_live] = TRANSITIONS[_live] | _ENDINGS


def allowed(src: RunState, dst: RunState) -> bool:
    return dst in TRANSITIONS.get(src, frozenset())


class FileState(StrEnum):
    PENDING = "pending"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    CONFLICTED = "conflicted"
    DENIED = "denied"


class HunkState(StrEnum):
    """Where review stands for one hunk (`FileReview.hunks` keeps the decided ones; a hunk of a
    decided file takes the file's state)."""

    PENDING = "pending"
    ACCEPTED = "accepted"
    REJECTED = "rejected"
    CONFLICTED = "conflicted"


class ConflictCause(StrEnum):
    """Why a change is conflicted; the first two clear when their cause does."""

    UNSAVED = "unsaved"  # the editor held unsaved changes of the file when it was decided
    LIVE_EDIT = "live_edit"  # the file on disk moved away from the change's base while proposed
    MOVED = "moved"  # the file moved between staging and inspection


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Transition(_Record):
    state: RunState
    at: float
    detail: str = ""


class FileReview(_Record):
    """One change of a proposal: what changed, the decision and rule, and where review stands."""

    path: str
    change: str
    decision: Decision
    rule: str
    reason: str
    state: FileState = FileState.PENDING
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    base_blob: str | None = None  # copy of the live content the change was made against
    # Per-hunk review (modified text files): hunk id -> "accepted" / "rejected" / "conflicted";
    # a hunk not listed is pending. `partial` is the entry of the content the landed hunks left
    # on disk: the base the next per-hunk commit is checked against.
    hunks: dict[str, str] = Field(default_factory=dict)
    partial: dict[str, Any] | None = None
    conflict: ConflictCause | None = None  # while the change is conflicted: why
    # What the reviewer must know before trusting how the change looks (names.marks, and what
    # hides in the proposed text): shown beside the path by the CLI and the editors.
    marks: list[str] = Field(default_factory=list)

    @property
    def base(self) -> dict[str, Any] | None:
        """What the live node must be for this change to land: what landed hunks left, else the base."""
        return self.partial or self.before

    @property
    def kind(self) -> str:
        return str((self.after or self.before or {}).get("kind", "file"))


class LimitHit(_Record):
    limit: str
    measured: float
    allowed: float
    source: str


class Applied(_Record):
    """One committed transaction of a run, kept so it can be undone."""

    txid: str
    paths: list[str]
    at: float
    undone: bool = False


class RunRecord(_Record):
    id: str
    agent: str
    mode: str
    state: RunState
    prompt: str  # redacted before it is stored
    prompt_sha256: str
    policy_revision: str
    created_at: float = Field(default_factory=time.time)
    follow_up: str | None = None
    proposed_at: float | None = None
    injection_markers: list[str] = Field(default_factory=list)
    prompt_redactions: list[str] = Field(default_factory=list)  # detectors whose finds were masked
    transitions: list[Transition] = Field(default_factory=list)
    withheld: list[dict[str, str]] = Field(default_factory=list)
    files: list[FileReview] = Field(default_factory=list)
    container: dict[str, Any] = Field(default_factory=dict)
    limit: LimitHit | None = None
    applied: list[Applied] = Field(default_factory=list)
    tokens: int = 0
    tokens_source: str | None = None
    output_bytes: int = 0
    staged_bytes: int = 0
    staged_entries: int = 0  # inodes of the capped staging before the agent ran (0: unknown or uncapped)
    growth_bytes: int = 0
    growth_capped: bool = False
    stager: str = "copy"  # "overlay" (mirror + per-run upper layer) or "copy" (full copy); see docs/staging.md
    peak: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    stopped_by: str | None = None
    owner_pid: int | None = None  # the process executing the run, while it is live
    owner_start: int | None = None  # its start time, so a reused pid is not mistaken for it
    stop_kind: str | None = None  # "stop" or "kill", when someone asked
    # digests of the live tree (withheld paths excluded) at staging ("before") and just before the
    # first approve / reject ("after"): the proof that nothing moved while the run was proposed
    live_tree: dict[str, Any] = Field(default_factory=dict)
    classifier: list[dict[str, Any]] = Field(default_factory=list)  # what the model classifier raised
    # the package broker's use (gateway/broker.py Tunnels.summary): allowed, tunnels, bytes, hosts,
    # refused, the first refusals; empty when the run had no broker and asked for none
    egress: dict[str, Any] = Field(default_factory=dict)
    compacted_at: float | None = None  # when retention reduced the run to its summary (runs/retention.py)

    def file(self, path: str) -> FileReview | None:
        return next((f for f in self.files if f.path == path), None)

    @property
    def pending(self) -> list[FileReview]:
        return [f for f in self.files if f.state is FileState.PENDING]


class AgentUsage(_Record):
    name: str
    runs_used: int = 0
    tokens_used: int = 0
    consecutive_violations: int = 0
    quarantined: bool = False
    reason: str | None = None
