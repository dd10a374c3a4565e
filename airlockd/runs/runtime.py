"""The agent runtime image, built for `airlockd runtime build` (sandbox/image.py builds it without
any image registry; this asks the engine first, so a stopped engine is one clear error)."""

from __future__ import annotations

from collections.abc import Callable

from airlockd.errors import EngineError
from airlockd.sandbox import enginepaths
from airlockd.sandbox.image import ensure_codex_image, ensure_image


def build(*, force: bool = False, with_codex: bool = False, progress: Callable[[str], None]) -> dict[str, str]:
    """Build (or, unless `force`, find) the runtime image, and with `with_codex` the same image
    plus the Codex CLI under its own tag: {"image": tag[, "codex_image": tag]}."""
    try:
        client = enginepaths.connect()
        client.ping()
    except Exception as exc:
        raise EngineError(
            f"the Docker engine does not answer: {exc}",
            hint="run scripts/ensure-docker.sh (or start dockerd)",
        ) from None
    built = {"image": ensure_image(client, force=force, progress=progress)}
    if with_codex:
        built["codex_image"] = ensure_codex_image(client, force=force, progress=progress)
    return built
