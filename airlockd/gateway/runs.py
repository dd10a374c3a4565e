"""The gateway of this process and its wiring into one run: socket, token, usage, audit.

One `Gateway` per process, started on first use: the process that executes a run (`airlockd run
--wait`, the background `_execute`, or the `serve` daemon's run pool) is the one that serves its
model traffic, so the run-token key never leaves that process.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from airlockd.errors import PolicyError
from airlockd.gateway.server import Gateway, Route
from airlockd.policy import AgentConfig, Broker, Policy
from airlockd.records import RunRecord

SOCKET_DIR = "/run/airlock/gw"  # where the run's socket directory is mounted, read-only
SOCKET_NAME = "gateway.sock"
PORT = 8181  # the forwarder's port on the container's loopback
TOKEN_ENV = "AIRLOCK_RUN_TOKEN"
ORIGIN = f"http://127.0.0.1:{PORT}"  # what Anthropic clients append /v1/messages to
BASE_URL = f"{ORIGIN}/v1"  # what OpenAI clients append /responses, /chat/completions to

_lock = threading.Lock()
_gateway: Gateway | None = None
_meters: dict[str, Any] = {}  # run id -> RunMonitor counting the run's tokens


def process_gateway() -> Gateway:
    global _gateway
    with _lock:
        if _gateway is None:
            _gateway = Gateway().start()
        return _gateway


def uses_gateway(cfg: AgentConfig) -> bool:
    """An agent CLI (codex, claude) always talks to its model through the gateway; a command
    agent when it asks."""
    return cfg.network == "gateway" or cfg.adapter != "command"


def uses_socket(policy: Policy, agent: str) -> bool:
    """Whether the agent's container gets the gateway's socket: for its model, or for the
    package broker (its `[broker] allow` names a host)."""
    return uses_gateway(policy.agent(agent)) or bool(policy.broker_for(agent).allow)


def open_for_run(
    service: Any, rec: RunRecord, cfg: AgentConfig, provider: str | None = None
) -> tuple[dict[str, str], list[tuple[Path, str, bool]]]:
    """Open the run's gate to `provider`'s route (None: `[gateway]`'s own, a command agent's) and
    to the package broker its policy allows; the environment and mounts that give its container
    the model, those hosts and nothing else. The real key is read here, masked everywhere, and
    never leaves memory. An agent that does not use the model gateway but has a broker gets a
    route that allows no request."""
    gw = service.policy.gateway
    table = gw.route_for(provider)
    if table is None:
        raise PolicyError(
            f"agent {rec.agent!r} ({cfg.adapter}) speaks the {provider} API, and the policy has no route for it:"
            f" [gateway] is for {gw.provider}",
            hint=f"add [gateway.providers.{provider}] (upstream, key_env, allowed) to policies.toml",
        )
    model = uses_gateway(cfg)
    route = Route.from_policy(table) if model else Route(upstream="", allowed=frozenset(), key="")
    broker = service.policy.broker_for(rec.agent)
    if route.key:
        service.redactor.add(route.key)
    d = service.state.run_dir(rec.id) / "gw"
    d.mkdir(mode=0o755, exist_ok=True)
    os.chmod(d, 0o755)  # the container's user must reach the socket inside it
    ttl = min(gw.token_ttl_s, cfg.limits.wall_time_s + 60)
    token = process_gateway().open_run(
        rec.id,
        rec.agent,
        route,
        d / SOCKET_NAME,
        ttl_s=ttl,
        on_usage=lambda n: _usage(rec.id, n),
        on_refused=lambda reason, data: service.gateway_refused(rec.id, reason, **data),
        broker=broker,
        on_broker=lambda event, data: service.audit.append(
            f"broker.{event}", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **data
        ),
    )
    service.redactor.add(token, in_names=False)  # short-lived: no staged name predates it
    service.audit.append(
        "gateway.opened",
        run=rec.id,
        agent=rec.agent,
        policy=rec.policy_revision,
        upstream=urlsplit(route.upstream).netloc if model else None,
        allowed=sorted(f"{m} {p}" for m, p in route.allowed),
        broker=[str(e) for e in broker.entries],
        token_ttl_s=ttl,
    )
    env = {
        "AIRLOCK_GATEWAY_SOCKET": f"{SOCKET_DIR}/{SOCKET_NAME}",
        "AIRLOCK_GATEWAY_PORT": str(PORT),
        TOKEN_ENV: token,
        **(broker_env(token, broker) if broker.allow else {}),
    }
    if not model:
        return env, [(d, SOCKET_DIR, True)]
    env |= {
        "OPENAI_API_KEY": token,  # what OpenAI clients look for: the run token, never the real key
        "OPENAI_BASE_URL": BASE_URL,
        "ANTHROPIC_API_KEY": token,  # what Anthropic clients look for (sent as x-api-key)
        "ANTHROPIC_BASE_URL": ORIGIN,
        "GEMINI_API_KEY": token,  # what Gemini clients look for (sent as x-goog-api-key)
        "GOOGLE_GEMINI_BASE_URL": ORIGIN,
    }
    return env, [(d, SOCKET_DIR, True)]


def broker_env(token: str, broker: Broker) -> dict[str, str]:
    """How clients in the container find the package broker: the proxy variables that pip, npm,
    yarn, cargo, go, curl and git read (upper and lower case: each client reads one or the other),
    with the run token as the proxy's password. No HTTP_PROXY: the model gateway's base URLs are
    plain http on the container's loopback, so they are never proxied, and no NO_PROXY either (a
    registry named by its address, 127.0.0.1 included, still goes through the broker).
    AIRLOCK_BROKER_HOSTS names what it allows, for an agent (or its scripts) to read."""
    proxy = f"http://airlock:{token}@127.0.0.1:{PORT}"
    return {
        "HTTPS_PROXY": proxy,
        "https_proxy": proxy,
        "npm_config_https_proxy": proxy,
        "AIRLOCK_BROKER_HOSTS": " ".join(str(e) for e in broker.entries),
    }


def attach(run_id: str, monitor: Any) -> None:
    """Usage the gateway measures for `run_id` is counted by `monitor` (its token budget)."""
    with _lock:
        _meters[run_id] = monitor


def _usage(run_id: str, tokens: int) -> bool:
    with _lock:
        monitor = _meters.get(run_id)
    return bool(monitor.add_tokens(tokens)) if monitor is not None else False


def revoke(run_id: str) -> None:
    """The run's token stops working now (stop / kill requested in this process)."""
    with _lock:
        gw = _gateway
    if gw is not None:
        gw.revoke(run_id)


def close_for_run(service: Any, rec: RunRecord) -> None:
    """Revoke the token, close the socket and its streams, record what passed."""
    with _lock:
        gw = _gateway
        _meters.pop(rec.id, None)
    if gw is None:
        return
    gate = gw.gate(rec.id)
    if gate is None:
        return
    requests, cut = gate.requests, gate.cut
    tokens = gw.close_run(rec.id)
    tunnels = gate.tunnels
    # kept with the run when it had a broker, or asked for one it did not have
    egress = tunnels.summary() if tunnels is not None and (tunnels.rules.allow or tunnels.refused) else {}
    if egress:
        service.store.update_run(rec.id, lambda r: setattr(r, "egress", egress))
    service.audit.append(
        "gateway.closed",
        run=rec.id,
        agent=rec.agent,
        policy=rec.policy_revision,
        requests=requests,
        tokens=tokens,
        budget_cut=cut,
        broker={k: egress[k] for k in ("tunnels", "bytes", "refused")} if egress else None,
    )
