"""Files that ship with airlockd: the default policy and the runtime image definition.

In a wheel they live under `airlockd/_data/`; in a source checkout (editable install) they are the
top-level `policies.toml` and `runtime/` of the repository.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource(name: str) -> Path:
    """Path of a shipped resource (`policies.toml`, `runtime`), wheel layout first."""
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"airlockd resource {name!r} is missing from this installation")
