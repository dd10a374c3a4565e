"""The `opencode` adapter: opencode (npm `opencode-ai`, its native binary in the runtime image:
`airlockd runtime build --with opencode`) headless, with a private home per agent.

Its configuration is never a file the agent could leave for the next run: it comes whole in
`OPENCODE_CONFIG_CONTENT`, naming one provider, the in-container forwarder to the run's gateway
(OpenAI chat completions), with the run's token as its key. Its home (lent to each run as a capped
copy: homes.py) is opencode's data directory (`XDG_DATA_HOME`): the SQLite database that holds its
sessions. A follow-up resumes the earlier run's session (`--session ID`) when that session is
still in the database (it is gone when that run was rejected and the home rolled back).

The database is the agent's writing: it is read from a private copy, read-only in intent and
bounded (no trusted schema, a step budget, a size cap), for the session ids alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import stat
import tempfile
from pathlib import Path

from airlockd.agents.command import Invocation
from airlockd.policy import AgentConfig

HOME_IN_CONTAINER = "/run/airlock/opencode-home"
PROVIDER = "openai"  # chat completions through [gateway]
PROVIDER_ID = "airlock"
DEFAULT_MODEL = "gpt-5"
DB = ("opencode", "opencode.db")  # under the home
DB_BYTES = 256 * 2**20  # a database larger than this is not read (the home's cap bounds it anyway)
STEPS = 2_000_000  # SQLite virtual machine steps one read may take
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
    """Session id -> the database holding it, for every session in `home`'s database."""
    db = home.joinpath(*DB)
    return {sid: db for sid in _session_ids(db)}


def _session_ids(db: Path) -> set[str]:
    """The session ids in the agent's database, read from a private copy of it (and of its
    write-ahead log): never through a link, never a file over DB_BYTES, with no trusted schema
    and a step budget, so a database built to hurt the reader only yields nothing."""
    parts = [(db, "opencode.db"), (db.with_name(db.name + "-wal"), "opencode.db-wal")]
    with tempfile.TemporaryDirectory(prefix="airlockd-opencode-") as tmp:
        for src, name in parts:
            try:
                fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                if name == "opencode.db":
                    return set()
                continue
            with os.fdopen(fd, "rb") as fh:
                st = os.fstat(fh.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_size > DB_BYTES:
                    return set()
                with open(os.path.join(tmp, name), "wb") as out:
                    shutil.copyfileobj(fh, out)
        steps = 0

        def budget() -> int:
            nonlocal steps
            steps += 1000
            return 1 if steps > STEPS else 0

        con = sqlite3.connect(os.path.join(tmp, "opencode.db"), isolation_level=None)
        try:
            con.set_progress_handler(budget, 1000)
            con.execute("PRAGMA trusted_schema = OFF")
            con.execute("PRAGMA cell_size_check = ON")
            rows = con.execute("SELECT id FROM session LIMIT 10000").fetchall()
        except sqlite3.Error:
            return set()
        finally:
            con.close()
    return {r[0] for r in rows if isinstance(r[0], str) and _SESSION.fullmatch(r[0])}


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
