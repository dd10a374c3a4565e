"""Package broker throughput: one large blob downloaded over TLS from a local registry three ways,
interleaved, each repeated and its median taken: straight to the registry (the baseline); through
the broker (CONNECT on the run's gateway socket, then TLS end to end inside the tunnel); and
through the loopback forwarder and the broker, which is what a client in a container does
(`airlock-forward` run here on the host, relaying a TCP port to the gateway socket). Prints MiB/s
for each and the ratios to direct (the target is ≥ 0.8); asserts only that every byte arrived.

The registry is a process of its own (a registry is another machine), as is the forwarder (it is
in the container); the gateway's loop and the client share this one. On a small machine the three
ways compete for the same CPUs: the broker's way uses more of them than the direct one does."""

from __future__ import annotations

import base64
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
from pyregistry import Registry, TestCA, make_ca  # tests/ is on sys.path (conftest)

from airlockd.gateway import Gateway, Route, RunTokens
from airlockd.policy import Broker

pytestmark = pytest.mark.slow

MIB = 1 << 20
SIZE = int(os.environ.get("AIRLOCK_BENCH_BROKER_MIB", "1024")) * MIB
N = int(os.environ.get("AIRLOCK_BENCH_BROKER_N", "7"))
FORWARD = Path(__file__).resolve().parents[2] / "runtime/rootfs/usr/local/bin/airlock-forward"

Opener = Callable[[], socket.socket]  # a connected socket on which the TLS conversation with the registry starts


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return int(s.getsockname()[1])


def _connect_through(sock: socket.socket, target: str, token: str) -> socket.socket:
    """CONNECT `target` on a socket to the gateway (directly or by the forwarder); the tunnel."""
    cred = base64.b64encode(f"airlock:{token}".encode()).decode()
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {cred}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:  # the broker sends nothing after its answer until the registry speaks
        chunk = sock.recv(4096)
        assert chunk, f"the gateway closed the connection: {head!r}"
        head += chunk
    assert head.split(b" ", 2)[1] == b"200", head
    assert head.endswith(b"\r\n\r\n"), head
    return sock


# The client, as a process of its own (in a container it is): connect directly, through the
# gateway's socket or through the forwarder; CONNECT when tunnelled; GET the blob over TLS; print
# the seconds from connecting to its last byte (read in 1 MiB slices, discarded).
CLIENT = r"""
import base64, socket, ssl, sys, time
way, where, target, token, path, size, ca = sys.argv[1:8]
size = int(size)
t0 = time.perf_counter()
if way == "direct":
    host, port = where.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=30)
elif way == "broker":
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(where)
else:
    host, port = where.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
if way != "direct":
    cred = base64.b64encode(("airlock:" + token).encode()).decode()
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: Basic {cred}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        assert chunk, head
        head += chunk
    assert head.split(b" ", 2)[1] == b"200" and head.endswith(b"\r\n\r\n"), head
ctx = ssl.create_default_context(cafile=ca)
buf = bytearray(1 << 20)
view = memoryview(buf)
with ctx.wrap_socket(s, server_hostname="127.0.0.1") as tls:
    tls.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        n = tls.recv_into(view)
        assert n, head
        head += bytes(view[:n])
    head, _, body = head.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and f"content-length: {size}".encode() in head.lower(), head
    got = len(body)
    while got < size:
        n = tls.recv_into(view)
        assert n, f"the download ended at {got} of {size} bytes"
        got += n
print(time.perf_counter() - t0)
"""


def _download(way: str, where: str, target: str, token: str, path: str, ca_file: Path) -> float:
    args = [way, where, target, token, path, str(SIZE), str(ca_file)]
    out = subprocess.run([sys.executable, "-c", CLIENT, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip())


def _cpu_of(pid: int) -> float:
    """User + system CPU seconds of a live process (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _registry(root: Path, ca: TestCA, conn: Connection) -> None:
    """In a process of its own: serve the blob until told to stop."""
    with Registry(root, ca) as reg:
        conn.send((reg.port, reg.add_blob("blob.bin", SIZE)))
        conn.recv()
        (reg.files / "blob.bin").unlink()  # pytest keeps the last runs' tmp dirs: not this GiB


def test_bench_broker_throughput(tmp_path: Path) -> None:
    ca = make_ca()
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    sock_path = tmp_path / "run" / "gateway.sock"
    sock_path.parent.mkdir()
    port = _free_port()
    ready = tmp_path / "forward.ready"
    mine, theirs = multiprocessing.get_context("fork").Pipe()  # forked before any thread starts here
    registry = multiprocessing.get_context("fork").Process(target=_registry, args=(tmp_path / "reg", ca, theirs))
    registry.start()
    try:
        reg_port, blob = mine.recv()
        target = f"127.0.0.1:{reg_port}"
        gw = Gateway(RunTokens()).start()
        forward: subprocess.Popen[bytes] | None = None
        try:
            token = gw.open_run(
                "rbench",
                "bench",
                Route("", frozenset(), ""),
                sock_path,
                ttl_s=3600,
                on_usage=lambda n: False,
                on_refused=lambda reason, data: None,
                broker=Broker(allow=[target], max_bytes=4 * (N + 1) * SIZE),  # two tunnelled ways, a margin
                on_broker=lambda event, data: None,
            )
            env = {
                **os.environ,
                "AIRLOCK_GATEWAY_SOCKET": str(sock_path),
                "AIRLOCK_GATEWAY_PORT": str(port),
                "AIRLOCK_FORWARD_READY": str(ready),
            }
            forward = subprocess.Popen([sys.executable, str(FORWARD)], env=env, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 10
            while not (ready.exists() and ready.read_text().strip()):
                assert forward.poll() is None, forward.stderr.read() if forward.stderr else b""
                assert time.monotonic() < deadline, "airlock-forward never became ready"
                time.sleep(0.02)

            ways = {"direct": target, "broker": str(sock_path), "forwarder + broker": f"127.0.0.1:{port}"}
            for way, where in ways.items():  # warm the page cache, the loop and the forwarder
                _download(way, where, target, token, blob, ca_file)
            seconds: dict[str, list[float]] = {name: [] for name in ways}
            cpu: dict[str, float] = dict.fromkeys(ways, 0.0)  # this process's: the gateway's loop
            forwarder_cpu = 0.0
            for _ in range(N):
                for way, where in ways.items():
                    c0, f0 = time.process_time(), _cpu_of(forward.pid)
                    seconds[way].append(_download(way, where, target, token, blob, ca_file))
                    cpu[way] += time.process_time() - c0
                    if way == "forwarder + broker":
                        forwarder_cpu += _cpu_of(forward.pid) - f0
        finally:
            if forward is not None:
                forward.kill()
                forward.wait(5)
                if forward.stderr is not None:
                    forward.stderr.close()
            gw.shutdown()
    finally:
        mine.send("stop")
        registry.join(30)
        if registry.is_alive():
            registry.kill()

    rate = {name: SIZE / MIB / statistics.median(s) for name, s in seconds.items()}
    load = os.getloadavg()[0]
    lines = [
        f"\nbroker throughput: {SIZE // MIB} MiB over TLS from a local registry, {N} interleaved downloads"
        f" each way, medians ({os.cpu_count()} CPUs, load {load:.2f} before printing):"
    ]
    for name, s in seconds.items():
        spread = ", ".join(f"{SIZE / MIB / x:.0f}" for x in s)
        lines.append(f"  {name:<20} {rate[name]:7.0f} MiB/s  ({statistics.median(s):.3f} s; runs MiB/s: {spread})")
    gib = N * SIZE / (1 << 30)
    relay = ", ".join(f"{name} {cpu[name] / gib:.2f}" for name in ways if name != "direct")
    lines.append(f"  the broker's CPU (its process), s per GiB: {relay} (direct {cpu['direct'] / gib:.2f})")
    lines.append(f"  the forwarder's CPU, s per GiB: {forwarder_cpu / gib:.2f}")
    lines.append(f"  broker ÷ direct:             {rate['broker'] / rate['direct']:.2f} (p50 of {N})")
    lines.append(f"  forwarder+broker ÷ direct:   {rate['forwarder + broker'] / rate['direct']:.2f} (p50 of {N})")
    print("\n".join(lines))
