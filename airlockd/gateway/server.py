"""The model gateway: one Unix socket per run, forwarding only allowed requests to the upstream.

Each run gets its own socket (in its state dir, mounted into that run's container only). A request
passes when it carries the run's token (`Authorization: Bearer alrt_...`, `x-api-key`, or for
Gemini `x-goog-api-key` or a `key=` query parameter) and its "METHOD /path" is in the policy's
allow-list (never a path with a `.` or `..` segment); the token is then swapped for the real key
where the agent put it (a query `key` goes upstream as `x-goog-api-key`, never in the URL), which is
read from the environment or a file when the run's gate opens and kept in memory only. Only the
query parameters the provider's clients need go upstream (Gemini: `alt=sse`; Anthropic: `beta`;
others: all but `key`), and a streamed chat completion is made to ask for its usage
(`stream_options.include_usage`). Responses stream through chunk by chunk (SSE is never buffered
whole) while their usage is read (usage.py, per protocol); a run whose token budget runs out
mid-stream has that stream cut and every later request refused. A client that hangs up does not
end the metering: the rest of the answer is read (for up to DRAIN_S seconds and DRAIN_MAX bytes)
for its usage. A 2xx answer whose usage was not measured (none reported, some too large to read,
or the answer not read to its end) is charged an estimate, (request bytes + response bytes) / 4 less
what was measured, and audited as such: it never costs 0. A large request body goes upstream in
slices, so each connection holds its body once.
Everything refused gets a clear status (401, 403, 404, 405, 413, 429: budget spent, or more than
MAX_CONNECTIONS admitted requests of one run in flight at once) and an audit event.

It runs on its own asyncio loop in a background thread (`Gateway`), so it works the same in
`airlockd run --wait` (the executing process) and in `airlockd serve` (the daemon).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import re
import socket
import stat
import threading
import urllib.parse
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import h11
import httpx

from airlockd.errors import PolicyError
from airlockd.gateway.broker import BrokerHook, Tunnels, open_tunnel
from airlockd.gateway.tokens import PREFIX, RunTokens, TokenRefused
from airlockd.gateway.usage import JsonUsage, SseUsage
from airlockd.policy import Broker

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_REQUEST_BODY = 32 * 1024 * 1024
READ_SIZE = 64 * 1024
MAX_CONNECTIONS = 16  # admitted requests of one run in flight at once; more are answered 429
DRAIN_S = 30.0  # after a client hangs up mid-answer, how long the rest is still read for its usage
DRAIN_MAX = 32 * 1024 * 1024  # ... and how many bytes of it
ESTIMATE_BYTES_PER_TOKEN = 4  # an answer whose usage is not known costs (request + response bytes) / 4
# Query parameters that go upstream, by provider (others: every one but `key`). Gemini's API reads
# system parameters from the query (`fields`/`$fields` to trim the answer, its usage with it;
# `$alt`/`alt=proto`; `userProject` to bill another project), so only what its clients send
# passes: `alt=sse`, exactly. Anthropic's clients send `beta=true` on beta endpoints.
_QUERY_KEPT: dict[str, Callable[[str], bool]] = {
    "gemini": lambda part: part == "alt=sse",
    "anthropic": lambda part: part.partition("=")[0] == "beta",
}
# Request headers an agent may send upstream, by provider: what its clients need to be understood
# (content negotiation, API version and beta switches, SDK telemetry). Everything else is dropped:
# credentials, cookies, hop headers, and account or project selectors (`OpenAI-Organization`,
# `OpenAI-Project`), which only the policy sets ([gateway] headers), so an agent cannot bill
# another organisation the key can reach.
_PASS_COMMON = frozenset({"content-type", "accept", "user-agent", "idempotency-key", "x-request-id"})
_PASS_PREFIX_COMMON = ("x-stainless-",)  # the official SDKs' platform telemetry
PROVIDER_HEADERS: dict[str, frozenset[str]] = {
    "openai": frozenset({"openai-beta", "originator", "session_id", "conversation_id", "version"}),
    "anthropic": frozenset({"anthropic-version", "anthropic-beta", "x-app"}),
    "gemini": frozenset({"x-goog-api-client"}),
    "generic": frozenset(),
}
# Never passed, whatever a policy adds: the gateway sets them, or they carry credentials or hops.
_NEVER = frozenset(
    {
        "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length", "authorization", "x-api-key",
        "accept-encoding", "cookie", "x-goog-api-key", "api-key",
    }
)  # fmt: skip
_HOP_RESPONSE = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "set-cookie"}
)

UsageHook = Callable[[int], bool]  # tokens just measured -> True when the run's budget is spent
RefusedHook = Callable[[str, dict[str, Any]], None]  # (reason, details): audit; called off the loop


@dataclass(frozen=True)
class Route:
    """The policy's `[gateway]` for one run: where to, with which key, which requests."""

    upstream: str
    allowed: frozenset[tuple[str, str]]  # (METHOD, /path)
    key: str = field(repr=False)
    provider: str = "openai"  # which request headers pass (PROVIDER_HEADERS)
    set_headers: tuple[tuple[str, str], ...] = ()  # set on every forwarded request, replacing the agent's
    pass_headers: frozenset[str] = frozenset()  # more request headers the policy lets through

    def allows(self, method: str, path: str) -> bool:
        """Whether `METHOD /path` is in the allow-list: exactly, or by an entry with `*`, which
        stands for one name (letters, digits, `.`, `_`, `-`: a model's, as in Gemini's
        `/v1beta/models/*:streamGenerateContent`); never a path with `..`, `%`, `//` or `\\`, and
        never, whatever the list says, a path with a segment of dots alone (`.`, `..`)."""
        if _dot_segment(path):  # httpx would send `/a/./b` as `/a/b`: a path the allow-list never named
            return False
        if (method, path) in self.allowed:
            return True
        return not _suspicious(path) and any(m == method and _pattern(p).fullmatch(path) for m, p in self.allowed)

    def knows(self, path: str) -> bool:
        """Whether some method is allowed on `path` (a 405 rather than a 404)."""
        return any(self.allows(m, path) for m, _ in self.allowed)

    def passes(self, name: str) -> bool:
        """Whether the agent's request header `name` (lower case) goes upstream."""
        if name in _NEVER or any(name == k for k, _ in self.set_headers):
            return False
        return (
            name in _PASS_COMMON
            or name.startswith(_PASS_PREFIX_COMMON)
            or name in PROVIDER_HEADERS.get(self.provider, frozenset())
            or name in self.pass_headers
        )

    @classmethod
    def from_policy(cls, gw: Any) -> Route:
        """Read the real key named by the policy (env var, else file). Never writes it anywhere."""
        key = ""
        if gw.key_env:
            key = os.environ.get(gw.key_env, "").strip()
        if not key and gw.key_file:
            try:
                key = Path(gw.key_file).expanduser().read_text().strip()
            except OSError as exc:
                raise PolicyError(
                    f"the gateway key file {gw.key_file} cannot be read: {exc.strerror}",
                    hint="fix [gateway] key_file, or set the variable named by key_env",
                ) from None
        if not key:
            raise PolicyError(
                "the model gateway has no key: "
                + (f"${gw.key_env} is not set" if gw.key_env else "no key_env or key_file in [gateway]"),
                hint="export the key in the variable [gateway] key_env names, or point key_file at a 0600 file",
            )
        allowed = set()
        for entry in gw.allowed:
            method, _, path = entry.strip().partition(" ")
            if not method or not path.startswith("/"):
                raise PolicyError(
                    f"[gateway] allowed entry {entry!r} is not 'METHOD /path'", hint='e.g. "POST /v1/responses"'
                )
            allowed.add((method.upper(), path.strip()))
        return cls(
            gw.upstream.rstrip("/"),
            frozenset(allowed),
            key,
            provider=gw.provider,
            set_headers=tuple((k.lower(), v) for k, v in gw.headers.items()),
            pass_headers=frozenset(h.lower() for h in gw.pass_headers),
        )


@dataclass
class RunGate:
    """One run's socket and its accounting."""

    run_id: str
    agent: str
    route: Route
    socket_path: Path
    on_usage: UsageHook
    on_refused: RefusedHook
    server: asyncio.AbstractServer | None = None
    tokens: int = 0
    requests: int = 0
    cut: bool = False  # budget spent: streams closed, further requests refused
    closed: bool = False  # the run's gate is closed: nothing more is read for it
    connections: int = 0  # admitted requests in flight (at most MAX_CONNECTIONS)
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    tunnels: Tunnels | None = None  # the package broker's rules and use (no `allow`: every CONNECT refused)


class Gateway:
    """The gateway of one process: a loop thread, the run-token key, the upstream client and
    one `RunGate` per live run. Methods other than the coroutines are called from any thread."""

    def __init__(self, tokens: RunTokens | None = None) -> None:
        self.tokens = tokens or RunTokens()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx.AsyncClient | None = None
        self._gates: dict[str, RunGate] = {}
        self._lock = threading.Lock()

    # -- lifecycle (any thread) ------------------------------------------------------------

    def start(self) -> Gateway:
        with self._lock:
            if self._thread is not None:
                return self
            ready = threading.Event()
            loop = asyncio.new_event_loop()

            def main() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            self._loop = loop
            self._thread = threading.Thread(target=main, name="airlockd-gateway", daemon=True)
            self._thread.start()
        ready.wait(10)
        return self

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        assert self._loop is not None, "Gateway.start() first"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def open_run(
        self,
        run_id: str,
        agent: str,
        route: Route,
        socket_path: Path,
        *,
        ttl_s: float,
        on_usage: UsageHook,
        on_refused: RefusedHook,
        broker: Broker | None = None,
        on_broker: BrokerHook | None = None,
    ) -> str:
        """Serve `run_id` on `socket_path` (created 0666: the container's user connects) and
        return the run's token. The socket's directory must exist. With `broker` (its rules), the
        same socket tunnels to the hosts they allow (broker.py), each event given to `on_broker`."""
        self.start()
        gate = RunGate(run_id, agent, route, socket_path, on_usage, on_refused)
        gate.tunnels = Tunnels(broker or Broker(), on_broker or (lambda event, data: None))
        self._call(self._listen(gate))
        with self._lock:
            self._gates[run_id] = gate
        return self.tokens.mint(run_id, agent, ttl_s)

    def close_run(self, run_id: str) -> int:
        """Revoke the run's token, close its socket and every open stream; the tokens it
        measured. Idempotent."""
        self.tokens.revoke(run_id)
        with self._lock:
            gate = self._gates.pop(run_id, None)
        if gate is None:
            return 0
        if self._loop is not None and self._loop.is_running():
            with contextlib.suppress(Exception):
                self._call(self._close(gate), timeout=10)
        with contextlib.suppress(OSError):
            gate.socket_path.unlink()
        return gate.tokens

    def revoke(self, run_id: str) -> None:
        """The run's token stops working now (stop / kill asked); its socket stays until close."""
        self.tokens.revoke(run_id)

    def gate(self, run_id: str) -> RunGate | None:
        with self._lock:
            return self._gates.get(run_id)

    def shutdown(self) -> None:
        with self._lock:
            ids = list(self._gates)
        for run_id in ids:
            self.close_run(run_id)
        if self._loop is None or self._thread is None:
            return
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._call(self._client.aclose(), timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
        self._loop = self._thread = self._client = None

    # -- on the loop -----------------------------------------------------------------------

    async def _listen(self, gate: RunGate) -> None:
        path = gate.socket_path
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()  # a stale socket of this run id from an earlier process
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # bind through the directory's fd: a state dir can be deeper than sun_path's 108 bytes
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            sock.bind(f"/proc/self/fd/{dfd}/{path.name}")
            os.chmod(path.name, 0o666, dir_fd=dfd, follow_symlinks=False)
        except BaseException:
            sock.close()
            raise
        finally:
            os.close(dfd)
        sock.listen(64)
        sock.setblocking(False)
        gate.server = await asyncio.start_unix_server(lambda r, w: self._serve(gate, r, w), sock=sock)

    async def _close(self, gate: RunGate) -> None:
        gate.closed = True
        if gate.server is not None:
            gate.server.close()
        if gate.tunnels is not None:
            gate.tunnels.closed = True
        for w in gate.writers:
            w.close()
        for t in list(gate.tunnels.upstreams if gate.tunnels else ()):
            t.abort()  # the run is over: what a tunnel still holds to send goes nowhere
        gate.writers.clear()

    def _upstream(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(connect=15, read=600, write=60, pool=60), follow_redirects=False
            )
        return self._client

    async def _serve(self, gate: RunGate, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests one after the other on one connection. Token, method and path, the declared
        size and the budget are checked on the request line and headers, before a byte of the body
        is read; a refused request closes the connection with its body unread. An admitted request
        over MAX_CONNECTIONS in flight (a body read or an answer streaming) is answered 429: a
        connection that never finishes its headers holds no more than h11's bound."""
        gate.writers.add(writer)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        try:
            while True:
                req = await _next(conn, reader)
                if not isinstance(req, h11.Request):
                    return
                if req.method == b"CONNECT":  # the package broker's; nothing more on this connection
                    if gate.tunnels is not None and isinstance(await _next(conn, reader), h11.EndOfMessage):
                        await open_tunnel(gate.tunnels, self.tokens, gate.run_id, conn, reader, writer, req)
                    return
                if not req.target.startswith(b"/"):
                    where = {"method": req.method.decode("ascii", "replace").upper(), "path": _path(req)[:200]}
                    reason = "the gateway takes paths only; other hosts are reached by CONNECT through the broker"
                    await self._refuse(gate, conn, writer, 400, reason, where)
                    return
                if not await self._admit(gate, conn, writer, req):
                    return
                if gate.connections >= MAX_CONNECTIONS:  # admitted requests in flight: bodies held
                    where = {"method": req.method.decode("ascii", "replace").upper(), "path": _path(req)[:200]}
                    reason = f"too many requests to the gateway at once (at most {MAX_CONNECTIONS} per run)"
                    await self._refuse(gate, conn, writer, 429, reason, where)
                    return
                gate.connections += 1
                try:
                    body = await _read_body(conn, reader)
                    if body is None:
                        where = {"method": req.method.decode("ascii", "replace"), "path": _path(req)[:200]}
                        await self._refuse(gate, conn, writer, 413, "request body too large", where)
                        return
                    await self._forward_request(gate, conn, writer, req, body)
                finally:
                    gate.connections -= 1
                if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                    conn.start_next_cycle()
                else:
                    return
        except (h11.RemoteProtocolError, h11.LocalProtocolError, ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            gate.writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _admit(self, gate: RunGate, conn: h11.Connection, writer: asyncio.StreamWriter, req: h11.Request) -> bool:
        """Whether the request may proceed (else it has been answered with why)."""
        method = req.method.decode("ascii", "replace").upper()
        path = _path(req)
        headers = _headers(req)
        where = {"method": method, "path": path[:200]}
        token, _ = _run_token(headers, req.target.decode("ascii", "replace"))
        try:
            if token is None:
                raise TokenRefused("no run token")
            self.tokens.verify(token, run_id=gate.run_id)
        except TokenRefused as exc:
            await self._refuse(gate, conn, writer, 401, f"run token refused: {exc.reason}", where)
            return False
        if not gate.route.allows(method, path):
            if gate.route.knows(path):
                await self._refuse(gate, conn, writer, 405, f"{method} is not allowed on {path}", where)
            elif _suspicious(path):
                await self._refuse(gate, conn, writer, 403, "path refused", where)
            else:
                await self._refuse(gate, conn, writer, 404, f"{path} is not in the gateway's allow-list", where)
            return False
        declared = next((v for k, v in headers if k == "content-length"), None)
        if declared is not None and (not declared.strip().isdigit() or int(declared) > MAX_REQUEST_BODY):
            await self._refuse(gate, conn, writer, 413, "request body too large", where)
            return False
        if gate.cut:
            await self._refuse(gate, conn, writer, 429, "the run's token budget is spent", where)
            return False
        return True

    async def _forward_request(
        self, gate: RunGate, conn: h11.Connection, writer: asyncio.StreamWriter, req: h11.Request, body: bytes
    ) -> None:
        gate.requests += 1
        method = req.method.decode("ascii", "replace").upper()
        await self._forward(gate, conn, writer, method, req.target.decode("ascii", "replace"), _headers(req), body)

    async def _forward(
        self,
        gate: RunGate,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        route = gate.route
        out = [(k, v) for k, v in headers if route.passes(k)]
        dropped = sorted({k for k, _ in headers if not route.passes(k)} - _NEVER)
        if dropped:
            log.info("gateway: run %s: request headers not passed upstream: %s", gate.run_id, ", ".join(dropped)[:500])
        out.extend(route.set_headers)
        _, where = _run_token(headers, target)
        if where in ("x-goog-api-key", "query"):  # Gemini: its key header, and no bearer (read as OAuth)
            out.append(("x-goog-api-key", route.key))
        elif where == "x-api-key" or route.provider == "anthropic":  # Anthropic: its key header alone
            out.append(("x-api-key", route.key))  # (a bearer there is an OAuth token, not an API key)
        else:
            out.append(("authorization", f"Bearer {route.key}"))
        out.append(("accept-encoding", "identity"))  # usage is read from the bytes as they pass
        path = target.partition("?")[0]
        what: dict[str, Any] = {"method": method, "path": path[:200]}
        target, dropped_query = _forwarded_query(target, route.provider)
        if dropped_query:
            log.info(
                "gateway: run %s: query parameters not passed upstream: %s",
                gate.run_id,
                ", ".join(dropped_query)[:500],
            )
        sent = len(body)
        if path.endswith("/chat/completions"):
            if len(body) > 256 * 1024:  # parsing a large body would hold up every other stream
                body = await asyncio.get_running_loop().run_in_executor(None, _ask_for_usage, body)
            else:
                body = _ask_for_usage(body)
        client = self._upstream()
        url = route.upstream + target
        try:
            try:
                resp = await client.send(_upstream_request(client, method, url, out, body), stream=True)
            except _STALE as exc:  # a pooled connection the upstream closed while idle: once more, anew
                log.info(
                    "gateway: run %s: upstream connection went stale (%s); retrying", gate.run_id, type(exc).__name__
                )
                resp = await client.send(_upstream_request(client, method, url, out, body), stream=True)
        except httpx.HTTPError as exc:
            log.warning("gateway: upstream unreachable for run %s: %s", gate.run_id, type(exc).__name__)
            return await _respond(conn, writer, 502, {"error": {"message": "the model upstream is unreachable"}})
        ctype = resp.headers.get("content-type", "")
        meter: SseUsage | JsonUsage = SseUsage() if "text/event-stream" in ctype else JsonUsage()
        relay = _Relay()
        try:
            await self._relay(gate, conn, writer, resp, meter, relay)
        finally:
            await resp.aclose()
            if 200 <= resp.status_code < 300 and not relay.cut:
                self._charge_unmeasured(gate, meter, sent, relay, {**what, "status": resp.status_code})

    async def _relay(
        self,
        gate: RunGate,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        resp: httpx.Response,
        meter: SseUsage | JsonUsage,
        relay: _Relay,
    ) -> None:
        """Pass the upstream's answer to the client chunk by chunk, metering it (`relay` says how
        far it got).

        The budget spent: the client's stream is closed without the chunk that spent it. The client
        gone (its socket failed): the rest is still read into the meter, for up to DRAIN_S seconds
        and DRAIN_MAX bytes, so usage reported at the end is counted all the same."""
        gone_at = -1  # bytes read when the client went; -1 while it is there
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(None) as bound:
                rheaders = [(k, v) for k, v in resp.headers.multi_items() if k.lower() not in _HOP_RESPONSE]
                head = h11.Response(status_code=resp.status_code, headers=_h11_headers(rheaders))
                try:
                    await _send(conn, writer, head)
                except ConnectionError:
                    gone_at = 0
                    bound.reschedule(loop.time() + DRAIN_S)
                async for chunk in resp.aiter_raw():
                    relay.received += len(chunk)
                    if self._measure(gate, meter.feed(chunk)):
                        log.warning("gateway: run %s spent its token budget mid-stream; cutting it off", gate.run_id)
                        relay.cut = True
                        writer.close()  # the client sees the stream end without its last event
                        return
                    if gone_at >= 0:
                        if gate.closed or relay.received - gone_at > DRAIN_MAX:
                            log.info("gateway: run %s: stopped reading an answer its client left", gate.run_id)
                            return
                        continue
                    try:
                        await _send(conn, writer, h11.Data(data=chunk))
                    except ConnectionError:
                        if gate.closed:
                            return
                        log.info(
                            "gateway: run %s: the client left mid-answer; reading the rest for its usage", gate.run_id
                        )
                        gone_at = relay.received
                        bound.reschedule(loop.time() + DRAIN_S)
                relay.complete = True
                if isinstance(meter, JsonUsage) and self._measure(gate, meter.finish()):
                    relay.cut = True
                    writer.close()
                    return
                if gone_at < 0:
                    with contextlib.suppress(ConnectionError):
                        await _send(conn, writer, h11.EndOfMessage())
        except TimeoutError:  # only a client gone sets a deadline
            log.info("gateway: run %s: stopped reading an answer its client left (%.0f s)", gate.run_id, DRAIN_S)
        except httpx.HTTPError as exc:
            log.warning("gateway: upstream stream of run %s broke: %s", gate.run_id, type(exc).__name__)
            writer.close()

    def _charge_unmeasured(
        self, gate: RunGate, meter: SseUsage | JsonUsage, sent: int, relay: _Relay, where: dict[str, Any]
    ) -> None:
        """Fail closed: a 2xx answer whose usage was not measured (none reported; or some of it too
        large or malformed to read, or never read: the upstream broke, or its client left and the
        rest did not come within the drain's bounds) costs an estimate, (request + response bytes)
        / 4 and at least 1, less what was measured; logged and audited (`gateway.refused`, that
        reason, `estimated_tokens`)."""
        if meter.tokens > 0 and not meter.unreadable and relay.complete:
            return
        estimate = max(1, (sent + relay.received) // ESTIMATE_BYTES_PER_TOKEN) - meter.tokens
        if estimate <= 0:
            return
        if meter.unreadable:
            why = "its usage could not be read"
        elif not relay.complete:
            why = "it was not read to its end"
        else:
            why = "it reported no usage"
        log.warning(
            "gateway: run %s: answer to %s %s: %s; charging an estimate of %d tokens",
            gate.run_id,
            where["method"],
            where["path"],
            why,
            estimate,
        )
        self._measure(gate, estimate)
        reason = f"usage not measured ({why}): charged an estimate of {estimate} tokens"
        data = {**where, "estimated_tokens": estimate}
        with contextlib.suppress(RuntimeError):  # no loop: the gateway is shutting down
            asyncio.get_running_loop().run_in_executor(None, _quietly, gate.on_refused, reason, data)

    def _measure(self, gate: RunGate, tokens: int) -> bool:
        """Count measured tokens; True when the run's budget is now spent (cut it off)."""
        if tokens <= 0:
            return gate.cut
        gate.tokens += tokens
        try:
            spent = gate.on_usage(tokens)
        except Exception:  # accounting must not break the stream; it is logged
            log.exception("gateway: usage hook of run %s failed", gate.run_id)
            spent = False
        if spent:
            gate.cut = True
        return gate.cut

    async def _refuse(
        self,
        gate: RunGate,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        status: int,
        reason: str,
        where: dict[str, Any],
    ) -> None:
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, _quietly, gate.on_refused, reason, {**where, "status": status})
        doc = {"error": {"message": reason, "type": "airlock_gateway", "code": status}}
        await _respond(conn, writer, status, doc, close=True)


@dataclass
class _Relay:
    """How far an answer got: bytes read from the upstream, read to its end, cut at the budget."""

    received: int = 0
    complete: bool = False
    cut: bool = False


# What sending on a kept-alive connection that the upstream had closed raises before any byte of
# a response came back (the request was not taken, so sending it again on a new connection is safe).
_STALE = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def _upstream_request(
    client: httpx.AsyncClient, method: str, url: str, headers: list[tuple[str, str]], body: bytes
) -> httpx.Request:
    """The request to the upstream. A body larger than READ_SIZE goes in slices of that size (its
    Content-Length given), so sending it never makes another whole copy of it."""
    if len(body) <= READ_SIZE:
        return client.build_request(method, url, headers=headers, content=body)

    async def slices() -> AsyncIterator[bytes]:
        for start in range(0, len(body), READ_SIZE):
            yield body[start : start + READ_SIZE]

    sized = [*headers, ("content-length", str(len(body)))]
    return client.build_request(method, url, headers=sized, content=slices())


@functools.lru_cache(maxsize=256)
def _pattern(allowed: str) -> re.Pattern[str]:
    """An allow-list path as a pattern: `*` is one name, everything else itself."""
    return re.compile("[A-Za-z0-9._-]+".join(re.escape(part) for part in allowed.split("*")))


def _path(req: h11.Request) -> str:
    return req.target.decode("ascii", "replace").partition("?")[0]


def _headers(req: h11.Request) -> list[tuple[str, str]]:
    return [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in req.headers]


async def _read_body(conn: h11.Connection, reader: asyncio.StreamReader) -> bytes | None:
    """The request's body, or None once it passes MAX_REQUEST_BODY (the rest is left unread)."""
    body = bytearray()
    while True:
        ev = await _next(conn, reader)
        if isinstance(ev, h11.Data):
            if len(body) + len(ev.data) > MAX_REQUEST_BODY:
                return None
            body += ev.data
        elif isinstance(ev, h11.EndOfMessage):
            return bytes(body)
        else:
            raise ConnectionError("the request ended inside its body")


def _quietly(fn: RefusedHook, reason: str, data: dict[str, Any]) -> None:
    try:
        fn(reason, data)
    except Exception:
        log.exception("gateway: recording a refusal failed")


def _run_token(headers: list[tuple[str, str]], target: str) -> tuple[str | None, str]:
    """(the token the request carries, where: "authorization", "x-api-key", "x-goog-api-key",
    "query" (a `key=` parameter) or "" when none). A bearer is taken whatever it holds (a wrong
    one is refused by name); the other places only when they hold something shaped as a run token."""
    for k, v in headers:
        if k == "authorization" and v[:7].lower() == "bearer ":
            return v[7:].strip(), "authorization"
    for name in ("x-api-key", "x-goog-api-key"):
        for k, v in headers:
            if k == name and v.strip().startswith(PREFIX):
                return v.strip(), name
    for param in _key_params(target):
        if param.startswith(PREFIX):
            return param, "query"
    return None, ""


def _key_params(target: str) -> list[str]:
    """The values of the target's `key` query parameters, decoded."""
    query = target.partition("?")[2]
    if not query:
        return []
    return [v for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True) if k == "key"]


def _forwarded_query(target: str, provider: str) -> tuple[str, list[str]]:
    """The target with only the query parameters its provider's clients need (_QUERY_KEPT; for
    other providers every one but `key`, a credential: Google's API key, or the run token in its
    place), every kept byte as sent; and the names of those dropped (for a log line: a name that
    looks like a run token is masked, and values are never given)."""
    path, sep, query = target.partition("?")
    if not sep:
        return target, []
    keep = _QUERY_KEPT.get(provider, lambda part: True)
    kept: list[str] = []
    dropped: list[str] = []
    for part in query.split("&"):
        name = urllib.parse.unquote_plus(part.partition("=")[0])
        if name != "key" and keep(part):
            kept.append(part)
        else:
            dropped.append("<run token>" if PREFIX in name else repr(name[:40]) if name != "key" else "key")
    if not dropped:
        return target, []
    return (f"{path}?{'&'.join(kept)}" if kept else path), dropped


_INCLUDE_USAGE = b'"stream_options":{"include_usage":true},'


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _ask_for_usage(body: bytes) -> bytes:
    """A chat completion's body, made to ask for usage when it streams (`"stream": true`): the
    real API streams none otherwise. Without `stream_options`, that object is put right after the
    opening `{` and every other byte is kept; with one lacking `include_usage: true`, the body is
    written anew (same keys, same order) with it set. A body that is not a JSON object in UTF-8
    (or holds NaN or Infinity) goes as it is: its answer is charged an estimate if it reports no
    usage."""
    try:
        doc = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return body
    if not isinstance(doc, dict) or doc.get("stream") is not True:
        return body
    options = doc.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body
    if "stream_options" not in doc:
        start = body.index(b"{")  # only JSON whitespace can come before it
        return body[: start + 1] + _INCLUDE_USAGE + body[start + 1 :]
    doc["stream_options"] = {**options, "include_usage": True} if isinstance(options, dict) else {"include_usage": True}
    try:
        return json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:  # a number too large for a float (1e999) was read as infinity
        return body


def _dot_segment(path: str) -> bool:
    """Whether a segment of `path` is dots alone (`.`, `..`): a client or httpx would resolve it."""
    return any(seg and not seg.strip(".") for seg in path.split("/"))


def _suspicious(path: str) -> bool:
    return ".." in path or "%" in path or "//" in path or "\\" in path or _dot_segment(path)


def _h11_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1", "replace")) for k, v in headers]


async def _next(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    while True:
        ev = conn.next_event()
        if ev is h11.NEED_DATA:
            data = await reader.read(READ_SIZE)
            conn.receive_data(data)  # b"" marks the end of the peer's data
            continue
        if ev is h11.PAUSED:
            return None
        return ev


async def _send(conn: h11.Connection, writer: asyncio.StreamWriter, event: Any) -> None:
    data = conn.send(event)
    if data:
        writer.write(data)
        await writer.drain()


async def _respond(
    conn: h11.Connection, writer: asyncio.StreamWriter, status: int, doc: dict[str, Any], *, close: bool = False
) -> None:
    body = json.dumps(doc).encode()
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    if close:  # the request's body was left unread: this connection cannot carry another request
        headers.append(("connection", "close"))
    await _send(conn, writer, h11.Response(status_code=status, headers=_h11_headers(headers)))
    await _send(conn, writer, h11.Data(data=body))
    await _send(conn, writer, h11.EndOfMessage())
