"""The `command` adapter: any argv, the prompt on standard input or in a "{prompt}" placeholder."""

from __future__ import annotations

import locale
from dataclasses import dataclass, field
from pathlib import Path

from airlockd.policy import AgentConfig

PLACEHOLDER = "{prompt}"


@dataclass(frozen=True)
class Invocation:
    argv: list[str]
    stdin_file: Path | None
    env: dict[str, str] = field(default_factory=dict)
    # extra bind mounts (host path, container path, read_only): e.g. a Codex home
    mounts: list[tuple[Path, str, bool]] = field(default_factory=list)


def stdin_bytes(agent: AgentConfig, prompt: str) -> bytes | None:
    """What the agent reads on its standard input (the prompt, as its prompt file holds it); None
    when it takes the prompt in its argv."""
    return None if agent.prompt == "argv" else prompt.encode(locale.getpreferredencoding(False))


def invocation(agent: AgentConfig, prompt: str, run_dir: Path) -> Invocation:
    """The argv and stdin for one run; the prompt file is private to the run (0600)."""
    data = stdin_bytes(agent, prompt)
    if data is None:
        return Invocation([a.replace(PLACEHOLDER, prompt) for a in agent.command], None, dict(agent.env))
    prompt_file = run_dir / "prompt"
    prompt_file.write_bytes(data)
    prompt_file.chmod(0o644)  # read by the container's non-root user, mounted read-only
    return Invocation(list(agent.command), prompt_file, dict(agent.env))
