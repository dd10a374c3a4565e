"""The wire: every payload that crosses a process, as pydantic models. The ONLY module both sides
of a boundary share (the run process and the daemon; the daemon and the editors).

- the run process's events (`RunEvent`, one JSON line each, told apart by `type`);
- what the LSP server sends (`airlock/runStatus`, `airlock/agentStatus`, `airlock/proposal`) and
  what its commands answer (`RunSummary`, `Evidence`, `ApproveResult`, ...);
- the commands' arguments (validated by `airlockd.lsp.args.parse`).

Field names are the editors' (camelCase on the wire). A field that may be absent defaults to None
and is left out of the JSON when it is None; a field that is always sent but may be null has no
default. `python -m airlockd.schema --schema` prints the JSON Schema the VS Code extension's
types are generated from (`make protocol`); never edit those generated files by hand.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from airlockd.pipeline.manifest import ChangeKind
from airlockd.policy import Admission, Decision, Limits, Mode
from airlockd.records import Applied, FileState, HunkState, RunState, Transition

__all__ = [
    "AgentArgs",
    "AgentInfo",
    "AgentStatus",
    "AgentStatusEvent",
    "ApproveResult",
    "ChangeKind",
    "DaemonHello",
    "DecideArgs",
    "Decision",
    "DeniedChange",
    "DiffArgs",
    "DiffResult",
    "Evidence",
    "EvidenceDocument",
    "FileChange",
    "FileState",
    "Hunk",
    "HunkState",
    "ListRunsArgs",
    "NoArgs",
    "ProgressEvent",
    "Proposal",
    "RunArgs",
    "RunDone",
    "RunEvent",
    "RunProgress",
    "RunResult",
    "RunState",
    "RunStatus",
    "RunStatusEvent",
    "RunSummary",
    "RunTaskArgs",
    "StatusEvent",
    "StopArgs",
    "WorkspaceEdit",
]


class Wire(BaseModel):
    """A payload: exact keys, optional fields absent (not null) when unset."""

    model_config = ConfigDict(extra="forbid")

    @model_serializer(mode="wrap")
    def _absent_when_none(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in _optional_fields(type(self)):
                if name in data and data[name] is None:
                    del data[name]
        return data

    def wire(self) -> dict[str, Any]:
        """The JSON-ready dict an editor receives."""
        out: dict[str, Any] = self.model_dump(mode="json")
        return out


@cache
def _optional_fields(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(n for n, f in model.model_fields.items() if not f.is_required() and f.default is None)


class Loose(Wire):
    """A document whose keys an editor reads are typed; any other key passes through."""

    model_config = ConfigDict(extra="allow")


# -- the run process -> the daemon ---------------------------------------------------------------


class RunStatus(Wire):
    """`airlock/runStatus`: state and resource use of one run (at state changes, and at most once a
    second while it runs). `conflicts`: paths that changed on disk under a pending proposal; `cleared`: paths
    whose conflict cleared (back to the change's base, no unsaved buffer): pending again."""

    runId: str
    agent: str
    state: RunState
    elapsedS: float
    cpuPct: float
    memBytes: int
    outputBytes: int
    tokens: int
    conflicts: list[str] | None = None
    cleared: list[str] | None = None


class AgentStatus(Wire):
    """`airlock/agentStatus`: an agent's usage and quarantine."""

    agent: str
    quarantined: bool
    reason: str | None
    runsUsed: int
    tokensUsed: int


class RunOutput(Wire):
    """`airlock/runOutput`: what a run's agent printed, live (its own account, never evidence):
    whole lines, redacted, hidden characters escaped (runs/liveoutput.py); `dropped`: bytes not
    shown since the last batch (past the rate the daemon forwards)."""

    runId: str
    text: str
    dropped: int = 0


class RunStatusEvent(Wire):
    type: Literal["runStatus"]
    payload: RunStatus


class RunOutputEvent(Wire):
    type: Literal["runOutput"]
    payload: RunOutput


class AgentStatusEvent(Wire):
    type: Literal["agentStatus"]
    payload: AgentStatus


class ProgressEvent(Wire):
    """A step of the run (work-done progress in the editor)."""

    type: Literal["progress"]
    stage: RunState
    message: str


StatusEvent = RunStatusEvent | AgentStatusEvent | RunOutputEvent  # what the daemon forwards to the editors
AnyRunEvent = RunStatusEvent | AgentStatusEvent | RunOutputEvent | ProgressEvent


class RunEvent(RootModel[Annotated[AnyRunEvent, Field(discriminator="type")]]):
    """One line the run process (`airlockd _execute --events`) writes on its stdout."""

    def line(self) -> str:
        """The event as one JSON line (newline included)."""
        return self.model_dump_json() + "\n"

    @classmethod
    def of_line(cls, raw: str | bytes) -> AnyRunEvent:
        """Parse one line; raises pydantic.ValidationError for anything that is not an event."""
        return cls.model_validate_json(raw).root

    @classmethod
    def of_service(cls, event: str, payload: dict[str, Any]) -> RunEvent:
        """A Service event (what `Service.subscribe` listeners get: event name, payload)."""
        return cls.model_validate({"type": event, "payload": payload})


# -- the control socket (lsp/control.py): what the CLI hears of the daemon ------------------------


class RunProgress(Wire):
    """`airlock/progress`: a step of a run the daemon carries (the CLI's `run --wait` prints it)."""

    runId: str
    stage: RunState
    message: str


class RunDone(Wire):
    """`airlock/runDone`: the process carrying a run has said its last word: `state` is the run's
    then (null when it could not be read). What that process lets go of on the engine (the holder
    of the run's upper layer) may still be going."""

    runId: str
    state: RunState | None


class DaemonHello(Wire):
    """`airlock/hello`: who serves the workspace: an editor's daemon (`stdio`, `tcp`) or one the
    CLI started (`background`)."""

    pid: int
    mode: Literal["stdio", "tcp", "background"]
    workspace: str
    version: str


# -- the proposal --------------------------------------------------------------------------------


class Position(Wire):
    line: int
    character: int


class Range(Wire):
    start: Position
    end: Position


class TextEdit(Loose):
    range: Range
    newText: str
    annotationId: str | None = None


class VersionedDocument(Loose):
    uri: str
    version: int | None


class DocumentChange(Loose):
    """A `CreateFile` / `DeleteFile` (`kind`, `uri`) or a `TextDocumentEdit` (`textDocument`, `edits`)."""

    kind: Literal["create", "rename", "delete"] | None = None
    uri: str | None = None
    annotationId: str | None = None
    textDocument: VersionedDocument | None = None
    edits: list[TextEdit] | None = None


class ChangeAnnotation(Loose):
    label: str
    needsConfirmation: bool | None = None
    description: str | None = None


class WorkspaceEdit(Loose):
    """The LSP `WorkspaceEdit` as lsprotocol writes it: `documentChanges` (with `changeAnnotations`
    whose ids are decisions) when the client supports them, `changes` otherwise."""

    changes: dict[str, list[TextEdit]] | None = None
    documentChanges: list[DocumentChange] | None = None
    changeAnnotations: dict[str, ChangeAnnotation] | None = None


class Hunk(Wire):
    """One hunk of a modified text file; `range` is where it is in the live file now."""

    id: str
    range: Range
    state: HunkState
    oldLines: int
    newLines: int
    oldText: str
    newText: str


class FileChange(Wire):
    """One change of a proposal that a person may decide."""

    path: str
    change: ChangeKind
    kind: str  # the node's type (`pipeline.manifest.Kind`): file, dir, symlink, ...
    decision: Decision
    rule: str
    rules: list[str]
    reason: str
    state: FileState
    binary: bool
    hunks: list[Hunk]
    marks: list[str] = []  # what the reviewer must know before trusting how it looks (escaped names)


class DeniedChange(Wire):
    """A change the policy denied: listed, never part of the edit."""

    path: str
    change: ChangeKind
    rule: str
    reason: str
    marks: list[str] = []


class Proposal(Wire):
    """`airlock.getProposal` / `airlock/proposal`: the whole proposal with its review state."""

    runId: str
    agent: str
    state: RunState
    edit: WorkspaceEdit
    files: list[FileChange]
    denied: list[DeniedChange]


# -- command results -----------------------------------------------------------------------------


class RunResult(Wire):
    """`airlock.runTask`, `stopRun`, `killRun`, `reject`, `undo`."""

    runId: str
    state: RunState


class ApproveResult(RunResult):
    applied: list[str]
    conflicts: list[str]


class DiffResult(Wire):
    runId: str
    path: str | None
    diff: str


class RunSummary(Wire):
    """One run of `airlock.listRuns`; `review` counts files per review state (non-zero only)."""

    runId: str
    agent: str
    mode: Mode
    state: RunState
    createdAt: float
    prompt: str
    files: int
    review: dict[FileState, int]
    detail: str


class AgentInfo(Wire):
    """One agent of `airlock.listAgents` (and the answer of `airlock.releaseAgent`)."""

    agent: str
    adapter: str
    mode: Mode
    quarantined: bool
    reason: str | None
    runsUsed: int
    tokensUsed: int
    consecutiveViolations: int
    limits: Limits  # the policy's own models: snake_case, as in policies.toml
    admission: Admission


# -- evidence ------------------------------------------------------------------------------------


class EvidencePolicy(Wire):
    revision: str
    file: str | None
    show: str
    current: bool


class EditorEvidencePolicy(EvidencePolicy):
    snapshot: str | None  # the policy revision's text, when it is kept


class AdmissionEvidence(Wire):
    prompt_sha256: str
    injection_markers: list[str]
    detail: str


class RuleFired(Wire):
    rule: str
    decision: Decision
    reason: str
    paths: list[str]


class FileDecision(Wire):
    path: str
    change: ChangeKind
    decision: Decision
    rule: str
    state: FileState


class FileRule(Wire):
    path: str
    change: ChangeKind
    decision: Decision
    rule: str
    reason: str


class WithheldPath(Wire):
    path: str
    rule: str


class ResourceEvidence(Wire):
    effective: dict[str, Any]
    peak: dict[str, float]
    duration_s: float | None
    output_bytes: int
    limit_hit: dict[str, Any] | None


class EditorResourceEvidence(ResourceEvidence):
    container: dict[str, Any]
    outputBytes: int
    tokens: int
    limit: dict[str, Any] | None


class TokenEvidence(Wire):
    used: int
    source: str


class EgressHost(Wire):
    host: str  # "host:port"
    bytes: int


class EgressRefusal(Wire):
    host: str | None = None
    port: int | None = None
    target: str | None = None  # what a CONNECT named when it was not host:port
    status: int
    reason: str


class EgressEvidence(Wire):
    """What the run's package broker let through and refused (docs/broker.md)."""

    allowed: list[str]
    tunnels: int
    bytes: int
    hosts: list[EgressHost]
    refused: int
    refusals: list[EgressRefusal]


class EvidenceDocument(Wire):
    """A run's evidence (`airlockd show RUN --json`): redacted, never holding file contents."""

    run: str
    agent: str
    state: RunState
    mode: Mode
    policy: EvidencePolicy
    admission: AdmissionEvidence
    rules: list[RuleFired]
    decisions: list[FileDecision]
    classifier: list[dict[str, Any]]
    withheld: list[WithheldPath]
    container: dict[str, Any]
    resources: ResourceEvidence
    tokens: TokenEvidence
    egress: EgressEvidence | None = None
    workspace: dict[str, Any]
    timeline: list[dict[str, Any]]


class Evidence(Wire):
    """`airlock.getEvidence`: the evidence document with the shapes the editors read (the policy
    text, per-file rules, resources with the container, transitions, applied transactions)."""

    runId: str
    run: str
    agent: str
    state: RunState
    mode: Mode
    policy: EditorEvidencePolicy
    admission: AdmissionEvidence
    rules: list[FileRule]
    rulesFired: list[RuleFired]
    decisions: list[FileDecision]
    classifier: list[dict[str, Any]]
    withheld: list[WithheldPath]
    container: dict[str, Any]
    resources: EditorResourceEvidence
    tokens: TokenEvidence
    egress: EgressEvidence | None = None
    workspace: dict[str, Any]
    timeline: list[dict[str, Any]]
    transitions: list[Transition]
    applied: list[Applied]


# -- command arguments (one JSON object each; `airlockd.lsp.args.parse`) -------------------------


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NoArgs(Args):
    pass


LIST_LIMIT = 200  # runs `airlock.listRuns` answers with when it is not told how many


class ListRunsArgs(Args):
    """`airlock.listRuns`: the newest runs first, at most `limit`, of the states / agent given,
    admitted at or after `since` (seconds since the epoch); `before` (a run id) pages on."""

    limit: int = Field(LIST_LIMIT, ge=1, le=10_000)
    state: list[RunState] | None = Field(None, min_length=1)
    agent: str | None = Field(None, min_length=1)
    since: float | None = None
    before: str | None = Field(None, min_length=1)


class RunTaskArgs(Args):
    agent: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    mode: Mode | None = None
    followUp: str | None = Field(None, min_length=1)


class RunArgs(Args):
    runId: str = Field(min_length=1)


class StopArgs(RunArgs):
    wait: bool = True  # false: answer at once with the state the run is in then


class DecideArgs(RunArgs):
    """`airlock.approve` / `airlock.reject`: chosen paths and / or hunks; none: everything pending."""

    paths: list[str] | None = None
    hunks: dict[str, list[str]] | None = None


class DiffArgs(RunArgs):
    path: str | None = None


class AgentArgs(Args):
    agent: str = Field(min_length=1)
