"""Per-run engine volumes: the overlay a run's /workspace is, created by the engine's local driver.

`docker volume create --driver local --opt type=overlay --opt device=overlay --opt o=...` makes
the engine mount the overlay itself when the container starts (airlockd needs no privileges for
it) and unmount it when the container is gone. Each run's volume is named after the run and
labelled with it, so a crashed run's volume can be found and removed.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import docker.errors

from airlockd.sandbox.base import OverlayVolume

log = logging.getLogger(__name__)

RUN_LABEL = "airlockd.run"
OWNER_LABEL = "airlockd"


def volume_name(run_id: str) -> str:
    return f"airlockd-ws-{run_id}"


def create(client: Any, run_id: str, ov: OverlayVolume) -> str:
    """Create the run's overlay volume (nothing is mounted until a container uses it)."""
    name = volume_name(run_id)
    remove(client, run_id)  # a leftover of an earlier attempt of the same run
    client.volumes.create(
        name=name,
        driver="local",
        driver_opts={"type": "overlay", "device": "overlay", "o": ov.options},
        labels={OWNER_LABEL: "1", RUN_LABEL: run_id},
    )
    return name


def remove(client: Any, run_id: str) -> bool:
    """Remove the run's volume if it exists; True when one was removed. Never raises for a
    volume that is gone; logs (and returns False) when the engine refuses."""
    try:
        vol = client.volumes.get(volume_name(run_id))
    except docker.errors.NotFound:
        return False
    except docker.errors.DockerException as exc:
        log.error("cannot look up the volume of run %s: %s", run_id, exc)
        return False
    try:
        vol.remove(force=True)
        return True
    except docker.errors.NotFound:
        return False
    except docker.errors.DockerException as exc:
        log.error("cannot remove the volume of run %s: %s", run_id, exc)
        return False


def remove_labelled(client: Any, run_id: str) -> int:
    """Remove every volume labelled with the run; how many."""
    n = 0
    with contextlib.suppress(docker.errors.DockerException):
        for vol in client.volumes.list(filters={"label": f"{RUN_LABEL}={run_id}"}):
            with contextlib.suppress(docker.errors.DockerException):
                vol.remove(force=True)
                n += 1
    return n
