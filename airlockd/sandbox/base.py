"""What a container run is, what it reports, and the Protocol every container runtime implements.

Pure data and a Protocol: nothing here talks to an engine. `DockerSandbox` (docker.py) is the real
implementation; tests may provide fakes with the same shape.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from airlockd.policy import Limits

if TYPE_CHECKING:
    from airlockd.staging.base import HeldUpper

#: Where the agent's standard-input file is mounted (read-only) inside the container.
STDIN_PATH = "/run/airlock/stdin"
#: Where the staged workspace is mounted (read-write) inside the container.
WORKSPACE_PATH = "/workspace"
#: How much of the end of the output an ExitInfo keeps.
TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class OverlayVolume:
    """An overlay the engine mounts at /workspace as a per-run named volume (local driver):
    `options` is the whole mount option string (lowerdir=...,upperdir=...,workdir=...,...)."""

    lower: Path
    upper: Path
    work: Path
    options: str


@dataclass(frozen=True)
class ContainerSpec:
    """One agent run: the command, the staged workspace, the limits and the wiring around them."""

    run_id: str
    image: str
    argv: list[str]
    workspace: Path  # host directory, mounted read-write at /workspace
    limits: Limits
    stdin_file: Path | None = None  # content becomes the agent's standard input
    env: dict[str, str] = field(default_factory=dict)
    user: str = "1000:1000"
    network: str = "none"
    # Extra bind mounts: (host path, container path, read_only); e.g. the gateway socket.
    mounts: list[tuple[Path, str, bool]] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    # When set, /workspace is this overlay (a volume created for the run and removed after its
    # container) instead of a bind mount of `workspace` (which is then the upper layer).
    workspace_overlay: OverlayVolume | None = None
    # The engine's runtime for the container: "runc", or "runsc" (gVisor: the agent's system calls
    # go to a kernel of gVisor's own, never straight to the host's).
    runtime: str = "runc"
    # The paths of `stdin_file` and `mounts` are on the engine's host (a remote engine), not here.
    engine_paths: bool = False
    # A container of the engine's, with no network of its own ("none"), whose network namespace
    # (loopback only) the agent's joins instead of the engine making one for it: the run's holder
    # (sandbox/layers.py), made ahead. Still no network; on runc only.
    network_of: str | None = None


#: Runtimes whose containers are processes of the host's kernel, counted by its pids cgroup.
HOST_KERNEL_RUNTIMES = frozenset({"runc"})


@dataclass(frozen=True)
class CapCounters:
    """What the kernel itself counted against a container's caps while it ran: forks refused at
    the pids cap, the most tasks at once, OOM kills. `source` names the files they were read
    from (empty when none could be read; `unavailable` then says why)."""

    pids_refused: int = 0
    pids_peak: int = 0
    oom_kills: int = 0
    source: str = ""
    unavailable: str = ""
    # under gVisor: tasks the host refused the sandbox at its backstop (its own threads' cap),
    # which ends gVisor itself
    backstop_hits: int = 0


@dataclass
class ExitInfo:
    """How a run ended, what it printed (a bounded tail) and the settings it really ran with."""

    container_id: str
    exit_code: int | None
    oom_killed: bool
    timed_out: bool  # the wall time was hit and the container killed
    output_limited: bool  # output_bytes was exceeded and the container killed
    stopped: str | None  # "stop" / "kill" when someone asked, else None
    duration_s: float
    output_bytes: int
    output_tail: bytes  # last <= TAIL_BYTES of stdout+stderr, unredacted: the caller redacts
    effective: dict[str, Any]  # network, read-only root, caps, security opts, user, limits, tmpfs
    counters: CapCounters = field(default_factory=CapCounters)  # the kernel's, read while it ran

    @property
    def limit_hit(self) -> str | None:
        """The limit that ended the run ("wall_time", "memory", "output"), if one did; else
        "pids" when a fork was refused at the cap (the agent may have ended on its own after)."""
        if self.timed_out:
            return "wall_time"
        if self.output_limited:
            return "output"
        if self.oom_killed or self.counters.oom_kills:
            return "memory"
        if self.counters.pids_refused or self.counters.backstop_hits:
            return "pids"
        return None


@runtime_checkable
class Sandbox(Protocol):
    """A container runtime. `run` blocks (callers run it in a thread); the rest return promptly."""

    def run(self, spec: ContainerSpec, on_output: Callable[[bytes], None] | None = None) -> ExitInfo:
        """Run `spec` to its end and remove the container, whatever happens."""
        ...

    def stop(self, run_id: str, grace_s: float) -> bool:
        """SIGTERM the run's container, wait `grace_s`, then SIGKILL it. No-op if it is gone.
        Whether a container of the run was reached (False: none exists yet, or any more)."""
        ...

    def kill(self, run_id: str) -> bool:
        """SIGKILL the run's container at once. No-op if it is gone. Whether one was reached."""
        ...

    def stats(self, run_id: str) -> dict[str, float] | None:
        """One sample: cpu_pct, mem_bytes, pids; None when the run has no running container."""
        ...

    def ping(self) -> None:
        """Raise EngineError, saying how to fix it, when the engine does not answer."""
        ...

    def runtime_refusal(self, runtime: str, *, host_sockets: bool) -> str | None:
        """Why a container cannot run under `runtime` here (missing, or unable to reach a host
        Unix socket when `host_sockets`), with the fix; None when it can. Asked at admission."""
        ...

    def attach(
        self,
        run_id: str,
        limits: Limits,
        *,
        output_so_far: int = 0,
        on_output: Callable[[bytes], None] | None = None,
    ) -> ExitInfo | None:
        """Keep watching (or read how it ended) the container another, dead, process started;
        None when the run has no container."""
        ...

    def labelled_runs(self, workspace: str, *, holders: bool = True) -> list[str]:
        """Run ids of every container this sandbox started for `workspace`, running or not;
        without `holders`, of the agents' containers alone (not those holding upper layers)."""
        ...

    def held_upper(self, image: str, workspace: str) -> HeldUpper | None:
        """The engine's way of holding capped upper layers (holder containers of `image`,
        labelled with `workspace`), for a process that cannot mount them; None when this engine
        cannot serve the run's overlay (its paths are not this machine's)."""
        ...

    def reap(self, run_id: str) -> int:
        """Kill and remove every container of a run whose owner is gone; how many there were."""
        ...
