"""A holder's standing service: its `statvfs` and its upper layer's dump without an exec each.

An `exec` in a container costs 30-70 ms on this machine (runc sets up a process in the
container's namespaces and cgroup), and a run whose capped upper layer the engine holds
(sandbox/layers.py) needs two at its end: the growth measured once more when the agent's
container has ended, then the upper layer streamed back. A run's whole no-op costs about 0.3 s,
so these two were a third of it. Instead, when a holder is made, one exec starts `SERVE` (the
image's python3) with its standard streams on the engine API's hijacked connection, which this
process keeps: each request is then a line written to that connection and frames read back.

Requests (one at a time; a JSON line): `{"op": "statvfs"}` answers the capped filesystem's
figures; `{"op": "dump", "path": ..., "opaque": ...}` runs `upperdump.DUMP` in the service
itself (its output framed); `{"op": "write", "name": ..., "data": base64}` makes a new file of
that name at the top of the mount, root's and read-only (the agent's standard input). Frames:
kind (1 byte: 0 data, 1 end), length (4 bytes), data; the end frame's data is JSON
`{"ok": bool, "err": str}`. The service ends when its connection does (this process closed it,
or died): the holder and its volume are untouched by that.

It only makes the same reads faster: every request it cannot answer (none started, the
connection broken, a reader that stopped half way through a dump) is answered by an exec, as
before, and the service is dropped. Nothing in it is the agent's: the agent's container never
sees the holder's processes or this connection.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import socket
import struct
import threading
from collections.abc import Iterator
from typing import Any

import docker.errors
from docker.utils.socket import frames_iter

from airlockd.staging import upperdump

log = logging.getLogger(__name__)

HEADER = struct.Struct(">BI")
DATA, END = 0, 1
MAX_FRAME = 1 << 20
READY_S = 10

SERVE = r"""
import json, os, struct, sys
H = struct.Struct('>BI')
DUMP = sys.argv[1]
MOUNT = sys.argv[2]
raw = sys.stdout.buffer
class Framed:
    def write(self, data):
        view = memoryview(data)
        while len(view):
            part = view[:1 << 20]
            raw.write(H.pack(0, len(part)) + bytes(part))
            view = view[len(part):]
        return len(data)
    def flush(self):
        raw.flush()
class Out:
    buffer = Framed()
def end(ok, err=''):
    data = json.dumps({'ok': ok, 'err': err[-2000:]}).encode()
    raw.write(H.pack(1, len(data)) + data)
    raw.flush()
end(True)
for line in sys.stdin.buffer:
    try:
        req = json.loads(line)
        if req['op'] == 'statvfs':
            s = os.statvfs(MOUNT)
            Framed().write(json.dumps([s.f_blocks, s.f_bfree, s.f_frsize, s.f_files, s.f_ffree]).encode())
            end(True)
        elif req['op'] == 'write':
            import base64
            name = req['name']
            if '/' in name or name in ('', '.', '..'):
                raise ValueError('not a plain name')
            data = base64.b64decode(req['data'])
            fd = os.open(os.path.join(MOUNT, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
            try:
                view = memoryview(data)
                while len(view):
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            end(True)
        elif req['op'] == 'dump':
            sys.argv = ['dump', req['path'], req['opaque']]
            old, sys.stdout = sys.stdout, Out()
            try:
                exec(DUMP, {'__name__': 'dump'})
            finally:
                sys.stdout = old
            end(True)
        else:
            end(False, 'unknown request')
    except SystemExit:
        raise
    except BaseException as exc:
        end(False, type(exc).__name__ + ': ' + str(exc))
"""


class Broken(Exception):
    """The service cannot answer: the caller asks by an exec instead."""


class HolderService:
    """The connection to one holder's service."""

    def __init__(self, client: Any, container: str, mount: str) -> None:
        self.client, self.container, self.mount = client, container, mount
        self._lock = threading.Lock()  # one request at a time
        self._sock: Any = None
        self._raw: Any = None
        self._frames: Iterator[tuple[int, bytes]] | None = None
        self._buf = bytearray()
        self.closed = False

    def start(self) -> HolderService:
        try:
            exec_id = self.client.api.exec_create(
                self.container, ["python3", "-I", "-c", SERVE, upperdump.DUMP, self.mount], user="0:0",
                stdin=True, stdout=True, stderr=False,
            )["Id"]  # fmt: skip
            self._sock = self.client.api.exec_start(exec_id, socket=True)
        except docker.errors.DockerException as exc:
            raise Broken(f"the holder's service did not start in {self.container}: {exc}") from None
        self._raw = getattr(self._sock, "_sock", self._sock)
        self._raw.settimeout(READY_S)
        self._frames = frames_iter(self._sock, tty=False)
        self._end()  # its first frame says it reads requests
        self._raw.settimeout(None)
        return self

    def statvfs(self) -> tuple[int, int, int, int, int]:
        """(blocks, free blocks, fragment size, inodes, free inodes) of the holder's mount."""
        with self._lock:
            self._ask({"op": "statvfs"})
            data = b"".join(self._data())
        blocks, free, frsize, files, ffree = (int(x) for x in json.loads(data))
        return blocks, free, frsize, files, ffree

    def write(self, name: str, data: bytes) -> None:
        """A new file `name` at the top of the holder's mount holding `data`: root's, mode 0444."""
        with self._lock:
            self._ask({"op": "write", "name": name, "data": base64.b64encode(data).decode()})
            for _ in self._data():
                pass

    def dump(self, path: str, opaque: str) -> Iterator[bytes]:
        """`upperdump.DUMP` of `path`. A reader that stops before the end drops the service
        (what is still coming could not be told from the next answer)."""
        with self._lock:
            self._ask({"op": "dump", "path": path, "opaque": opaque})
            whole = False
            try:
                yield from self._data()
                whole = True
            finally:
                if not whole:
                    self.close()

    def _ask(self, request: dict[str, str]) -> None:
        if self.closed:
            raise Broken("closed")
        try:
            self._raw.sendall(json.dumps(request).encode() + b"\n")
        except OSError as exc:
            self.close()
            raise Broken(str(exc)) from None

    def _data(self) -> Iterator[bytes]:
        """The data frames of one answer, up to its end frame (an error there is Broken)."""
        while True:
            kind, data = self._frame()
            if kind == DATA:
                yield data
            else:
                answer = json.loads(data)
                if not answer.get("ok"):
                    raise Broken(f"the holder's service in {self.container} failed: {answer.get('err')}")
                return

    def _end(self) -> None:
        kind, data = self._frame()
        if kind != END or not json.loads(data).get("ok"):
            self.close()
            raise Broken(f"the holder's service in {self.container} did not start")

    def _frame(self) -> tuple[int, bytes]:
        try:
            while len(self._buf) < HEADER.size or len(self._buf) < HEADER.size + HEADER.unpack_from(self._buf)[1]:
                if len(self._buf) >= HEADER.size and HEADER.unpack_from(self._buf)[1] > MAX_FRAME:
                    raise ValueError("a frame over the bound")
                assert self._frames is not None
                stream, chunk = next(self._frames)
                if stream == 1:
                    self._buf += chunk
        except (StopIteration, OSError, ValueError) as exc:
            self.close()
            raise Broken(f"the holder's service in {self.container} ended: {exc or 'no more frames'}") from None
        kind, n = HEADER.unpack_from(self._buf)
        data = bytes(self._buf[HEADER.size : HEADER.size + n])
        del self._buf[: HEADER.size + n]
        return kind, data

    def close(self) -> None:
        """End the service (its exec reads the end of its input and leaves)."""
        self.closed = True
        with contextlib.suppress(Exception):
            self._raw.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._sock.close()


Key = tuple[str, str]  # (the engine's address, the holder's name)
_services: dict[Key, HolderService] = {}  # this process's services
_opening: dict[Key, threading.Event] = {}  # those being started (set when started or failed)
_lock = threading.Lock()


def _key(client: Any, name: str) -> Key:
    return (str(client.api.base_url), name)


def open_for(client: Any, name: str, mount: str) -> None:
    """Start the service of the holder `name`; a failure only logs (an exec answers)."""
    key = _key(client, name)
    with _lock:
        started = _opening.setdefault(key, threading.Event())
    try:
        try:
            service = HolderService(client, name, mount).start()
        except Broken as exc:
            log.info("%s", exc)
            return
        with _lock:
            old = _services.pop(key, None)
            _services[key] = service
        if old is not None:
            old.close()
    finally:
        with _lock:
            if _opening.get(key) is started:
                del _opening[key]
        started.set()


def get(client: Any, name: str, wait: float = 0.0) -> HolderService | None:
    """The holder's service; with `wait`, one being started is waited for that long (asking the
    holder anything else while its exec starts waits about as long)."""
    with _lock:
        starting = _opening.get(_key(client, name))
    if starting is not None and wait > 0:
        starting.wait(wait)
    with _lock:
        service = _services.get(_key(client, name))
    if service is not None and service.closed:
        drop(client, name)
        return None
    return service


def rename(client: Any, old: str, new: str) -> None:
    """The holder `old` is `new` now (a spare taken by a run): its exec goes on."""
    with _lock:
        service = _services.pop(_key(client, old), None)
        if service is not None:
            _services[_key(client, new)] = service


def drop(client: Any, name: str) -> None:
    with _lock:
        service = _services.pop(_key(client, name), None)
    if service is not None:
        service.close()
