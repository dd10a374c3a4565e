"""A second Docker engine playing a remote host (scripts/second-engine.sh): its own mount and
network namespaces, where none of this machine's working paths exist. Started once per test
session by the first test that asks for it, stopped at the session's end."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import docker

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "second-engine.sh"
NAME = os.environ.get("AIRLOCK_SECOND_ENGINE", "tests")  # another name: a second test session beside one


def start(images: list[str]) -> str:
    """The engine's DOCKER_HOST, with `images` (from the first engine) loaded into it."""
    proc = subprocess.run(["bash", str(SCRIPT), "start", NAME, *images], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the second engine did not start: {proc.stderr[-2000:]}"
    return proc.stdout.strip().splitlines()[-1]


def load(host: str, image: str) -> None:
    """`image` from the first engine into the second (once)."""
    start([image])
    assert docker.DockerClient(base_url=host).images.get(image)


def stop() -> None:
    subprocess.run(["bash", str(SCRIPT), "stop", NAME], capture_output=True, timeout=120, check=False)


def first_engine() -> docker.DockerClient:
    """The engine `make test` starts (images are built there), whatever DOCKER_HOST says now."""
    return docker.DockerClient(base_url="unix:///var/run/docker.sock")


def codex_image() -> str:
    """The Codex image, built on the first engine when missing and loaded into the second when
    DOCKER_HOST points there (the second has no network to install it with)."""
    from airlockd.sandbox.image import ensure_codex_image

    image = ensure_codex_image(first_engine())
    host = os.environ.get("DOCKER_HOST", "")
    if host and host != "unix:///var/run/docker.sock":
        load(host, image)
    return image
