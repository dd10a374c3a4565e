"""The agent runtime image, built for `airlockd runtime build` (sandbox/image.py builds it without
any image registry; this asks the engine first, so a stopped engine is one clear error)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from airlockd.errors import EngineError
from airlockd.sandbox import enginepaths, projectimage, projectsource
from airlockd.sandbox.image import agent_cli, ensure_agent_image, ensure_image
from airlockd.staging import copy
from airlockd.staging.mirror import policy_digest


def build(*, force: bool = False, agents: Iterable[str] = (), progress: Callable[[str], None]) -> dict[str, str]:
    """Build (or, unless `force`, find) the runtime image, and for each of `agents` the same image
    plus that agent's CLI under its own tag: {"image": tag, "<agent>_image": tag, ...}."""
    wanted = list(dict.fromkeys(agents))
    for name in wanted:
        agent_cli(name)  # an unknown name is refused before anything is built
    try:
        client = enginepaths.connect()
        client.ping()
    except Exception as exc:
        raise EngineError(
            f"the Docker engine does not answer: {exc}",
            hint="run scripts/ensure-docker.sh (or start dockerd)",
        ) from None
    built = {"image": ensure_image(client, force=force, progress=progress)}
    for name in wanted:
        built[f"{name}_image"] = ensure_agent_image(client, name, force=force, progress=progress)
    return built


def image_scope(policy: Any, agent: str) -> str:
    """What a project image's staged build context depends on besides the files: the staging
    rules and the agent's clearance."""
    return policy_digest(policy, policy.clearance_for(agent))


def agent_image(svc: Any, agent: str, progress: Callable[[str], None]) -> str:
    """The image `agent`'s container runs: its policy's `image` tag as it is, the runtime image
    (with the agent CLI's layer), or, for `image = "devcontainer"` or `"./path/Dockerfile"`, the
    project's own image with airlockd's layer (and the CLI's), built now when its inputs changed
    (sandbox/projectimage.py), from a copy of the workspace staged for this agent."""
    cfg = svc.policy.agent(agent)
    if not projectsource.is_project_image(cfg.image):
        return str(svc.image_for(agent))
    client = svc.sandbox.client
    policy, clearance, workspace = svc.policy, svc.policy.clearance_for(agent), svc.workspace
    runtime_tag = ensure_image(client, progress=progress, tag_latest=False)

    def staged(dest: Path) -> list[str]:
        return [w.path for w in copy.stage(workspace, dest, policy, clearance).withheld]

    scratch = svc.state.root / "tmp"
    scratch.mkdir(mode=0o700, exist_ok=True)
    tag = projectimage.ensure_project_image(
        client,
        workspace,
        str(cfg.image),
        runtime_tag,
        staged,
        scope=image_scope(policy, agent),
        network=cfg.build_network,
        progress=progress,
        scratch=scratch,
    )
    if cfg.adapter == "command":
        return tag
    version = agent_cli(cfg.adapter).version
    return ensure_agent_image(client, cfg.adapter, progress=progress, base=tag, tag=f"{tag}-{cfg.adapter}-{version}")
