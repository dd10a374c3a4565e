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
import contextlib
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

TUNNEL_READ = 256 * 1024
BrokerHook = Callable[[str, dict[str, Any]], None]  # (event: refused / opened / closed, details): audit


MAX_SHOWN = 20  # refusals and hosts a run's summary lists (all are audited)


@dataclass
class Tunnels:
    """One run's tunnels: its rules and what it has used of them."""

    rules: Broker
    on_event: BrokerHook
    opened: int = 0  # tunnels let past the allow-list and caps (the max_connections cap counts these)
    connected: int = 0  # ... that then reached their host
    active: int = 0
    bytes: int = 0
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    reached: dict[str, int] = field(default_factory=dict)  # "host:port" -> bytes both ways
    refused: int = 0
    refusals: list[dict[str, Any]] = field(default_factory=list)  # the first MAX_SHOWN

    def spent(self) -> bool:
        return self.bytes >= self.rules.max_bytes

    def refuse(self, where: dict[str, Any], refused: Refused) -> None:
        self.refused += 1
        event = {**where, "status": refused.status, "reason": refused.reason}
        if len(self.refusals) < MAX_SHOWN:
            self.refusals.append(event)
        _later(self.on_event, "refused", event)

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
    infos = await asyncio.wait_for(
        loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP), timeout
    )
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
        raise Refused(502, f"{host} does not resolve: {exc}") from None
    usable = [ip for ip in found if reachable(ip)]
    if not usable:
        shown = ", ".join(str(ip) for ip in found[:4]) or "nothing"
        raise Refused(
            403,
            f"{host} resolves to {shown}: not a public address, and a host name in the broker's"
            " allow-list never reaches this machine or a private network (name the address itself in the"
            " policy to allow it)",
        )
    return usable


async def _connect(addresses: list[IPAddress], port: int, timeout: float) -> tuple[Any, Any, IPAddress]:
    last: Exception | None = None
    for ip in addresses:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(str(ip), port), timeout)
        except (OSError, TimeoutError) as exc:
            last = exc
            continue
        return reader, writer, ip
    raise Refused(502, f"could not connect to port {port}: {last}")


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
            addresses = await _addresses(host, port, entry.address is not None, rules.connect_timeout_s)
            up_reader, up_writer, ip = await _connect(addresses, port, rules.connect_timeout_s)
        except Refused as refused:
            tunnels.refuse(where, refused)
            await _refuse(conn, writer, refused)
            return
        await _carry(tunnels, conn, reader, writer, up_reader, up_writer, {**where, "address": str(ip)})
    finally:
        tunnels.active -= 1


async def _carry(
    tunnels: Tunnels,
    conn: h11.Connection,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
    where: dict[str, Any],
) -> None:
    _later(tunnels.on_event, "opened", where)
    tunnels.connected += 1
    tunnels.writers.add(up_writer)
    started = time.monotonic()
    moved = {"up": 0, "down": 0}
    last = [time.monotonic()]
    ended = ["closed"]
    idle = tunnels.rules.idle_timeout_s
    reached = f"{where['host']}:{where['port']}"
    try:
        writer.write(conn.send(h11.Response(status_code=200, headers=[], reason=b"Connection Established")) or b"")
        early, _ = conn.trailing_data
        if early:
            up_writer.write(early)
            tunnels.bytes += len(early)
            moved["up"] += len(early)
            tunnels.reached[reached] = tunnels.reached.get(reached, 0) + len(early)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, way: str) -> None:
            """Copy one way until its end (then half-close: the other way may still carry an
            answer), or until the tunnel idles out, the run's bytes are spent, or either side
            fails (then both sides close)."""
            try:
                while ended[0] == "closed":
                    try:
                        data = await asyncio.wait_for(src.read(TUNNEL_READ), idle)
                    except TimeoutError:
                        if time.monotonic() - last[0] < idle:
                            continue  # the other way is busy: a download needs no upload
                        ended[0] = "idle"
                        break
                    if not data:
                        if dst.can_write_eof():
                            dst.write_eof()
                        return
                    last[0] = time.monotonic()
                    if tunnels.bytes + len(data) > tunnels.rules.max_bytes:
                        tunnels.bytes = tunnels.rules.max_bytes  # spent: no tunnel opens after this one
                        ended[0] = "bytes spent"
                        break
                    tunnels.bytes += len(data)
                    moved[way] += len(data)
                    tunnels.reached[reached] = tunnels.reached.get(reached, 0) + len(data)
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            for w in (writer, up_writer):
                w.close()

        await asyncio.gather(pump(reader, up_writer, "up"), pump(up_reader, writer, "down"))
    finally:
        tunnels.writers.discard(up_writer)
        up_writer.close()
        with contextlib.suppress(Exception):
            await up_writer.wait_closed()
        if tunnels.spent() and ended[0] == "closed":
            ended[0] = "bytes spent"
        seconds = round(time.monotonic() - started, 3)
        _later(tunnels.on_event, "closed", {**where, **moved, "seconds": seconds, "ended": ended[0]})


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
