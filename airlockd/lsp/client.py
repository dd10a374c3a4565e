"""The client side of the daemon's control socket (`control.py`, beside it), for the CLI and for a
daemon taking a workspace over: find the daemon that serves a workspace, or start one in the
background, and ask it to decide.

The standard library only: a command that goes to a warm daemon must not pay for importing
pydantic, the Docker SDK or pygls (that alone is 0.15 s, half a `docker run`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airlockd.interpreter import module_command

SOCKET_NAME = "control.sock"  # lsp/control.py
INFO_NAME = "serve.json"
START_TIMEOUT_S = float(os.environ.get("AIRLOCK_DAEMON_START_S", "60"))


class RemoteError(Exception):
    """An error the daemon answered: its JSON-RPC code, message and `data` (errors.py's shape)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


class DaemonGone(Exception):
    """The connection to the daemon closed (it ended, or handed the workspace over)."""


def daemon_policy() -> str:
    """`AIRLOCK_DAEMON`: `auto` (the default: use the daemon serving the workspace; a run starts
    one in the background when none does) or `off` (every command acts alone, in-process)."""
    value = os.environ.get("AIRLOCK_DAEMON", "auto").strip().lower()
    return "off" if value in ("off", "0", "no", "false") else "auto"


def _address(path: Path) -> tuple[str, int | None]:
    if len(os.fsencode(path)) < 100:
        return str(path), None
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)  # AF_UNIX paths stop at 107 bytes
    return f"/proc/self/fd/{fd}/{path.name}", fd


class Daemon:
    """One connection to a workspace's daemon: requests, and the notifications it was asked for."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.ids = 0
        self.notes: list[dict[str, Any]] = []

    @classmethod
    def connect(cls, state_root: Path) -> Daemon | None:
        """The daemon serving the workspace whose state is `state_root`, or None."""
        path = state_root / SOCKET_NAME
        if not os.path.exists(path):
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address, fd = _address(path)
        try:
            sock.connect(address)
        except OSError:  # a stale socket: its daemon is gone
            sock.close()
            return None
        finally:
            if fd is not None:
                os.close(fd)
        return cls(sock)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    # -- framing --------------------------------------------------------------------------------

    def _send(self, msg: dict[str, Any]) -> None:
        body = json.dumps(msg).encode()
        try:
            self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        except OSError as exc:
            raise DaemonGone(str(exc)) from None

    def _fill(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)
        try:
            chunk = self.sock.recv(1 << 16)
        except TimeoutError:
            raise
        except OSError as exc:
            raise DaemonGone(str(exc)) from None
        if not chunk:
            raise DaemonGone("the daemon closed the connection")
        self.buf += chunk

    def _next(self, timeout: float | None = None) -> dict[str, Any]:
        """The next message (TimeoutError when none came within `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            head, sep, rest = self.buf.partition(b"\r\n\r\n")
            if sep:
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(rest) >= length:
                    self.buf = rest[length:]
                    msg: dict[str, Any] = json.loads(rest[:length])
                    return msg
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left == 0.0:
                raise TimeoutError
            self._fill(left)

    # -- calls ----------------------------------------------------------------------------------

    def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self.ids += 1
        my_id = self.ids
        self._send({"jsonrpc": "2.0", "id": my_id, "method": method, "params": params or {}})
        while True:
            msg = self._next()
            if msg.get("id") != my_id:
                if "method" in msg:
                    self.notes.append(msg)
                continue
            if "error" in msg:
                err = msg["error"]
                raise RemoteError(int(err.get("code", -32603)), str(err.get("message", "")), err.get("data"))
            return msg.get("result")

    def command(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        return self.request("workspace/executeCommand", {"command": name, "arguments": [arguments or {}]})

    def subscribe(self, *methods: str) -> None:
        self.request("airlock/subscribe", {"methods": list(methods)})

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout: float | None = None) -> dict[str, Any]:
        """The first notification `match` accepts (earlier ones are dropped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while self.notes:
                note = self.notes.pop(0)
                if match(note):
                    return note
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            msg = self._next(left)
            if "method" in msg:
                self.notes.append(msg)


def info(state_root: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((state_root / INFO_NAME).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def wait_gone(state_root: Path, timeout: float = 30.0) -> None:
    """Return once no daemon holds the workspace's serve lock (one asked to leave has left), or
    after `timeout` (the next daemon then says who still holds it)."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(state_root / "serve.lock"))
    with contextlib.suppress(Timeout):
        lock.acquire(timeout=timeout)
        lock.release()


def start_background(workspace: Path, state_root: Path) -> Daemon:
    """Start `airlockd serve --background` for the workspace (it leaves when idle) and connect.
    It says on a pipe whether it serves or why it cannot (RemoteError with the error's data). When
    two commands race, both end up talking to the one that took the workspace's lock."""
    import select
    import subprocess

    state_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    log = state_root / "daemon.log"
    mine_r, theirs_w = os.pipe()
    try:
        with open(log, "ab") as log_file:
            proc = subprocess.Popen(
                module_command(
                    "airlockd", "--workspace", str(workspace), "serve", "--background", "--ready-fd", str(theirs_w)
                ),
                start_new_session=True,  # not ended with the terminal or the command that started it
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                pass_fds=(theirs_w,),
            )
    finally:
        os.close(theirs_w)
    try:
        said = b""
        deadline = time.monotonic() + START_TIMEOUT_S
        while b"\n" not in said and time.monotonic() < deadline:
            ready, _, _ = select.select([mine_r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(mine_r, 65536)
            if not chunk:
                break
            said += chunk
    finally:
        os.close(mine_r)
    try:
        doc = json.loads(said) if said.strip() else {}
    except ValueError:
        doc = {}
    if doc.get("ok") is False:
        err = doc.get("error") or {}
        lost_race = err.get("error") == "usage" and "already serving" in str(err.get("message"))
        daemon = _await_winner(state_root, deadline) if lost_race else None
        if daemon is not None:
            return daemon
        raise RemoteError(-32001, str(err.get("message", "the daemon could not start")), err)
    daemon = Daemon.connect(state_root)
    if daemon is None:
        code = proc.poll()
        why = f"exited with code {code}" if code is not None else "did not answer"
        raise DaemonGone(f"the background daemon {why}; see {log}")
    return daemon


def _await_winner(state_root: Path, deadline: float) -> Daemon | None:
    """Another command's daemon took the workspace first: it opens its socket once its service
    is up (a fraction of a second); wait for it, as long as that daemon lives."""
    delay = 0.005
    while time.monotonic() < deadline:
        daemon = Daemon.connect(state_root)
        if daemon is not None:
            return daemon
        pid = (info(state_root) or {}).get("pid")
        if not isinstance(pid, int) or not os.path.exists(f"/proc/{pid}"):
            return Daemon.connect(state_root)  # it is gone (or never said who it was): one last look
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    return None
