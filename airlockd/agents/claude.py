"""The `claude` adapter: Claude Code (npm `@anthropic-ai/claude-code`, its native binary in the
runtime image: `airlockd runtime build --with claude`) headless, with a private home per agent.

The home (`agents/<agent>/home` in the state dir, lent to each run as a capped copy: homes.py) is
Claude Code's whole configuration directory (`CLAUDE_CONFIG_DIR`: `.claude.json`, `projects/`
with the conversations, `settings.json`), so a follow-up resumes the earlier run's session by id
when that session is still there (it is gone when that run was rejected and its conversation
rolled back: then a fresh session starts). airlockd writes `settings.json` afresh before every
run, so what an agent wrote there during a run (hooks, environment, a helper for its key) never
decides what the next run does. The key it sees is the run's short-lived token; its base URL is
the in-container forwarder to the run's gateway, the only way out (../shared/design/AGENT-CLIS.md:
`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` alone stops every other lookup).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from airlockd.agents import homes
from airlockd.agents.command import Invocation
from airlockd.policy import AgentConfig

HOME_IN_CONTAINER = "/run/airlock/claude-home"
PROVIDER = "anthropic"
SETTINGS = "{}\n"  # nothing of the agent's: no hooks, no environment, no key helper
# Every switch that keeps it from phoning home; the first alone was enough when checked.
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
}
_SESSION = re.compile(r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$")


def sessions(home: Path) -> dict[str, Path]:
    """Session id -> transcript, for every conversation recorded in `home`
    (`projects/<the working directory, / as ->/<id>.jsonl`). Never follows a link (an agent may
    leave `projects` pointing anywhere on the host) and never goes deeper than that one level."""
    found: dict[str, Path] = {}
    root = home / "projects"
    if root.is_symlink() or not root.is_dir():
        return found
    try:
        with os.scandir(root) as projects:
            dirs = [Path(p.path) for p in projects if p.is_dir(follow_symlinks=False)]
    except OSError:
        return found
    for d in dirs:
        try:
            with os.scandir(d) as it:
                for de in it:
                    if de.is_file(follow_symlinks=False) and (m := _SESSION.match(de.name)):
                        found[m.group(1)] = Path(de.path)
        except OSError:
            continue
    return found


def invocation(agent: AgentConfig, prompt: str, home: Path, base_url: str, *, resume: str | None = None) -> Invocation:
    """`claude -p` (with `--resume ID` for a follow-up), its account streamed as JSON lines;
    `command` in the policy, when given, adds options (e.g. ["--model", "claude-sonnet-5"]).
    Permissions are not asked for: nobody could answer, and the container is the sandbox. MCP
    servers come only from the policy's options (`--mcp-config`), never from `.claude.json` or a
    `.mcp.json` the agent wrote."""
    homes.write_fresh(home, "settings.json", SETTINGS)
    argv = ["claude", "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions"]
    argv.append("--strict-mcp-config")  # no MCP server an agent left in its home or the workspace starts
    argv += [*agent.command, *(["--resume", resume] if resume else []), "--", prompt]
    env = {**agent.env, **QUIET, "CLAUDE_CONFIG_DIR": HOME_IN_CONTAINER, "ANTHROPIC_BASE_URL": base_url}
    return Invocation(argv, None, env, [(home, HOME_IN_CONTAINER, False)])
