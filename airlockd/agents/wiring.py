"""From (run, agent, prompt) to what its container gets: the adapter's command, the model gateway
when the agent uses one, and the agent's home with its transactional snapshot."""

from __future__ import annotations

import json
import os
from typing import Any

from airlockd.agents import codex, sessions
from airlockd.agents.command import Invocation
from airlockd.agents.command import invocation as command_invocation
from airlockd.gateway import runs as gateway_runs
from airlockd.policy import AgentConfig
from airlockd.records import RunRecord

AGENT_UID = (1000, 1000)


def prepare(service: Any, rec: RunRecord, cfg: AgentConfig, prompt: str) -> Invocation:
    """The run's Invocation with the gateway wired in (its gate is open from here on: the caller
    must call `finish`)."""
    env: dict[str, str] = {}
    mounts: list[tuple[Any, str, bool]] = []
    if gateway_runs.uses_gateway(cfg):
        env, mounts = gateway_runs.open_for_run(service, rec, cfg)
    try:
        inv = _adapter(service, rec, cfg, prompt)
    except BaseException:
        gateway_runs.close_for_run(service, rec)  # no container will use the gate
        raise
    return Invocation(inv.argv, inv.stdin_file, {**inv.env, **env}, [*inv.mounts, *mounts])


def _adapter(service: Any, rec: RunRecord, cfg: AgentConfig, prompt: str) -> Invocation:
    run_dir = service.state.run_dir(rec.id)
    if cfg.adapter == "codex":
        owner = AGENT_UID if os.getuid() == 0 else None
        home = sessions.home(service.state.root, rec.agent, owner)
        resume = None
        if rec.follow_up:
            resume = codex.resumable(home, service.state.run_dir(rec.follow_up))
            service.audit.append(
                "session.follow_up",
                run=rec.id,
                agent=rec.agent,
                policy=rec.policy_revision,
                follows=rec.follow_up,
                resumed=resume is not None,
                why=None
                if resume
                else "that run's conversation is not in the agent's home (rolled back or never made)",
            )
        sessions.snapshot(service.state.root, rec, run_dir)
        inv = codex.invocation(cfg, prompt, home, gateway_runs.BASE_URL, resume=resume)
        (run_dir / codex.SESSION_FILE).write_text(
            json.dumps({"before": sorted(codex.sessions(home)), "resume": resume})
        )
        return inv
    return command_invocation(cfg, prompt, run_dir)


def finish(service: Any, rec: RunRecord) -> None:
    """Close the run's gate; note which agent session the run used (for `--follow-up`)."""
    gateway_runs.close_for_run(service, rec)
    cfg = service.policy.agents.get(rec.agent)
    if cfg is None or cfg.adapter != "codex":
        return
    run_dir = service.state.run_dir(rec.id)
    f = run_dir / codex.SESSION_FILE
    try:
        meta = json.loads(f.read_text())
    except (OSError, ValueError):
        return
    home = sessions.agent_dir(service.state.root, rec.agent) / "home"
    new = sorted(set(codex.sessions(home)) - set(meta.get("before", [])))
    meta["session"] = meta.get("resume") or (new[-1] if new else None)
    f.write_text(json.dumps(meta))
