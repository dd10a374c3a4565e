"""The `codex` adapter: Codex CLI (npm `@openai/codex`, a static binary in the runtime image) with
a private home per agent and a config whose model provider is the in-container gateway forwarder.

The home lives in the state dir (`agents/<agent>/codex-home`), persists across that agent's runs
and is mounted read-write at CODEX_HOME; airlockd rewrites its config.toml before every run, so what
an agent wrote there during a run never decides where the next run's requests go. The config holds
no credential: `env_key` names the variable that carries the run's short-lived token. A follow-up
resumes the earlier run's Codex session by id when that session is still in the home (it is gone
when that run was rejected and its conversation rolled back: then a fresh session starts).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from airlockd.agents import homes
from airlockd.agents.command import Invocation
from airlockd.policy import AgentConfig

HOME_IN_CONTAINER = "/run/airlock/codex-home"
TOKEN_ENV = "AIRLOCK_RUN_TOKEN"
PROVIDER_ID = "airlock"  # the model provider airlockd writes into its config
PROVIDER = "openai"  # the protocol its gateway route speaks
_ROLLOUT = re.compile(r"rollout-.*-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$")


def config_toml(base_url: str) -> str:
    """Codex's config: the gateway forwarder as its only provider, no approvals, no inner sandbox
    (the container is the sandbox)."""
    return (
        "# Written by airlockd before each run; changes made here by the agent do not last.\n"
        f'model_provider = "{PROVIDER_ID}"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "\n"
        f"[model_providers.{PROVIDER_ID}]\n"
        'name = "airlockd model gateway"\n'
        f"base_url = {json.dumps(base_url)}\n"
        f'env_key = "{TOKEN_ENV}"\n'
        'wire_api = "responses"\n'
    )


SESSION_DEPTH = 8  # Codex keeps sessions/YYYY/MM/DD/rollout-*.jsonl


def sessions(home: Path) -> dict[str, Path]:
    """Session id -> rollout file, for every Codex session recorded in `home`. Never follows a
    link (an agent may leave `sessions` pointing anywhere on the host: attack review) and never
    recurses (a tree may be as deep as an agent made it): SESSION_DEPTH levels at most."""
    found: dict[str, Path] = {}
    root = home / "sessions"
    if root.is_symlink() or not root.is_dir():
        return found
    stack = [(root, 0)]
    while stack:
        d, depth = stack.pop()
        try:
            with os.scandir(d) as it:
                for de in it:
                    if de.is_dir(follow_symlinks=False):
                        if depth < SESSION_DEPTH:
                            stack.append((Path(de.path), depth + 1))
                    elif de.is_file(follow_symlinks=False) and (m := _ROLLOUT.search(de.name)):
                        found[m.group(1)] = Path(de.path)
        except OSError:
            continue
    return found


def write_config(home: Path, text: str) -> None:
    """Write `home/config.toml` afresh (homes.write_fresh: never through a link an agent left)."""
    homes.write_fresh(home, "config.toml", text)


def invocation(agent: AgentConfig, prompt: str, home: Path, base_url: str, *, resume: str | None = None) -> Invocation:
    """`codex exec` (or `codex exec resume ID`) with the prompt as its argument; `command` in the
    policy, when given, adds options (e.g. ["-m", "gpt-5"])."""
    write_config(home, config_toml(base_url))
    head = ["codex", "exec"] + (["resume"] if resume else [])
    argv = [*head, "--skip-git-repo-check", "--json", *agent.command, "--"]
    argv += [resume, prompt] if resume else [prompt]
    env = {**agent.env, "CODEX_HOME": HOME_IN_CONTAINER}
    return Invocation(argv, None, env, [(home, HOME_IN_CONTAINER, False)])
