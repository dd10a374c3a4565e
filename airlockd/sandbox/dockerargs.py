"""The container-creation arguments of a `ContainerSpec`, as one pure function.

Everything that locks a run's container down is decided here, from the spec alone: read-only
root, bounded /tmp, no capabilities, no-new-privileges, the agent's user, no network, memory (no
swap) / cpu / pids limits, no core dumps, docker-init as PID 1, the mounts
(read-only where they must be), the labels that find the run's container again, and the overlay
volume. It never talks to an engine, so every flag is unit-tested without one.
"""

from __future__ import annotations

import re
from typing import Any

from docker.types import LogConfig, Mount, Ulimit

from airlockd.errors import UsageError
from airlockd.sandbox import volumes
from airlockd.sandbox.base import STDIN_PATH, WORKSPACE_PATH, ContainerSpec

RUN_LABEL = "airlockd.run"
OWNER_LABEL = "airlockd"
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}$")
#: No core dumps: they would land in the staged workspace as the agent's "changes". (Only limits
#: that lower the engine's own are set: raising one, e.g. nofile, fails on engines started lower.)
ULIMITS = (("core", 0, 0),)


def create_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    """The arguments of `containers.create` for `spec`: every security flag and limit, derived
    from the spec alone (no engine, no client). Raises UsageError for a spec the sandbox refuses
    (a network other than "none", an empty command, relative or missing paths)."""
    if spec.network != "none":
        raise UsageError(
            f"network {spec.network!r} is not supported by the Docker sandbox yet",
            hint='use network = "none"; the model gateway arrives as a mounted socket',
        )
    if not spec.argv:
        raise UsageError(f"run {spec.run_id}: empty command", hint="give the agent a command")
    if not spec.workspace.is_absolute() or not spec.workspace.is_dir():
        raise UsageError(f"run {spec.run_id}: workspace {spec.workspace} is not a directory")
    mounts = [Mount(WORKSPACE_PATH, str(spec.workspace), type="bind", read_only=False)]
    if spec.workspace_overlay is not None:
        mounts = [Mount(WORKSPACE_PATH, volumes.volume_name(spec.run_id), type="volume", read_only=False)]
    argv = list(spec.argv)
    if spec.stdin_file is not None:
        if not spec.stdin_file.is_absolute() or not spec.stdin_file.is_file():
            raise UsageError(f"run {spec.run_id}: stdin file {spec.stdin_file} is not a file")
        mounts.append(Mount(STDIN_PATH, str(spec.stdin_file), type="bind", read_only=True))
        argv = ["/bin/sh", "-c", f'exec "$@" < {STDIN_PATH}', "agent", *argv]
    for host, target, read_only in spec.mounts:
        if not host.is_absolute() or not target.startswith("/"):
            raise UsageError(f"run {spec.run_id}: mount {host} -> {target} needs absolute paths")
        mounts.append(Mount(target, str(host), type="bind", read_only=read_only))
    lim = spec.limits
    kwargs: dict[str, Any] = {
        "image": spec.image,
        "command": argv,
        "user": spec.user,
        "environment": dict(spec.env),
        "working_dir": WORKSPACE_PATH,
        "labels": {**spec.labels, OWNER_LABEL: "1", RUN_LABEL: spec.run_id},
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {"/tmp": f"size={lim.tmpfs_mb}m,mode=1777"},
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "mounts": mounts,
        "mem_limit": f"{lim.memory_mb}m",
        "memswap_limit": f"{lim.memory_mb}m",  # equal to the memory limit: no swap
        "pids_limit": lim.pids,
        "ulimits": [Ulimit(name=name, soft=soft, hard=hard) for name, soft, hard in ULIMITS],
        "nano_cpus": int(lim.cpus * 1e9),
        "init": True,  # docker-init as PID 1: reaps zombies, forwards SIGTERM
        "stdin_open": False,
        "tty": False,
        # Output is read from the attach stream only: nothing piles up on the engine's disk.
        "log_config": LogConfig(type="none"),
        "detach": True,
    }
    name = f"airlockd-{spec.run_id}"
    if _NAME_OK.match(name):
        kwargs["name"] = name
    return kwargs
