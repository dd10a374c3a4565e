"""The LSP daemon end to end: a real client, the real Docker engine, both editors' capabilities.

The tests of one module share a server per capability set and run in order: a run is proposed,
then reviewed hunk by hunk, conflicted by an unsaved buffer and by a live edit, undone; runs are
stopped and killed; the policy is reloaded and a proposal expires."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pydantic import BaseModel
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

from airlockd import protocol
from airlockd.pipeline.hunks import apply_hunks

from .conftest import MOD, POLICY, command, notes, uri, wait_until

pytestmark = [
    pytest.mark.docker,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("error::pytest_lsp.LspSpecificationWarning"),
]

COMMANDS = [
    "airlock.runTask",
    "airlock.stopRun",
    "airlock.killRun",
    "airlock.getProposal",
    "airlock.approve",
    "airlock.reject",
    "airlock.undo",
    "airlock.listRuns",
    "airlock.getEvidence",
    "airlock.listAgents",
    "airlock.releaseAgent",
]

SCRIPT = (
    "set -e; sed -i 's/^line 2$/line two/; s/^line 18$/line eighteen/' src/mod.py;"
    " echo 'X = 2' >> src/lib.py; echo 'W = 2' >> src/watched.py;"
    " printf 'def new():\\n    return 1\\n' > src/new.py; rm docs/old.md;"
    " printf '\\x89PNG\\x00\\x01' > logo.bin; echo hacked >> AGENTS.md; echo 'echo hi' > build.sh"
)
PROPOSED_MOD = MOD.replace("line 2\n", "line two\n", 1).replace("line 18\n", "line eighteen\n")
RUNS: dict[str, dict[str, Any]] = {}


def ws(client: LanguageClient) -> Path:
    return client.ws  # type: ignore[attr-defined,no-any-return]


def run_of(client: LanguageClient) -> dict[str, Any]:
    return RUNS.setdefault(client.caps, {})  # type: ignore[attr-defined]


def states_of(client: LanguageClient, run_id: str) -> list[str]:
    """The run's states in the order announced, repeats (samples while running) folded."""
    out: list[str] = []
    for n in notes(client, "airlock/runStatus"):
        if n["runId"] == run_id and (not out or out[-1] != n["state"]):
            out.append(n["state"])
    return out


def last_proposal(client: LanguageClient, run_id: str) -> dict[str, Any] | None:
    hits = [n for n in notes(client, "airlock/proposal") if n["runId"] == run_id]
    return hits[-1] if hits else None


async def rpc_error(client: LanguageClient, name: str, args: Any) -> JsonRpcException:
    with pytest.raises(JsonRpcException) as info:
        await command(client, name, args)
    return info.value


async def test_initialize_advertises_every_command(client: LanguageClient) -> None:
    caps = client.init_result.capabilities  # type: ignore[attr-defined]
    assert caps.execute_command_provider is not None
    assert set(COMMANDS) <= set(caps.execute_command_provider.commands)
    assert caps.code_lens_provider is not None
    assert caps.text_document_sync is not None


async def test_bad_arguments_name_the_field(client: LanguageClient) -> None:
    err = await rpc_error(client, "airlock.runTask", {"prompt": "x"})
    assert err.code == -32602 and "`agent`" in err.message
    assert err.data["field"] == "agent"
    err = await rpc_error(client, "airlock.approve", {"runId": "r1", "hunks": {"a.py": "nope"}})
    assert err.code == -32602 and "hunks" in err.message
    err = await rpc_error(client, "airlock.getProposal", {"runId": "r1", "bogus": 1})
    assert err.code == -32602 and "bogus" in err.message


async def test_admission_refusals_are_errors_with_data(client: LanguageClient) -> None:
    err = await rpc_error(client, "airlock.runTask", {"agent": "nobody", "prompt": "hi"})
    assert err.code == -32011 and "nobody" in err.message
    err = await rpc_error(client, "airlock.runTask", {"agent": "bot", "prompt": "use sk-ant-" + "a" * 40})
    assert err.code == -32020
    assert err.data["error"] == "admission_rejected" and "secret" in err.data["reason"]
    assert any(n["agent"] == "bot" for n in notes(client, "airlock/agentStatus"))


async def test_run_task_answers_at_once_then_proposes(client: LanguageClient) -> None:
    result = await command(client, "airlock.runTask", {"agent": "bot", "prompt": SCRIPT})
    assert result["state"] == "admitted"
    run_id = result["runId"]
    run_of(client)["id"] = run_id
    # other requests are answered while the run stages, runs and is inspected
    runs = await command(client, "airlock.listRuns", {})
    assert any(r["runId"] == run_id for r in runs)
    await wait_until(lambda: last_proposal(client, run_id), what="airlock/proposal")
    assert states_of(client, run_id)[:4] == ["staging", "running", "inspecting", "proposed"]
    token = f"airlock-run-{run_id}"
    await wait_until(lambda: isinstance(client.progress_reports[token][-1], types.WorkDoneProgressEnd))
    reports = client.progress_reports[token]
    assert isinstance(reports[0], types.WorkDoneProgressBegin) and reports[0].cancellable
    assert {r.message.split(":")[0] for r in reports[1:-1] if r.message} >= {"staging", "running", "inspecting"}
    await wait_until(lambda: any(run_id in m.message and "proposes" in m.message for m in client.messages))


async def test_proposal_as_workspace_edit(client: LanguageClient) -> None:
    run_id = run_of(client)["id"]
    p = await command(client, "airlock.getProposal", {"runId": run_id})
    files = {f["path"]: f for f in p["files"]}
    assert files["src/mod.py"]["change"] == "modified" and len(files["src/mod.py"]["hunks"]) == 2
    assert files["src/new.py"]["change"] == "created"
    assert files["docs/old.md"]["change"] == "deleted"
    assert files["logo.bin"]["binary"] is True and files["logo.bin"]["hunks"] == []
    assert [d["path"] for d in p["denied"]] == ["AGENTS.md"]
    assert p["denied"][0]["rule"].startswith("invariant:")
    assert "AGENTS.md" not in files
    edit = p["edit"]
    mod_uri, agents_uri, logo_uri = (uri(ws(client) / n) for n in ("src/mod.py", "AGENTS.md", "logo.bin"))
    if client.caps == "visual-studio-code":  # type: ignore[attr-defined]
        dc = edit["documentChanges"]
        kinds = {(c.get("kind"), (c.get("uri") or c["textDocument"]["uri"]).rsplit("/", 1)[1]) for c in dc}
        assert ("create", "new.py") in kinds and ("delete", "old.md") in kinds and (None, "mod.py") in kinds
        mod_edit = next(c for c in dc if "textDocument" in c and c["textDocument"]["uri"] == mod_uri)
        assert [e["newText"] for e in mod_edit["edits"]] == ["line two\n", "line eighteen\n"]
        assert mod_edit["edits"][0]["range"] == {
            "start": {"line": 1, "character": 0},
            "end": {"line": 2, "character": 0},
        }
        assert edit["changeAnnotations"]["review"]["needsConfirmation"] is True
        assert edit["changeAnnotations"]["auto"]["needsConfirmation"] is False
        build = next(c for c in dc if c.get("kind") == "create" and c["uri"].endswith("/build.sh"))
        assert build["annotationId"] == "review" and files["build.sh"]["decision"] == "review"
        assert all(agents_uri not in str(c) and logo_uri not in str(c) for c in dc)
    else:  # Neovim: no documentChanges -> plain changes, text edits of modified files only
        assert "documentChanges" not in edit or edit["documentChanges"] is None
        assert [e["newText"] for e in edit["changes"][mod_uri]] == ["line two\n", "line eighteen\n"]
        assert agents_uri not in edit["changes"] and logo_uri not in edit["changes"]


async def test_evidence_and_code_lens(client: LanguageClient) -> None:
    run_id = run_of(client)["id"]
    ev = await command(client, "airlock.getEvidence", {"runId": run_id})
    assert ev["policy"]["snapshot"] and any(r["rule"].startswith("invariant:") for r in ev["rules"])
    assert any(e["kind"] == "run.proposed" for e in ev["timeline"])
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri(ws(client) / "src/mod.py")))
    )
    assert lenses is not None
    titles = [lens.command.title for lens in lenses if lens.command]
    assert titles == ["Accept", "Reject", "Diff"] * 2
    assert sorted({lens.range.start.line for lens in lenses}) == [1, 17]
    diff = await command(client, "airlock.diff", {"runId": run_id, "path": "src/mod.py"})
    assert "+line two" in diff["diff"]


async def test_per_hunk_approval_lands_exactly_the_chosen_hunk(client: LanguageClient) -> None:
    run_id = run_of(client)["id"]
    p = await command(client, "airlock.getProposal", {"runId": run_id})
    first, second = (h["id"] for h in next(f for f in p["files"] if f["path"] == "src/mod.py")["hunks"])
    before = len(notes(client, "airlock/proposal"))
    result = await command(client, "airlock.approve", {"runId": run_id, "hunks": {"src/mod.py": [first]}})
    assert result["applied"] == ["src/mod.py"] and result["state"] == "proposed"
    assert (ws(client) / "src/mod.py").read_text() == apply_hunks(MOD, PROPOSED_MOD, {first})
    pushed = await wait_until(lambda: len(notes(client, "airlock/proposal")) > before and last_proposal(client, run_id))
    mod = next(f for f in pushed["files"] if f["path"] == "src/mod.py")
    assert [h["state"] for h in mod["hunks"]] == ["accepted", "pending"]
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri(ws(client) / "src/mod.py")))
    )
    assert lenses is not None and {lens.range.start.line for lens in lenses} == {17}
    await command(client, "airlock.reject", {"runId": run_id, "hunks": {"src/mod.py": [second]}})
    assert (ws(client) / "src/mod.py").read_text() == apply_hunks(MOD, PROPOSED_MOD, {first})
    p = await command(client, "airlock.getProposal", {"runId": run_id})
    assert next(f for f in p["files"] if f["path"] == "src/mod.py")["state"] == "accepted"
    assert client.airlock.apply_edits == []  # type: ignore[attr-defined]


async def test_unsaved_buffer_conflicts(client: LanguageClient) -> None:
    run_id = run_of(client)["id"]
    lib = ws(client) / "src/lib.py"
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri(lib), language_id="python", version=1, text="X = 1\n")
        )
    )
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri(lib), version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text="X = 1  # unsaved\n")],
        )
    )
    err = await rpc_error(client, "airlock.approve", {"runId": run_id, "paths": ["src/lib.py", "src/new.py"]})
    assert err.code == -32030 and err.data["paths"] == ["src/lib.py"]
    assert lib.read_text() == "X = 1\n" and not (ws(client) / "src/new.py").exists()  # nothing written
    await wait_until(lambda: any("src/lib.py" in m.message and "conflicted" in m.message for m in client.messages))
    p = await command(client, "airlock.getProposal", {"runId": run_id})
    assert next(f for f in p["files"] if f["path"] == "src/lib.py")["state"] == "conflicted"
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri(lib)))
    )


async def test_live_edit_seen_by_the_watcher_conflicts(client: LanguageClient) -> None:
    run_id = run_of(client)["id"]
    (ws(client) / "src/watched.py").write_text("W = 'edited by a person'\n")
    hit = await wait_until(
        lambda: [n for n in notes(client, "airlock/runStatus") if n["runId"] == run_id and n.get("conflicts")],
        timeout=10,
        what="runStatus with conflicts",
    )
    assert hit[-1]["conflicts"] == ["src/watched.py"]
    p = await command(client, "airlock.getProposal", {"runId": run_id})
    assert next(f for f in p["files"] if f["path"] == "src/watched.py")["state"] == "conflicted"


async def test_approve_rest_reject_conflicts_then_undo(client: LanguageClient) -> None:
    run_id = run_of(client)["id"]
    result = await command(client, "airlock.approve", {"runId": run_id})
    assert set(result["applied"]) >= {"src/new.py", "docs/old.md", "logo.bin"}
    assert (ws(client) / "src/new.py").exists() and not (ws(client) / "docs/old.md").exists()
    assert (ws(client) / "logo.bin").read_bytes() == b"\x89PNG\x00\x01"
    result = await command(client, "airlock.reject", {"runId": run_id})
    assert result["state"] == "applied"
    assert (ws(client) / "AGENTS.md").read_text() == "be nice\n"
    result = await command(client, "airlock.undo", {"runId": run_id})
    assert result["state"] == "undone"
    assert (ws(client) / "src/mod.py").read_text() == MOD
    assert (ws(client) / "docs/old.md").exists() and not (ws(client) / "src/new.py").exists()


async def _wait_running(client: LanguageClient, run_id: str) -> None:
    await wait_until(lambda: "running" in states_of(client, run_id), what="running")


async def test_kill_stop_and_cancel(client: LanguageClient) -> None:
    a = await command(client, "airlock.runTask", {"agent": "bot", "prompt": "sleep 30"})
    await _wait_running(client, a["runId"])
    await command(client, "airlock.killRun", {"runId": a["runId"]})
    await wait_until(lambda: "killed" in states_of(client, a["runId"]), what="killed")
    await wait_until(lambda: any(a["runId"] in m.message and "killed" in m.message for m in client.messages))
    b = await command(client, "airlock.runTask", {"agent": "bot", "prompt": "sleep 30"})
    await _wait_running(client, b["runId"])
    await command(client, "airlock.stopRun", {"runId": b["runId"]})
    await wait_until(lambda: "stopped" in states_of(client, b["runId"]), what="stopped")
    c = await command(client, "airlock.runTask", {"agent": "bot", "prompt": "sleep 30"})
    await _wait_running(client, c["runId"])
    client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=f"airlock-run-{c['runId']}"))
    await wait_until(lambda: "stopped" in states_of(client, c["runId"]), what="stopped by cancel")


async def test_stop_and_kill_answer_with_the_final_state(client: LanguageClient) -> None:
    """stopRun / killRun answer once the run has ended (an agent that ignores SIGTERM is stopped
    after the grace); the loop keeps serving meanwhile; `wait: false` answers at once."""
    stubborn = "trap '' TERM; echo trapped; sleep 30"
    a = await command(client, "airlock.runTask", {"agent": "bot", "prompt": stubborn})
    await _wait_running(client, a["runId"])
    await asyncio.sleep(1)  # the container started and bash set its trap
    t0 = time.monotonic()
    stopping = asyncio.ensure_future(command(client, "airlock.stopRun", {"runId": a["runId"]}))
    runs = await command(client, "airlock.listRuns", {})  # answered while the stop waits in a thread
    assert a["runId"] in json.dumps(runs) and not stopping.done()
    assert await stopping == {"runId": a["runId"], "state": "stopped"}
    assert time.monotonic() - t0 >= 1  # the grace (1 s) passed: SIGTERM was ignored

    b = await command(client, "airlock.runTask", {"agent": "bot", "prompt": stubborn})
    await _wait_running(client, b["runId"])
    now = await command(client, "airlock.killRun", {"runId": b["runId"], "wait": False})
    assert now["runId"] == b["runId"] and now["state"] in {"running", "killed"}
    await wait_until(lambda: "killed" in states_of(client, b["runId"]), what="killed")

    c = await command(client, "airlock.runTask", {"agent": "bot", "prompt": stubborn})
    await _wait_running(client, c["runId"])
    assert await command(client, "airlock.killRun", {"runId": c["runId"]}) == {"runId": c["runId"], "state": "killed"}
    err = await rpc_error(client, "airlock.stopRun", {"runId": c["runId"], "wait": "soon"})
    assert "`wait`" in str(err)


async def test_run_status_samples_while_running(client: LanguageClient) -> None:
    r = await command(client, "airlock.runTask", {"agent": "bot", "prompt": "sleep 4"})
    await wait_until(lambda: "proposed" in states_of(client, r["runId"]) or "applied" in states_of(client, r["runId"]))
    running = [n for n in notes(client, "airlock/runStatus") if n["runId"] == r["runId"] and n["state"] == "running"]
    assert len(running) >= 2  # the state change and at least one sample
    assert all({"elapsedS", "cpuPct", "memBytes", "outputBytes", "tokens"} <= set(n) for n in running)
    assert any(n["memBytes"] > 0 for n in running)


async def test_agents(client: LanguageClient) -> None:
    agents = await command(client, "airlock.listAgents", {})
    assert "bot" in [a["agent"] for a in agents]
    before = len(notes(client, "airlock/agentStatus"))
    released = await command(client, "airlock.releaseAgent", {"agent": "bot"})
    assert released["quarantined"] is False
    await wait_until(lambda: len(notes(client, "airlock/agentStatus")) > before, what="agentStatus")


async def test_policy_reload_and_expiry(client: LanguageClient) -> None:
    r = await command(client, "airlock.runTask", {"agent": "bot", "prompt": "echo hi > hello.txt"})
    await wait_until(lambda: "proposed" in states_of(client, r["runId"]), what="proposed")
    policy = ws(client) / "policies.toml"
    policy.write_text(POLICY + "\n[defaults\n")
    await wait_until(lambda: any("invalid" in m.message and "last good" in m.message for m in client.messages))
    policy.write_text(POLICY + "\n[defaults]\nproposal_ttl_s = 1\n")
    await wait_until(lambda: any("policy reloaded" in m.message for m in client.messages), what="reload message")
    await wait_until(lambda: "expired" in states_of(client, r["runId"]), timeout=10, what="expired")
    await wait_until(lambda: (last_proposal(client, r["runId"]) or {}).get("state") == "expired", timeout=5)
    assert not (ws(client) / "hello.txt").exists()


async def test_the_agents_own_account_streams_live_escaped(client: LanguageClient) -> None:
    prompt = "echo one; sleep 1; echo two; printf '\\033]0;pwned\\007three\\n'; printf 'no end'"
    r = await command(client, "airlock.runTask", {"agent": "bot", "prompt": prompt})

    def shown() -> str:
        return "".join(n["text"] for n in notes(client, "airlock/runOutput") if n["runId"] == r["runId"])

    await wait_until(lambda: "one\n" in shown(), what="the first line while the run goes on")
    assert "two" not in shown() and "proposed" not in states_of(client, r["runId"])  # live, not at the end
    await wait_until(lambda: "no end" in shown(), what="the rest")
    assert shown() == "one\ntwo\n\\x1b]0;pwned\\x07three\nno end\n"  # a terminal never sees the escape


async def test_every_payload_is_its_wire_model(client: LanguageClient) -> None:
    """Everything the module's runs made the server send, and each command's answer, is exactly its
    model in airlockd.protocol (the source of the editors' generated types): no key missing, none
    unknown, and dumping the model gives back the same JSON."""
    sent = {
        "airlock/runStatus": protocol.RunStatus,
        "airlock/agentStatus": protocol.AgentStatus,
        "airlock/proposal": protocol.Proposal,
        "airlock/runOutput": protocol.RunOutput,
    }
    for method, model in sent.items():
        got = notes(client, method)
        assert got, f"no {method} was sent"
        for payload in got:
            assert model.model_validate(payload).wire() == payload, method
    conflicted = [n for n in notes(client, "airlock/runStatus") if "conflicts" in n]
    assert conflicted and all(n["conflicts"] for n in conflicted)  # absent, never null or empty
    hunk_states = {h["state"] for p in notes(client, "airlock/proposal") for f in p["files"] for h in f["hunks"]}
    assert {"pending", "accepted", "rejected"} <= hunk_states

    run_id = run_of(client)["id"]
    answers: list[tuple[type[BaseModel], Any]] = [
        (protocol.Proposal, await command(client, "airlock.getProposal", {"runId": run_id})),
        (protocol.Evidence, await command(client, "airlock.getEvidence", {"runId": run_id})),
        (protocol.DiffResult, await command(client, "airlock.diff", {"runId": run_id})),
        (protocol.AgentInfo, await command(client, "airlock.releaseAgent", {"agent": "bot"})),
    ]
    answers += [(protocol.RunSummary, s) for s in await command(client, "airlock.listRuns", {})]
    answers += [(protocol.AgentInfo, a) for a in await command(client, "airlock.listAgents", {})]
    for model, payload in answers:
        assert model.model_validate(payload).wire() == payload, model.__name__
