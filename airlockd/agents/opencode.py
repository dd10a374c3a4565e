"""The `opencode` adapter: opencode (npm `opencode-ai`, its native binary in the runtime image:
`airlockd runtime build --with opencode`) headless, with a private home per agent.

Its configuration is never a file the agent could leave for the next run: it comes whole in
`OPENCODE_CONFIG_CONTENT`, naming one provider, the in-container forwarder to the run's gateway
(OpenAI chat completions), with the run's token as its key. Its home (lent to each run as a capped
copy: homes.py) is opencode's data directory (`XDG_DATA_HOME`): the SQLite database that holds its
sessions. A follow-up resumes the earlier run's session (`--session ID`) when that session is
still in the database (it is gone when that run was rejected and the home rolled back).

The database is the agent's writing: its session ids are read by a process of its own, from a
private copy, bounded in time, CPU, memory and size (agents/opencodedb.py).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
from pathlib import Path

from airlockd.agents.command import Invocation
from airlockd.interpreter import module_command
from airlockd.policy import AgentConfig

log = logging.getLogger(__name__)

HOME_IN_CONTAINER = "/run/airlock/opencode-home"
PROVIDER = "openai"  # chat completions through [gateway]
PROVIDER_ID = "airlock"
DEFAULT_MODEL = "gpt-5"
DB = ("opencode", "opencode.db")  # under the home
READ_S = 10  # the reader's wall clock (it has CPU_S of CPU)
QUIET = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",  # no models.dev catalogue
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
}
_SESSION = re.compile(r"ses_[A-Za-z0-9]{8,64}")


def config(base_url: str, model: str, token_env: str) -> str:
    """opencode's whole configuration: the gateway as its only provider, no sharing, no updates."""
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "airlockd model gateway",
        "options": {"baseURL": base_url, "apiKey": f"{{env:{token_env}}}"},
        "models": {model: {"name": model}},
    }
    doc = {
        "provider": {PROVIDER_ID: provider},
        "model": f"{PROVIDER_ID}/{model}",
        "small_model": f"{PROVIDER_ID}/{model}",
        "autoupdate": False,
        "share": "disabled",
    }
    return json.dumps(doc)


def _model(options: list[str]) -> tuple[str, list[str]]:
    """The model the policy's `command` names (`-m NAME`, `--model NAME`, with or without the
    provider's prefix), and the other options."""
    model, rest, it = DEFAULT_MODEL, [], iter(options)
    for opt in it:
        if opt in ("-m", "--model"):
            model = next(it, model)
        elif opt.startswith("--model="):
            model = opt.partition("=")[2]
        else:
            rest.append(opt)
    return model.removeprefix(f"{PROVIDER_ID}/"), rest


def sessions(home: Path) -> dict[str, Path]:
    """Session id -> the database holding it, for every session in `home`'s database: read by a
    process of its own (agents/opencodedb.py), bounded in time, CPU and memory, so a database
    built to hurt the reader only yields nothing."""
    db = home.joinpath(*DB)
    try:
        done = subprocess.run(
            module_command("airlockd.agents.opencodedb", str(home)),
            capture_output=True,
            timeout=READ_S,
            stdin=subprocess.DEVNULL,
        )
        ids = json.loads(done.stdout) if done.returncode == 0 else []
    except (subprocess.TimeoutExpired, OSError, ValueError) as exc:
        log.warning("the sessions in %s were not read: %s", db, type(exc).__name__)
        return {}
    if done.returncode != 0:
        log.warning("the sessions in %s were not read (exit %s)", db, done.returncode)
    return {sid: db for sid in ids if isinstance(sid, str) and _SESSION.fullmatch(sid)}


def invocation(agent: AgentConfig, prompt: str, home: Path, base_url: str, *, resume: str | None = None) -> Invocation:
    """`opencode run` (with `--session ID` for a follow-up), its account as JSON events; `command`
    in the policy, when given, names the model (`["-m", "NAME"]`) and adds options. Permissions
    are not asked for (`--auto`): nobody could answer, and the container is the sandbox."""
    model, options = _model(list(agent.command))
    argv = ["opencode", "run", "--format", "json", "--auto", "--title", "airlockd run", "-m", f"{PROVIDER_ID}/{model}"]
    argv += [*options, *(["--session", resume] if resume else []), "--", prompt]
    env = {
        **agent.env,
        **QUIET,
        "XDG_DATA_HOME": HOME_IN_CONTAINER,
        "OPENCODE_CONFIG_CONTENT": config(base_url, model, "AIRLOCK_RUN_TOKEN"),
    }
    return Invocation(argv, None, env, [(home, HOME_IN_CONTAINER, False)])
