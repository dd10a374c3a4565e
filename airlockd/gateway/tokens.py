"""Run tokens: short-lived, HMAC-SHA256-signed bearer tokens bound to one run and its agent.

A token is `alrt_<payload>.<mac>` (base64url, no padding); the payload is the run id, the agent,
the expiry and a nonce. The signing key is 32 random bytes made when a `RunTokens` is created and
kept only in this process's memory: the gateway that checks a token lives in the same process that
minted it (the one executing the run), so the key never needs to be shared, written or sent.
A token also stops working when its run is revoked (the run ended, was stopped or killed), long
before it expires. Never logs or stores a token; every comparison is constant-time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

PREFIX = "alrt_"  # the Redactor's "airlock-run-token" detector knows this prefix


class TokenRefused(Exception):
    """A token that must not pass; `reason` says why, without echoing the token."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class RunToken:
    """What a valid token is bound to."""

    run_id: str
    agent: str
    expires_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class RunTokens:
    """Mints and checks run tokens with a key that exists only in this object. Thread-safe."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._key = secrets.token_bytes(32)
        self._clock = clock
        self._lock = threading.Lock()
        self._live: dict[str, str] = {}  # run id -> nonce of its one valid token

    def mint(self, run_id: str, agent: str, ttl_s: float) -> str:
        """A new token for `run_id`; any earlier token of that run stops working."""
        nonce = secrets.token_hex(8)
        payload = json.dumps(
            {"r": run_id, "a": agent, "e": round(self._clock() + ttl_s, 3), "n": nonce},
            separators=(",", ":"),
        ).encode()
        body = _b64(payload)
        mac = _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())
        with self._lock:
            self._live[run_id] = nonce
        return f"{PREFIX}{body}.{mac}"

    def revoke(self, run_id: str) -> None:
        """The run's token stops working now (run ended, stopped or killed)."""
        with self._lock:
            self._live.pop(run_id, None)

    def live(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._live

    def verify(self, token: str, *, run_id: str | None = None) -> RunToken:
        """The run a token is bound to, or TokenRefused. With `run_id`, the token must be that
        run's: a token of another run is refused even when it is valid."""
        if not token.startswith(PREFIX) or token.count(".") != 1:
            raise TokenRefused("not a run token")
        body, _, mac = token[len(PREFIX) :].partition(".")
        want = hmac.new(self._key, body.encode(), hashlib.sha256).digest()
        try:
            got = _unb64(mac)
        except ValueError:
            got = b""
        if not hmac.compare_digest(want, got):
            raise TokenRefused("bad signature")
        try:
            claims = json.loads(_unb64(body))
            bound = RunToken(str(claims["r"]), str(claims["a"]), float(claims["e"]))
            nonce = str(claims["n"])
        except (ValueError, KeyError, TypeError):
            raise TokenRefused("malformed token") from None
        if run_id is not None and not hmac.compare_digest(bound.run_id.encode(), run_id.encode()):
            raise TokenRefused("token of another run")
        if self._clock() >= bound.expires_at:
            raise TokenRefused("token expired")
        with self._lock:
            current = self._live.get(bound.run_id)
        if current is None or not hmac.compare_digest(current.encode(), nonce.encode()):
            raise TokenRefused("run is over or token revoked")
        return bound
