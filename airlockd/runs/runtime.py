"""The agent runtime image, built for `airlockd runtime build` (sandbox/image.py builds it without
any image registry; this asks the engine first, so a stopped engine is one clear error)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from airlockd.errors import EngineError
from airlockd.sandbox import enginepaths
from airlockd.sandbox.image import agent_cli, ensure_agent_image, ensure_image


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
