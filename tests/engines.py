"""The engines beside the first, each started once per test session by the first test that asks
for it and stopped at the session's end:

- a second Docker engine playing a remote host (scripts/second-engine.sh): its own mount and
  network namespaces, where none of this machine's working paths exist;
- a rootful Podman serving the Docker API (scripts/podman-engine.sh), with storage of its own."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import docker

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
NAME = os.environ.get("AIRLOCK_SECOND_ENGINE", "tests")  # another name: a second test session beside one
#: engine kind -> (its script, its name)
KINDS = {"remote": ("second-engine.sh", NAME), "podman": ("podman-engine.sh", NAME)}


def start(images: list[str], kind: str = "remote") -> str:
    """The engine's DOCKER_HOST, with `images` (from the first engine) loaded into it."""
    script, name = KINDS[kind]
    argv = ["bash", str(SCRIPTS / script), "start", name, *images]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"the {kind} engine did not start: {proc.stderr[-2000:]}"
    return proc.stdout.strip().splitlines()[-1]


def load(host: str, image: str, kind: str = "remote") -> None:
    """`image` from the first engine into the other (once)."""
    start([image], kind)
    assert docker.DockerClient(base_url=host).images.get(image)


def stop(kind: str = "remote") -> None:
    script, name = KINDS[kind]
    subprocess.run(["bash", str(SCRIPTS / script), "stop", name], capture_output=True, timeout=300, check=False)


def first_engine() -> docker.DockerClient:
    """The engine `make test` starts (images are built there), whatever DOCKER_HOST says now."""
    return docker.DockerClient(base_url="unix:///var/run/docker.sock")


def codex_image() -> str:
    """The Codex image, built on the first engine when missing and loaded into the other when
    DOCKER_HOST points there (the others have no network to install it with)."""
    from airlockd.sandbox.image import ensure_codex_image

    image = ensure_codex_image(first_engine())
    host = os.environ.get("DOCKER_HOST", "")
    if host and host != "unix:///var/run/docker.sock":
        load(host, image, "podman" if "/airlockd-podman-" in host else "remote")
    return image
