"""Admission: may this request start a run? Pure checks on the policy, usage and prompt.

The caller holds the store's lock around check-and-spend, so two requests racing for the last run
slot or the last tokens cannot both pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from airlockd.policy import AgentConfig
from airlockd.records import AgentUsage
from airlockd.redact import find_secrets

# Phrases that try to talk an agent out of its instructions: flagged in the evidence, not refused.
INJECTION_MARKERS = (
    "ignore previous instructions",
    "ignore all previous instructions",
    "disregard the above",
    "you are now",
    "system prompt",
    "exfiltrate",
    "base64 -d | sh",
    "curl | sh",
)


@dataclass(frozen=True)
class Screening:
    secrets: list[str]  # detector names that fired (never the values)
    injection_markers: list[str]


def screen_prompt(prompt: str, known_values: list[str] | None = None) -> Screening:
    """Find secrets (by detector, or a known withheld value) and injection markers in a prompt."""
    secrets = sorted({name for name, _ in find_secrets(prompt)})
    if known_values and any(v in prompt for v in known_values):
        secrets.append("withheld-value")
    lowered = prompt.lower()
    markers = [m for m in INJECTION_MARKERS if m in lowered]
    return Screening(secrets, markers)


def refusal(agent: AgentConfig, usage: AgentUsage, prompt: str, live_runs: int) -> str | None:
    """The reason this request must be refused, or None when it may be admitted."""
    budget = agent.admission
    if usage.quarantined:
        return f"agent {usage.name!r} is quarantined ({usage.reason}); `airlockd release {usage.name}` lifts it"
    size = len(prompt.encode())
    if budget.max_prompt_bytes and size > budget.max_prompt_bytes:
        return f"prompt is {size} bytes; the agent's limit is {budget.max_prompt_bytes}"
    if budget.max_runs and usage.runs_used >= budget.max_runs:
        return f"run budget spent: {usage.runs_used} of {budget.max_runs} runs used"
    if budget.max_tokens and usage.tokens_used >= budget.max_tokens:
        return f"token budget spent: {usage.tokens_used} of {budget.max_tokens} model tokens used"
    if budget.max_concurrent and live_runs >= budget.max_concurrent:
        return f"{live_runs} runs of this agent are already live; the limit is {budget.max_concurrent}"
    return None
