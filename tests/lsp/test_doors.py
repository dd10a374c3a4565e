"""Both doors on one workspace: the daemon (a real LSP client against `airlockd serve`, the real
engine) and the CLI (`airlockd.cli.main`, in this process) decide the same proposals by the same
rules. Per-hunk decisions made in the editor hold when the CLI approves the file; `--hunk` from
the CLI; conflicts that clear when their cause does; a real disk change that stays conflicted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

from airlockd.cli import main
from airlockd.pipeline.hunks import apply_hunks

from .conftest import MOD, command, notes, uri, wait_until

pytestmark = [
    pytest.mark.docker,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("error::pytest_lsp.LspSpecificationWarning"),
]

SCRIPT = (
    "set -e; sed -i 's/^line 2$/line two/; s/^line 18$/line eighteen/' src/mod.py;"
    " echo 'X = 2' >> src/lib.py; echo 'W = 2' >> src/watched.py; echo 'N = 1' > src/new.py"
)
PROPOSED = MOD.replace("line 2\n", "line two\n", 1).replace("line 18\n", "line eighteen\n")
RUNS: dict[str, str] = {}


def ws(client: LanguageClient) -> Path:
    return client.ws  # type: ignore[attr-defined,no-any-return]


async def cli(
    client: LanguageClient, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, Any]:
    """`airlockd --json ARGV` on the daemon's workspace and state, as a person in a terminal. With
    the VS Code client the CLI is the daemon's client (its control socket, the default); with the
    Neovim one it acts alone (`--no-daemon`): every decision here goes through both ways."""
    monkeypatch.setenv("AIRLOCK_STATE_DIR", str(client.state))  # type: ignore[attr-defined]
    capsys.readouterr()
    alone = ["--no-daemon"] if client.caps == "neovim" else []  # type: ignore[attr-defined]
    code = await asyncio.to_thread(main, ["--workspace", str(ws(client)), "--json", *alone, *argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else None


async def proposed_run(client: LanguageClient, script: str) -> str:
    r = await command(client, "airlock.runTask", {"agent": "bot", "prompt": script})
    run_id: str = r["runId"]

    def proposed() -> bool:
        return any(n["runId"] == run_id and n["state"] == "proposed" for n in notes(client, "airlock/runStatus"))

    await wait_until(proposed, what=f"run {run_id} proposed")
    return run_id


async def file_of(client: LanguageClient, run_id: str, path: str) -> dict[str, Any]:
    p = await command(client, "airlock.getProposal", {"runId": run_id})
    return next(f for f in p["files"] if f["path"] == path)  # type: ignore[no-any-return]


async def test_a_hunk_rejected_in_the_editor_never_lands_through_the_cli(
    client: LanguageClient, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = RUNS[client.caps] = await proposed_run(client, SCRIPT)  # type: ignore[attr-defined]
    first, second = (h["id"] for h in (await file_of(client, run_id, "src/mod.py"))["hunks"])
    await command(client, "airlock.reject", {"runId": run_id, "hunks": {"src/mod.py": [second]}})
    code, out = await cli(client, monkeypatch, capsys, "approve", run_id, "--path", "src/mod.py")
    assert code == 0, out
    assert out["applied"] == ["src/mod.py"]
    assert (ws(client) / "src/mod.py").read_text() == apply_hunks(MOD, PROPOSED, {first})
    mod = await file_of(client, run_id, "src/mod.py")
    assert mod["state"] == "accepted" and [h["state"] for h in mod["hunks"]] == ["accepted", "rejected"]


async def test_an_unsaved_buffer_conflict_clears_when_the_buffer_is_saved_back(client: LanguageClient) -> None:
    run_id = RUNS[client.caps]  # type: ignore[attr-defined]
    lib = ws(client) / "src/lib.py"
    doc = types.VersionedTextDocumentIdentifier(uri=uri(lib), version=2)
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri(lib), language_id="python", version=1, text="X = 1\n")
        )
    )
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=doc, content_changes=[types.TextDocumentContentChangeWholeDocument(text="X = 1  # wip\n")]
        )
    )
    with pytest.raises(JsonRpcException) as err:
        await command(client, "airlock.approve", {"runId": run_id, "paths": ["src/lib.py"]})
    assert err.value.code == -32030 and err.value.data["paths"] == ["src/lib.py"]
    assert "save or revert" in err.value.data["hint"]
    assert (await file_of(client, run_id, "src/lib.py"))["state"] == "conflicted"
    # the person undoes the edit and saves: the buffer is the file on disk again
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri(lib), version=3),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text="X = 1\n")],
        )
    )
    lib.write_text("X = 1\n")  # what the editor's save writes
    await wait_until(
        lambda: any(n["runId"] == run_id and n.get("cleared") for n in notes(client, "airlock/runStatus")),
        timeout=10,
        what="the watch clears the conflict",
    )
    assert (await file_of(client, run_id, "src/lib.py"))["state"] == "pending"
    result = await command(client, "airlock.approve", {"runId": run_id, "paths": ["src/lib.py"]})
    assert result["applied"] == ["src/lib.py"] and lib.read_text() == "X = 1\nX = 2\n"
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri(lib)))
    )


async def test_a_live_edit_conflict_clears_when_the_file_is_put_back(
    client: LanguageClient, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = RUNS[client.caps]  # type: ignore[attr-defined]
    watched = ws(client) / "src/watched.py"
    watched.write_text("W = 'a person was here'\n")
    await wait_until(lambda: _state_pushed(client, run_id, "src/watched.py") == "conflicted", timeout=10)
    watched.write_text("W = 1\n")  # put back
    await wait_until(lambda: _state_pushed(client, run_id, "src/watched.py") == "pending", timeout=10)
    code, out = await cli(client, monkeypatch, capsys, "approve", run_id, "--path", "src/watched.py")
    assert code == 0, out
    assert watched.read_text() == "W = 1\nW = 2\n"


async def test_a_real_disk_change_stays_conflicted_with_the_follow_up_hint(
    client: LanguageClient, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = RUNS[client.caps]  # type: ignore[attr-defined]
    new = ws(client) / "src/new.py"
    new.write_text("N = 'written by a person'\n")
    await wait_until(lambda: _state_pushed(client, run_id, "src/new.py") == "conflicted", timeout=10)
    code, out = await cli(client, monkeypatch, capsys, "approve", run_id, "--path", "src/new.py")
    assert code == 5 and out["paths"] == ["src/new.py"]
    assert f"airlockd run --agent bot --follow-up {run_id}" in out["hint"]
    assert new.read_text() == "N = 'written by a person'\n"
    code, out = await cli(client, monkeypatch, capsys, "reject", run_id, "--path", "src/new.py")
    assert code == 0 and out["state"] == "applied"  # nothing else pending: what landed stands


async def test_hunks_decided_from_the_cli(
    client: LanguageClient, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mod = ws(client) / "src/mod.py"
    base = mod.read_text()
    run_id = await proposed_run(client, "sed -i 's/^line 5$/line five/; s/^line 15$/line fifteen/' src/mod.py")
    code, shown = await cli(client, monkeypatch, capsys, "show", run_id)
    first, second = (h["id"] for h in shown["hunks"]["src/mod.py"])
    assert [h["id"] for h in (await file_of(client, run_id, "src/mod.py"))["hunks"]] == [first, second]
    code, out = await cli(client, monkeypatch, capsys, "approve", run_id, "--hunk", f"src/mod.py:{second}")
    assert code == 0 and out["applied"] == ["src/mod.py"]
    assert mod.read_text() == base.replace("line 15\n", "line fifteen\n")
    code, out = await cli(client, monkeypatch, capsys, "reject", run_id, "--hunk", f"src/mod.py:{first}")
    assert code == 0 and out["state"] == "applied"
    code, shown = await cli(client, monkeypatch, capsys, "show", run_id)
    assert next(f for f in shown["files"] if f["path"] == "src/mod.py")["hunks"] == {
        first: "rejected",
        second: "accepted",
    }
    assert mod.read_text() == base.replace("line 15\n", "line fifteen\n")


def _state_pushed(client: LanguageClient, run_id: str, path: str) -> str | None:
    """The file's review state in the last `airlock/proposal` the daemon pushed for the run."""
    hits = [n for n in notes(client, "airlock/proposal") if n["runId"] == run_id]
    if not hits:
        return None
    return next((f["state"] for f in hits[-1]["files"] if f["path"] == path), None)
