"""Whether the engine sees this machine's paths: a local engine does, a remote one does not.

Asked of the engine itself, once per engine a process uses: a container is created (not started)
with a bind mount of a fresh directory made here, and a marker file in it is read back through
the engine (`get_archive`). An engine on another host refuses the mount (no such path there) or
finds an empty directory of the same name. `DOCKER_HOST` alone cannot tell: a Unix socket may lead
to an engine in other mount namespaces, and a TCP address to this very machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

import docker.errors
from docker.types import Mount, Ulimit

from airlockd.enginehost import engine_host
from airlockd.errors import EngineError

log = logging.getLogger(__name__)

_lock = threading.Lock()
_seen: dict[str, bool] = {}  # the engine (ID, host, data root) -> the answer (Unix sockets share a base URL)
_by_client: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_kinds: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

DOCKER = "docker"
PODMAN = "podman"
#: Podman raises every container's nofile and nproc limits to its own defaults (1,048,576 and
#: 4,194,304) unless told otherwise, and a start fails where the engine's hard limits are lower
#: ("error setting rlimit type 7"); Docker leaves its own. On Podman these are set instead: as
#: many open files as a developer's shell usually has, and a per-user process count (RLIMIT_NPROC
#: counts the agent's uid across the engine's host) far above any run's pids cap, which is the
#: process bound that matters (docs/engines.md, Podman).
PODMAN_ULIMITS = (("nofile", 4096, 4096), ("nproc", 4096, 4096))


def connect(timeout: int = 60) -> Any:
    """A client of the engine `DOCKER_HOST` names (as the docker CLI reads it, TLS variables
    included). `ssh://` goes through this machine's `ssh` (its config, keys and agent, as the
    docker CLI does), not a Python SSH library."""
    ssh = os.environ.get("DOCKER_HOST", "").startswith("ssh://")
    return docker.from_env(timeout=timeout, use_ssh_client=ssh)


def kind(client: Any) -> str:
    """`PODMAN` for an engine that says it is Podman (its Docker API's version names a "Podman
    Engine" component), else `DOCKER`; asked once per client."""
    with _lock:
        if client in _kinds:
            return _kinds[client]
    try:
        parts = client.version().get("Components") or []
    except docker.errors.DockerException as exc:
        raise EngineError(f"the engine did not answer: {exc}", hint="check the engine (airlockd doctor)") from None
    found = PODMAN if any("podman" in str(c.get("Name", "")).lower() for c in parts) else DOCKER
    with _lock:
        _kinds[client] = found
    return found


def ulimits(client: Any) -> list[Ulimit]:
    """The limits every container on `client`'s engine must be given (none on Docker)."""
    if kind(client) != PODMAN:
        return []
    return [Ulimit(name=name, soft=soft, hard=hard) for name, soft, hard in PODMAN_ULIMITS]


def podman_runtime(client: Any, container: str) -> str:
    """The OCI runtime Podman runs `container` under, from its own API (its Docker API says
    "oci" for all); "oci" when it does not say."""
    try:
        url = f"{client.api.base_url}/v4.0.0/libpod/containers/{container}/json"
        found = client.api._result(client.api._get(url), json=True)
    except docker.errors.DockerException as exc:
        log.warning("Podman did not say the runtime of container %s: %s", container[:12], exc)
        return "oci"
    return str(found.get("OCIRuntime") or "oci")


def sees_local_paths(client: Any, image: str) -> bool:
    """True when a bind mount of a path here shows that path's content in the engine's containers.
    The engine of this machine's own socket is asked nothing (a probe costs a container create)."""
    if not engine_host():  # this machine's own socket: taken as local without a probe
        return True
    with _lock:
        if client in _by_client:
            return _by_client[client]
    try:
        info = client.info()  # engines that share a key file share an ID: the data root tells them apart
        key = f"{info.get('ID')} {info.get('Name')}:{info.get('DockerRootDir')}"
    except docker.errors.DockerException as exc:
        raise EngineError(f"the engine did not answer: {exc}", hint="check the engine (airlockd doctor)") from None
    with _lock:
        if key in _seen:
            _by_client[client] = _seen[key]
            return _seen[key]
    probe = Path(tempfile.mkdtemp(prefix="airlockd-probe-"))
    marker = f"m-{secrets.token_hex(8)}"
    (probe / marker).write_bytes(b"")
    probe.chmod(0o755)
    container = None
    try:
        try:
            container = client.api.create_container(
                image, ["true"], network_disabled=True,
                host_config=client.api.create_host_config(
                    mounts=[Mount("/probe", str(probe), type="bind", read_only=True)], network_mode="none"
                ),
            )  # fmt: skip
        except docker.errors.APIError as exc:
            if "bind source path does not exist" not in str(exc):
                raise
            seen = False
        else:
            try:
                stream, _ = client.api.get_archive(container["Id"], f"/probe/{marker}")
                for _chunk in stream:
                    pass
                seen = True
            except docker.errors.NotFound:
                seen = False
    except docker.errors.ImageNotFound:
        raise EngineError(
            f"the image {image} is not on the engine {key}",
            hint="build it there: DOCKER_HOST=<that engine> airlockd runtime build",
        ) from None
    except docker.errors.DockerException as exc:
        raise EngineError(
            f"the engine failed to say whether it sees this machine's files: {exc}",
            hint="check the engine (airlockd doctor)",
        ) from None
    finally:
        if container is not None:
            with contextlib.suppress(docker.errors.DockerException):
                client.api.remove_container(container["Id"], force=True)
        shutil.rmtree(probe, ignore_errors=True)
    log.info("the engine %s %s this machine's paths", key, "sees" if seen else "does not see")
    with _lock:
        _seen[key] = _by_client[client] = seen
    return seen
