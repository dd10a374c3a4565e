"""A fork server for the processes that carry runs, so a run does not pay for Python's start-up.

The daemon carries each run in a process of its own (`runs/carrier.py`), so copying, hashing and
the container's watch never compete with its event loop for the interpreter. Starting that process
costs about 0.3 s before it does anything (the interpreter, then importing pydantic, the Docker SDK
and airlockd), as much as a whole `docker run` of a no-op container. The launcher pays it once: the
daemon starts `python -m airlockd.runs.launcher` beside itself, which imports everything a run
needs and then forks one run process per request.

Protocol, over a `SOCK_SEQPACKET` socket pair (one message per datagram): the daemon sends
`{"id": N, "argv": [...]}` with three descriptors attached (`SCM_RIGHTS`): the run process's
stdin, stdout and stderr. The launcher forks; the child makes them its 0, 1 and 2 and runs
`carrier.main(argv)`; the launcher answers `{"id": N, "pid": P}` and, when the child ends,
`{"id": N, "exit": CODE}` (a signal's death is `-SIGNUM`, as `subprocess` reports it).

The launcher is single-threaded (it forks, so no other thread may hold a lock at that moment):
it waits with `select` on the socket and one `pidfd` per child. The daemon's side (`Launcher`)
looks like `asyncio.subprocess.Process` to its caller (`stdin`, `stdout`, `stderr`, `wait()`,
`pid`). When the launcher cannot start or dies, `spawn` returns None and the daemon starts a
plain process as before. The launcher ends when the daemon's end of the socket closes; its
children (runs in flight) are not its to stop: they carry on and are reconciled like any run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import select
import signal
import socket
import sys
from pathlib import Path

from airlockd.interpreter import module_command

log = logging.getLogger(__name__)

_MAX_MSG = 1 << 16
MODULE = "airlockd.runs.launcher"  # `python -m MODULE`: the launcher process


# -- the launcher process -------------------------------------------------------------------------


def _warm(workspace: Path) -> None:
    """Import what a run process needs and probe what it would probe, so each fork has it."""
    import docker  # noqa: F401

    import airlockd.sandbox.docker  # noqa: F401  (the service imports it when asked)
    from airlockd.pathmatch import matcher
    from airlockd.policy import load_policy
    from airlockd.runs import carrier  # noqa: F401  (and with it the service)
    from airlockd.sandbox import enginepaths, image
    from airlockd.staging import overlay
    from airlockd.state import StateDir

    with contextlib.suppress(Exception):  # a run process probes again, and says what fails
        overlay.unavailable(StateDir.for_workspace(workspace).root)
    with contextlib.suppress(Exception):  # the engine: its API version, kind, whether it sees our paths
        enginepaths.learn(image.image_tag())
    with contextlib.suppress(Exception):  # its patterns checked and its matchers made, for each fork
        policy = load_policy(workspace).policy
        matcher(policy.withhold.patterns, anywhere=True)
        matcher(policy.defaults.protected_files)


def serve(fd: int, workspace: Path) -> int:
    """`python -m airlockd.runs.launcher --fd FD`: fork a run process per request on socket FD
    until it closes."""
    _warm(workspace)
    sock = socket.socket(fileno=fd)
    children: dict[int, tuple[int, int]] = {}  # pidfd -> (request id, pid)
    while True:
        ready, _, _ = select.select([sock.fileno(), *children], [], [])
        for pidfd in [r for r in ready if r != sock.fileno()]:
            rid, pid = children.pop(pidfd)
            os.close(pidfd)
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            with contextlib.suppress(OSError):
                sock.send(json.dumps({"id": rid, "exit": code}).encode())
        if sock.fileno() not in ready:
            continue
        try:
            msg, fds, _, _ = socket.recv_fds(sock, _MAX_MSG, 3)
        except OSError:  # the daemon's end was closed with our answers unread: it is gone
            msg, fds = b"", []
        if not msg:
            for fd_ in fds:
                os.close(fd_)
            return 0  # the daemon is gone
        req = json.loads(msg)
        if len(fds) != 3:
            for fd_ in fds:
                os.close(fd_)
            with contextlib.suppress(OSError):
                sock.send(json.dumps({"id": req.get("id"), "error": "three descriptors expected"}).encode())
            continue
        pid = os.fork()
        if pid == 0:  # the run process
            sock.close()
            for pidfd in children:
                os.close(pidfd)
            _child(fds, [str(a) for a in req["argv"]])
        for fd_ in fds:
            os.close(fd_)
        children[os.pidfd_open(pid)] = (req["id"], pid)
        with contextlib.suppress(OSError):
            sock.send(json.dumps({"id": req["id"], "pid": pid}).encode())


def _child(fds: list[int], argv: list[str]) -> None:
    code = 70
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        from airlockd.runs.carrier import main

        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# -- the daemon's side ----------------------------------------------------------------------------


class Process:
    """A run process the launcher forked, as the daemon's code uses `asyncio.subprocess.Process`."""

    def __init__(self, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader, stderr: asyncio.StreamReader) -> None:
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.pid = 0
        self.returncode: int | None = None
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def wait(self) -> int:
        code = await self._exit
        self.returncode = code
        return code


class Launcher:
    """The daemon's handle on its launcher process."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.sock: socket.socket | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[int]] = {}
        self._running: dict[int, Process] = {}
        self._reader: asyncio.Task[None] | None = None

    async def start(self, workspace: Path) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *module_command(MODULE, "--workspace", str(workspace), "--fd", str(theirs.fileno())),
                pass_fds=(theirs.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,  # the daemon's stdout may be its LSP channel
            )
        finally:
            theirs.close()
        mine.setblocking(False)
        self.sock = mine
        self._reader = asyncio.ensure_future(self._read())

    @property
    def alive(self) -> bool:
        return self.sock is not None and self.proc is not None and self.proc.returncode is None

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        assert self.sock is not None
        try:
            while True:
                msg = await loop.sock_recv(self.sock, _MAX_MSG)
                if not msg:
                    break
                reply = json.loads(msg)
                rid = reply.get("id")
                if "pid" in reply and rid in self._pending:
                    self._pending.pop(rid).set_result(int(reply["pid"]))
                elif "exit" in reply and rid in self._running:
                    proc = self._running.pop(rid)
                    if not proc._exit.done():
                        proc._exit.set_result(int(reply["exit"]))
                elif "error" in reply and rid in self._pending:
                    self._pending.pop(rid).set_exception(OSError(reply["error"]))
        except (OSError, ValueError) as exc:
            log.warning("launcher: its socket failed: %s", exc)
        finally:
            self._lost()

    def _lost(self) -> None:
        """The launcher is gone: what waits on it learns so (a run in flight carries on alone)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(OSError("the launcher ended"))
        self._pending.clear()
        for proc in self._running.values():
            if not proc._exit.done():
                proc._exit.set_result(-1)
        self._running.clear()

    async def spawn(self, argv: list[str]) -> Process | None:
        """A run process for `airlockd ARGV` forked by the launcher; None if it cannot."""
        if not self.alive:
            return None
        loop = asyncio.get_running_loop()
        pipes = [os.pipe() for _ in range(3)]
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        mine = [pipes[0][1], pipes[1][0], pipes[2][0]]
        rid = next(self._ids)
        fut: asyncio.Future[int] = loop.create_future()
        self._pending[rid] = fut
        try:
            assert self.sock is not None
            socket.send_fds(self.sock, [json.dumps({"id": rid, "argv": argv}).encode()], theirs)
        except OSError as exc:
            self._pending.pop(rid, None)
            for fd in theirs + mine:
                os.close(fd)
            log.warning("launcher: cannot hand it a run: %s", exc)
            return None
        for fd in theirs:
            os.close(fd)
        stdout, stderr = asyncio.StreamReader(), asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdout), os.fdopen(mine[1], "rb", 0))
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stderr), os.fdopen(mine[2], "rb", 0))
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(loop), os.fdopen(mine[0], "wb", 0)
        )
        stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        proc = Process(stdin, stdout, stderr)
        self._running[rid] = proc
        try:
            proc.pid = await fut
        except OSError:
            self._running.pop(rid, None)
            stdin.close()
            return None
        return proc

    async def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None and self.proc.returncode is None:
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def argv_for(workspace: Path, run_id: str) -> list[str]:
    """What the daemon asks of a run process (the same with or without the launcher: without,
    `python -m airlockd.runs.carrier ARGV`)."""
    from airlockd.runs.carrier import argv_for

    return argv_for(workspace, run_id, events=True, values_on_stdin=True)


def main(argv: list[str] | None = None) -> int:
    """`python -m airlockd.runs.launcher --workspace W --fd FD` (the daemon starts it)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m " + MODULE)
    p.add_argument("--workspace", required=True)
    p.add_argument("--fd", type=int, required=True)
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="airlockd: %(levelname)s %(name)s: %(message)s"
    )
    return serve(args.fd, Path(args.workspace))


if __name__ == "__main__":
    sys.exit(main())
