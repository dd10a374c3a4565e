"""An agent in the real container proposes secrets; they are denied and shown nowhere.

The agent builds, inside the container, a value of the workspace's withheld `.env` (from pieces:
the prompt never holds it whole, else admission refuses it), a PEM private key, and a GitHub token
used as a file name, and writes them into the staging copy. Each change is `deny` by
`secret-in-content` / `secret-in-name` with a reason that names the detector, `approve` of it is
refused, the workspace never receives it, and the raw values appear in no output: every CLI
command a person runs (plain and `--json`, alone and through the daemon), the whole LSP transcript
of an editor connected to the daemon (its proposals, notifications and replies), the daemon's
stderr, and every file under the state directory. The value written as an exact search misses it
(base64, split across lines) is denied too, and no form of it is shown.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from airlockd.redact import Redactor

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

POLICY = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    [agents.bot.limits]
    wall_time_s = 60
    grace_s = 1

    [[rules]]
    match = ["src/**"]
    action = "auto"
    reason = "sources are the agent's to change"
    """
)
WITHHELD = "Zq8-withheld-value-xK31-for-the-db"
KEY_BODY = base64.b64encode(bytes(range(7, 103)) * 2).decode()
TOKEN = "ghp" + "_" + "Xk9mQ2vR7tL4wP8sN1bY6cF3hJ5dG0aZ2eU7"
RAW = (WITHHELD, KEY_BODY, TOKEN)


def _halves(name: str, value: str) -> str:
    """Shell that sets $name to `value` without the prompt holding it whole."""
    h = len(value) // 2
    return f'{name}1={shlex.quote(value[:h])}; {name}2={shlex.quote(value[h:])}; {name}="${name}1${name}2"'


AGENT_SCRIPT = "; ".join(
    [
        _halves("V", WITHHELD),
        _halves("K", KEY_BODY),
        _halves("T", TOKEN),
        "B=BEGIN; E=END",
        'printf \'A = 1\\nPASSWORD = "%s"\\n\' "$V" > src/config.py',  # a withheld value, modified file
        'printf -- "keep this\\n-----$B PRIVATE KEY-----\\n%s\\n-----$E PRIVATE KEY-----\\n" "$K" > src/notes.txt',
        'echo hi > "src/$T.txt"',  # a token in the name
        "echo 'OK = True' > src/ok.py",  # clean
    ]
)


def make_workspace(root: Path) -> Path:
    ws = root / "project"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "config.py").write_text("A = 1\n")
    (ws / ".env").write_text(f"DB_PASSWORD={WITHHELD}\n")
    (ws / "policies.toml").write_text(POLICY)
    return ws


def _cli(ws: Path, out: list[str], *argv: str, daemon: bool = False) -> subprocess.CompletedProcess[str]:
    head = [sys.executable, "-m", "airlockd", "--workspace", str(ws), *([] if daemon else ["--no-daemon"])]
    proc = subprocess.run([*head, *argv], capture_output=True, text=True, timeout=180, env=dict(os.environ))
    out += [proc.stdout, proc.stderr]
    return proc


def _check_denied(files: list[dict[str, Any]]) -> None:
    by = {f["path"]: f for f in files}
    assert by["src/config.py"]["rule"] == "invariant:secret-in-content", by
    assert "a value of a withheld file" in by["src/config.py"]["reason"]
    assert by["src/notes.txt"]["rule"] == "invariant:secret-in-content"
    assert "private-key" in by["src/notes.txt"]["reason"]
    (named,) = [f for f in files if f["rule"] == "invariant:secret-in-name"]
    assert "github-token" in named["reason"]
    assert all(f["decision"] == "deny" for f in files if f["path"] != "src/ok.py")
    assert by["src/ok.py"]["decision"] == "auto"


def _read_commands(ws: Path, out: list[str], run_id: str, export_dir: Path, daemon: bool) -> None:
    """Every reading command a person runs, plain and --json; the refused approval of a deny."""
    for argv in (
        ["runs"],
        ["show", run_id],
        ["diff", run_id],
        ["audit"],
        ["audit", "--run", run_id],
        ["audit", "--export", str(export_dir / f"audit-{len(out)}.jsonl")],
    ):
        assert _cli(ws, out, *argv, daemon=daemon).returncode == 0, out[-1]
        assert _cli(ws, out, "--json", *argv, daemon=daemon).returncode == 0, out[-1]
    for as_json in ([], ["--json"]):
        refused = _cli(ws, out, *as_json, "approve", run_id, "--path", "src/notes.txt", daemon=daemon)
        assert refused.returncode != 0 and "invariant:secret-in-content" in refused.stdout + refused.stderr
        # errors that would echo a secret back: a path or a run id that is one
        assert _cli(ws, out, *as_json, "approve", run_id, "--path", WITHHELD, daemon=daemon).returncode != 0
        assert _cli(ws, out, *as_json, "reject", run_id, "--path", f"src/{TOKEN}.txt", daemon=daemon).returncode != 0
        assert _cli(ws, out, *as_json, "show", TOKEN, daemon=daemon).returncode != 0


def _assert_never_shown(texts: list[str], *roots: Path) -> None:
    for i, text in enumerate(texts):
        for raw in RAW:
            assert raw not in text, (i, text[:3000])
    for root in roots:
        for p in root.rglob("*"):
            assert TOKEN not in str(p), p
            if not p.is_file() or p.is_symlink():
                continue
            data = p.read_bytes()
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
            for raw in RAW:
                assert raw.encode() not in data, p


def _workspace_clean(ws: Path) -> None:
    assert (ws / "src" / "config.py").read_text() == "A = 1\n"
    assert not (ws / "src" / "notes.txt").exists()
    assert not any(TOKEN in p.name for p in ws.rglob("*"))


def test_a_proposal_carrying_secrets_is_denied_from_the_cli(
    _state_dir: Path, tmp_path: Path, stager: str | None
) -> None:
    ws = make_workspace(tmp_path)
    out: list[str] = []
    proc = _cli(ws, out, "--json", "run", "--agent", "bot", "--wait", AGENT_SCRIPT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = json.loads(proc.stdout)
    assert run["state"] == "proposed"
    _check_denied(run["files"])
    exports = tmp_path / "exports"
    exports.mkdir()
    _read_commands(ws, out, run["id"], exports, daemon=False)
    approved = _cli(ws, out, "--json", "approve", run["id"])  # everything pending: the clean file only
    assert approved.returncode == 0, approved.stderr
    assert (ws / "src" / "ok.py").exists()
    _workspace_clean(ws)
    _assert_never_shown(out, _state_dir, exports)


# The withheld value as an exact search misses it, built in the container from its halves: the
# base64 of a whole .env line written to a file, the value split across lines in another, both
# also said on stdout.
ENCODING_SCRIPT = "; ".join(
    [
        _halves("V", WITHHELD),
        'printf "%s" "DB_PASSWORD=$V" | base64 -w0 > src/blob.txt',
        'printf \'P = """%s\\n%s"""\\n\' "$V1" "$V2" > src/split.py',
        'printf "%s" "$V" | base64',
        'printf "%s\\n%s\\n" "$V1" "$V2"',
        "echo 'OK = True' > src/ok.py",
    ]
)


def test_a_proposal_carrying_an_encoded_value_is_denied_and_masked(_state_dir: Path, tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    out: list[str] = []
    proc = _cli(ws, out, "--json", "run", "--agent", "bot", "--wait", ENCODING_SCRIPT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = json.loads(proc.stdout)
    by = {f["path"]: f for f in run["files"]}
    for path in ("src/blob.txt", "src/split.py"):
        assert (by[path]["decision"], by[path]["rule"]) == ("deny", "invariant:secret-in-content"), by
        assert "a value of a withheld file" in by[path]["reason"]
    assert by["src/ok.py"]["decision"] == "auto"
    for argv in (["show", run["id"]], ["diff", run["id"]]):
        assert _cli(ws, out, *argv).returncode == 0 and _cli(ws, out, "--json", *argv).returncode == 0
    (log,) = _state_dir.glob(f"*/runs/{run['id']}/output.log")
    said = log.read_text()
    assert said.count("[REDACTED]") == 2, said  # the agent said both, masked
    known = Redactor([WITHHELD])
    assert known.known_in(base64.b64encode(WITHHELD.encode()).decode())
    for text in [*out, said]:
        assert not known.known_in(text), text[:3000]
    for p in _state_dir.rglob("*"):
        if p.is_file() and not p.is_symlink():
            data = p.read_bytes()
            data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
            assert not known.known_in(data.decode("utf-8", "replace")), p


def test_a_proposal_carrying_secrets_is_denied_through_the_daemon_and_the_editor(
    _state_dir: Path, tmp_path: Path
) -> None:
    asyncio.run(_through_the_daemon(_state_dir, tmp_path))


async def _through_the_daemon(state: Path, tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    wire = tmp_path / "wire"
    wire.mkdir()
    transcript, stderr = wire / "server-to-client.jsonrpc", wire / "server.stderr"
    # the server's whole output to the editor, as it went over the pipe
    serve = shlex.join([sys.executable, "-m", "airlockd", "--workspace", str(ws), "serve", "--stdio"])
    notes: list[tuple[str, Any]] = []

    def make_client() -> LanguageClient:
        from pytest_lsp.client import make_test_lsp_client

        client = make_test_lsp_client()
        for method in ("airlock/runStatus", "airlock/agentStatus", "airlock/proposal"):

            def heard(ls: LanguageClient, params: Any, method: str = method) -> None:
                notes.append((method, params))

            client.feature(method)(heard)
        return client

    config = ClientServerConfig(
        server_command=["bash", "-c", f"{serve} 2>{shlex.quote(str(stderr))} | tee {shlex.quote(str(transcript))}"],
        server_env={**os.environ, "AIRLOCK_STATE_DIR": str(state)},
        client_factory=make_client,
    )
    client = await config.start()
    assert isinstance(client, LanguageClient)
    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            root_uri=ws.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=ws.as_uri(), name="project")],
        )
    )
    out: list[str] = []
    exports = tmp_path / "exports"
    exports.mkdir()
    try:

        async def command(name: str, args: dict[str, Any]) -> Any:
            params = types.ExecuteCommandParams(command=name, arguments=[args])
            return await client.workspace_execute_command_async(params)

        # door 1: the CLI, as the daemon's client
        argv = ["--json", "run", "--agent", "bot", "--wait", AGENT_SCRIPT]
        proc = await asyncio.to_thread(_cli, ws, out, *argv, daemon=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        by_cli = json.loads(proc.stdout)
        _check_denied(by_cli["files"])
        await asyncio.to_thread(_read_commands, ws, out, by_cli["id"], exports, True)

        # door 2: the editor
        started = await command("airlock.runTask", {"agent": "bot", "prompt": AGENT_SCRIPT})
        run_id = started["runId"]
        for _ in range(1200):
            got = await command("airlock.getProposal", {"runId": run_id})
            if got and got.get("state") == "proposed":
                break
            await asyncio.sleep(0.1)
        proposal = await command("airlock.getProposal", {"runId": run_id})
        assert {d["path"] for d in proposal["denied"]} >= {"src/config.py", "src/notes.txt"}
        _check_denied([*proposal["files"], *({**d, "decision": "deny"} for d in proposal["denied"])])
        edit = json.dumps(proposal["edit"])
        assert "notes.txt" not in edit and "config.py" not in edit  # denied: never in the edit
        with pytest.raises(Exception, match="secret-in-content"):
            await command("airlock.approve", {"runId": run_id, "paths": ["src/notes.txt"]})
        for bad in ({"runId": run_id, "paths": [WITHHELD]}, {"runId": run_id, TOKEN: 1}, {"runId": TOKEN}):
            with pytest.raises(Exception):  # noqa: B017 - the error's text is what the transcript check reads
                await command("airlock.approve", bad)
        await command("airlock.getEvidence", {"runId": run_id})
        await command("airlock.listRuns", {})
        await command("airlock.approve", {"runId": run_id})  # the clean file lands
        assert any(m == "airlock/proposal" for m, _ in notes)
    finally:
        await client.shutdown_session()
        await client.stop()
    _workspace_clean(ws)
    out += [transcript.read_text(), stderr.read_text(), repr(notes)]
    said = transcript.read_text()
    assert "airlock/proposal" in said and "secret-in-content" in said  # the transcript is the real one
    _assert_never_shown(out, state, exports)
