"""The model gateway for a container on a remote engine, relayed over the engine's own connection.

The gateway (gateway/server.py) holds the real API key and stays on this machine. A container on
another host cannot reach its Unix socket, and has no network. So the run's holder container
(sandbox/layers.py), on the engine's host, runs `RELAY` (the image's python3) as an `exec` whose
standard streams are the engine API's own hijacked connection: it listens on a socket in the
run's capped filesystem, which the agent's container mounts read-only where the gateway's socket
would be, and carries each connection's bytes as frames over those streams. Here, `Relay` opens
a connection to the local gateway socket for each connection there and copies both ways. What
travels is what the agent would have sent the gateway anyway: the run token, never the key. The
relay ends with its exec (`close`), its holder, or this process.

Frames, both ways: connection id (4 bytes), kind (1 byte: 0 data, 1 end of data, 2 opened),
length (4 bytes), data. The relay's first frame (kind 3) says it listens: the container starts after it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
from pathlib import Path
from typing import Any

import docker.errors
from docker.utils.socket import frames_iter

from airlockd.errors import EngineError

log = logging.getLogger(__name__)

HEADER = struct.Struct(">IBI")
DATA, END, OPENED, LISTENING = 0, 1, 2, 3
READY_S = 20
MAX_FRAME = 1 << 20

#: run in the holder: listen on argv[1], carry each connection over stdin/stdout as frames. At most
#: MAX_CONNS connections at once (one more is closed at once: the holder's pids cap stays far);
#: a connection goes when both its directions have ended; one whose reader does not take what
#: the gateway sends within SEND_S is dropped (it cannot hold the others up for longer).
MAX_CONNS = 16
SEND_S = 15
RELAY = r"""
import os, socket, struct, sys, threading, time
H = struct.Struct('>IBI')
MAX_CONNS, SEND_S = int(sys.argv[2]), float(sys.argv[3])
path = sys.argv[1]
os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
try:
    os.unlink(path)
except FileNotFoundError:
    pass
srv = socket.socket(socket.AF_UNIX)
srv.bind(path)
os.chmod(path, 0o666)
srv.listen(16)
out = sys.stdout.buffer
lock = threading.Lock()
conns = {}
ended = {}
def send(cid, kind, data=b''):
    with lock:
        out.write(H.pack(cid, kind, len(data)) + data)
        out.flush()
def done(cid, half):
    with lock:
        halves = ended.setdefault(cid, set())
        halves.add(half)
        both = len(halves) == 2
    if both:
        drop(cid)
def drop(cid):
    with lock:
        s = conns.pop(cid, None)
        ended.pop(cid, None)
    if s is not None:
        try:
            s.close()
        except OSError:
            pass
send(0, 3)
def pump(cid, s):
    try:
        while True:
            try:
                d = s.recv(65536)
            except socket.timeout:
                continue
            if not d:
                break
            send(cid, 0, d)
    except OSError:
        pass
    send(cid, 1)
    done(cid, 'in')
def accept():
    n = 0
    while True:
        try:
            s, _ = srv.accept()
        except OSError:
            time.sleep(0.1)
            continue
        if len(conns) >= MAX_CONNS:
            s.close()
            continue
        n += 1
        s.settimeout(SEND_S)
        conns[n] = s
        send(n, 2)
        try:
            threading.Thread(target=pump, args=(n, s), daemon=True).start()
        except RuntimeError:
            send(n, 1)
            drop(n)
threading.Thread(target=accept, daemon=True).start()
inp = sys.stdin.buffer
def readn(k):
    b = b''
    while len(b) < k:
        d = inp.read(k - len(b))
        if not d:
            return None
        b += d
    return b
while True:
    h = readn(H.size)
    if h is None:
        break
    cid, kind, n = H.unpack(h)
    data = readn(n) if n else b''
    if data is None:
        break
    s = conns.get(cid)
    if s is None:
        continue
    try:
        if kind == 0:
            s.sendall(data)
        else:
            s.shutdown(socket.SHUT_WR)
            done(cid, 'out')
    except OSError:
        drop(cid)
os._exit(0)
"""


class Relay:
    """One run's relay: the exec in its holder and the copying here."""

    def __init__(self, client: Any, container: str, path: str, target: Path) -> None:
        self.client, self.container, self.path, self.target = client, container, path, target
        self._lock = threading.Lock()  # one frame at a time onto the engine's connection
        self._closing = threading.Lock()  # never the frames' lock: a send may block (close unblocks it)
        self._conns: dict[int, socket.socket] = {}
        self._sock: Any = None
        self._raw: Any = None
        self._closed = False
        self._listening = threading.Event()

    def start(self) -> Relay:
        try:
            exec_id = self.client.api.exec_create(
                self.container, ["python3", "-I", "-c", RELAY, self.path, str(MAX_CONNS), str(SEND_S)], user="0:0",
                stdin=True, stdout=True, stderr=False,
            )["Id"]  # fmt: skip
            self._sock = self.client.api.exec_start(exec_id, socket=True)
        except docker.errors.DockerException as exc:
            raise EngineError(
                f"the engine failed to start the model gateway's relay in {self.container}: {exc}",
                hint="check the engine (airlockd doctor)",
            ) from None
        self._raw = getattr(self._sock, "_sock", self._sock)
        threading.Thread(target=self._read, name=f"relay-{self.container}", daemon=True).start()
        if not self._listening.wait(READY_S) or self._closed:
            self.close()
            raise EngineError(
                f"the model gateway's relay in {self.container} did not start listening within {READY_S} s",
                hint="check the engine (airlockd doctor); the runtime image needs python3",
            )
        return self

    def _send(self, cid: int, kind: int, data: bytes = b"") -> None:
        with self._lock:
            if not self._closed:
                self._raw.sendall(HEADER.pack(cid, kind, len(data)) + data)

    def _read(self) -> None:
        buf = bytearray()
        try:
            for stream, chunk in frames_iter(self._sock, tty=False):
                if stream != 1:
                    continue
                buf += chunk
                while len(buf) >= HEADER.size:
                    cid, kind, n = HEADER.unpack_from(buf)
                    if n > MAX_FRAME:
                        raise ValueError(f"a frame of {n} bytes")
                    if len(buf) < HEADER.size + n:
                        break
                    data = bytes(buf[HEADER.size : HEADER.size + n])
                    del buf[: HEADER.size + n]
                    self._frame(cid, kind, data)
        except Exception as exc:  # the exec ended (its holder went) or spoke nonsense
            if not self._closed:
                log.warning("the model gateway's relay in %s ended: %s", self.container, exc)
        finally:
            self.close()

    def _frame(self, cid: int, kind: int, data: bytes) -> None:
        if kind == LISTENING:
            self._listening.set()
            return
        if kind == OPENED:
            conn = socket.socket(socket.AF_UNIX)
            try:
                conn.connect(str(self.target))
            except OSError as exc:
                log.warning("the relay cannot reach the model gateway at %s: %s", self.target, exc)
                conn.close()
                self._send(cid, END)
                return
            self._conns[cid] = conn
            threading.Thread(target=self._pump, args=(cid, conn), daemon=True).start()
            return
        known = self._conns.get(cid)
        if known is None:
            return
        with contextlib.suppress(OSError):
            if kind == DATA:
                known.sendall(data)
            else:
                known.shutdown(socket.SHUT_WR)

    def _pump(self, cid: int, conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                self._send(cid, DATA, data)
            self._send(cid, END)
        except OSError:
            with contextlib.suppress(OSError):
                self._send(cid, END)
        finally:
            self._conns.pop(cid, None)
            conn.close()

    def close(self) -> None:
        """End the relay; a send blocked on the engine's connection (a holder that stopped
        reading) is woken by the shutdown and fails."""
        with self._closing:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(Exception):
            self._raw.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._sock.close()
        for conn in list(self._conns.values()):
            with contextlib.suppress(OSError):
                conn.close()


_relays: dict[str, Relay] = {}
_relays_lock = threading.Lock()


def start(client: Any, run_id: str, container: str, path: str, target: Path) -> None:
    """Start run `run_id`'s relay (one a run: an earlier one is closed first)."""
    relay = Relay(client, container, path, target).start()
    with _relays_lock:
        old = _relays.pop(run_id, None)
        _relays[run_id] = relay
    if old is not None:
        old.close()


def stop(run_id: str) -> None:
    with _relays_lock:
        relay = _relays.pop(run_id, None)
    if relay is not None:
        relay.close()
