"""How the daemon is reached: TCP only on loopback and only with the token from the state dir; one
`serve` per workspace. No container engine needed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import make_workspace


def _serve(ws: Path, state: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "AIRLOCK_STATE_DIR": str(state)}
    return subprocess.Popen(
        [sys.executable, "-m", "airlockd", "--workspace", str(ws), "serve", *extra],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _state_root(state: Path) -> Path:
    return next(p for p in state.iterdir() if p.is_dir())


def _wait_info(state: Path, key: str = "port") -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            info = json.loads((_state_root(state) / "serve.json").read_text())
            if info.get(key) or key == "pid":
                return info  # type: ignore[no-any-return]
        except (StopIteration, OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError("serve.json never appeared")


def _frame(msg: dict[str, Any]) -> bytes:
    body = json.dumps(msg).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _read(sock: socket.socket) -> dict[str, Any] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
    while len(rest) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        rest += chunk
    return json.loads(rest[:length])  # type: ignore[no-any-return]


def _initialize(token: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {"processId": None, "rootUri": None, "capabilities": {}}
    if token is not None:
        params["initializationOptions"] = {"token": token}
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}


@pytest.fixture
def tcp_server(tmp_path: Path) -> Any:
    ws = make_workspace(tmp_path)
    state = tmp_path / "state"
    proc = _serve(ws, state, "--tcp", "127.0.0.1:0")
    try:
        info = _wait_info(state)
        yield ws, state, info, proc
    finally:
        proc.kill()
        proc.wait()


def test_tcp_without_the_token_is_refused(tcp_server: Any) -> None:
    _, state, info, proc = tcp_server
    token_file = _state_root(state) / "serve.token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    for first in (_initialize(None), _initialize("wrong-token"), {"jsonrpc": "2.0", "id": 7, "method": "shutdown"}):
        with socket.create_connection(("127.0.0.1", info["port"]), timeout=10) as s:
            s.sendall(_frame(first))
            reply = _read(s)
            assert reply is not None and reply["error"]["code"] == -32001
            assert "unauthorized" in reply["error"]["message"]
            assert s.recv(1) == b""  # closed
    assert proc.poll() is None  # a refused client does not end the daemon
    with socket.create_connection(("127.0.0.1", info["port"]), timeout=10) as s:
        s.sendall(_frame(_initialize(token_file.read_text().strip())))
        reply = _read(s)
        assert reply is not None
        assert "airlock.runTask" in reply["result"]["capabilities"]["executeCommandProvider"]["commands"]


def test_tcp_refuses_a_non_loopback_host(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    proc = _serve(ws, tmp_path / "state", "--tcp", "0.0.0.0:0")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert b"only loopback is allowed" in err


def test_a_second_serve_on_the_same_workspace_is_refused(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    state = tmp_path / "state"
    first = _serve(ws, state)
    try:
        info = _wait_info(state, "pid")
        assert info["pid"] == first.pid
        second = _serve(ws, state)
        out, err = second.communicate(timeout=30)
        assert second.returncode == 2
        assert b"already serving the workspace" in err and str(first.pid).encode() in err
        assert out == b""  # nothing but the protocol ever goes to stdout
    finally:
        first.kill()
        first.wait()


def test_tcp_survives_any_first_header_and_a_non_ascii_token(tcp_server: Any) -> None:
    """Hostile first messages (a non-ASCII token, a huge Content-Length, an endless header line,
    a non-numeric length) are refused or dropped; the daemon stays up and serves a real client."""
    _, state, info, proc = tcp_server
    with socket.create_connection(("127.0.0.1", info["port"]), timeout=10) as s:
        s.sendall(_frame(_initialize("tøken-\u202e-\U0001f600")))
        reply = _read(s)
        assert reply is not None and reply["error"]["code"] == -32001
    for raw in (
        b"Content-Length: 99999999999999999999999\r\n\r\n{}",
        b"X-Junk: " + b"a" * 200_000 + b"\r\n\r\n",
        b"Content-Length: \xff\xfe12\r\n\r\n{}",
    ):
        with socket.create_connection(("127.0.0.1", info["port"]), timeout=10) as s:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)
            assert s.recv(1 << 16) == b""  # closed, unanswered
    assert proc.poll() is None
    token = (_state_root(state) / "serve.token").read_text().strip()
    with socket.create_connection(("127.0.0.1", info["port"]), timeout=10) as s:
        s.sendall(_frame(_initialize(token)))
        assert _read(s) is not None


def test_an_oversized_message_ends_the_session_cleanly(tcp_server: Any) -> None:
    """After authentication, a Content-Length over the cap closes the connection before any of the
    body is held (the sender need not send it), and the daemon ends as a session does."""
    _, state, info, proc = tcp_server
    token = (_state_root(state) / "serve.token").read_text().strip()
    with socket.create_connection(("127.0.0.1", info["port"]), timeout=10) as s:
        s.sendall(_frame(_initialize(token)))
        assert _read(s) is not None
        s.sendall(b"Content-Length: %d\r\n\r\n" % (1 << 40))
        s.settimeout(20)
        while s.recv(1 << 16):
            pass
    proc.wait(timeout=30)
    err = proc.stderr.read().decode()
    assert "over the cap" in err and "Traceback" not in err


def test_stdio_oversized_message_is_reported_not_hung(tmp_path: Path) -> None:
    ws = make_workspace(tmp_path)
    proc = _serve(ws, tmp_path / "state")
    assert proc.stdin is not None
    proc.stdin.write(b"Content-Length: %d\r\n\r\n" % (1 << 40))
    proc.stdin.flush()
    _, err = proc.communicate(timeout=30)
    assert b"over the cap" in err and b"Traceback" not in err
