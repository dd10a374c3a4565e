"""Run tokens: bound to run, agent and expiry; HMAC-signed; revoked with the run."""

from __future__ import annotations

import pytest

from airlockd.gateway.tokens import PREFIX, RunTokens, TokenRefused
from airlockd.redact import Redactor


def test_token_binds_run_agent_and_expiry() -> None:
    now = [100.0]
    tokens = RunTokens(clock=lambda: now[0])
    tok = tokens.mint("r1", "codex", 30)
    assert tok.startswith(PREFIX)
    bound = tokens.verify(tok, run_id="r1")
    assert (bound.run_id, bound.agent, bound.expires_at) == ("r1", "codex", 130.0)
    with pytest.raises(TokenRefused, match="another run"):
        tokens.verify(tok, run_id="r2")
    now[0] = 130.0
    with pytest.raises(TokenRefused, match="expired"):
        tokens.verify(tok)


def test_tampered_foreign_and_revoked_tokens_fail() -> None:
    tokens = RunTokens()
    tok = tokens.mint("r1", "codex", 30)
    body, mac = tok[len(PREFIX) :].split(".")
    other = RunTokens().mint("r1", "codex", 30)
    for bad in [other, f"{PREFIX}{body}x.{mac}", f"{PREFIX}{body}.{mac[:-2]}", "alrt_", "Bearer x", tok + ".x"]:
        with pytest.raises(TokenRefused):
            tokens.verify(bad)
    newer = tokens.mint("r1", "codex", 30)  # re-minting replaces the run's token
    with pytest.raises(TokenRefused, match="revoked"):
        tokens.verify(tok)
    tokens.verify(newer)
    tokens.revoke("r1")
    with pytest.raises(TokenRefused, match="run is over"):
        tokens.verify(newer)


def test_tokens_are_masked_by_the_redactor() -> None:
    tok = RunTokens().mint("r1", "codex", 30)
    assert tok not in Redactor().text(f"OPENAI_API_KEY={tok} and Bearer {tok}")
