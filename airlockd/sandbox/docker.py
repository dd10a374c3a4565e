"""`DockerSandbox`: runs a `ContainerSpec` in a locked-down, disposable Docker container.

Every container gets a read-only root, a bounded /tmp tmpfs, no capabilities, no-new-privileges,
a non-root user, no network, memory (no swap) / cpu / pids limits, docker-init as PID 1, and is
watched for wall time and output volume. It is always removed when the run ends, however it ends.
Never mounts anything but the staged workspace, the stdin file and the spec's extra mounts; never
passes a network other than "none"; never keeps output beyond a bounded tail.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors
import requests.exceptions
from docker.models.containers import Container
from docker.utils.socket import frames_iter

from airlockd.errors import EngineError
from airlockd.policy import Limits
from airlockd.sandbox import cgroups, enginepaths, layers, runtimes, seccomp, volumes
from airlockd.sandbox.base import HOST_KERNEL_RUNTIMES, TAIL_BYTES, CapCounters, ContainerSpec, ExitInfo
from airlockd.sandbox.dockerargs import RUN_LABEL, RUNTIME_LABEL, create_kwargs

log = logging.getLogger(__name__)

_ENGINE_FIX = "start the engine with scripts/ensure-docker.sh (or `make engine`) and check `docker info`"
_LIST_ATTEMPTS = 5  # each retry answers a container removed while it was listed
_DockerFailure = (docker.errors.DockerException, requests.exceptions.RequestException)


@contextlib.contextmanager
def _engine(action: str) -> Iterator[None]:
    """Turn docker / HTTP failures into EngineError, keeping the engine's own message."""
    try:
        yield
    except docker.errors.ImageNotFound as exc:
        cli = re.search(r"airlockd-runtime:[0-9a-f]+-([a-z]+)-", _explain(exc))  # an agent CLI's image
        build = f"airlockd runtime build --with {cli.group(1)}" if cli else "airlockd runtime build"
        raise EngineError(
            f"{action}: {_explain(exc)}",
            hint=f"build the image with `{build}` (or check the agent's `image` in policies.toml)",
        ) from None
    except docker.errors.APIError as exc:
        raise EngineError(f"{action}: the engine refused: {_explain(exc)}", hint=_ENGINE_FIX) from None
    except _DockerFailure as exc:
        raise EngineError(f"{action}: cannot reach the engine: {exc}", hint=_ENGINE_FIX) from None


def _explain(exc: docker.errors.DockerException) -> str:
    return str(getattr(exc, "explanation", None) or exc)


@dataclass
class _Output:
    """What the reader thread saw: byte count, bounded tail, whether the limit was crossed."""

    limit: int
    total: int = 0
    tail: bytearray = field(default_factory=bytearray)
    limited: bool = False
    error: BaseException | None = None

    def accept(self, data: bytes) -> bytes:
        """Count `data`; return the part that is within the limit (delivered and kept)."""
        room = max(0, self.limit - self.total)
        self.total += len(data)
        kept = data[:room]
        self.tail += kept
        if len(self.tail) > TAIL_BYTES:
            del self.tail[: len(self.tail) - TAIL_BYTES]
        if self.total > self.limit:
            self.limited = True
        return kept


class DockerSandbox:
    """The `Sandbox` Protocol on a local Docker engine, through the docker SDK."""

    def __init__(self, client: docker.DockerClient | None = None, *, timeout: float = 60) -> None:
        self._client = client
        self._timeout = timeout
        self._lock = threading.Lock()
        self._requested: dict[str, str] = {}  # run_id -> "stop" / "kill", asked in this process
        self._handled: set[str] = set()  # runs whose container the stop/kill itself reached
        self._grace: dict[str, float] = {}  # run_id -> the grace its stop asked for

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            with _engine("connecting to the Docker engine"):
                self._client = enginepaths.connect(int(self._timeout))
        return self._client

    # ---- the Protocol ----------------------------------------------------------------------

    def ping(self) -> None:
        """Raise EngineError with a fix when the engine does not answer; never starts one."""
        with _engine("pinging the Docker engine"):
            self.client.ping()

    def runtime_refusal(self, runtime: str, *, host_sockets: bool) -> str | None:
        """Asks the engine (`docker info`) for its runtimes; runc needs no question."""
        if runtime == "runc":
            return None
        try:
            with _engine(f"asking the engine for its runtimes (the agent asks for {runtime})"):
                info = self.client.info()
        except EngineError as exc:
            return str(exc)
        podman = enginepaths.kind(self.client) == enginepaths.PODMAN
        return runtimes.refusal(info.get("Runtimes"), runtime, host_sockets=host_sockets, podman=podman)

    def run(self, spec: ContainerSpec, on_output: Callable[[bytes], None] | None = None) -> ExitInfo:
        """Create, start and watch the container until it ends; always remove it.

        Blocking: call it from a worker thread. `on_output` gets stdout+stderr chunks in order
        (up to the output limit) on the reader thread; it must not block for long.
        """
        with _engine(f"asking the engine what it is, for run {spec.run_id}"):
            engine = enginepaths.kind(self.client)
            profile = None
            if engine == enginepaths.PODMAN:
                enginepaths.refuse_image_workspace(self.client, spec.image)
                profile = enginepaths.host_profile_path(self.client, spec.image)
            volumes_of_image = _image_volumes(self.client, spec.image)
        kwargs = create_kwargs(spec, engine, profile, enginepaths.engine_limits(), volumes_of_image)
        started = time.monotonic()
        container: Container | None = None
        watch: cgroups.CgroupWatch | None = None
        out = _Output(spec.limits.output_bytes)
        try:
            if spec.workspace_overlay is not None:
                with _engine(f"creating the overlay volume for run {spec.run_id}"):
                    volumes.create(self.client, spec.run_id, spec.workspace_overlay)
            with _engine(f"creating the container for run {spec.run_id}"):
                container = self.client.containers.create(**kwargs)  # (read back by the SDK: its attrs)
            effective = _effective(container.attrs, self.client)
            if effective["network_mode"] != "none":  # connected to a network, or joins a namespace that is
                raise EngineError(
                    f"the container of run {spec.run_id} would have the network"
                    f" {effective['network_mode']!r}, not none: it is not started",
                    hint="something connected it (or the holder whose namespace it joins) to a network;"
                    " look at who uses this engine (docker network inspect), then start the run again",
                )
            if (asked := self._asked(spec.run_id)) is not None:
                return _exit(container, None, False, out, asked, started, effective, timed_out=False)
            reader = self._start_reader(container, out, on_output)
            watch = self._watch(container)  # before the start: an agent may end within milliseconds
            with _engine(f"starting the container for run {spec.run_id}"):
                container.start()
            with self._lock:  # a stop/kill that could not reach the container yet still wins
                missed = self._requested.get(spec.run_id) if spec.run_id not in self._handled else None
                grace = self._grace.get(spec.run_id, 0.0)
            if missed == "kill":
                self._kill_quietly(container)
            elif missed == "stop":  # the same graceful stop it asked for, not a kill
                with _engine(f"stopping run {spec.run_id}"), _gone_is_fine():
                    container.stop(timeout=max(0, math.ceil(grace)))
            return self._follow(container, spec.run_id, started, spec.limits.wall_time_s, out, effective, reader, watch)
        finally:
            if watch is not None:
                watch.finish()
            self._remove(spec.run_id, container)
            if spec.workspace_overlay is not None:  # unmounted with its container: drop it now
                volumes.remove(self.client, spec.run_id)
            with self._lock:
                self._requested.pop(spec.run_id, None)
                self._handled.discard(spec.run_id)
                self._grace.pop(spec.run_id, None)

    def attach(
        self,
        run_id: str,
        limits: Limits,
        *,
        output_so_far: int = 0,
        on_output: Callable[[bytes], None] | None = None,
    ) -> ExitInfo | None:
        """Take over watching a run's container that an earlier process started (after that
        process died): the same wall-time and output limits from where they stood, and removal
        at the end. A container that already exited is read as it ended (its output since the
        other process died is lost). None when the run has no container."""
        found = self._find(run_id)
        if not found:
            return None
        container = found[0]
        never = container.attrs.get("State", {}).get("StartedAt", "").startswith("0001-")
        if container.status == "created" and never:  # its process died between create and start: no agent ran
            self._remove(run_id, container)
            volumes.remove(self.client, run_id)
            return None
        effective = _effective(container.attrs, self.client)
        state = container.attrs.get("State", {})
        ran = _since(state.get("StartedAt", ""))
        if container.status != "running":  # how long it ran, not how long ago it started
            ran -= _since(state.get("FinishedAt", ""))
        started = time.monotonic() - ran
        out = _Output(limits.output_bytes, total=output_so_far)  # earlier output counts against the cap
        watch: cgroups.CgroupWatch | None = None  # counted from now on (the kernel's figures are cumulative)
        try:
            if container.status == "running":
                reader = self._start_reader(container, out, on_output)
                watch = self._watch(container)
            else:
                reader = threading.Thread(target=lambda: None)
                reader.start()
            return self._follow(container, run_id, started, limits.wall_time_s, out, effective, reader, watch)
        finally:
            if watch is not None:
                watch.finish()
            self._remove(run_id, container)
            volumes.remove(self.client, run_id)  # its overlay volume, if it had one
            with self._lock:
                self._requested.pop(run_id, None)
                self._handled.discard(run_id)
                self._grace.pop(run_id, None)

    def _follow(
        self,
        container: Container,
        run_id: str,
        started: float,
        wall_time_s: float,
        out: _Output,
        effective: dict[str, Any],
        reader: threading.Thread,
        watch: cgroups.CgroupWatch | None,
    ) -> ExitInfo:
        """Wait for a started container within its wall time (killing it past that), drain its
        output, and read how it ended (with the kernel's counters of its caps)."""
        timed_out = not self._wait(container, started + wall_time_s)
        if timed_out:
            self._kill_quietly(container)
            self._wait(container, time.monotonic() + 30)
        reader.join(timeout=10)
        counters = watch.finish() if watch is not None else CapCounters(unavailable="it had ended before")
        with _engine(f"inspecting the container for run {run_id}"):
            container.reload()
        state = container.attrs.get("State", {})
        return _exit(
            container,
            state.get("ExitCode"),
            bool(state.get("OOMKilled")),
            out,
            self._asked(run_id),
            started,
            effective,
            timed_out=timed_out,
            counters=counters,
        )

    def _watch(self, container: Container) -> cgroups.CgroupWatch:
        """Poll the container's cgroup counters (caps reached) while it runs."""
        cid = str(container.id)

        def engine_pid() -> int | None:
            return int(self.client.api.inspect_container(cid)["State"]["Pid"]) or None

        return cgroups.CgroupWatch(cid, engine_pid, pids=_host_kernel(container)).start()

    def stop(self, run_id: str, grace_s: float) -> bool:
        """SIGTERM (docker-init forwards it), then SIGKILL after `grace_s` (whole seconds, up).

        Blocks until the container has ended. A run not yet started is never started.
        """
        with self._lock:
            self._requested.setdefault(run_id, "stop")
            self._grace[run_id] = grace_s
        found = self._find(run_id)
        with self._lock:  # reached only if it was already running: a created one is killed at start
            self._handled.update([run_id] if any(c.status == "running" for c in found) else [])
        for c in found:
            with _engine(f"stopping run {run_id}"), _gone_is_fine():
                c.stop(timeout=max(0, math.ceil(grace_s)))
        return any(c.status == "running" for c in found)  # a created one may start after our look

    def kill(self, run_id: str) -> bool:
        """SIGKILL the run's container now. A run not yet started is never started."""
        with self._lock:
            self._requested[run_id] = "kill"
        found = self._find(run_id)
        with self._lock:  # reached only if it was already running: a created one is killed at start
            self._handled.update([run_id] if any(c.status == "running" for c in found) else [])
        for c in found:
            self._kill_quietly(c)
        return any(c.status == "running" for c in found)

    def reap(self, run_id: str) -> int:
        """Force-remove every container labelled with the run (running or not), and the capped
        upper layer the engine held for it."""
        found = self._find(run_id)
        for c in found:
            with _engine(f"removing the container of run {run_id}"), contextlib.suppress(docker.errors.NotFound):
                c.remove(force=True, v=True)
        volumes.remove_labelled(self.client, run_id)
        layers.release(self.client, run_id)
        return len(found)

    def held_upper(self, image: str, workspace: str) -> layers.EngineUpper:
        """Holder containers on this engine; `remote` when it cannot see this machine's paths
        (asked of the engine once: sandbox/enginepaths.py)."""
        remote = not enginepaths.sees_local_paths(self.client, image)
        return layers.EngineUpper(self.client, image, {"airlockd.workspace": workspace}, remote=remote)

    def stats(self, run_id: str) -> dict[str, float] | None:
        """One sample (takes about a second): cpu_pct, mem_bytes, pids. None if not running."""
        running = [c for c in self._find(run_id) if c.status == "running"]
        if not running:
            return None
        try:
            raw = running[0].stats(stream=False)
        except docker.errors.NotFound:
            return None
        except _DockerFailure as exc:
            log.warning("stats for run %s failed: %s", run_id, exc)
            return None
        if not isinstance(raw, dict):
            return None
        sample = _stats_sample(raw)
        if not _host_kernel(running[0]):  # the sandbox's own threads, not the agent's processes
            sample.pop("pids", None)
        return sample

    # ---- pieces ------------------------------------------------------------------------------

    def _start_reader(
        self, container: Container, out: _Output, on_output: Callable[[bytes], None] | None
    ) -> threading.Thread:
        """Attach before start (so nothing is missed) and pump the output on a thread."""
        cid = str(container.id)
        with _engine("attaching to the container's output"):
            sock = self.client.api.attach_socket(cid, params={"stdout": 1, "stderr": 1, "stream": 1, "logs": 0})
        for s in (sock, getattr(sock, "_sock", None)):
            if s is not None and hasattr(s, "settimeout"):
                s.settimeout(None)  # an agent may be silent for a long time

        def pump() -> None:
            killing: threading.Thread | None = None
            try:
                for _stream, data in frames_iter(sock, tty=False):
                    kept = out.accept(data)
                    if kept and on_output is not None:
                        try:
                            on_output(kept)
                        except Exception:  # a consumer's bug must not stop the limit watch
                            log.exception("on_output callback failed; output keeps being counted")
                    if out.limited and killing is None:
                        # Kill from another thread and keep draining: the engine cannot finish
                        # the container while its output stream is blocked on us.
                        killing = threading.Thread(target=self._kill_quietly, args=(container,), daemon=True)
                        killing.start()
            except (OSError, ValueError) as exc:  # includes socket timeouts
                out.error = exc
            finally:
                with contextlib.suppress(OSError):
                    sock.close()

        thread = threading.Thread(target=pump, name=f"airlockd-output-{cid[:12]}", daemon=True)
        thread.start()
        return thread

    def _wait(self, container: Container, deadline: float) -> bool:
        """Wait for the container to exit before `deadline`; False when the deadline passes."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            asked = min(remaining, 300.0)
            t0 = time.monotonic()
            try:
                container.wait(timeout=asked)
                return True
            except (requests.exceptions.Timeout, requests.exceptions.ConnectionError) as exc:
                # A read timeout ends the slice; anything that fails fast is the engine going away.
                if time.monotonic() - t0 < asked * 0.9:
                    raise EngineError(
                        f"lost the engine while waiting for container {container.short_id}: {exc}",
                        hint=_ENGINE_FIX,
                    ) from None
            except docker.errors.NotFound:
                return True
            except docker.errors.APIError as exc:
                raise EngineError(f"waiting for the container: {_explain(exc)}", hint=_ENGINE_FIX) from None

    def _asked(self, run_id: str) -> str | None:
        with self._lock:
            return self._requested.get(run_id)

    def labelled_runs(self, workspace: str, *, holders: bool = True) -> list[str]:
        """Run ids of every container (running or not) airlockd started for `workspace`; without
        `holders`, of the agents' containers alone."""
        with _engine("listing airlockd's containers"):
            found = self._listed(f"airlockd.workspace={workspace}")
        held = (lambda c: layers.holder_run(c.name, c.labels)) if holders else (lambda c: "")
        return sorted({c.labels.get(RUN_LABEL) or held(c) for c in found} - {""})

    def _find(self, run_id: str) -> list[Container]:
        with _engine(f"looking up run {run_id}"):
            return self._listed(f"{RUN_LABEL}={run_id}")

    def _listed(self, label: str) -> list[Container]:
        """Containers carrying `label`. One removed between the listing and its inspection is
        simply gone: Docker answers 404 for it, which `ignore_removed` skips, but Podman answers
        500 "no such container", so the listing is asked again."""
        for attempt in range(_LIST_ATTEMPTS):
            try:
                found: list[Container] = self.client.containers.list(
                    all=True, filters={"label": label}, ignore_removed=True
                )
                return found
            except docker.errors.APIError as exc:
                if "no such container" not in str(exc).lower() or attempt == _LIST_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _kill_quietly(self, container: Container) -> None:
        try:
            container.kill()
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: not running any more, which is what we wanted
                log.warning("killing %s failed: %s", container.short_id, _explain(exc))
        except _DockerFailure as exc:
            log.warning("killing %s failed: %s", container.short_id, exc)

    def _remove(self, run_id: str, container: Container | None) -> None:
        """Force-remove the run's container; by label when create() never returned its id."""
        try:
            targets = [container] if container is not None else self._find(run_id)
        except EngineError as exc:
            log.error("cannot look up the container of run %s to remove it: %s", run_id, exc)
            return
        for c in targets:
            try:
                c.remove(force=True, v=True)  # v: an anonymous volume the engine made goes with it
            except docker.errors.NotFound:
                pass
            except _DockerFailure as exc:
                log.error("could not remove container %s of run %s: %s", c.short_id, run_id, exc)


@contextlib.contextmanager
def _gone_is_fine() -> Iterator[None]:
    """Inside `_engine`: a container that vanished or already stopped is not an error (Podman
    says one removed while it was being stopped with a 500 "no such container", not a 404)."""
    try:
        yield
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409 and "no such container" not in str(exc).lower():
            raise


def _host_kernel(container: Container) -> bool:
    """Whether the container's processes are the host kernel's (runc), by the label every run's
    container carries (a listing's attributes have no HostConfig.Runtime)."""
    return (container.labels or {}).get(RUNTIME_LABEL, "runc") in HOST_KERNEL_RUNTIMES


def _mounts(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    """The container's mounts as the engine made them (Podman leaves HostConfig.Mounts empty and
    says them in the top-level Mounts, with RW rather than ReadOnly)."""
    asked = (attrs.get("HostConfig") or {}).get("Mounts") or []
    if asked:
        return [{"target": m.get("Target"), "read_only": bool(m.get("ReadOnly"))} for m in asked]
    made = attrs.get("Mounts") or []
    return [{"target": m.get("Destination"), "read_only": not m.get("RW", True)} for m in made]


def _network(attrs: dict[str, Any], client: Any) -> dict[str, Any]:
    """The container's network as the engine has it: its mode, with any network it was connected
    to besides (`docker network connect` leaves the mode as it was: "none+bridge" then). One that
    joined another's namespace (`ContainerSpec.network_of`) has that container's network: "none"
    only when the engine says that one is running with none and connected to nothing, and then
    `network_shared_with` names it."""
    mode = (attrs.get("HostConfig") or {}).get("NetworkMode")
    if not (isinstance(mode, str) and mode.startswith("container:")):
        return {"network_mode": _connected(mode, attrs)}
    if client is None:
        return {"network_mode": mode}
    try:
        joined = client.api.inspect_container(mode.removeprefix("container:"))
    except docker.errors.DockerException:
        return {"network_mode": mode}
    theirs = _connected((joined.get("HostConfig") or {}).get("NetworkMode"), joined)
    if theirs != "none" or not (joined.get("State") or {}).get("Running"):
        return {"network_mode": f"{mode} ({theirs})"}
    return {"network_mode": "none", "network_shared_with": str(joined.get("Name", "")).lstrip("/")}


def _connected(mode: Any, attrs: dict[str, Any]) -> Any:
    """`mode`, or "none+NAME,..." for a container of mode none that networks were connected to."""
    networks = set((attrs.get("NetworkSettings") or {}).get("Networks") or {})
    extra = sorted(networks - {"none"})
    return f"{mode}+{','.join(extra)}" if mode == "none" and extra else mode


def _effective(attrs: dict[str, Any], client: Any = None) -> dict[str, Any]:
    """The settings the engine recorded for the container (not what we asked for)."""
    hc = attrs.get("HostConfig", {})
    cfg = attrs.get("Config", {})
    runtime = hc.get("Runtime") or "runc"
    if runtime == "oci" and client is not None:  # Podman's Docker API says no more: its own does
        runtime = enginepaths.podman_runtime(client, attrs.get("Id", ""))
    return {
        "image": cfg.get("Image"),
        "image_id": attrs.get("Image"),
        "user": cfg.get("User"),
        "runtime": runtime,
        **_network(attrs, client),
        "read_only_root": hc.get("ReadonlyRootfs"),
        "cap_drop": hc.get("CapDrop"),
        "cap_add": hc.get("CapAdd"),
        "privileged": hc.get("Privileged"),
        "security_opt": seccomp.shown(hc.get("SecurityOpt")),
        "init": hc.get("Init"),
        "memory_bytes": hc.get("Memory"),
        "memory_swap_bytes": hc.get("MemorySwap"),
        "pids_limit": hc.get("PidsLimit"),
        "cpus": (hc.get("NanoCpus") or 0) / 1e9,
        "tmpfs": hc.get("Tmpfs"),
        "mounts": _mounts(attrs),
        # Podman names them RLIMIT_NOFILE, ...
        "ulimits": {
            str(u.get("Name", "")).lower().removeprefix("rlimit_"): [u.get("Soft"), u.get("Hard")]
            for u in hc.get("Ulimits") or []
        },
    }


def _exit(
    container: Container,
    exit_code: int | None,
    oom_killed: bool,
    out: _Output,
    stopped: str | None,
    started: float,
    effective: dict[str, Any],
    *,
    timed_out: bool,
    counters: CapCounters | None = None,
) -> ExitInfo:
    return ExitInfo(
        container_id=container.id or "",
        exit_code=exit_code,
        oom_killed=oom_killed,
        timed_out=timed_out,
        output_limited=out.limited,
        stopped=stopped,
        duration_s=round(time.monotonic() - started, 3),
        output_bytes=out.total,
        output_tail=bytes(out.tail),
        effective=effective,
        counters=counters or CapCounters(unavailable="the container never started"),
    )


def _stats_sample(raw: dict[str, Any]) -> dict[str, float]:
    """cpu_pct (100 = one core), mem_bytes (without page cache), pids, as `docker stats` does."""
    cpu, pre = raw.get("cpu_stats", {}), raw.get("precpu_stats", {})
    cpu_delta = cpu.get("cpu_usage", {}).get("total_usage", 0) - pre.get("cpu_usage", {}).get("total_usage", 0)
    sys_delta = cpu.get("system_cpu_usage", 0) - pre.get("system_cpu_usage", 0)
    online = cpu.get("online_cpus") or len(cpu.get("cpu_usage", {}).get("percpu_usage") or [1])
    cpu_pct = cpu_delta / sys_delta * online * 100.0 if cpu_delta > 0 and sys_delta > 0 else 0.0
    mem = raw.get("memory_stats", {})
    inner = mem.get("stats", {})
    cache = inner.get("total_inactive_file", inner.get("inactive_file", 0))
    return {
        "cpu_pct": round(cpu_pct, 2),
        "mem_bytes": float(max(0, mem.get("usage", 0) - cache)),
        "mem_max_bytes": float(mem.get("max_usage", 0)),  # cgroup v1 high-water mark (0 on v2)
        "pids": float(raw.get("pids_stats", {}).get("current", 0)),
    }


def _since(iso: str) -> float:
    """Seconds since an engine timestamp (RFC 3339 with nanoseconds); 0 if unreadable."""
    from datetime import UTC, datetime

    try:
        head, _, frac = iso.rstrip("Z").partition(".")
        at = datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp() + float(f"0.{frac or 0}"[:11])
    except ValueError:
        return 0.0
    return max(0.0, time.time() - at)


def _image_volumes(client: Any, image: str) -> tuple[str, ...]:
    """The paths the image declares as VOLUME: the engine would make each an anonymous, writable,
    uncapped volume on its own disk, outliving the run; create_kwargs covers them instead."""
    try:
        config = client.images.get(image).attrs.get("Config") or {}
    except docker.errors.ImageNotFound:
        return ()  # create() says the image is missing, with its own hint
    return tuple(sorted(str(p) for p in (config.get("Volumes") or {})))
