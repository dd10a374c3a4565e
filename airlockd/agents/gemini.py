"""The `gemini` adapter: Gemini CLI (npm `@google/gemini-cli`, its bundle and a node 24 runtime in
the runtime image: `airlockd runtime build --with gemini`) headless, with a private home per agent.

The agent's home (lent to each run as a capped copy: homes.py) is the CLI's `HOME`: `.gemini/`
holds its settings, its projects and its conversations (`tmp/<project>/chats/session-*.jsonl`,
the first line naming the session). airlockd writes `.gemini/settings.json` afresh before every
run: API-key authentication (without it the CLI takes the base URL for another kind of gateway and
refuses to run headless), no usage statistics (its one lookup when checked), no telemetry, no
update checks; so what an agent wrote there never decides what the next run does. The key it
sees is the run's short-lived token (sent as `x-goog-api-key`); its base URL is the forwarder to
the run's gateway. A follow-up resumes the earlier run's session by id when it is still there.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from airlockd.agents import homes
from airlockd.agents.command import Invocation
from airlockd.policy import AgentConfig

HOME_IN_CONTAINER = "/run/airlock/gemini-home"
PROVIDER = "gemini"
DEFAULT_MODEL = "gemini-2.5-flash"  # a fixed model: `auto` asks a router model first, every turn
SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}
FIRST_LINE = 4096  # a session file's first line (its id) is read up to this many bytes
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_CHAT = re.compile(r"session-[0-9A-Za-z:T.-]{1,64}\.jsonl")


def _model(options: list[str]) -> tuple[str, list[str]]:
    """The model the policy's `command` names (`-m NAME`, `--model NAME`), and the other options."""
    model, rest, it = DEFAULT_MODEL, [], iter(options)
    for opt in it:
        if opt in ("-m", "--model"):
            model = next(it, model)
        elif opt.startswith("--model="):
            model = opt.partition("=")[2]
        else:
            rest.append(opt)
    return model, rest


def sessions(home: Path) -> dict[str, Path]:
    """Session id -> its file, for every conversation in `home` (`.gemini/tmp/<project>/chats/
    session-*.jsonl`, the id read from its first line, at most FIRST_LINE bytes). Never follows
    a link and goes no deeper than that."""
    found: dict[str, Path] = {}
    root = home / ".gemini" / "tmp"
    if any(p.is_symlink() for p in (home / ".gemini", root)) or not root.is_dir():
        return found
    try:
        with os.scandir(root) as it:
            projects = [Path(p.path) / "chats" for p in it if p.is_dir(follow_symlinks=False)]
    except OSError:
        return found
    for chats in projects:
        if chats.is_symlink() or not chats.is_dir():
            continue
        try:
            with os.scandir(chats) as it:
                files = [Path(f.path) for f in it if f.is_file(follow_symlinks=False) and _CHAT.fullmatch(f.name)]
        except OSError:
            continue
        for f in files:
            if (sid := _session_id(f)) is not None:
                found[sid] = f
    return found


def _session_id(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            line = fh.read(FIRST_LINE).partition(b"\n")[0]
        sid = json.loads(line).get("sessionId")
    except (OSError, ValueError, AttributeError, RecursionError):  # a line nested to hurt the parser
        return None
    return sid if isinstance(sid, str) and _UUID.fullmatch(sid) else None


def invocation(agent: AgentConfig, prompt: str, home: Path, base_url: str, *, resume: str | None = None) -> Invocation:
    """`gemini --prompt=PROMPT` (with `--resume ID` for a follow-up), its account as JSON lines;
    `command` in the policy, when given, names the model (`["-m", "NAME"]`) and adds options.
    Tool calls are not asked about (`--yolo`; the container is the sandbox), and the staged
    workspace is trusted (`--skip-trust`: it is the agent's private copy)."""
    homes.write_fresh(home, "settings.json", json.dumps(SETTINGS) + "\n", subdir=".gemini")
    model, options = _model(list(agent.command))
    argv = ["gemini", "--yolo", "--skip-trust", "--output-format", "stream-json", "--model", model, *options]
    argv += [*(["--resume", resume] if resume else []), f"--prompt={prompt}"]  # one word, whatever it holds
    env = {**agent.env, "HOME": HOME_IN_CONTAINER, "GOOGLE_GEMINI_BASE_URL": base_url, "NO_COLOR": "1"}
    return Invocation(argv, None, env, [(home, HOME_IN_CONTAINER, False)])
