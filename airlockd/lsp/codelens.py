"""`textDocument/codeLens`: "Accept | Reject | Diff" above each pending hunk of a proposal (above
line 0 for a change without hunks), so any editor with CodeLens support can review."""

from __future__ import annotations

import logging

from lsprotocol import types
from pygls.capabilities import get_capability

from airlockd.lsp.documents import relative
from airlockd.lsp.proposal import shifted
from airlockd.lsp.server import AirlockServer
from airlockd.records import FileState, RunState
from airlockd.runs.service import Service

log = logging.getLogger(__name__)


def setup(server: AirlockServer) -> None:
    @server.feature(types.TEXT_DOCUMENT_CODE_LENS, types.CodeLensOptions(resolve_provider=False))
    async def code_lens(ls: AirlockServer, params: types.CodeLensParams) -> list[types.CodeLens]:
        path = relative(ls.service.workspace, params.text_document.uri)
        if path is None:
            return []
        return await ls.call(lenses_for, ls.service, path)

    def refresh(run_id: str) -> None:
        if get_capability(server.client_capabilities, "workspace.code_lens.refresh_support", False):
            server.workspace_code_lens_refresh(None)

    server.on_proposal_change.append(refresh)


def _lenses(line: int, run_id: str, path: str, hunk: str | None) -> list[types.CodeLens]:
    pos = types.Position(line=line, character=0)
    rng = types.Range(start=pos, end=pos)
    sel: dict[str, object] = {"runId": run_id}
    sel.update({"hunks": {path: [hunk]}} if hunk else {"paths": [path]})
    what = f"hunk {hunk}" if hunk else path
    return [
        types.CodeLens(range=rng, command=types.Command(title="Accept", command="airlock.approve", arguments=[sel])),
        types.CodeLens(range=rng, command=types.Command(title="Reject", command="airlock.reject", arguments=[sel])),
        types.CodeLens(
            range=rng,
            command=types.Command(
                title="Diff", command="airlock.diff", arguments=[{"runId": run_id, "path": path}], tooltip=what
            ),
        ),
    ]


def lenses_for(svc: Service, path: str) -> list[types.CodeLens]:
    """Lenses for every proposed run with a pending change at `path` (blocking: reads the store)."""
    out: list[types.CodeLens] = []
    for rec in svc.store.open_runs(frozenset({RunState.PROPOSED})):
        f = rec.file(path)
        if f is None or f.state is not FileState.PENDING:
            continue
        states = svc.content.hunk_states(rec, f)
        if not states:
            out += _lenses(0, rec.id, path, None)
            continue
        for h, state, start in shifted(states):
            if state == "pending":
                out += _lenses(max(start - (1 if h.old_lines == 0 and start > 0 else 0), 0), rec.id, path, h.id)
    return out
