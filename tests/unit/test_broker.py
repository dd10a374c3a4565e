"""The package broker on a real gateway socket: CONNECT tunnels to allowed hosts only, the run
token as proxy credentials, names that resolve to this machine refused, the caps (bytes, tunnels
at once, tunnels in all, idle), the gate's close ending live tunnels, and the audit events; the
allow-list entries themselves (hostallow.py); a TLS download from a local registry through a tunnel."""

from __future__ import annotations

import base64
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyregistry import Registry, make_ca
from tcpservers import TcpServer

from airlockd.gateway import Gateway, Route, RunTokens
from airlockd.gateway.broker import proxy_token
from airlockd.hostallow import parse_entry, reachable, split_target
from airlockd.policy import Broker, Policy


class BrokerRun:
    def __init__(self, gw: Gateway, tmp: Path, run_id: str = "r1", **rules: Any) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        d = tmp / run_id
        d.mkdir()
        self.sock = d / "gateway.sock"
        self.gw, self.run_id = gw, run_id
        self.token = gw.open_run(
            run_id,
            "builder",
            Route("", frozenset(), ""),
            self.sock,
            ttl_s=60,
            on_usage=lambda n: False,
            on_refused=lambda reason, data: None,
            broker=Broker(**rules),
            on_broker=self._event,
        )

    def _event(self, event: str, data: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((event, data))

    def wait_event(self, event: str, n: int = 1, timeout: float = 5) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = [d for e, d in self.events if e == event]
            if len(found) >= n:
                return found
            time.sleep(0.01)
        raise AssertionError(f"no {n} {event} events: {self.events}")

    def connect(self, target: str, token: str | None = "", user: str = "airlock") -> tuple[socket.socket, int, bytes]:
        """Send CONNECT; (the socket, the status, the head and any body read with it)."""
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(str(self.sock))
        auth = ""
        if token is not None:
            cred = base64.b64encode(f"{user}:{token or self.token}".encode()).decode()
            auth = f"Proxy-Authorization: Basic {cred}\r\n"
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        status = int(head.split(b" ", 2)[1]) if head else 0
        if status != 200:
            s.settimeout(2)
            try:
                while chunk := s.recv(4096):
                    head += chunk
            except OSError:
                pass
        return s, status, head


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    gw = Gateway(RunTokens()).start()
    yield gw
    gw.shutdown()


@pytest.fixture
def echo() -> Iterator[TcpServer]:
    e = TcpServer()
    yield e
    e.close()


def test_an_allowed_address_tunnels_both_ways_and_is_audited(gateway: Gateway, tmp_path: Path, echo: TcpServer) -> None:
    run = BrokerRun(gateway, tmp_path, allow=[f"127.0.0.1:{echo.port}"])
    s, status, head = run.connect(f"127.0.0.1:{echo.port}")
    assert status == 200, head
    s.sendall(b"hello through the broker")
    got = b""
    while len(got) < 24:
        got += s.recv(100)
    assert got == b"hello through the broker"
    s.close()
    opened = run.wait_event("opened")[0]
    assert opened["host"] == "127.0.0.1" and opened["port"] == echo.port and opened["address"] == "127.0.0.1"
    closed = run.wait_event("closed")[0]
    assert closed["up"] == 24 and closed["down"] == 24 and closed["ended"] == "closed"
    gate = gateway.gate(run.run_id)
    assert gate is not None and gate.tunnels is not None
    summary = gate.tunnels.summary()
    assert summary["tunnels"] == 1 and summary["bytes"] == 48 and summary["refused"] == 0
    assert summary["hosts"] == [{"host": f"127.0.0.1:{echo.port}", "bytes": 48}]
    assert summary["allowed"] == [f"127.0.0.1:{echo.port}"]


def test_hosts_not_allowed_are_refused_with_what_is_allowed(gateway: Gateway, tmp_path: Path, echo: TcpServer) -> None:
    other = TcpServer()
    try:
        run = BrokerRun(gateway, tmp_path, allow=[f"127.0.0.1:{echo.port}", "pkgs.example.org"])
        for target in (f"127.0.0.1:{other.port}", f"127.0.0.2:{echo.port}", "example.org:443", "pkgs.example.org:80"):
            _, status, head = run.connect(target)
            assert status == 403, (target, head)
            assert b"not in the broker's allow-list" in head and b"pkgs.example.org:443" in head
        assert other.accepted == 0
        refused = run.wait_event("refused", 4)
        assert {r["host"] for r in refused} == {"127.0.0.1", "127.0.0.2", "example.org", "pkgs.example.org"}
        assert all(r["status"] == 403 for r in refused)
        gate = gateway.gate(run.run_id)
        assert gate is not None and gate.tunnels is not None
        summary = gate.tunnels.summary()
        assert (summary["tunnels"], summary["refused"], len(summary["refusals"])) == (0, 4, 4)
    finally:
        other.close()


def test_a_name_that_resolves_to_this_machine_is_refused(gateway: Gateway, tmp_path: Path, echo: TcpServer) -> None:
    run = BrokerRun(gateway, tmp_path, allow=[f"localhost:{echo.port}"])
    _, status, head = run.connect(f"localhost:{echo.port}")
    assert status == 403 and b"not a public address" in head
    assert echo.accepted == 0


def test_the_run_token_is_the_proxy_credential(gateway: Gateway, tmp_path: Path, echo: TcpServer) -> None:
    run = BrokerRun(gateway, tmp_path, allow=[f"127.0.0.1:{echo.port}"])
    other = gateway.tokens.mint("r2", "builder", 60)
    for token in (None, "alrt_forged", other):
        _, status, head = run.connect(f"127.0.0.1:{echo.port}", token=token)
        assert status == 407, head
        assert b"Proxy-Authenticate: Basic" in head or b"proxy-authenticate: Basic" in head
    s, status, _ = run.connect(f"127.0.0.1:{echo.port}", user=run.token, token="x")  # the token as the user
    assert status == 200
    s.close()
    s, status, _ = run.connect(f"127.0.0.1:{echo.port}")
    assert status == 200
    s.close()
    gateway.revoke(run.run_id)
    _, status, _ = run.connect(f"127.0.0.1:{echo.port}")
    assert status == 407
    time.sleep(0.2)  # the echo server's accepting thread counts what the kernel already accepted
    assert echo.accepted == 2


def test_no_broker_without_an_allow_list(gateway: Gateway, tmp_path: Path, echo: TcpServer) -> None:
    run = BrokerRun(gateway, tmp_path)
    _, status, head = run.connect(f"127.0.0.1:{echo.port}")
    assert status == 403 and b"no package broker" in head
    assert echo.accepted == 0


def test_tunnels_at_once_and_in_all_are_capped(gateway: Gateway, tmp_path: Path, echo: TcpServer) -> None:
    run = BrokerRun(gateway, tmp_path, allow=[f"127.0.0.1:{echo.port}"], concurrent=2, max_connections=3)
    a, s1, _ = run.connect(f"127.0.0.1:{echo.port}")
    b, s2, _ = run.connect(f"127.0.0.1:{echo.port}")
    _, s3, head = run.connect(f"127.0.0.1:{echo.port}")
    assert (s1, s2, s3) == (200, 200, 429), head
    a.close()
    run.wait_event("closed")
    c, s4, _ = run.connect(f"127.0.0.1:{echo.port}")
    assert s4 == 200
    b.close()
    c.close()
    run.wait_event("closed", 3)
    _, s5, head = run.connect(f"127.0.0.1:{echo.port}")
    assert s5 == 429 and b"opened its 3 tunnels" in head


def test_the_run_bytes_cap_ends_the_tunnel(gateway: Gateway, tmp_path: Path) -> None:
    big = TcpServer(mode="send", size=8 * 1024 * 1024)
    try:
        run = BrokerRun(gateway, tmp_path, allow=[f"127.0.0.1:{big.port}"], max_bytes=1024 * 1024)
        s, status, _ = run.connect(f"127.0.0.1:{big.port}")
        assert status == 200
        got = 0
        while chunk := s.recv(65536):
            got += len(chunk)
        assert got <= 1024 * 1024
        closed = run.wait_event("closed")[0]
        assert closed["ended"] == "bytes spent" and closed["down"] <= 1024 * 1024
        _, status, head = run.connect(f"127.0.0.1:{big.port}")
        assert status == 429 and b"bytes are spent" in head
    finally:
        big.close()


def test_an_idle_tunnel_ends(gateway: Gateway, tmp_path: Path, echo: TcpServer) -> None:
    run = BrokerRun(gateway, tmp_path, allow=[f"127.0.0.1:{echo.port}"], idle_timeout_s=0.3)
    s, status, _ = run.connect(f"127.0.0.1:{echo.port}")
    assert status == 200
    assert s.recv(10) == b""  # nothing said either way: the broker closed it
    assert run.wait_event("closed")[0]["ended"] == "idle"


def test_closing_the_gate_ends_live_tunnels(gateway: Gateway, tmp_path: Path, echo: TcpServer) -> None:
    run = BrokerRun(gateway, tmp_path, allow=[f"127.0.0.1:{echo.port}"])
    s, status, _ = run.connect(f"127.0.0.1:{echo.port}")
    assert status == 200
    gateway.close_run(run.run_id)
    s.settimeout(5)
    assert s.recv(10) == b""
    run.wait_event("closed")


def test_a_registry_answers_over_tls_through_a_tunnel(gateway: Gateway, tmp_path: Path) -> None:
    ca = make_ca()
    with Registry(tmp_path / "reg", ca) as reg:
        blob = reg.add_blob("data.bin", 3 * 1024 * 1024)
        run = BrokerRun(gateway, tmp_path, allow=[f"127.0.0.1:{reg.port}"])
        raw, status, _ = run.connect(f"127.0.0.1:{reg.port}")
        assert status == 200
        ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(f"GET {blob} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := tls.recv(1 << 20):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0] + b" "
        assert len(body) == 3 * 1024 * 1024
        closed = run.wait_event("closed")[0]
        assert closed["down"] > 3 * 1024 * 1024  # the body and TLS's own bytes


def test_plain_http_proxying_is_refused(gateway: Gateway, tmp_path: Path) -> None:
    run = BrokerRun(gateway, tmp_path, allow=["pkgs.example.org"])
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(str(run.sock))
    s.sendall(b"GET http://pkgs.example.org/simple/ HTTP/1.1\r\nHost: pkgs.example.org\r\n\r\n")
    assert s.recv(100).startswith(b"HTTP/1.1 400")


# -- the entries ------------------------------------------------------------------------------


def test_entries_match_host_and_port_exactly() -> None:
    assert str(parse_entry("Pkgs.Example.org.")) == "pkgs.example.org:443"
    assert parse_entry("pkgs.example.org").matches("pkgs.example.org", 443)
    assert not parse_entry("pkgs.example.org").matches("pkgs.example.org", 80)
    assert not parse_entry("pkgs.example.org").matches("evilpkgs.example.org", 443)
    wild = parse_entry("*.example.net")
    assert wild.matches("npm.example.net", 443) and wild.matches("a.b.example.net", 443)
    assert not wild.matches("example.net", 443) and not wild.matches("xexample.net", 443)
    v6 = parse_entry("[::1]:8443")
    assert str(v6) == "[::1]:8443" and v6.matches("::1", 8443)
    assert parse_entry("127.0.0.1:8443").matches("127.0.0.1", 8443)
    bad_entries = ("https://x.org", "x.org/simple", "*.org", "a..b", "x.org:0", "x.org:99999", "u@x.org")
    for bad in bad_entries:
        with pytest.raises(ValueError):
            parse_entry(bad)


def test_targets_are_parsed_strictly() -> None:
    assert split_target("Pkgs.Example.org.:443") == ("pkgs.example.org", 443)
    assert split_target("[::1]:443") == ("::1", 443)
    for bad in ("x.example.org", "x.example.org:", "x.org:x", "::1:443", "a b:443", "x.org:0443x", "[zz]:1", ":443"):
        assert split_target(bad) is None, bad


def test_only_global_addresses_are_reachable_by_name() -> None:
    import ipaddress

    for private in ("127.0.0.1", "10.1.2.3", "172.17.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "::1"):
        assert not reachable(ipaddress.ip_address(private)), private
    assert not reachable(ipaddress.ip_address("::ffff:127.0.0.1"))
    assert not reachable(ipaddress.ip_address("224.0.0.1"))
    assert reachable(ipaddress.ip_address("151.101.0.223"))


def test_proxy_credentials() -> None:
    def basic(text: str) -> list[tuple[str, str]]:
        return [("proxy-authorization", "Basic " + base64.b64encode(text.encode()).decode())]

    assert proxy_token(basic("airlock:alrt_x")) == "alrt_x"
    assert proxy_token(basic("alrt_x:")) == "alrt_x"
    assert proxy_token([("proxy-authorization", "Bearer alrt_y")]) == "alrt_y"
    assert proxy_token([("proxy-authorization", "Basic !!!")]) == ""
    assert proxy_token([]) is None


def test_an_agent_table_replaces_what_it_sets() -> None:
    policy = Policy.model_validate(
        {
            "broker": {"allow": ["pkgs.example.org"], "max_bytes": 100},
            "agents": {"a": {"command": ["x"], "broker": {"allow": ["npm.example.net"]}}, "b": {"command": ["y"]}},
        }
    )
    assert policy.broker_for("a").allow == ["npm.example.net"] and policy.broker_for("a").max_bytes == 100
    assert policy.broker_for("b").allow == ["pkgs.example.org"]


def test_bytes_sent_with_the_connect_count_against_the_cap(gateway: Gateway, tmp_path: Path, echo: TcpServer) -> None:
    run = BrokerRun(gateway, tmp_path, allow=[f"127.0.0.1:{echo.port}"], max_bytes=1000)
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(str(run.sock))
    cred = base64.b64encode(f"airlock:{run.token}".encode()).decode()
    head = f"CONNECT 127.0.0.1:{echo.port} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {cred}\r\n\r\n".encode()
    s.sendall(head + b"x" * 60000)  # pipelined past the request, before the answer
    got = b""
    while chunk := s.recv(65536):
        got += chunk
    assert b"x" not in got  # nothing came back from the echo: nothing went up (the tunnel was ended at once)
    assert run.wait_event("closed")[0]["ended"] == "bytes spent"


def test_a_tunnel_whose_reader_takes_nothing_ends(gateway: Gateway, tmp_path: Path) -> None:
    big = TcpServer(mode="send", size=64 * 1024 * 1024)
    try:
        run = BrokerRun(gateway, tmp_path, allow=[f"127.0.0.1:{big.port}"], idle_timeout_s=0.5, concurrent=1)
        s, status, _ = run.connect(f"127.0.0.1:{big.port}")
        assert status == 200
        # never read: the buffers fill, the broker stops reading the host, nothing moves for the idle time
        assert run.wait_event("closed", timeout=10)[0]["ended"] == "idle"
        s.close()
        again, status, _ = run.connect(f"127.0.0.1:{big.port}")
        assert status == 200  # its slot is free again
        again.close()
    finally:
        big.close()


def test_a_flood_of_refusals_is_audited_up_to_a_bound_and_counted(gateway: Gateway, tmp_path: Path) -> None:
    from airlockd.gateway.broker import MAX_AUDITED_REFUSALS

    run = BrokerRun(gateway, tmp_path, allow=["pkgs.example.org"])
    for _ in range(MAX_AUDITED_REFUSALS + 30):
        _, status, _ = run.connect("example.org:443")
        assert status == 403
    audited = run.wait_event("refused", MAX_AUDITED_REFUSALS)
    time.sleep(0.3)
    assert len(run.wait_event("refused", MAX_AUDITED_REFUSALS)) == MAX_AUDITED_REFUSALS
    assert audited[-1]["last_audited"] is True
    gate = gateway.gate(run.run_id)
    assert gate is not None and gate.tunnels is not None and gate.tunnels.refused == MAX_AUDITED_REFUSALS + 30


def test_ipv6_forms_that_carry_an_ipv4_address_are_not_reachable_by_name() -> None:
    import ipaddress

    for embedded in ("::7f00:1", "::a9fe:a9fe", "64:ff9b::7f00:1", "2002:7f00:1::", "2001:0:4136:e378::1", "fec0::1"):
        assert not reachable(ipaddress.ip_address(embedded)), embedded
    assert not reachable(ipaddress.ip_address("192.88.99.1"))
    assert reachable(ipaddress.ip_address("2a04:4e42::223"))
