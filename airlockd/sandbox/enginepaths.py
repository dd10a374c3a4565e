"""Whether the engine sees this machine's paths: a local engine does, a remote one does not.

Asked of the engine itself, once per engine a process uses: a container is created (not started)
with a bind mount of a fresh directory made here, and a marker file in it is read back through
the engine (`get_archive`). An engine on another host refuses the mount (no such path there) or
finds an empty directory of the same name. `DOCKER_HOST` alone cannot tell: a Unix socket may lead
to an engine in other mount namespaces, and a TCP address to this very machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import secrets
import shutil
import socket
import struct
import tarfile
import tempfile
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions
from docker.types import Mount, Ulimit

from airlockd.enginehost import engine_host
from airlockd.errors import EngineError

log = logging.getLogger(__name__)

_lock = threading.Lock()
_seen: dict[str, bool] = {}  # the engine (ID, host, data root) -> the answer (Unix sockets share a base URL)
_by_client: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_kinds: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
#: DOCKER_HOST -> (its API version, its kind, whether it sees this machine's paths), from `learn`
_engines: dict[str, tuple[str, str, bool | None]] = {}
_profiles: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
_clean_images: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()  # no /workspace

DOCKER = "docker"
PODMAN = "podman"
#: Podman raises every container's nofile and nproc limits to its own defaults (1,048,576 and
#: 4,194,304) unless told otherwise, and a start fails where the engine's hard limits are lower
#: ("error setting rlimit type 7"); Docker leaves its own. On Podman each container is given the
#: engine's own hard limits instead, as Docker's containers have them: read from the process behind
#: a local socket (`engine_limits`), else these. RLIMIT_NPROC counts the agent's uid across the
#: engine's host, so it is never the process bound of a run: its `pids` cap is (docs/engines.md).
PODMAN_ULIMITS = (("nofile", 4096, 4096), ("nproc", 4096, 4096))
_LIMIT_ROWS = {"Max open files": "nofile", "Max processes": "nproc"}


def engine_limits(host: str | None = None) -> tuple[tuple[str, int, int], ...]:
    """(name, soft, hard) for nofile and nproc: the hard limits of the engine's own process when
    `host` (default: DOCKER_HOST) is a Unix socket here (its peer's `/proc/PID/limits`), else
    `PODMAN_ULIMITS`."""
    host = os.environ.get("DOCKER_HOST", "") if host is None else host
    if not host.startswith("unix://"):
        return PODMAN_ULIMITS
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(host[len("unix://") :])
            pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        rows = Path(f"/proc/{pid}/limits").read_text().splitlines()
    except OSError:
        return PODMAN_ULIMITS
    found: dict[str, int] = {}
    for row in rows:
        for label, name in _LIMIT_ROWS.items():
            if row.startswith(label):
                hard = row[len(label) :].split()[1]
                found[name] = (1 << 20) if hard == "unlimited" else int(hard)
    if set(found) != set(_LIMIT_ROWS.values()):
        return PODMAN_ULIMITS
    return tuple((name, min(found[name], 1 << 20), min(found[name], 1 << 20)) for name in ("nofile", "nproc"))


def connect(timeout: int = 60) -> Any:
    """A client of the engine `DOCKER_HOST` names (as the docker CLI reads it, TLS variables
    included). `ssh://` goes through this machine's `ssh` (its config, keys and agent, as the
    docker CLI does), not a Python SSH library. An engine `learn` asked already in this process
    (or in the one it was forked from) is not asked its API version and kind again."""
    host = os.environ.get("DOCKER_HOST", "")
    known = _engines.get(host)
    ssh = host.startswith("ssh://")
    if known is None:
        return docker.from_env(timeout=timeout, use_ssh_client=ssh)
    client = docker.from_env(timeout=timeout, use_ssh_client=ssh, version=known[0])  # not asked again
    with _lock:
        _kinds[client] = known[1]
        if known[2] is not None:
            _by_client[client] = known[2]
    return client


def learn(image: str | None = None, timeout: int = 10) -> None:
    """Ask the engine `DOCKER_HOST` names its API version and kind, and with `image` whether it
    sees this machine's paths, once, for `connect` (the daemon's launcher, before it forks run
    processes: each then saves two round trips, and on a remote engine a probe container)."""
    client = connect(timeout)
    try:
        seen = sees_local_paths(client, image) if image else None
        _engines[os.environ.get("DOCKER_HOST", "")] = (str(client.api.api_version), kind(client), seen)
    finally:
        client.close()


def kind(client: Any) -> str:
    """`PODMAN` for an engine that says it is Podman (its Docker API's version names a "Podman
    Engine" component), else `DOCKER`; asked once per client."""
    with _lock:
        if client in _kinds:
            return _kinds[client]
    try:
        parts = client.version().get("Components") or []
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise EngineError(f"the engine did not answer: {exc}", hint="check the engine (airlockd doctor)") from None
    found = PODMAN if any("podman" in str(c.get("Name", "")).lower() for c in parts) else DOCKER
    with _lock:
        _kinds[client] = found
    return found


def ulimits(client: Any) -> list[Ulimit]:
    """The limits every container on `client`'s engine must be given (none on Docker)."""
    if kind(client) != PODMAN:
        return []
    return [Ulimit(name=name, soft=soft, hard=hard) for name, soft, hard in engine_limits()]


def podman_runtime(client: Any, container: str) -> str:
    """The OCI runtime Podman runs `container` under, from its own API (its Docker API says
    "oci" for all); "oci" when it does not say."""
    try:
        url = f"{client.api.base_url}/v4.0.0/libpod/containers/{container}/json"
        found = client.api._result(client.api._get(url), json=True)
    except (docker.errors.DockerException, requests.exceptions.RequestException, ValueError) as exc:
        log.warning("Podman did not say the runtime of container %s: %s", container[:12], exc)
        return "oci"
    return str(found.get("OCIRuntime") or "oci")


@contextlib.contextmanager
def _scratch(client: Any, image: str, mounts: list[Mount] | None = None) -> Iterator[str]:
    """The id of a container of `image` that never starts, removed after: the engine's archive
    API reaches its file system, and the volumes it mounts, through it."""
    host_config = client.api.create_host_config(mounts=mounts or [], network_mode="none")
    cid = client.api.create_container(image, ["true"], network_disabled=True, host_config=host_config)["Id"]
    try:
        yield cid
    finally:
        with contextlib.suppress(docker.errors.DockerException, requests.exceptions.RequestException):
            client.api.remove_container(cid, force=True)


def _has(client: Any, cid: str, path: str) -> bool:
    """Whether `path` exists in the container `cid` (read through `get_archive`)."""
    try:
        stream, _ = client.api.get_archive(cid, path)
    except docker.errors.NotFound:
        return False
    for _chunk in stream:
        pass
    return True


def host_profile_path(client: Any, image: str) -> str:
    """The path, on the engine's host, of a file holding `seccomp.host_profile()` (Podman takes a
    profile only as a file there): in a volume of its own, named after the profile's digest,
    written through a container of `image` that never starts; once per client."""
    from airlockd.sandbox import seccomp

    with _lock:
        if client in _profiles:
            return _profiles[client]
    text = seccomp.host_profile().encode()
    name = f"airlockd-seccomp-{hashlib.sha256(text).hexdigest()[:12]}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        ti = tarfile.TarInfo(f"{seccomp.HOST_NAME}.json")
        ti.size, ti.mode = len(text), 0o644
        tf.addfile(ti, io.BytesIO(text))
    try:
        try:
            vol = client.api.inspect_volume(name)
        except docker.errors.NotFound:
            client.volumes.create(name=name, driver="local", labels={"airlockd": "1", "airlockd.role": "seccomp"})
            vol = client.api.inspect_volume(name)
        with _scratch(client, image, [Mount("/profile", name, type="volume")]) as cid:
            if not client.api.put_archive(cid, "/profile", buf.getvalue()):
                raise docker.errors.APIError(f"the engine refused to write into the volume {name}")
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise EngineError(
            f"the engine failed to keep airlockd's seccomp profile (a file in its volume {name}): {exc}",
            hint="check the engine (airlockd doctor)",
        ) from None
    path = f"{vol['Mountpoint']}/{seccomp.HOST_NAME}.json"
    with _lock:
        _profiles[client] = path
    return path


def refuse_image_workspace(client: Any, image: str) -> None:
    """On Podman, an EngineError when `image` has a /workspace: Podman would give its owner, mode
    and files to the run's staged workspace (docs/engines.md, Podman). Asked once per image."""
    with _lock:
        if image in _clean_images.get(client, ()):
            return
    try:
        with _scratch(client, image) as cid:
            found = _has(client, cid, "/workspace")
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise EngineError(f"the engine failed to look into the image {image}: {exc}", hint="check the engine") from None
    if found:
        raise EngineError(
            f"the image {image} has a /workspace: on Podman its owner, mode and files would become the"
            " run's workspace's",
            hint="build the image without /workspace (no WORKDIR /workspace), or run this agent on Docker",
        )
    with _lock:
        _clean_images.setdefault(client, set()).add(image)


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
    try:
        try:
            with _scratch(client, image, [Mount("/probe", str(probe), type="bind", read_only=True)]) as cid:
                seen = _has(client, cid, f"/probe/{marker}")
        except docker.errors.APIError as exc:
            if "bind source path does not exist" not in str(exc):
                raise
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
        shutil.rmtree(probe, ignore_errors=True)
    log.info("the engine %s %s this machine's paths", key, "sees" if seen else "does not see")
    with _lock:
        _seen[key] = _by_client[client] = seen
    return seen
