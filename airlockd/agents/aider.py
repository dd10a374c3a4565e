"""The `aider` adapter: Aider (PyPI `aider-chat`, a tree of its own on the runtime image's Python:
`airlockd runtime build --with aider`) headless, with a private home per agent.

Aider edits by text: the model answers with edit blocks, and shell commands it suggests are run
(`--yes-always`); it has no tools and no git here (`--no-git`: the staged copy's repository is not
its to commit to). Its home (lent to each run as a capped copy: homes.py) is its `HOME` and holds
its conversations, one chat history file per session (`chats/<id>.md`, never in the workspace,
where it would be proposed as a change); a follow-up restores the earlier run's session
(`--restore-chat-history` on that file) when it is still there. The model's metadata file, which
spares it the lookup of a model catalogue, is written afresh before every run.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path

from airlockd.agents import homes
from airlockd.agents.command import Invocation
from airlockd.policy import AgentConfig

HOME_IN_CONTAINER = "/run/airlock/aider-home"
PROVIDER = "openai"  # chat completions through [gateway]
DEFAULT_MODEL = "gpt-5"
CHATS = "chats"
METADATA = "model-metadata.json"
# Every switch that keeps it from looking anything up (zero lookups when checked: AGENT-CLIS.md)
# or from asking: no update check, no analytics, a local model catalogue, no git, no colours.
SWITCHES = [
    "--yes-always", "--no-git", "--no-auto-commits", "--no-check-update", "--analytics-disable",
    "--no-show-release-notes", "--no-show-model-warnings", "--no-pretty", "--no-fancy-input",
]  # fmt: skip
_SESSION = re.compile(r"[0-9a-f]{32}")


def _model(options: list[str]) -> tuple[str, list[str]]:
    """The model the policy's `command` names (`--model NAME`, with or without `openai/`), and
    the other options."""
    model, rest, it = DEFAULT_MODEL, [], iter(options)
    for opt in it:
        if opt == "--model":
            model = next(it, model)
        elif opt.startswith("--model="):
            model = opt.partition("=")[2]
        else:
            rest.append(opt)
    return model.removeprefix("openai/"), rest


def sessions(home: Path) -> dict[str, Path]:
    """Session id -> its chat history, for every `chats/<id>.md` in `home` (never through a link)."""
    root = home / CHATS
    if root.is_symlink() or not root.is_dir():
        return {}
    try:
        with os.scandir(root) as it:
            return {
                f.name[:-3]: Path(f.path)
                for f in it
                if f.name.endswith(".md") and _SESSION.fullmatch(f.name[:-3]) and f.is_file(follow_symlinks=False)
            }
    except OSError:
        return {}


def invocation(agent: AgentConfig, prompt: str, home: Path, base_url: str, *, resume: str | None = None) -> Invocation:
    """`aider --message=PROMPT` on a session's chat history (a new one, or `resume`'s restored);
    `command` in the policy, when given, names the model (`["--model", "NAME"]`) and adds options
    (e.g. `["--edit-format", "diff"]`)."""
    model, options = _model(list(agent.command))
    name = f"openai/{model}"
    meta = {name: {"max_input_tokens": 128000, "max_output_tokens": 8192, "input_cost_per_token": 0,
                   "output_cost_per_token": 0, "litellm_provider": "openai", "mode": "chat"}}  # fmt: skip
    homes.write_fresh(home, METADATA, json.dumps(meta) + "\n")
    homes.ensure_dir(home, CHATS)
    session = resume or uuid.uuid4().hex
    at = HOME_IN_CONTAINER
    argv = ["aider", "--model", name, *SWITCHES, "--model-metadata-file", f"{at}/{METADATA}"]
    argv += ["--chat-history-file", f"{at}/{CHATS}/{session}.md", "--input-history-file", f"{at}/input.history"]
    argv += [*(["--restore-chat-history"] if resume else []), *options, f"--message={prompt}"]
    env = {**agent.env, "HOME": at, "OPENAI_API_BASE": base_url, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return Invocation(argv, None, env, [(home, HOME_IN_CONTAINER, False)])
