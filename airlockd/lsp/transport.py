"""How `airlockd serve` is reached: stdio (default) or TCP on loopback with a bearer token, and the
one-writer lock that keeps a second daemon off the same workspace.

TCP authentication: the token lives in the state directory (`serve.token`, mode 0600, created on
first use). The client's FIRST message must be `initialize` with
`initializationOptions: {"token": "<token>"}`; it is checked (constant time) before the language
server sees any byte. Anything else gets one JSON-RPC error and the connection is closed. Only one
authenticated client at a time; when it disconnects the daemon ends, like a stdio session.
`serve.json` in the state directory says where the daemon listens ({host, port, pid}).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import os
import re
import secrets
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from airlockd.errors import UsageError
from airlockd.state import StateDir

log = logging.getLogger(__name__)

AUTH_TIMEOUT_S = 10.0
MAX_FIRST_MESSAGE = 1 << 20
UNAUTHORIZED = -32001
_LENGTH = re.compile(rb"^Content-Length: (\d+)\r\n$", re.IGNORECASE)


# -- one writer per workspace ---------------------------------------------------------------------


def acquire_lock(state: StateDir) -> FileLock:
    """Hold the workspace's serve lock for the life of the process, or refuse clearly."""
    state.ensure()
    lock = FileLock(str(state.root / "serve.lock"), timeout=0)
    info = state.root / "serve.json"
    try:
        lock.acquire()
    except Timeout:
        who = ""
        try:
            d = json.loads(info.read_text())
            who = f" (pid {d.get('pid')}" + (f", tcp {d['host']}:{d['port']}" if d.get("port") else ", stdio") + ")"
        except (OSError, ValueError):
            pass
        raise UsageError(
            f"another `airlockd serve`{who} is already serving the workspace {state.workspace}",
            hint="use that daemon (one writer per workspace), or stop it first",
        ) from None
    write_info(state, None, None)
    return lock


def write_info(state: StateDir, host: str | None, port: int | None) -> None:
    path = state.root / "serve.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "host": host, "port": port, "workspace": str(state.workspace)}))
    os.replace(tmp, path)


# -- token ----------------------------------------------------------------------------------------


def token_path(state: StateDir) -> Path:
    return state.root / "serve.token"


def ensure_token(state: StateDir) -> str:
    """The bearer token, created (0600, atomically) on first use; refused if others can read it."""
    path = token_path(state)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        st = os.lstat(path)
        if st.st_mode & 0o077 or st.st_uid != os.getuid():
            raise UsageError(
                f"the token file {path} is readable by others (mode {st.st_mode & 0o777:o})",
                hint=f"delete it (a new one is made) or `chmod 600 {path}`",
            ) from None
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


def check_loopback(host: str) -> None:
    """Refuse any address that is not loopback: the daemon commits to the workspace."""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise UsageError(f"cannot resolve {host!r}: {exc}") from None
    addrs = {info[4][0] for info in infos}
    if not addrs or not all(ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addrs):
        raise UsageError(
            f"refusing to listen on {host} ({', '.join(sorted(map(str, addrs)))}): only loopback is allowed",
            hint="use --tcp 127.0.0.1:PORT (or localhost); reach it from elsewhere through an SSH tunnel",
        )


def parse_hostport(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"--tcp expects HOST:PORT, got {value!r}")
    host = host.strip("[]") or "127.0.0.1"
    check_loopback(host)
    return host, int(port)


# -- TCP ------------------------------------------------------------------------------------------


async def _read_message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """(raw headers, body) of one LSP message."""
    headers = b""
    length = None
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionError("closed before a message")
        headers += line
        if len(headers) > 8192:
            raise ValueError("headers too long")
        if m := _LENGTH.match(line):
            length = int(m.group(1))
        if line in (b"\r\n", b"\n"):
            break
    if length is None or length > MAX_FIRST_MESSAGE:
        raise ValueError("missing or oversized Content-Length")
    return headers, await reader.readexactly(length)


def authorized(body: bytes, token: str) -> tuple[bool, Any]:
    """Whether the first message is `initialize` carrying the token; and its id (to answer)."""
    try:
        msg = json.loads(body)
    except ValueError:
        return False, None
    if not isinstance(msg, dict):
        return False, None
    opts = (msg.get("params") or {}).get("initializationOptions") if isinstance(msg.get("params"), dict) else None
    given = opts.get("token") if isinstance(opts, dict) else None
    ok = msg.get("method") == "initialize" and isinstance(given, str) and hmac.compare_digest(given, token)
    return ok, msg.get("id")


class _Replay:
    """The stream reader with the already-read first message put back in front of it."""

    def __init__(self, first: bytes, reader: asyncio.StreamReader) -> None:
        self.buf, self.reader = first, reader

    async def readline(self) -> bytes:
        if self.buf:
            i = self.buf.find(b"\n")
            if i >= 0:
                line, self.buf = self.buf[: i + 1], self.buf[i + 1 :]
                return line
        line = self.buf + await self.reader.readline()
        self.buf = b""
        return line

    async def readexactly(self, n: int) -> bytes:
        if self.buf:
            take, self.buf = self.buf[:n], self.buf[n:]
            return take + (await self.reader.readexactly(n - len(take)) if len(take) < n else b"")
        return await self.reader.readexactly(n)


def _refuse(writer: asyncio.StreamWriter, msg_id: Any, why: str) -> None:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": msg_id, "error": {"code": UNAUTHORIZED, "message": why, "data": {"error": "auth"}}}
    ).encode()
    writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)


def serve_tcp(server: Any, state: StateDir, host: str, port: int) -> None:
    """Serve one authenticated client over TCP on loopback; blocks until it disconnects."""
    from pygls.io_ import run_async

    token = ensure_token(state)
    stop_event = threading.Event()
    busy = asyncio.Lock()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            headers, body = await asyncio.wait_for(_read_message(reader), AUTH_TIMEOUT_S)
        except (ValueError, ConnectionError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.warning("refused %s: %s", peer, exc)
            writer.close()
            return
        ok, msg_id = authorized(body, token)
        if not ok or busy.locked():
            why = (
                "another client is connected"
                if ok
                else "unauthorized: send initialize with initializationOptions.token"
            )
            log.warning("refused %s: %s", peer, why)
            _refuse(writer, msg_id, why)
            await writer.drain()
            writer.close()
            return
        async with busy:
            server.protocol.set_writer(writer)
            await run_async(
                stop_event=stop_event,
                reader=_Replay(headers + body, reader),
                protocol=server.protocol,
                logger=log,
                error_handler=server.report_server_error,
            )
            stop_event.set()
            listening[0].close()

    async def main() -> None:
        listener = await asyncio.start_server(connection, host, port)
        listening.append(listener)
        bound = listener.sockets[0].getsockname()[1]
        write_info(state, host, bound)
        sys.stderr.write(f"airlockd: serving {state.workspace} on {host}:{bound}; token in {token_path(state)}\n")
        async with listener:
            with contextlib.suppress(asyncio.CancelledError):
                await listener.serve_forever()

    listening: list[asyncio.Server] = []
    try:
        asyncio.run(main())
    finally:
        server.shutdown()


# -- entry ----------------------------------------------------------------------------------------


class _AnsweredErrors(logging.Filter):
    """pygls logs every error answer with a traceback; an AirlockError answered to the client
    (refused admission, conflict, bad argument) is not a server fault: keep the log for real ones."""

    def filter(self, record: logging.LogRecord) -> bool:
        from pygls.exceptions import JsonRpcException, JsonRpcInternalError

        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, JsonRpcException) and not isinstance(exc, JsonRpcInternalError))


def serve(workspace: Path, tcp: str | None = None) -> int:
    """`airlockd serve`: take the workspace's lock, start the Service, serve until the client leaves.
    In stdio mode nothing but the protocol is ever written to stdout."""
    from airlockd.lsp.server import create_server
    from airlockd.service import Service

    logging.getLogger("pygls.protocol.json_rpc").addFilter(_AnsweredErrors())
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must never corrupt the protocol stream
    state = StateDir.for_workspace(workspace)
    hostport = parse_hostport(tcp) if tcp else None
    lock = acquire_lock(state)
    try:
        server = create_server(Service(workspace, actor="lsp").recover())  # recovery: once, at start-up
        if hostport:
            serve_tcp(server, state, *hostport)
        else:
            server.start_io(sys.stdin.buffer, stdout)
    finally:
        (state.root / "serve.json").unlink(missing_ok=True)
        lock.release()
    return 0
