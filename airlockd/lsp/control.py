"""The daemon's control socket: how the CLI (or any local tool of the same user) reaches the daemon
that serves a workspace, so both doors decide through the same code with the same state — the
editor's unsaved buffers, the live-edit watch, the warm mirror, the runs it carries.

A Unix socket in the workspace's state directory (`control.sock`, mode 0600, peers checked to be
this user by `SO_PEERCRED`), speaking JSON-RPC 2.0 with LSP's framing (`Content-Length`). Many
clients at once; each request is answered on its own connection. Methods:

- `workspace/executeCommand` `{command, arguments}`: the `airlock.*` commands of `lsp/commands.py`,
  the very handlers the editor calls, plus `airlock.getRun` (one run as `airlockd show --json`
  gives it). Errors carry the codes and `data` of `errors.py`.
- `airlock/hello`: `{pid, mode, workspace, version}`.
- `airlock/subscribe` `{methods: [...]}`: this connection is sent those notifications
  (`airlock/runStatus`, `airlock/agentStatus`, `airlock/progress`, `airlock/runDone`).
- `airlock/handover`: a background daemon leaves (an editor's daemon is taking the workspace);
  the runs it carries go on in their own processes. Refused by an editor's daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from airlockd.errors import AirlockError

if TYPE_CHECKING:
    from airlockd.lsp.server import AirlockServer

log = logging.getLogger(__name__)

SOCKET_NAME = "control.sock"
DaemonMode = Literal["stdio", "tcp", "background"]
MAX_MESSAGE = 16 << 20  # a command's arguments are small; a bigger claim is refused before reading it
MAX_HEADERS = 8192
DRAIN_S = 60.0  # how long a leaving daemon waits for the answers it owes (a commit, a stop's wait)
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INTERNAL = -32700, -32600, -32601, -32603


def socket_path(state_root: Path) -> Path:
    return state_root / SOCKET_NAME


def short_address(path: Path) -> tuple[str, int | None]:
    """An address `bind`/`connect` accept for `path` (AF_UNIX paths stop at 107 bytes): the path
    itself, or the same file named through an open descriptor of its directory (close it after)."""
    if len(os.fsencode(path)) < 100:
        return str(path), None
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{path.name}", fd


def frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, default=str).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


async def read_message(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """One framed message; None at the end of the stream. ValueError for a malformed frame."""
    length = None
    seen = 0
    while True:
        line = await reader.readline()
        if not line:
            return None
        seen += len(line)
        if seen > MAX_HEADERS:
            raise ValueError("headers too long")
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            if not value.strip().isdigit():
                raise ValueError("bad Content-Length")
            length = int(value.strip())
    if length is None or length > MAX_MESSAGE:
        raise ValueError(f"missing or oversized Content-Length (at most {MAX_MESSAGE} bytes)")
    msg = json.loads(await reader.readexactly(length))
    if not isinstance(msg, dict):
        raise ValueError("a message must be a JSON object")
    return msg


def _peer_uid(writer: asyncio.StreamWriter) -> int | None:
    sock = writer.get_extra_info("socket")
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    return int(struct.unpack("3i", raw)[1])


class Connection:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.methods: set[str] = set()

    def send(self, message: dict[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(frame(message))


class ControlServer:
    """The control socket of one daemon; lives on its event loop."""

    def __init__(
        self, ls: AirlockServer, path: Path, mode: DaemonMode, on_handover: Callable[[], None] | None = None
    ) -> None:
        self.ls, self.path, self.mode = ls, path, mode
        self.on_handover = on_handover
        self.connections: set[Connection] = set()
        self.last_activity = time.monotonic()
        self._server: asyncio.AbstractServer | None = None
        self.answering: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a dead daemon's socket: we hold the workspace's lock now
        address, fd = short_address(self.path)
        old = os.umask(0o077)
        try:
            self._server = await asyncio.start_unix_server(self._connection, address, limit=MAX_HEADERS * 2)
        finally:
            os.umask(old)
            if fd is not None:
                os.close(fd)
        os.chmod(self.path, 0o600)

    async def close(self, drain_s: float = DRAIN_S) -> None:
        """Stop listening; answer what was asked already (a decision under way is finished and its
        answer sent, within `drain_s`), then close every connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        pending = [t for t in self.answering if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=drain_s)
            for conn in list(self.connections):
                with contextlib.suppress(ConnectionError, OSError):
                    await conn.writer.drain()
        for conn in list(self.connections):
            conn.writer.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def broadcast(self, method: str, params: Any) -> None:
        """Send a notification to every connection subscribed to it (on the loop)."""
        for conn in list(self.connections):
            if method in conn.methods:
                conn.send({"jsonrpc": "2.0", "method": method, "params": params})

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if _peer_uid(writer) not in (os.getuid(), None):
            log.warning("control: refused a connection from another user")
            writer.close()
            return
        conn = Connection(writer)
        self.connections.add(conn)
        try:
            while True:
                try:
                    msg = await read_message(reader)
                except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                    conn.send(_error(None, PARSE_ERROR, f"malformed message: {exc}"))
                    break
                if msg is None:
                    break
                self.last_activity = time.monotonic()
                # each request is its own task: a long decision never holds the others
                task = self.ls.spawn(self._answer(conn, msg), name=f"control {msg.get('method')}")
                self.answering.add(task)
                task.add_done_callback(self.answering.discard)
        except (ConnectionError, OSError):
            pass
        finally:
            self.connections.discard(conn)
            self.last_activity = time.monotonic()
            writer.close()

    async def _answer(self, conn: Connection, msg: dict[str, Any]) -> None:
        msg_id = msg.get("id")
        try:
            result = await self._dispatch(conn, str(msg.get("method")), msg.get("params") or {})
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "result": result}
        except AirlockError as exc:
            data = self.ls.service.redactor.value(exc.to_json())
            message = f"{exc.message} (fix: {exc.hint})" if exc.hint else exc.message
            reply = _error(msg_id, exc.rpc_code, self.ls.service.redactor.text(message), data)
        except _RpcError as exc:
            reply = _error(msg_id, exc.code, exc.message, exc.data)
        except Exception as exc:
            code = getattr(exc, "code", None)
            if isinstance(code, int):  # pygls' JsonRpcException (an invalid argument)
                reply = _error(msg_id, code, str(getattr(exc, "message", exc)), getattr(exc, "data", None))
            else:
                log.exception("control: %s failed", msg.get("method"))
                reply = _error(msg_id, INTERNAL, f"internal error ({type(exc).__name__}); see the daemon's log")
        if msg_id is not None:
            conn.send(reply)
        self.last_activity = time.monotonic()

    async def _dispatch(self, conn: Connection, method: str, params: Any) -> Any:
        from airlockd import __version__
        from airlockd.lsp import commands
        from airlockd.runs.service import acting_as

        if not isinstance(params, dict):
            raise _RpcError(INVALID_REQUEST, "params must be a JSON object")
        if method == "workspace/executeCommand":
            name = params.get("command")
            handler = commands.COMMANDS.get(str(name)) or CONTROL_COMMANDS.get(str(name))
            if handler is None:
                raise _RpcError(METHOD_NOT_FOUND, f"unknown command {name!r}")
            arguments = params.get("arguments") or []
            if not isinstance(arguments, list):
                raise _RpcError(INVALID_REQUEST, "arguments must be a list")
            with acting_as("cli"):
                return await handler(self.ls, *arguments)
        if method == "airlock/hello":
            return {
                "pid": os.getpid(),
                "mode": self.mode,
                "workspace": str(self.ls.service.workspace),
                "version": __version__,
            }
        if method == "airlock/subscribe":
            methods = params.get("methods") or []
            conn.methods.update(str(m) for m in methods)
            return {"methods": sorted(conn.methods)}
        if method == "airlock/handover":
            if self.mode != "background" or self.on_handover is None:
                raise _RpcError(INVALID_REQUEST, f"this daemon serves an editor ({self.mode}); it does not hand over")
            asyncio.get_running_loop().call_soon(self.on_handover)
            return {"leaving": True, "runs": sorted(self.ls.run_processes)}
        raise _RpcError(METHOD_NOT_FOUND, f"unknown method {method!r}")


class _RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def _error(msg_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": msg_id, "error": err}


# -- commands only the control socket offers ------------------------------------------------------


def run_document(ls: AirlockServer, run_id: str) -> dict[str, Any]:
    """One run as `airlockd run/show --json` prints it (masked; blocking: reads the store)."""
    from airlockd.redact import scrub

    rec = ls.service.store.get_run(run_id)
    doc = rec.model_dump(mode="json")
    doc["timeline"] = doc.pop("transitions", [])
    return dict(scrub(doc))


async def get_run(ls: AirlockServer, *arguments: Any) -> dict[str, Any]:
    from airlockd.lsp.args import parse
    from airlockd.protocol import RunArgs

    a = parse(RunArgs, arguments)
    return await ls.call(run_document, ls, a.runId)


CONTROL_COMMANDS = {"airlock.getRun": get_run}
