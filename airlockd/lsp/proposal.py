"""A run's proposal as the editor sees it: files with their hunks and review state, denied changes,
and the pending part as an LSP `WorkspaceEdit`. Reads the run's files; never writes anything.

The edit is evidence for a preview, never the way a change lands: approvals go through the
commit engine (`Review`), so what reaches disk does not depend on what an editor says it applied.
The whole proposal passes the run's redactor on its way out (hunk texts, the edit's new text,
paths, reasons); a change that carries a secret is denied at classification, so it is listed
under `denied` with its rule and reason and its content is never sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsprotocol import types
from lsprotocol.converters import get_converter
from pygls.uris import from_fs_path

from airlockd import protocol
from airlockd.pipeline.hunks import Hunk, is_binary
from airlockd.pipeline.manifest import ChangeKind, Kind
from airlockd.policy import Decision
from airlockd.records import FileReview, FileState, RunRecord
from airlockd.runs.content import ProposalContent

try:  # the editor's line splitting, the same the hunks are computed with
    from airlockd.pipeline.hunks import lines
except ImportError:  # pragma: no cover - older hunks module

    def lines(text: str) -> list[str]:
        return text.splitlines(keepends=True)


_converter = get_converter()

ANNOTATIONS = {
    Decision.AUTO.value: types.ChangeAnnotation(
        label="airlock: auto", needs_confirmation=False, description="allowed by policy without review"
    ),
    Decision.REVIEW.value: types.ChangeAnnotation(
        label="airlock: review", needs_confirmation=True, description="the policy asks a person to confirm"
    ),
}


@dataclass(frozen=True)
class EditSupport:
    """What the client can take in a WorkspaceEdit (from its capabilities)."""

    document_changes: bool
    resource_operations: frozenset[str]
    annotations: bool

    @classmethod
    def of(cls, caps: types.ClientCapabilities | None) -> EditSupport:
        we = caps.workspace.workspace_edit if caps and caps.workspace else None
        if we is None:
            return cls(False, frozenset(), False)
        ops = frozenset(str(getattr(o, "value", o)) for o in (we.resource_operations or []))
        return cls(bool(we.document_changes), ops, we.change_annotation_support is not None)


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _position(doc: list[str], line: int) -> types.Position:
    """Start of line `line` of `doc`, or the very end of the document when that is past it."""
    if line < len(doc):
        return types.Position(line=line, character=0)
    if doc and not doc[-1].endswith(("\n", "\r")):
        return types.Position(line=len(doc) - 1, character=utf16_len(doc[-1]))
    return types.Position(line=len(doc), character=0)


def shifted(all_hunks: list[tuple[Hunk, str]]) -> list[tuple[Hunk, str, int]]:
    """Each hunk with the line where it starts in the live file: landed hunks before it moved it."""
    out, delta = [], 0
    for h, state in all_hunks:
        out.append((h, state, h.old_start + delta))
        if state == "accepted":
            delta += h.new_lines - h.old_lines
    return out


def hunk_range(doc: list[str], start: int, h: Hunk, state: str) -> types.Range:
    """Where hunk `h` is in the live document `doc` (its new lines when it already landed)."""
    n = h.new_lines if state == "accepted" else h.old_lines
    return types.Range(start=_position(doc, start), end=_position(doc, start + n))


def _unstructure(obj: Any) -> Any:
    return _converter.unstructure(obj)


def _file_change(f: FileReview, binary: bool, hunk_list: list[protocol.Hunk]) -> protocol.FileChange:
    return protocol.FileChange(
        path=f.path,
        change=ChangeKind(f.change),
        kind=f.kind,
        decision=f.decision,
        rule=f.rule,
        rules=[f.rule],
        reason=f.reason,
        state=f.state,
        binary=binary,
        hunks=hunk_list,
        marks=f.marks,
    )


def build(content: ProposalContent, rec: RunRecord, workspace: Path, support: EditSupport) -> dict[str, Any]:
    """The proposal of `rec` as `airlock.getProposal` returns it (and `airlock/proposal` pushes)."""
    files: list[protocol.FileChange] = []
    denied: list[protocol.DeniedChange] = []
    doc_changes: list[Any] = []
    changes: dict[str, list[types.TextEdit]] = {}
    used: set[str] = set()
    for f in rec.files:
        if f.state is FileState.DENIED:
            denied.append(
                protocol.DeniedChange(
                    path=f.path, change=ChangeKind(f.change), rule=f.rule, reason=f.reason, marks=f.marks
                )
            )
            continue
        uri = from_fs_path(str(workspace / f.path)) or ""
        base, new = content.contents(rec, f) if f.kind == Kind.FILE.value else (None, None)
        binary = bool((base and is_binary(base)) or (new and is_binary(new)))
        states = content.hunk_states(rec, f)
        hunk_list: list[protocol.Hunk] = []
        edits: list[types.TextEdit | types.AnnotatedTextEdit] = []
        if states is not None and base is not None:
            live = (workspace / f.path).read_text() if f.partial else base.decode()
            doc = lines(live)
            for h, state, start in shifted(states):
                rng = hunk_range(doc, start, h, state)
                hunk_list.append(
                    protocol.Hunk(
                        id=h.id,
                        range=protocol.Range.model_validate(_unstructure(rng)),
                        state=protocol.HunkState(state),
                        oldLines=h.old_lines,
                        newLines=h.new_lines,
                        oldText="".join(h.old),
                        newText="".join(h.new),
                    )
                )
                if state == "pending" and f.state is FileState.PENDING:
                    edits.append(_text_edit(rng, "".join(h.new), f.decision.value, support))
        files.append(_file_change(f, binary, hunk_list))
        if f.state is not FileState.PENDING or binary or f.kind != Kind.FILE.value:
            continue
        ann = f.decision.value if support.annotations else None
        if f.change == "modified" and edits:
            if support.document_changes:
                ident = types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=None)
                doc_changes.append(types.TextDocumentEdit(text_document=ident, edits=edits))
            else:
                changes[uri] = [types.TextEdit(range=e.range, new_text=e.new_text) for e in edits]
            used.add(f.decision.value)
        elif (
            f.change == "created"
            and new is not None
            and support.document_changes
            and "create" in support.resource_operations
        ):
            doc_changes.append(
                types.CreateFile(uri=uri, options=types.CreateFileOptions(ignore_if_exists=False), annotation_id=ann)
            )
            top = types.Position(line=0, character=0)
            full = _text_edit(types.Range(start=top, end=top), new.decode(), f.decision.value, support)
            ident = types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=None)
            doc_changes.append(types.TextDocumentEdit(text_document=ident, edits=[full]))
            used.add(f.decision.value)
        elif f.change == "deleted" and support.document_changes and "delete" in support.resource_operations:
            doc_changes.append(types.DeleteFile(uri=uri, annotation_id=ann))
            used.add(f.decision.value)
    if support.document_changes:
        annotations = {k: v for k, v in ANNOTATIONS.items() if k in used} if support.annotations else None
        edit = types.WorkspaceEdit(document_changes=doc_changes, change_annotations=annotations or None)
    else:
        edit = types.WorkspaceEdit(changes=changes)
    wire = protocol.Proposal(
        runId=rec.id,
        agent=rec.agent,
        state=rec.state,
        edit=protocol.WorkspaceEdit.model_validate(_unstructure(edit)),
        files=files,
        denied=denied,
    ).wire()
    return dict(content.redactor.value(wire))


def _text_edit(
    rng: types.Range, text: str, decision: str, support: EditSupport
) -> types.TextEdit | types.AnnotatedTextEdit:
    if support.document_changes and support.annotations:
        return types.AnnotatedTextEdit(annotation_id=decision, range=rng, new_text=text)
    return types.TextEdit(range=rng, new_text=text)
