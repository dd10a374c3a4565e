"""From (run, agent, prompt) to what its container gets: the adapter's command, the model gateway
when the agent uses one, and the agent's home with its transactional snapshot.

Every agent CLI adapter has one shape (agents/codex.py, agents/claude.py, agents/opencode.py,
agents/gemini.py, agents/aider.py): `HOME_IN_CONTAINER`,
`PROVIDER` (the protocol its gateway route speaks), `sessions(home)` (id -> transcript) and
`invocation(cfg, prompt, home, base_url, resume=)`; the image it needs is
`sandbox/image.py`'s `AGENT_CLIS[adapter]`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from airlockd.agents import aider, claude, codex, gemini, homes, opencode, sessions
from airlockd.agents.command import Invocation
from airlockd.agents.command import invocation as command_invocation
from airlockd.gateway import runs as gateway_runs
from airlockd.policy import AgentConfig
from airlockd.records import RunRecord
from airlockd.staging.base import HeldUpper

AGENT_UID = (1000, 1000)
SESSION_FILE = "agent-session.json"  # in the run dir: which session of the agent the run used
CLIS: dict[str, Any] = {  # adapter -> its module
    "codex": codex,
    "claude": claude,
    "opencode": opencode,
    "gemini": gemini,
    "aider": aider,
}
# what each client appends its paths to
BASE_URLS = {
    "codex": gateway_runs.BASE_URL,
    "claude": gateway_runs.ORIGIN,
    "opencode": gateway_runs.BASE_URL,
    "gemini": gateway_runs.ORIGIN,
    "aider": gateway_runs.BASE_URL,
}


def cli_of(cfg: AgentConfig) -> Any:
    """The adapter module of an agent CLI with a home of its own; None for a plain command."""
    return CLIS.get(cfg.adapter)


def resumable(cli: Any, home: Path, run_dir_of_previous: Path) -> str | None:
    """The session id an earlier run used, if that session is still in the home."""
    try:
        sid = json.loads((run_dir_of_previous / SESSION_FILE).read_text()).get("session")
    except (OSError, ValueError, AttributeError):
        return None
    return sid if isinstance(sid, str) and sid in cli.sessions(home) else None


def prepare(service: Any, rec: RunRecord, cfg: AgentConfig, prompt: str, held: HeldUpper | None = None) -> Invocation:
    """The run's Invocation with the gateway wired in (its gate is open from here on: the caller
    must call `finish`). `held`: the engine holds the run's capped filesystem (not root)."""
    env: dict[str, str] = {}
    mounts: list[tuple[Any, str, bool]] = []
    if gateway_runs.uses_socket(service.policy, rec.agent):
        cli = cli_of(cfg)
        env, mounts = gateway_runs.open_for_run(service, rec, cfg, None if cli is None else cli.PROVIDER)
        if held is not None and held.remote:  # the container reaches the gateway through a relay
            (gw_dir, target, ro), sock = mounts[0], gateway_runs.SOCKET_NAME
            try:
                mounts = [(Path(held.relay(rec.id, gw_dir / sock)), target, ro)]
            except BaseException:
                gateway_runs.close_for_run(service, rec)
                raise
    try:
        inv = _adapter(service, rec, cfg, prompt, held)
    except BaseException:
        gateway_runs.close_for_run(service, rec)  # no container will use the gate
        raise
    return Invocation(inv.argv, inv.stdin_file, {**inv.env, **env}, [*inv.mounts, *mounts])


def _adapter(service: Any, rec: RunRecord, cfg: AgentConfig, prompt: str, held: HeldUpper | None) -> Invocation:
    run_dir = service.state.run_dir(rec.id)
    cli = cli_of(cfg)
    if cli is None:
        return command_invocation(cfg, prompt, run_dir)
    owner = AGENT_UID if os.getuid() == 0 else None
    home = sessions.home(service.state.root, rec.agent, owner)
    resume = None
    if rec.follow_up:
        resume = resumable(cli, home, service.state.run_dir(rec.follow_up))
        service.audit.append(
            "session.follow_up",
            run=rec.id,
            agent=rec.agent,
            policy=rec.policy_revision,
            follows=rec.follow_up,
            resumed=resume is not None,
            why=None if resume else "that run's conversation is not in the agent's home (rolled back or never made)",
        )
    with homes.locked(home):  # not while another run's copy replaces it
        sessions.snapshot(service.state.root, rec, run_dir)
    inv = cli.invocation(cfg, prompt, home, BASE_URLS[cfg.adapter], resume=resume)
    (run_dir / SESSION_FILE).write_text(json.dumps({"before": sorted(cli.sessions(home)), "resume": resume}))
    cap = cfg.limits.workspace_growth_mb * 2**20
    with homes.locked(home):
        lent = homes.lend(run_dir, home, cap, rec.id, held, owner)  # a capped copy: never the home itself
    mounts = [(lent if src == home else src, target, ro) for src, target, ro in inv.mounts]
    return Invocation(inv.argv, inv.stdin_file, inv.env, mounts)


def home_bytes(service: Any, rec: RunRecord) -> int:
    """What the copy of the agent's home a run gets will take (0: the agent has none)."""
    cfg = service.policy.agents.get(rec.agent)
    if cfg is None or cli_of(cfg) is None:
        return 0
    return homes.home_bytes(sessions.agent_dir(service.state.root, rec.agent) / "home")


def finish(service: Any, rec: RunRecord, held: HeldUpper | None = None) -> None:
    """Close the run's gate; bring the agent's home back from the run's capped copy; note which
    agent session the run used (for `--follow-up`)."""
    gateway_runs.close_for_run(service, rec)
    cfg = service.policy.agents.get(rec.agent)
    cli = None if cfg is None else cli_of(cfg)
    if cfg is None or cli is None:
        return
    run_dir = service.state.run_dir(rec.id)
    home = sessions.agent_dir(service.state.root, rec.agent) / "home"
    try:  # the home's total is capped at the agent's growth allowance (it grows no further)
        homes.take_back(run_dir, home, rec.id, held, cfg.limits.workspace_growth_mb * 2**20)
    except Exception as exc:  # the run's fate stands; its turns are not kept (a hostile copy too)
        service.audit.append(
            "session.home_lost", run=rec.id, agent=rec.agent, policy=rec.policy_revision, error=str(exc)[:500]
        )
    f = run_dir / SESSION_FILE
    try:
        meta = json.loads(f.read_text())
    except (OSError, ValueError):
        return
    home = sessions.agent_dir(service.state.root, rec.agent) / "home"
    new = sorted(set(cli.sessions(home)) - set(meta.get("before", [])))
    meta["session"] = meta.get("resume") or (new[-1] if new else None)
    f.write_text(json.dumps(meta))
