"""The package broker: HTTPS tunnels (`CONNECT host:port`) to the hosts a run's policy allows,
served on the run's gateway socket next to its model route.

A container has no network. Its clients (pip, npm, cargo, go, curl, anything that honours
`HTTPS_PROXY`) reach the loopback forwarder, which carries the bytes to the run's gateway socket
(gateway/server.py), which hands a CONNECT request here. A tunnel opens only when, in this order:

1. the request carries the run's token as proxy credentials (`Proxy-Authorization: Basic`, the
   token as user or password, or `Bearer`): 407 otherwise;
2. `host:port` matches an entry of the agent's `[broker] allow` (hostallow.py): 403 otherwise,
   naming what is allowed, so the agent (and whoever reads its transcript) knows why;
3. the run is within its caps: tunnels opened over the run, tunnels open at once, bytes both ways
   (429 otherwise);
4. the host resolves, here, to an address its entry may reach: a name only to global addresses,
   never to this machine's or a private network's (403); an address entry to itself. The tunnel
   then connects to that address, never to the name again (nothing re-resolves it later).

Nothing else is resolved: a host not allowed is refused before any DNS query is made for it.
The broker never sees inside the tunnel (TLS runs end to end between the client and the
registry, against the CAs the image trusts); it counts bytes both ways, ends a tunnel idle for
`idle_timeout_s`, ends every tunnel once the run's bytes are spent, and ends them all when the
run's gate closes. Every tunnel opened and closed, and every refusal, is an audit event.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import h11

from airlockd.gateway.tokens import PREFIX, RunTokens, TokenRefused
from airlockd.hostallow import IPAddress, first_match, parse_address, reachable, split_target

if TYPE_CHECKING:
    from airlockd.policy import Broker

log = logging.getLogger(__name__)

BrokerHook = Callable[[str, dict[str, Any]], None]  # (event: refused / opened / closed, details): audit


TUNNEL_READ = 1 << 20  # each side's read buffer
MAX_SHOWN = 20  # refusals and hosts a run's summary lists
MAX_AUDITED_REFUSALS = 100  # a run's refusals audited one by one; the rest are counted (gateway.closed)
# Names are resolved on threads of their own: a run that floods the gateway with requests cannot
# hold another run's lookups up behind its audit writes (which go to the loop's default executor).
_RESOLVER = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="airlockd-resolve")


@dataclass
class Tunnels:
    """One run's tunnels: its rules and what it has used of them."""

    rules: Broker
    on_event: BrokerHook
    opened: int = 0  # tunnels let past the allow-list and caps (the max_connections cap counts these)
    connected: int = 0  # ... that then reached their host
    active: int = 0
    bytes: int = 0
    upstreams: set[asyncio.Transport] = field(default_factory=set)  # open tunnels' host sides
    reached: dict[str, int] = field(default_factory=dict)  # "host:port" -> bytes both ways
    refused: int = 0
    refusals: list[dict[str, Any]] = field(default_factory=list)  # the first MAX_SHOWN
    closed: bool = False  # the run's gate closed: a tunnel still connecting goes no further

    def spent(self) -> bool:
        return self.bytes >= self.rules.max_bytes

    def refuse(self, where: dict[str, Any], refused: Refused) -> None:
        self.refused += 1
        event = {**where, "status": refused.status, "reason": refused.reason}
        if len(self.refusals) < MAX_SHOWN:
            self.refusals.append(event)
        if self.refused <= MAX_AUDITED_REFUSALS:  # bounded: a flood costs the audit trail nothing more
            _later(self.on_event, "refused", {**event, "last_audited": self.refused == MAX_AUDITED_REFUSALS})

    def summary(self) -> dict[str, Any]:
        """What the run's evidence says of its tunnels (records.RunRecord.egress)."""
        hosts = sorted(self.reached.items(), key=lambda kv: -kv[1])
        return {
            "allowed": [str(e) for e in self.rules.entries],
            "tunnels": self.connected,
            "bytes": self.bytes,
            "hosts": [{"host": h, "bytes": n} for h, n in hosts[:MAX_SHOWN]],
            "refused": self.refused,
            "refusals": list(self.refusals),
        }


class Refused(Exception):
    def __init__(self, status: int, reason: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers


def proxy_token(headers: list[tuple[str, str]]) -> str | None:
    """The run token in `Proxy-Authorization`: Basic with the token as password or user (what a
    proxy URL `http://airlock:TOKEN@127.0.0.1:8181` makes clients send), or Bearer."""
    for k, v in headers:
        if k != "proxy-authorization":
            continue
        scheme, _, cred = v.strip().partition(" ")
        if scheme.lower() == "bearer":
            return cred.strip()
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(cred.strip(), validate=True).decode("ascii").partition(":")
            except (ValueError, UnicodeDecodeError):
                return ""
            return password if password.startswith(PREFIX) or not user.startswith(PREFIX) else user
    return None


async def _resolve(host: str, port: int, timeout: float) -> list[IPAddress]:
    loop = asyncio.get_running_loop()
    lookup = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    infos = await asyncio.wait_for(loop.run_in_executor(_RESOLVER, lookup), timeout)
    found: list[IPAddress] = []
    for _family, _type, _proto, _name, addr in infos:
        ip = parse_address(str(addr[0]).partition("%")[0])
        if ip is not None and ip not in found:
            found.append(ip)
    return found


async def _addresses(host: str, port: int, by_address: bool, timeout: float) -> list[IPAddress]:
    """Where a tunnel to an allowed `host:port` may connect: the address itself for an address
    entry; else what the name resolves to, global addresses only (Refused when none is)."""
    if by_address:
        ip = parse_address(host)
        assert ip is not None
        return [ip]
    try:
        found = await _resolve(host, port, timeout)
    except (OSError, TimeoutError) as exc:
        raise Refused(502, f"{host.rstrip('.')} does not resolve: {exc}") from None
    usable = [ip for ip in found if reachable(ip)]
    if not usable:
        shown = ", ".join(str(ip) for ip in found[:4]) or "nothing"
        raise Refused(
            403,
            f"{host.rstrip('.')} resolves to {shown}: not a public address, and a host name in the broker's"
            " allow-list never reaches this machine or a private network (name the address itself in the"
            " policy to allow it)",
        )
    return usable


async def open_tunnel(
    tunnels: Tunnels,
    tokens: RunTokens,
    run_id: str,
    conn: h11.Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    req: h11.Request,
) -> None:
    """Answer one CONNECT request on a gateway connection: refused with a status and why, or a
    tunnel carried until either side ends it, it idles out, or the run's bytes are spent."""
    target = req.target.decode("ascii", "replace")[:300]
    headers = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in req.headers]
    where: dict[str, Any] = {"target": target}
    try:
        split = split_target(target)
        if split is None:
            raise Refused(400, "CONNECT needs host:port")
        host, port = split
        where = {"host": host, "port": port}
        token = proxy_token(headers)
        try:
            if not token:
                raise TokenRefused("no run token in Proxy-Authorization")
            tokens.verify(token, run_id=run_id)
        except TokenRefused as exc:
            challenge = (("proxy-authenticate", 'Basic realm="airlockd"'),)
            raise Refused(407, f"run token refused: {exc.reason}", challenge) from None
        if not tunnels.rules.allow:
            raise Refused(403, "this run has no package broker: its agent's policy allows no host ([broker] allow)")
        rules = tunnels.rules
        entry = first_match(rules.entries, host, port)
        if entry is None:
            allowed = ", ".join(str(e) for e in rules.entries[:12])
            raise Refused(403, f"{host}:{port} is not in the broker's allow-list (allowed: {allowed})")
        if tunnels.spent():
            raise Refused(429, f"the run's broker bytes are spent ({rules.max_bytes} bytes)")
        if tunnels.opened >= rules.max_connections:
            raise Refused(429, f"the run has opened its {rules.max_connections} tunnels")
        if tunnels.active >= rules.concurrent:
            raise Refused(429, f"{rules.concurrent} tunnels are open at once already")
        tunnels.opened += 1
        tunnels.active += 1
    except Refused as refused:
        tunnels.refuse(where, refused)
        await _refuse(conn, writer, refused)
        return
    try:
        try:
            # a dotted name is looked up absolute (a trailing dot): no search domain of this machine applies
            lookup = host + "." if entry.address is None and "." in host else host
            addresses = await _addresses(lookup, port, entry.address is not None, rules.connect_timeout_s)
            await _carry(tunnels, conn, reader, writer, addresses, where)
        except Refused as refused:
            tunnels.refuse(where, refused)
            await _refuse(conn, writer, refused)
    finally:
        tunnels.active -= 1


class _Flow:
    """One tunnel's two directions, carried by the transports themselves: each side's protocol
    hands what it receives straight to the other side's transport (no stream buffers, no task per
    chunk), counting it against the run's bytes. A side whose peer cannot take more pauses reading
    (backpressure); a side that ends its writing half-closes the other; a tunnel with no byte
    either way for `idle_timeout_s` (nothing said, or a reader that takes nothing) is aborted, as
    is one whose bytes would pass the run's cap."""

    def __init__(self, tunnels: Tunnels, where: dict[str, Any], client: Any, original: Any) -> None:
        self.tunnels, self.where = tunnels, where
        self.reached = f"{where['host']}:{where['port']}"
        self.client, self.original = client, original  # the gateway connection and its stream protocol
        self.upstream: Any = None
        self.moved = {"up": 0, "down": 0}
        self.ended = "closed"
        self.eof: set[str] = set()
        self.lost: set[str] = set()
        self.last = time.monotonic()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def side(self, way: str) -> Any:
        """The transport that receives `way`'s bytes (up: from the client, so the upstream's)."""
        return self.upstream if way == "up" else self.client

    def source(self, way: str) -> Any:
        return self.client if way == "up" else self.upstream

    def received(self, way: str, data: bytes | memoryview) -> None:
        if self.ended != "closed":
            return
        rules = self.tunnels.rules
        if self.tunnels.bytes + len(data) > rules.max_bytes:
            self.tunnels.bytes = rules.max_bytes  # spent: no tunnel opens after this one
            self.end("bytes spent")
            return
        self.tunnels.bytes += len(data)
        self.moved[way] += len(data)
        self.tunnels.reached[self.reached] = self.tunnels.reached.get(self.reached, 0) + len(data)
        self.last = time.monotonic()
        self.side(way).write(data)

    def half_close(self, way: str) -> None:
        self.eof.add(way)
        dst = self.side(way)
        if dst is not None and dst.can_write_eof() and not dst.is_closing():
            dst.write_eof()
        if self.eof == {"up", "down"}:
            self.client.close()
            self.upstream.close()

    def end(self, why: str) -> None:
        """End both sides now, unsent bytes dropped (they must not keep a dead tunnel open)."""
        if self.ended == "closed":
            self.ended = why
        for t in (self.client, self.upstream):
            if t is not None:
                t.abort()

    def connection_lost(self, way: str, exc: Exception | None) -> None:
        """`way`'s source is gone: the other side goes too (after what it still has to send,
        when the tunnel ended well)."""
        self.lost.add(way)
        if way == "up":  # the gateway connection: its stream protocol learns it too (`_serve` waits on it)
            self.original.connection_lost(exc)
        other = self.side(way)
        if other is not None and not other.is_closing():
            other.close() if self.ended == "closed" else other.abort()
        if self.lost == {"up", "down"} and not self.done.done():
            self.done.set_result(None)

    def watch_idle(self) -> None:
        if self.done.done():
            return
        idle = self.tunnels.rules.idle_timeout_s
        quiet = time.monotonic() - self.last
        if quiet >= idle:
            self.end("idle")
            return
        asyncio.get_running_loop().call_later(idle - quiet + 0.01, self.watch_idle)


class _Side(asyncio.BufferedProtocol):
    """One side of a `_Flow`: what it receives goes the flow's `way`. It reads into a buffer of
    its own, reused (a fresh object per read costs the allocator more than the copy)."""

    def __init__(self, flow: _Flow, way: str) -> None:
        self.flow, self.way = flow, way
        self.buffer = memoryview(bytearray(TUNNEL_READ))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        # the transport sends at once what it can and copies only what it cannot: the buffer is free again
        self.flow.received(self.way, self.buffer[:nbytes])

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.way == "down":  # the upstream's: nothing is read before the client has its 200
            self.flow.upstream = transport
            transport.pause_reading()  # type: ignore[attr-defined]

    def eof_received(self) -> bool:
        self.flow.half_close(self.way)
        return True  # keep the transport: the other way may still carry an answer

    def pause_writing(self) -> None:  # this side's peer cannot take more: stop reading what feeds it
        src = self.flow.side(self.way)
        if src is not None and not src.is_closing():
            src.pause_reading()

    def resume_writing(self) -> None:
        src = self.flow.side(self.way)
        if src is not None and not src.is_closing():
            src.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.flow.connection_lost(self.way, exc)


async def _carry(
    tunnels: Tunnels,
    conn: h11.Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    addresses: list[IPAddress],
    where: dict[str, Any],
) -> None:
    """Connect to the first of `addresses` that answers, answer the client 200, and carry the
    tunnel until it ends (Refused when no address answers)."""
    client: Any = writer.transport
    flow = _Flow(tunnels, where, client, client.get_protocol())
    loop = asyncio.get_running_loop()
    port, last_error = where["port"], None
    for ip in addresses:
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: _Side(flow, "down"), str(ip), port), tunnels.rules.connect_timeout_s
            )
            break
        except (OSError, TimeoutError) as exc:
            last_error = exc
    else:
        raise Refused(502, f"could not connect to port {port}: {last_error}")
    if tunnels.closed:  # the run ended while this tunnel was connecting
        flow.upstream.abort()
        return
    where = {**where, "address": str(ip)}
    _later(tunnels.on_event, "opened", where)  # at most max_connections of these: bounded
    tunnels.connected += 1
    tunnels.upstreams.add(flow.upstream)
    started = time.monotonic()
    try:
        client.write(conn.send(h11.Response(status_code=200, headers=[], reason=b"Connection Established")) or b"")
        # what was read past the request already: h11's, and the stream's (asyncio keeps it there)
        buffered: bytearray = getattr(reader, "_buffer", bytearray())
        early = conn.trailing_data[0] + bytes(buffered)
        buffered.clear()
        client.set_protocol(_Side(flow, "up"))
        client.resume_reading()  # the stream protocol may have paused it
        if early:
            flow.received("up", early)
        flow.upstream.resume_reading()
        flow.watch_idle()
        await flow.done
    finally:
        tunnels.upstreams.discard(flow.upstream)
        if not flow.done.done():  # cancelled: the gateway is shutting down
            flow.end("gateway closed")
        ended = "bytes spent" if flow.ended == "closed" and tunnels.spent() else flow.ended
        seconds = round(time.monotonic() - started, 3)
        _later(tunnels.on_event, "closed", {**where, **flow.moved, "seconds": seconds, "ended": ended})


async def _refuse(conn: h11.Connection, writer: asyncio.StreamWriter, refused: Refused) -> None:
    body = f"airlockd broker: {refused.reason}\n".encode()
    headers = [
        ("content-type", "text/plain; charset=utf-8"),
        ("content-length", str(len(body))),
        ("connection", "close"),
        *refused.headers,
    ]
    with contextlib.suppress(h11.LocalProtocolError, ConnectionError, OSError):
        writer.write(conn.send(h11.Response(status_code=refused.status, headers=headers)) or b"")
        writer.write(conn.send(h11.Data(data=body)) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()


def _later(hook: BrokerHook, event: str, data: dict[str, Any]) -> None:
    """Run the audit hook off the loop (it writes a file)."""
    asyncio.get_running_loop().run_in_executor(None, _quietly, hook, event, data)


def _quietly(hook: BrokerHook, event: str, data: dict[str, Any]) -> None:
    try:
        hook(event, data)
    except Exception:
        log.exception("broker: recording %s failed", event)
