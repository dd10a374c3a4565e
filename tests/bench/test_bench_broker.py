"""Package broker throughput: one large blob downloaded over TLS from a local registry three ways,
interleaved, each repeated and its median taken: straight to the registry (the baseline); through
the broker (CONNECT on the run's gateway socket, then TLS end to end inside the tunnel); and
through the loopback forwarder and the broker, which is what a client in a container does
(`airlock-forward` run here on the host, relaying a TCP port to the gateway socket). Prints MiB/s
for each and the ratios to direct (the target is ≥ 0.8); asserts only that every byte arrived.

The registry, the gateway's loop and the client share this process (and its GIL); the forwarder
is a process of its own, as it is in a container."""

from __future__ import annotations

import base64
import os
import socket
import ssl
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyregistry import Registry, make_ca  # tests/ is on sys.path (conftest)

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


def _download(open_socket: Opener, ctx: ssl.SSLContext, path: str) -> float:
    """Seconds from connecting to the last byte of GET `path` (read in 1 MiB slices, discarded)."""
    buf = bytearray(MIB)
    view = memoryview(buf)
    t0 = time.perf_counter()
    with ctx.wrap_socket(open_socket(), server_hostname="127.0.0.1") as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            n = tls.recv_into(view)
            assert n, head
            head += bytes(view[:n])
        head, _, body = head.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert f"content-length: {SIZE}".encode() in head.lower(), head
        got = len(body)
        while got < SIZE:
            n = tls.recv_into(view)
            assert n, f"the download ended at {got} of {SIZE} bytes"
            got += n
    seconds = time.perf_counter() - t0
    assert got == SIZE
    return seconds


def test_bench_broker_throughput(tmp_path: Path) -> None:
    ca = make_ca()
    ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    sock_path = tmp_path / "run" / "gateway.sock"
    sock_path.parent.mkdir()
    port = _free_port()
    ready = tmp_path / "forward.ready"
    with Registry(tmp_path / "reg", ca) as reg:
        blob = reg.add_blob("blob.bin", SIZE)
        target = f"127.0.0.1:{reg.port}"
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

            def direct() -> socket.socket:
                return socket.create_connection(("127.0.0.1", reg.port), timeout=30)

            def broker() -> socket.socket:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(30)
                s.connect(str(sock_path))
                return _connect_through(s, target, token)

            def forwarded() -> socket.socket:
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return _connect_through(s, target, token)

            ways: dict[str, Opener] = {"direct": direct, "broker": broker, "forwarder + broker": forwarded}
            for open_socket in ways.values():  # warm the page cache, the loop and the forwarder
                _download(open_socket, ctx, blob)
            seconds: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(N):
                for name, open_socket in ways.items():
                    seconds[name].append(_download(open_socket, ctx, blob))
        finally:
            if forward is not None:
                forward.kill()
                forward.wait(5)
                if forward.stderr is not None:
                    forward.stderr.close()
            gw.shutdown()

    rate = {name: SIZE / MIB / statistics.median(s) for name, s in seconds.items()}
    load = os.getloadavg()[0]
    lines = [
        f"\nbroker throughput: {SIZE // MIB} MiB over TLS from a local registry, {N} interleaved downloads"
        f" each way, medians ({os.cpu_count()} CPUs, load {load:.2f} before printing):"
    ]
    for name, s in seconds.items():
        spread = ", ".join(f"{SIZE / MIB / x:.0f}" for x in s)
        lines.append(f"  {name:<20} {rate[name]:7.0f} MiB/s  ({statistics.median(s):.3f} s; runs MiB/s: {spread})")
    lines.append(f"  broker ÷ direct:             {rate['broker'] / rate['direct']:.2f} (p50 of {N})")
    lines.append(f"  forwarder+broker ÷ direct:   {rate['forwarder + broker'] / rate['direct']:.2f} (p50 of {N})")
    print("\n".join(lines))
