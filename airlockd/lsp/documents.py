"""Open editor buffers: pygls keeps their text (didOpen / didChange / didClose); this module says
which workspace files have unsaved changes, for the commit's conflict check."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from lsprotocol import types
from pygls.uris import to_fs_path

from airlockd.lsp.server import AirlockServer

log = logging.getLogger(__name__)


def setup(server: AirlockServer) -> None:
    # pygls stores the text itself; registering the notifications advertises open/close/change sync.
    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: AirlockServer, params: types.DidOpenTextDocumentParams) -> None:
        log.debug("opened %s", params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: AirlockServer, params: types.DidChangeTextDocumentParams) -> None:
        pass

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: AirlockServer, params: types.DidCloseTextDocumentParams) -> None:
        log.debug("closed %s", params.text_document.uri)


def relative(workspace: Path, uri: str) -> str | None:
    """The workspace-relative path of a file: URI, or None when it is elsewhere."""
    fs = to_fs_path(uri) if uri.startswith("file:") else None
    if fs is None:
        return None
    try:
        return Path(fs).resolve().relative_to(workspace).as_posix()
    except ValueError:
        return None


def snapshot(ls: AirlockServer) -> dict[str, str]:
    """Relative path -> buffer text of every open document in the workspace (on the loop)."""
    out: dict[str, str] = {}
    try:
        docs = dict(ls.workspace.text_documents)
    except RuntimeError:  # not initialized
        return out
    for uri, doc in docs.items():
        rel = relative(ls.service.workspace, uri)
        if rel is not None:
            out[rel] = doc.source
    return out


def dirty_paths(workspace: Path, buffers: Mapping[str, str]) -> set[str]:
    """The paths whose buffer text differs from the file on disk (blocking: reads the files)."""
    dirty = set()
    for rel, text in buffers.items():
        try:
            disk = (workspace / rel).read_bytes().decode("utf-8", "surrogateescape")
        except FileNotFoundError:
            disk = None
        except OSError:
            continue
        if disk != text and not (disk is None and text == ""):
            dirty.add(rel)
    return dirty
