"""How `airlockd serve` is reached: stdio (default) or TCP on loopback with a bearer token, and the
one-writer lock that keeps a second daemon off the same workspace.

TCP authentication: the token lives in the state directory (`serve.token`, mode 0600, created on
first use). The client's FIRST message must be `initialize` with
`initializationOptions: {"token": "<token>"}`; it is checked (constant time) before the language
server sees any byte. Anything else gets one JSON-RPC error and the connection is closed. Only one
authenticated client at a time; when it disconnects the daemon ends, like a stdio session.
Every message after the first is capped too (`BoundedReader`: header lines, Content-Length): a
client that claims more ends its session before any of the body is held.
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
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout

from airlockd.enginehost import engine_host
from airlockd.errors import AirlockError, UsageError
from airlockd.state import StateDir

if TYPE_CHECKING:
    from airlockd.lsp.control import DaemonMode

log = logging.getLogger(__name__)

AUTH_TIMEOUT_S = 10.0
MAX_FIRST_MESSAGE = 1 << 20
# Every later message: a didOpen of a large file fits; a bigger claim ends the session before any
# of its body is read (LSP framing cannot skip a message it will not read).
MAX_MESSAGE = 64 << 20
MAX_HEADER_LINE = 8192
UNAUTHORIZED = -32001
_LENGTH = re.compile(rb"^Content-Length: (\d+)\r\n$", re.IGNORECASE)


# -- one writer per workspace ---------------------------------------------------------------------


def acquire_lock(state: StateDir, mode: DaemonMode) -> FileLock:
    """Hold the workspace's serve lock for the life of the process, or refuse clearly. A daemon
    started in the background by the CLI hands the workspace over to an editor's daemon."""
    state.ensure()
    lock = FileLock(str(state.root / "serve.lock"), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = _info(state)
        if mode == "background" or holder.get("mode") != "background" or not _hand_over(state):
            who = ""
            if holder:
                where = f"tcp {holder['host']}:{holder['port']}" if holder.get("port") else holder.get("mode", "stdio")
                who = f" (pid {holder.get('pid')}, {where})"
            raise UsageError(
                f"another `airlockd serve`{who} is already serving the workspace {state.workspace}",
                hint="use that daemon (one writer per workspace), or stop it first",
            ) from None
        try:  # the background daemon is leaving; its lock is ours as soon as it has left
            lock.acquire(timeout=HANDOVER_S)
        except Timeout:
            raise UsageError(
                f"the background daemon (pid {holder.get('pid')}) of {state.workspace} did not leave"
                f" within {HANDOVER_S:.0f} s",
                hint=f"stop it (kill {holder.get('pid')}) and start again",
            ) from None
    write_info(state, None, None, mode)
    return lock


HANDOVER_S = 30.0


def _info(state: StateDir) -> dict[str, Any]:
    try:
        doc = json.loads((state.root / "serve.json").read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _hand_over(state: StateDir) -> bool:
    """Ask the workspace's background daemon to leave; whether it agreed."""
    from airlockd.lsp.client import Daemon, DaemonGone, RemoteError

    daemon = Daemon.connect(state.root)
    if daemon is None:
        return False
    try:
        daemon.request("airlock/handover")
        return True
    except DaemonGone:  # it left before its answer was read
        return True
    except (RemoteError, OSError) as exc:
        log.warning("the background daemon did not hand over: %s", exc)
        return False
    finally:
        daemon.close()


def write_info(state: StateDir, host: str | None, port: int | None, mode: DaemonMode = "stdio") -> None:
    path = state.root / "serve.json"
    tmp = path.with_suffix(".tmp")
    doc = {
        "pid": os.getpid(),
        "mode": mode,
        "host": host,
        "port": port,
        "workspace": str(state.workspace),
        "engine": engine_host(),  # where its agents run: a command naming another is not served here
    }
    tmp.write_text(json.dumps(doc))
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
    # as bytes: compare_digest refuses str with non-ASCII characters (a TypeError, not a "no")
    ok = (
        msg.get("method") == "initialize"
        and isinstance(given, str)
        and hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode())
    )
    return ok, msg.get("id")


class OversizedMessage(ValueError):
    """A header line or a Content-Length over the transport's caps: the session ends."""


class BoundedReader:
    """The reader pygls' message loop gets, with the transport's caps: a header line longer than
    MAX_HEADER_LINE or a Content-Length over MAX_MESSAGE raises OversizedMessage before the line
    or body is held in memory. `readline(limit)`/`readexactly(n)` of the wrapped reader."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    async def readline(self) -> bytes:
        line: bytes = await self.reader.readline(MAX_HEADER_LINE + 1)
        if len(line) > MAX_HEADER_LINE:
            raise OversizedMessage(f"a header line longer than {MAX_HEADER_LINE} bytes")
        return line

    async def readexactly(self, n: int) -> bytes:
        if n > MAX_MESSAGE:
            raise OversizedMessage(f"a message of {n} bytes, over the cap of {MAX_MESSAGE}")
        data: bytes = await self.reader.readexactly(n)
        return data


class _Replay:
    """The stream reader with the already-read first message put back in front of it."""

    def __init__(self, first: bytes, reader: asyncio.StreamReader) -> None:
        self.buf, self.reader = first, reader

    async def readline(self, limit: int = MAX_HEADER_LINE + 1) -> bytes:
        if self.buf:
            i = self.buf.find(b"\n")
            if i >= 0:
                line, self.buf = self.buf[: i + 1], self.buf[i + 1 :]
                return line
        line = self.buf + await _stream_line(self.reader, limit)
        self.buf = b""
        return line

    async def readexactly(self, n: int) -> bytes:
        if self.buf:
            take, self.buf = self.buf[:n], self.buf[n:]
            return take + (await self.reader.readexactly(n - len(take)) if len(take) < n else b"")
        return await self.reader.readexactly(n)


async def _stream_line(reader: asyncio.StreamReader, limit: int) -> bytes:
    """A line of at most `limit` bytes (more: what was read, which the caller refuses)."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial  # the end of the stream
    except asyncio.LimitOverrunError:
        return await reader.read(limit)


class _StdinReader:
    """Standard input for the message loop, read in a worker thread, lines bounded."""

    def __init__(self, stdin: Any, pool: Any) -> None:
        self.stdin, self.pool = stdin, pool

    async def readline(self, limit: int) -> bytes:
        loop = asyncio.get_running_loop()
        line: bytes = await loop.run_in_executor(self.pool, self.stdin.readline, limit)
        return line

    async def readexactly(self, n: int) -> bytes:
        loop = asyncio.get_running_loop()
        data: bytes = await loop.run_in_executor(self.pool, self.stdin.read, n)
        return data


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
            try:
                await run_async(
                    stop_event=stop_event,
                    reader=BoundedReader(_Replay(headers + body, reader)),
                    protocol=server.protocol,
                    logger=log,
                    error_handler=server.report_server_error,
                )
            except OversizedMessage as exc:
                log.error("closing the connection from %s: it sent %s", peer, exc)
                writer.close()
            stop_event.set()
            listening[0].close()

    async def main() -> None:
        listener = await asyncio.start_server(connection, host, port)
        listening.append(listener)
        bound = listener.sockets[0].getsockname()[1]
        write_info(state, host, bound, "tcp")
        await _open_control(server, state, "tcp")
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


def serve(
    workspace: Path,
    tcp: str | None = None,
    *,
    background: bool = False,
    idle_s: float | None = None,
    ready_fd: int | None = None,
) -> int:
    """`airlockd serve`: take the workspace's lock, start the Service, serve until the client leaves
    (stdio, TCP) or, started in the background by the CLI, until idle or handed over. Every mode
    also listens on the control socket, where the CLI reaches it. In stdio mode nothing but the
    protocol is ever written to stdout."""
    from airlockd.lsp.server import create_server
    from airlockd.runs.service import Service

    logging.getLogger("pygls.protocol.json_rpc").addFilter(_AnsweredErrors())
    stdout = sys.stdout.buffer
    sys.stdout = sys.stderr  # a stray print must never corrupt the protocol stream
    state = StateDir.for_workspace(workspace)
    hostport = parse_hostport(tcp) if tcp else None
    mode: DaemonMode = "background" if background else "tcp" if hostport else "stdio"
    ready = _Ready(ready_fd)
    try:
        lock = acquire_lock(state, mode)
    except AirlockError as exc:
        ready.failed(exc)
        raise
    server = None
    try:
        try:
            server = create_server(Service(workspace, actor="lsp").recover())  # recovery: once, at start-up
        except AirlockError as exc:
            ready.failed(exc)
            raise
        if background:
            asyncio.run(_serve_background(server, state, IDLE_S if idle_s is None else idle_s, ready))
        elif hostport:
            serve_tcp(server, state, *hostport)
        else:
            _serve_stdio(server, state, sys.stdin.buffer, stdout)
    finally:
        if server is not None:
            server.service.close()
        for name in ("serve.json", "control.sock"):
            (state.root / name).unlink(missing_ok=True)
        lock.release()
    return 0


IDLE_S = float(os.environ.get("AIRLOCK_DAEMON_IDLE_S", "900"))


async def _open_control(server: Any, state: StateDir, mode: DaemonMode, on_handover: Any = None) -> Any:
    from airlockd.lsp.control import ControlServer, socket_path

    server.loop = asyncio.get_running_loop()
    control = ControlServer(server, socket_path(state.root), mode, on_handover)
    await control.start()
    server.control = control
    return control


def _serve_stdio(server: Any, state: StateDir, stdin: Any, stdout: Any) -> None:
    """pygls' stdio loop, with the control socket on the same event loop."""
    from pygls.io_ import StdoutWriter, run_async

    server._stop_event = stop_event = threading.Event()

    async def main() -> None:
        control = await _open_control(server, state, "stdio")
        server.protocol.set_writer(StdoutWriter(stdout))
        try:
            await run_async(
                stop_event=stop_event,
                reader=BoundedReader(_StdinReader(stdin, server.thread_pool)),
                protocol=server.protocol,
                logger=log,
                error_handler=server.report_server_error,
            )
        finally:
            await control.close()

    try:
        asyncio.run(main())
    except BrokenPipeError:
        log.error("the connection to the client is lost; shutting down")
    except OversizedMessage as exc:
        log.error("the client sent %s; the stream cannot be resynchronised, shutting down", exc)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.shutdown()


class _Ready:
    """The pipe a background daemon tells the command that started it whether it serves (`ok`)
    or why not (the error as JSON), so that command says what went wrong, not "see the log"."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def _say(self, doc: dict[str, Any]) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self.fd, json.dumps(doc).encode() + b"\n")
            os.close(self.fd)
        self.fd = None

    def ok(self) -> None:
        self._say({"ok": True, "pid": os.getpid()})

    def failed(self, exc: AirlockError) -> None:
        self._say({"ok": False, "error": exc.to_json()})


async def _serve_background(server: Any, state: StateDir, idle_s: float, ready: _Ready) -> None:
    """No editor: the control socket only. Leaves after `idle_s` without a client or a run it
    carries, on SIGTERM, or when an editor's daemon asks for the workspace (the runs it carries
    go on in their own processes and are followed by the next daemon)."""
    import signal

    from airlockd.lsp import watching

    leave = asyncio.Event()
    control = await _open_control(server, state, "background", leave.set)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, leave.set)
    server.start_upkeep()
    watching.start(server)
    ready.ok()
    log.info("serving %s in the background (leaves after %.0f s idle)", state.workspace, idle_s)
    try:
        while not leave.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(leave.wait(), min(2.0, max(idle_s, 0.05)))
            busy = (
                control.connections
                or server.run_processes
                or any(t.get_name().startswith("run ") for t in server.tasks)
            )
            if not busy and time.monotonic() - control.last_activity > idle_s:
                log.info("idle for %.0f s: leaving", idle_s)
                break
    finally:
        await control.close()
        await server.wind_down()
        for task in list(server.tasks):
            task.cancel()
        server.shutdown()
