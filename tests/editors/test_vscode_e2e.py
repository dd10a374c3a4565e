"""The VS Code extension (editors/vscode) end to end in real VS Code: code-server (VS Code served on
loopback) with the packaged .vsix installed, driven by Playwright through Debian's chromium, against
the real `airlockd serve` and the real Docker engine.

From the command palette a task runs a scripted agent that changes two lines of a file; the status
bar goes through running to reviewing; the diff opens; one hunk is accepted with its CodeLens; the
file on disk then has that hunk and not the other, and the editor shows the disk's text. Every step
is saved as a screenshot: into docs/img/vscode-*.png (the pictures of docs/editors.md) when
AIRLOCK_UPDATE_SCREENSHOTS=1, else beside the test's temporary files (so a test run leaves the
work tree clean)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
EXT = REPO / "editors" / "vscode"
VSIX = EXT / "out" / "airlockd.vsix"
SHOTS = REPO / "docs" / "img"
ENSURE = REPO / "scripts" / "ensure-code-server.sh"

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

POLICY = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    [agents.bot.limits]
    wall_time_s = 120
    grace_s = 1
    memory_mb = 256
    """
)
MOD = "".join(f"line {i}\n" for i in range(1, 21))
# a few seconds of work first, so the status bar can be seen running
PROMPT = "sleep 6; sed -i 's/^line 2$/line two/; s/^line 18$/line eighteen/' src/mod.py"
ACCEPTED = MOD.replace("line 2\n", "line two\n", 1)

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
USER_SETTINGS = {
    "security.workspace.trust.enabled": False,
    "workbench.startupEditor": "none",
    "workbench.tips.enabled": False,
    "workbench.enableExperiments": False,
    "extensions.autoCheckUpdates": False,
    "extensions.autoUpdate": False,
    "extensions.ignoreRecommendations": True,
    "update.mode": "none",
    "telemetry.telemetryLevel": "off",
    "chat.disableAIFeatures": True,
    "window.commandCenter": False,
    "editor.minimap.enabled": False,
    "workbench.colorTheme": "Default Light Modern",
    "files.autoSave": "off",
    "workbench.secondarySideBar.defaultVisibility": "hidden",
    "diffEditor.useInlineViewWhenSpaceIsLimited": False,
}


@pytest.fixture(scope="module")
def code_server() -> str:
    """The code-server launcher (Node 24 + code-server + chromium, installed into a cache once)."""
    out = subprocess.run(["bash", str(ENSURE)], capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    launcher = out.stdout.strip().splitlines()[-1]
    assert Path(launcher).exists(), launcher
    return launcher


@pytest.fixture(scope="module")
def vsix() -> Path:
    if not VSIX.exists():  # `make vscode` builds it; a lone pytest run builds it here
        subprocess.run(["make", "-C", str(REPO), "vscode"], check=True, timeout=900)
    return VSIX


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(launcher: str, vsix: Path, ws: Path, home: Path) -> Iterator[str]:
    data, exts = home / "data", home / "extensions"
    (data / "User").mkdir(parents=True)
    settings = {**USER_SETTINGS, "airlockd.interpreter": [sys.executable]}
    (data / "User" / "settings.json").write_text(json.dumps(settings, indent=2))
    # machine-overridable settings (the daemon's command) are read from the machine's settings when
    # the extension host is remote, as code-server's is
    (data / "Machine").mkdir()
    (data / "Machine" / "settings.json").write_text(json.dumps({"airlockd.interpreter": [sys.executable]}))
    base = [launcher, "--user-data-dir", str(data), "--extensions-dir", str(exts)]
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config")}
    installed = subprocess.run(
        [*base, "--install-extension", str(vsix)], capture_output=True, text=True, env=env, timeout=120
    )
    assert "successfully installed" in installed.stdout, installed.stdout + installed.stderr
    port = _free_port()
    log = (home / "code-server.log").open("w")
    proc = subprocess.Popen(
        [
            *base,
            "--auth",
            "none",
            "--bind-addr",
            f"127.0.0.1:{port}",
            "--disable-telemetry",
            "--disable-update-check",
            "--disable-workspace-trust",
            "--disable-getting-started-override",
            str(ws),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "healthz", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((home / "code-server.log").read_text()[-3000:]) from None
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def make_workspace(root: Path) -> Path:
    ws = root / "project"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "mod.py").write_text(MOD)
    (ws / "policies.toml").write_text(POLICY)
    return ws


def shot(page: Any, name: str, where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(where / f"vscode-{name}.png"))


def status_text(page: Any) -> str:
    item = page.locator("#airlockd\\.airlockd-vscode\\.airlockd\\.status, [id$='airlockd.status']").first
    return str(item.inner_text(timeout=1000)).strip() if item.count() else ""


def wait_status(page: Any, pattern: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            seen = status_text(page)
        if re.search(pattern, seen):
            return seen
        page.wait_for_timeout(200)
    raise AssertionError(f"status bar never matched {pattern!r}; last: {seen!r}")


def palette(page: Any, command: str) -> None:
    page.keyboard.press("F1")
    box = page.locator(".quick-input-widget input")
    box.wait_for(state="visible")
    box.fill(">" + command)
    page.locator(".quick-input-list .monaco-list-row", has_text=command).first.wait_for()


def test_run_review_accept_in_code_server(_image: None, code_server: str, vsix: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    if not shutil.which("chromium") and not Path("/usr/bin/chromium").exists():
        pytest.fail("chromium is missing: scripts/ensure-code-server.sh installs it")
    ws = make_workspace(tmp_path)
    shots = SHOTS if os.environ.get("AIRLOCK_UPDATE_SCREENSHOTS") else tmp_path / "screenshots"
    with serving(code_server, vsix, ws, tmp_path / "home") as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS, headless=True)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        try:
            page.goto(f"{url}?folder={ws}")
            page.locator(".monaco-workbench").wait_for(timeout=90_000)
            wait_status(page, r"^airlock$", timeout=90)  # the daemon answered: idle

            # 1. run a task from the command palette: agent picker, then the prompt
            palette(page, "Airlock: Run Agent Task")
            shot(page, "1-palette", shots)
            page.keyboard.press("Enter")
            page.locator(".quick-input-list .monaco-list-row", has_text="bot").first.wait_for()
            page.keyboard.press("Enter")
            page.locator(".quick-input-widget input").wait_for(state="visible")
            page.wait_for_timeout(300)
            page.keyboard.type(PROMPT)
            shot(page, "2-prompt", shots)
            page.keyboard.press("Enter")

            # 2. the status bar follows the run, then counts what waits for review
            running = wait_status(page, r"bot (staging|running)", timeout=60)
            with contextlib.suppress(AssertionError):  # a resource sample: memory above zero
                running = wait_status(page, r"bot running .*CPU \d+% · [1-9][\d.]* [KMG]?B/", timeout=15)
            page.wait_for_timeout(600)
            shot(page, "3-running", shots)
            reviewing = wait_status(page, r"2 hunks in 1 file", timeout=120)
            assert (ws / "src" / "mod.py").read_text() == MOD, "nothing lands before the person accepts"

            # 3. the diff: the file against the read-only proposed side
            palette(page, "Airlock: Open Diff")
            page.keyboard.press("Enter")
            page.locator(".monaco-diff-editor").first.wait_for(timeout=30_000)
            page.locator(".monaco-diff-editor .view-line", has_text="line eighteen").first.wait_for(timeout=30_000)
            page.wait_for_timeout(800)
            shot(page, "4-diff", shots)

            # 4. the file itself: pending hunks decorated, "Accept | Reject | Diff" above each
            explorer = page.locator(".explorer-folders-view .monaco-list-row")
            explorer.filter(has_text=re.compile(r"^\s*src\s*$")).first.click()
            explorer.filter(has_text="mod.py").first.click()
            lens = page.locator(".codelens-decoration a", has_text="Accept")
            lens.first.wait_for(timeout=30_000)
            page.wait_for_timeout(500)
            shot(page, "5-lenses", shots)
            lens.first.click()  # the hunk at line 2

            # 5. accepted: on disk that hunk and not the other; the editor shows the disk's text
            deadline = time.monotonic() + 30
            while (ws / "src" / "mod.py").read_text() != ACCEPTED and time.monotonic() < deadline:
                time.sleep(0.2)
            assert (ws / "src" / "mod.py").read_text() == ACCEPTED
            wait_status(page, r"1 hunk in 1 file", timeout=30)
            page.locator(".editor-instance .view-line", has_text="line two").first.wait_for(timeout=30_000)
            page.wait_for_timeout(800)
            shot(page, "6-accepted", shots)
            assert running and reviewing
        except BaseException:
            with contextlib.suppress(Exception):
                page.screenshot(path=str(tmp_path / "failure.png"))
            raise
        finally:
            browser.close()
