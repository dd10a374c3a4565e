"""A real LSP client (pytest-lsp) against `airlockd serve --stdio`, once with VS Code's and once with
Neovim's capabilities. The client answers `workspace/applyEdit` (pytest-lsp has no default) and
records it: the server must never need it, since approvals land through the commit engine."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.uris import from_fs_path
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

POLICY = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    [agents.bot.limits]
    wall_time_s = 60
    grace_s = 1
    """
)

MOD = "".join(f"line {i}\n" for i in range(1, 21))


class Recorder:
    """What the server sent besides responses: our notifications and any applyEdit request."""

    def __init__(self) -> None:
        self.notes: dict[str, list[dict[str, Any]]] = {}
        self.apply_edits: list[Any] = []
        self.lens_refreshes = 0


def make_client() -> LanguageClient:
    from pytest_lsp.client import make_test_lsp_client

    client = make_test_lsp_client()
    rec = Recorder()
    client.airlock = rec  # type: ignore[attr-defined]

    @client.feature(types.WORKSPACE_APPLY_EDIT)
    def apply_edit(ls: LanguageClient, params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        rec.apply_edits.append(params)
        return types.ApplyWorkspaceEditResult(applied=False, failure_reason="the test client applies nothing")

    @client.feature(types.WORKSPACE_CODE_LENS_REFRESH)
    def code_lens_refresh(ls: LanguageClient, params: None) -> None:
        rec.lens_refreshes += 1

    for method in ("airlock/runStatus", "airlock/agentStatus", "airlock/proposal", "airlock/runOutput"):

        def handler(ls: LanguageClient, params: Any, method: str = method) -> None:
            rec.notes.setdefault(method, []).append(_plain(params))

        client.feature(method)(handler)
    return client


def _plain(value: Any) -> Any:
    """Notification params as plain JSON (pygls gives named tuples for unknown methods)."""
    if hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def make_workspace(root: Path) -> Path:
    ws = root / "project"
    (ws / "src").mkdir(parents=True)
    (ws / "docs").mkdir()
    (ws / "src" / "mod.py").write_text(MOD)
    (ws / "src" / "lib.py").write_text("X = 1\n")
    (ws / "src" / "watched.py").write_text("W = 1\n")
    (ws / "docs" / "old.md").write_text("old\n")
    (ws / "AGENTS.md").write_text("be nice\n")
    (ws / "policies.toml").write_text(POLICY)
    return ws


def uri(path: Path) -> str:
    return from_fs_path(str(path)) or ""


async def wait_until(pred: Callable[[], Any], timeout: float = 60, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def notes(client: LanguageClient, method: str) -> list[dict[str, Any]]:
    return client.airlock.notes.get(method, [])  # type: ignore[attr-defined,no-any-return]


async def command(client: LanguageClient, name: str, args: dict[str, Any] | None = None) -> Any:
    params = types.ExecuteCommandParams(command=name, arguments=[args] if args is not None else [])
    return await client.workspace_execute_command_async(params)


async def start_client(ws: Path, state: Path, caps: str) -> LanguageClient:
    env = {**os.environ, "AIRLOCK_STATE_DIR": str(state), "AIRLOCK_EXPIRY_CHECK_S": "0.5"}
    config = ClientServerConfig(
        server_command=[sys.executable, "-m", "airlockd", "--workspace", str(ws), "serve", "--stdio"],
        client_factory=make_client,
        server_env=env,
    )
    client = await config.start()
    assert isinstance(client, LanguageClient)
    result = await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities(caps),
            root_uri=uri(ws),
            workspace_folders=[types.WorkspaceFolder(uri=uri(ws), name="project")],
        )
    )
    client.init_result = result  # type: ignore[attr-defined]
    return client


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["visual-studio-code", "neovim"])
async def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, _image: None
) -> AsyncIterator[Any]:
    root = tmp_path_factory.mktemp(f"lsp-{request.param}")
    ws = make_workspace(root)
    state = root / "state"
    c = await start_client(ws, state, request.param)
    c.ws, c.state, c.caps = ws, state, request.param  # type: ignore[attr-defined]
    yield c
    await c.shutdown_session()
    await c.stop()
