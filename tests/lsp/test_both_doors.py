"""Both doors on one workspace: an editor's daemon (pytest-lsp over stdio) and the CLI at once.
With the daemon running, the CLI is its client (the control socket): its runs are the daemon's,
its decisions see the editor's unsaved buffers and reach the editor as notifications, and they are
audited as the CLI's. With `--no-daemon` the CLI acts alone, and the daemon follows the store."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import LanguageClient

from .conftest import MOD, command, make_workspace, notes, start_client, uri, wait_until

pytestmark = [
    pytest.mark.docker,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("error::pytest_lsp.LspSpecificationWarning"),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def editor(tmp_path_factory: pytest.TempPathFactory, _image: None) -> AsyncIterator[Any]:
    root = tmp_path_factory.mktemp("doors")
    ws = make_workspace(root)
    state = root / "state"
    c = await start_client(ws, state, "visual-studio-code")
    c.ws, c.state = ws, state  # type: ignore[attr-defined]
    yield c
    await c.shutdown_session()
    await c.stop()


async def cli(c: Any, *argv: str, no_daemon: bool = False) -> tuple[int, Any, str]:
    """`airlockd --json ARGV` from another process, as a person types it in a terminal; the event
    loop keeps serving the editor's side meanwhile (the daemon may ask it things)."""
    env = {**os.environ, "AIRLOCK_STATE_DIR": str(c.state)}
    head = [sys.executable, "-m", "airlockd", "--workspace", str(c.ws), "--json"]
    proc = await asyncio.create_subprocess_exec(
        *head, *(["--no-daemon"] if no_daemon else []), *argv, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode is not None
    return proc.returncode, json.loads(out) if out.strip() else None, err.decode()


def audit_by(c: Any, run_id: str, kind: str) -> list[str]:
    lines = (c.state.glob("*/audit.jsonl")).__next__().read_text().splitlines()
    events = [json.loads(line) for line in lines]
    return [e["data"].get("by") for e in events if e.get("run") == run_id and e["kind"] == kind]


def serve_pid(c: Any) -> int:
    return int(json.loads(next(c.state.glob("*/serve.json")).read_text())["pid"])


async def test_a_cli_run_is_the_editors_daemons_run(editor: LanguageClient) -> None:
    c: Any = editor
    pid = serve_pid(c)
    code, run, err = await cli(c, "run", "--agent", "bot", "--wait", "echo made > src/made.py")
    assert code == 0, err
    assert run["state"] == "proposed" and [f["path"] for f in run["files"]] == ["src/made.py"]
    # the editor heard of it as of its own runs: status changes and the proposal
    await wait_until(
        lambda: any(n["runId"] == run["id"] and n["state"] == "proposed" for n in notes(c, "airlock/runStatus")),
        what="the CLI's run announced to the editor",
    )
    await wait_until(lambda: any(p["runId"] == run["id"] for p in notes(c, "airlock/proposal")), what="its proposal")
    assert serve_pid(c) == pid  # no second daemon: the editor's served the CLI
    listed = await command(c, "airlock.listRuns", {})
    assert run["id"] in [r["runId"] for r in listed]
    code, out, err = await cli(c, "reject", run["id"])
    assert code == 0 and out["state"] == "rejected", err
    assert audit_by(c, run["id"], "review.reject") == ["cli"]


async def test_a_cli_decision_sees_the_editors_unsaved_buffer(editor: LanguageClient) -> None:
    c: Any = editor
    mod = c.ws / "src" / "mod.py"
    code, run, err = await cli(
        c, "run", "--agent", "bot", "--wait", "sed -i 's/line 3$/LINE 3/' src/mod.py; echo Y = 2 > src/lib.py"
    )
    assert code == 0 and run["state"] == "proposed", err
    doc = types.TextDocumentIdentifier(uri=uri(mod))
    c.text_document_did_open(
        types.DidOpenTextDocumentParams(text_document=types.TextDocumentItem(uri=uri(mod), language_id="python",
                                                                             version=1, text=MOD))
    )  # fmt: skip
    c.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=doc.uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=MOD + "# unsaved\n")],
        )
    )
    await asyncio.sleep(0.3)  # the notifications reach the daemon
    code, out, err = await cli(c, "approve", run["id"], "--path", "src/mod.py")
    assert code == 5, (code, out, err)  # conflict: the editor holds unsaved changes of that file
    assert out["error"] == "conflict" and out["paths"] == ["src/mod.py"]
    assert mod.read_text() == MOD  # nothing was written
    c.text_document_did_close(types.DidCloseTextDocumentParams(text_document=doc))
    before = len(notes(c, "airlock/proposal"))
    code, out, err = await cli(c, "approve", run["id"], "--path", "src/lib.py")
    assert code == 0 and out["applied"] == ["src/lib.py"], err
    assert (c.ws / "src" / "lib.py").read_text() == "Y = 2\n"
    # the editor's review follows the CLI's decision
    await wait_until(
        lambda: len(notes(c, "airlock/proposal")) > before, what="a proposal pushed after the CLI's approve"
    )
    files = {f["path"]: f["state"] for f in notes(c, "airlock/proposal")[-1]["files"]}
    assert files["src/lib.py"] == "accepted"
    assert audit_by(c, run["id"], "review.approve")[-1] == "cli"
    code, out, err = await cli(c, "reject", run["id"])
    assert code == 0, err


async def test_the_cli_decides_hunks_the_editor_decided_the_same_way(editor: LanguageClient) -> None:
    c: Any = editor
    mod = c.ws / "src" / "mod.py"
    script = "sed -i -e 's/^line 2$/LINE 2/' -e 's/^line 18$/LINE 18/' src/mod.py"
    code, run, err = await cli(c, "run", "--agent", "bot", "--wait", script)
    assert code == 0 and run["state"] == "proposed", err
    proposal = await command(c, "airlock.getProposal", {"runId": run["id"]})
    hunks = next(f for f in proposal["files"] if f["path"] == "src/mod.py")["hunks"]
    assert len(hunks) == 2
    await command(c, "airlock.reject", {"runId": run["id"], "hunks": {"src/mod.py": [hunks[1]["id"]]}})
    code, out, err = await cli(c, "approve", run["id"], "--path", "src/mod.py")
    assert code == 0, err
    text = mod.read_text()
    assert "LINE 2\n" in text and "line 18\n" in text and "LINE 18" not in text  # the rejected hunk stayed out
    assert out["run"]["state"] == "applied"
    code, out, err = await cli(c, "undo", run["id"])
    assert code == 0 and out["state"] == "undone", err
    assert mod.read_text() == MOD


async def test_without_the_daemon_the_cli_acts_alone_and_the_editor_follows(editor: LanguageClient) -> None:
    c: Any = editor
    code, run, err = await cli(c, "run", "--agent", "bot", "--wait", "echo alone > alone.txt", no_daemon=True)
    assert code == 0 and run["state"] == "proposed", err
    # carried by the CLI's own process, not the daemon: the daemon follows the store
    await wait_until(
        lambda: any(n["runId"] == run["id"] and n["state"] == "proposed" for n in notes(c, "airlock/runStatus")),
        what="the run announced from the store",
    )
    code, out, err = await cli(c, "approve", run["id"], no_daemon=True)
    assert code == 0 and out["applied"] == ["alone.txt"], err
    await wait_until(
        lambda: any(n["runId"] == run["id"] and n["state"] == "applied" for n in notes(c, "airlock/runStatus")),
        what="the CLI's decision announced from the store",
    )
    await wait_until(
        lambda: any(p["runId"] == run["id"] and p["state"] == "applied" for p in notes(c, "airlock/proposal")),
        what="the proposal pushed again",
    )
    assert audit_by(c, run["id"], "review.approve") == ["cli"]
    code, out, err = await cli(c, "undo", run["id"])  # through the daemon again: same store, same rules
    assert code == 0 and out["state"] == "undone", err
    assert not (c.ws / "alone.txt").exists()


async def test_stop_from_the_cli_of_an_editors_run(editor: LanguageClient) -> None:
    c: Any = editor
    started = await command(c, "airlock.runTask", {"agent": "bot", "prompt": "sleep 60"})
    run_id = started["runId"]
    await wait_until(
        lambda: any(n["runId"] == run_id and n["state"] == "running" for n in notes(c, "airlock/runStatus")),
        what="the run running",
    )
    code, out, err = await cli(c, "kill", run_id)
    assert code == 4, (code, out, err)  # killed
    await wait_until(
        lambda: any(n["runId"] == run_id and n["state"] == "killed" for n in notes(c, "airlock/runStatus")),
        what="the run killed",
    )
    assert audit_by(c, run_id, "run.kill_requested") == ["cli"]


async def test_listing_and_retention_by_either_door(editor: LanguageClient) -> None:
    c: Any = editor
    code, lines, err = await cli(c, "runs", "--all")
    assert code == 0 and len(lines) >= 4, err
    listed = await command(c, "airlock.listRuns", {"limit": 10_000})
    assert [r["runId"] for r in listed] == [x["id"] for x in lines]  # one order: newest first
    for state in ("rejected", "undone", "killed"):
        code, mine, err = await cli(c, "runs", "--state", state)
        theirs = await command(c, "airlock.listRuns", {"state": [state]})
        assert code == 0 and [r["runId"] for r in theirs] == [x["id"] for x in mine], err
    page = await command(c, "airlock.listRuns", {"limit": 2, "before": listed[0]["runId"]})
    assert [r["runId"] for r in page] == [r["runId"] for r in listed[1:3]]
    with pytest.raises(Exception, match="state"):
        await command(c, "airlock.listRuns", {"state": ["nonsense"]})
    # compact all but the newest finished run from the terminal; the editor still shows them all
    policy = c.ws / "policies.toml"
    policy.write_text(policy.read_text() + "\n[retention]\nkeep_runs = 1\n")
    code, dry, err = await cli(c, "gc")
    assert code == 0 and not dry["applied"] and dry["runs"], err
    code, done, err = await cli(c, "gc", "--apply")
    assert code == 0 and {r["id"] for r in done["runs"]} == {r["id"] for r in dry["runs"]}, err
    gone = done["runs"][0]["id"]
    after = await command(c, "airlock.listRuns", {"limit": 10_000})
    assert [(r["runId"], r["state"]) for r in after] == [(r["runId"], r["state"]) for r in listed]
    shown = await command(c, "airlock.getEvidence", {"runId": gone})
    assert shown["runId"] == gone and shown["state"] == done["runs"][0]["state"]
    code, out, err = await cli(c, "show", gone)
    assert code == 0 and out["compacted_at"], err
    code, out, err = await cli(c, "audit", "--verify")
    assert code == 0 and out["ok"], err
