"""The container-creation arguments of a `ContainerSpec`, as one pure function.

Everything that locks a run's container down is decided here, from the spec alone: read-only
root, bounded /tmp, no capabilities, no-new-privileges, the agent's user, no network, memory (no
swap) / cpu / pids limits, no core dumps, docker-init as PID 1, the mounts
(read-only where they must be), the labels that find the run's container again, the overlay
volume and the runtime. It never talks to an engine, so every flag is unit-tested without one.

Under gVisor (`runsc`) the agent's processes are tasks of gVisor's kernel, not of the host's: the
host's pids cgroup counts the sandbox's own threads instead, and a cap there wedges gVisor rather
than refusing the agent's fork. The process cap is then RLIMIT_NPROC, which gVisor's kernel
enforces for the agent's user inside the sandbox (a fork fails with EAGAIN at the cap, as at
`pids.max`), and the host's pids cgroup gets a backstop sized for gVisor's own threads (15 to 43
host tasks per busy agent process were measured), so that whatever happens inside, the
host's task table is bounded; docs/containment.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docker.types import LogConfig, Mount, Ulimit

from airlockd.errors import UsageError
from airlockd.sandbox import enginepaths, seccomp, volumes
from airlockd.sandbox.base import HOST_KERNEL_RUNTIMES, STDIN_PATH, WORKSPACE_PATH, ContainerSpec

RUN_LABEL = "airlockd.run"
OWNER_LABEL = "airlockd"
RUNTIME_LABEL = "airlockd.runtime"
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}$")
#: No core dumps: they would land in the staged workspace as the agent's "changes". (Only limits
#: that lower the engine's own are set: raising one, e.g. nofile, fails on engines started lower.)
ULIMITS = (("core", 0, 0),)
#: Podman mounts a writable tmpfs of no size at /var/tmp of a read-only root (Docker leaves it
#: read-only): there it is read-only, so /tmp stays the one bounded place to write besides /workspace
PODMAN_TMPFS = {"/var/tmp": "ro,size=64k,mode=755"}
#: over each VOLUME the image declares (a project's image may): read-only and empty, so the engine
#: makes no anonymous volume there (writable, uncapped, on its disk, outliving the run)
MASKED_VOLUME = "ro,size=64k,mode=755"


def _profile(spec: ContainerSpec, engine: str, host_profile: str | None) -> list[str]:
    """Under runsc a profile of our own, applied inside gVisor's kernel (sandbox/seccomp.py); under
    runc the engine's default on Docker, and ours on Podman, whose default lets an agent make a user
    namespace and use the keyrings."""
    if spec.runtime not in HOST_KERNEL_RUNTIMES:
        return [f"seccomp={seccomp.gvisor_profile()}"]
    if engine != enginepaths.PODMAN:
        return []
    if not host_profile:
        raise UsageError(f"run {spec.run_id}: on Podman a container needs airlockd's seccomp profile")
    return [f"seccomp={host_profile}"]


def _mounted(path: str, mounts: list[Mount]) -> bool:
    """Whether `path` is /tmp or a mount's target already (the run's own mount wins)."""
    norm = path.rstrip("/") or "/"
    return norm == "/tmp" or any(str(m["Target"]).rstrip("/") == norm for m in mounts)


def gvisor_host_tasks(pids: int, pid_max: int | None = None) -> int:
    """The host's pids cap for a gVisor sandbox whose agent may have `pids` processes: its own
    threads, which grow with the agent's busy processes (61 idle; 15 to 43 host tasks per busy
    process measured, 5,208 for 120), with room to spare, but never more than a quarter of the
    host's pid space (`kernel.pid_max`). Reaching it ends the sandbox, recorded as a `pids`
    violation (cgroups.CgroupWatch reads it)."""
    if pid_max is None:
        try:
            pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
        except (OSError, ValueError):
            pid_max = 32768
    return min(256 + 48 * pids, max(1024, pid_max // 4))


def _network_mode(spec: ContainerSpec, engine: str) -> str:
    """The network mode: "none", or the namespace of the container `spec.network_of` (which has
    no network either: the engine checks nothing, DockerSandbox reads the joined container's own
    mode back). A fresh namespace costs the engine half a bare run; one made ahead costs nothing.
    gVisor keeps its own, and so does Podman (it makes the joining container a dependent of the
    holder, which then cannot be removed while the agent's container exists)."""
    if spec.network_of and spec.runtime in HOST_KERNEL_RUNTIMES and engine != enginepaths.PODMAN:
        return f"container:{spec.network_of}"
    return "none"


def create_kwargs(
    spec: ContainerSpec,
    engine: str = enginepaths.DOCKER,
    host_profile: str | None = None,
    engine_limits: tuple[tuple[str, int, int], ...] = enginepaths.PODMAN_ULIMITS,
    image_volumes: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The arguments of `containers.create` for `spec` on an engine of kind `engine`
    (`enginepaths.kind`): every security flag and limit, derived from the spec alone (no client).
    On Podman a container on the host's kernel gets airlockd's seccomp profile, `host_profile`
    (its file on the engine's host: `enginepaths.host_profile_path`), and `engine_limits` (the
    engine's own: `enginepaths.engine_limits`) where the run sets none of its own. Each of
    `image_volumes` (the image's VOLUME paths) gets an empty read-only tmpfs (MASKED_VOLUME). Raises
    UsageError for a spec the sandbox refuses (a network other than "none", an empty command,
    relative or missing paths)."""
    if spec.network != "none":
        raise UsageError(
            f"network {spec.network!r} is not supported by the Docker sandbox yet",
            hint='use network = "none"; the model gateway arrives as a mounted socket',
        )
    if not spec.argv:
        raise UsageError(f"run {spec.run_id}: empty command", hint="give the agent a command")
    if spec.workspace_overlay is not None:  # the engine mounts it: no path here to check
        # no_copy: an empty staged workspace must not take the owner of a directory the engine made
        mounts = [Mount(WORKSPACE_PATH, volumes.volume_name(spec.run_id), type="volume", read_only=False, no_copy=True)]
    elif not spec.workspace.is_absolute() or not spec.workspace.is_dir():
        raise UsageError(f"run {spec.run_id}: workspace {spec.workspace} is not a directory")
    else:
        mounts = [Mount(WORKSPACE_PATH, str(spec.workspace), type="bind", read_only=False)]
    argv = list(spec.argv)
    if spec.stdin_file is not None:
        if not spec.stdin_file.is_absolute() or not (spec.engine_paths or spec.stdin_file.is_file()):
            raise UsageError(f"run {spec.run_id}: stdin file {spec.stdin_file} is not a file")
        mounts.append(Mount(STDIN_PATH, str(spec.stdin_file), type="bind", read_only=True))
        argv = ["/bin/sh", "-c", f'exec "$@" < {STDIN_PATH}', "agent", *argv]
    for host, target, read_only in spec.mounts:
        if not host.is_absolute() or not target.startswith("/"):
            raise UsageError(f"run {spec.run_id}: mount {host} -> {target} needs absolute paths")
        mounts.append(Mount(target, str(host), type="bind", read_only=read_only))
    lim = spec.limits
    ulimits = list(ULIMITS)
    host_kernel = spec.runtime in HOST_KERNEL_RUNTIMES
    if not host_kernel:
        ulimits.append(("nproc", lim.pids, lim.pids))
    if engine == enginepaths.PODMAN:  # it would raise these past the engine's own hard limits
        ulimits += [u for u in engine_limits if u[0] not in {name for name, _, _ in ulimits}]
    kwargs: dict[str, Any] = {
        "image": spec.image,
        "command": argv,
        "user": spec.user,
        "environment": dict(spec.env),
        "working_dir": WORKSPACE_PATH,
        "labels": {**spec.labels, OWNER_LABEL: "1", RUN_LABEL: spec.run_id, RUNTIME_LABEL: spec.runtime},
        "network_mode": _network_mode(spec, engine),
        "read_only": True,
        "tmpfs": {
            **{p: MASKED_VOLUME for p in image_volumes if p.startswith("/") and not _mounted(p, mounts)},
            "/tmp": f"size={lim.tmpfs_mb}m,mode=1777",
            **(PODMAN_TMPFS if engine == enginepaths.PODMAN else {}),
        },
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges", *_profile(spec, engine, host_profile)],
        "mounts": mounts,
        "mem_limit": f"{lim.memory_mb}m",
        "memswap_limit": f"{lim.memory_mb}m",  # equal to the memory limit: no swap
        "pids_limit": lim.pids if host_kernel else gvisor_host_tasks(lim.pids),
        "ulimits": [Ulimit(name=name, soft=soft, hard=hard) for name, soft, hard in ulimits],
        "nano_cpus": int(lim.cpus * 1e9),
        "init": True,  # docker-init as PID 1: reaps zombies, forwards SIGTERM
        "stdin_open": False,
        "tty": False,
        # Output is read from the attach stream only: nothing piles up on the engine's disk.
        "log_config": LogConfig(type="none"),
        "detach": True,
    }
    if spec.runtime != "runc" or engine == enginepaths.PODMAN:  # Podman's default may be another (crun)
        kwargs["runtime"] = spec.runtime
    name = f"airlockd-{spec.run_id}"
    if _NAME_OK.match(name):
        kwargs["name"] = name
    return kwargs
