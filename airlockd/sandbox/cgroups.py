"""The kernel's own counters of a container's caps, read from its cgroup while it runs.

A cap that holds leaves no trace in how the container ended: a fork refused at `pids.max` is an
EAGAIN inside the agent, and an agent that gives up at once exits 0. The kernel counts it
(`pids.events` `max N`), but the engine removes the container's cgroup the moment its last
process is gone (long before the container itself is removed), so the counters are read while
it runs: a thread polls the few files every few milliseconds, keeping the highest figures seen.
cgroup v1 (one hierarchy per controller) and v2 (unified) are both read; v1 sends no change
notification for these files, so polling is the one way that works on both.

Reads files only; never writes a cgroup, never touches a process. When the engine's cgroups are
not visible from here (a remote engine, another mount namespace), the counters stay empty and
say why.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from airlockd.sandbox.base import CapCounters

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
POLL_S = 0.005  # the cgroup outlives a fork bomb that gives up at once by ~15 ms
FIND_TRIES_BEFORE_ASKING = 40  # ~0.2 s of guessing the usual paths before asking the engine for the pid


def _v2() -> bool:
    return (ROOT / "cgroup.controllers").exists()


def _relative_paths(pid: int) -> dict[str, str]:
    """controller ("pids", "memory", or "" for the unified hierarchy) -> the process's cgroup."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path.lstrip("/")
    return out


def locate(container_id: str, pid: int | None = None) -> dict[str, Path]:
    """The container's cgroup directory per controller ("pids", "memory") that exists now; only
    a directory named after the container is taken (a reused pid cannot mislead it)."""
    guesses = [  # Docker's (cgroupfs, systemd), then Podman's (cgroupfs, systemd)
        f"docker/{container_id}",
        f"system.slice/docker-{container_id}.scope",
        f"libpod_parent/libpod-{container_id}",
        f"machine.slice/libpod-{container_id}.scope",
    ]
    found: dict[str, Path] = {}
    rel = _relative_paths(pid) if pid else {}
    for controller in ("pids", "memory"):
        base = ROOT if _v2() else ROOT / controller
        names = [rel[k] for k in (controller, "") if k in rel] + guesses
        hit = next((base / n for n in names if container_id in n and (base / n).is_dir()), None)
        if hit is not None:
            found[controller] = hit
    return found


def _fields(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


class CgroupWatch:
    """Polls one container's pids / memory counters from before its start until `finish()` or
    until its cgroup is gone. `engine_pid()` (the container's init pid, asked of the engine) is
    called only when the usual cgroup paths are not found."""

    def __init__(
        self, container_id: str, engine_pid: Callable[[], int | None] | None = None, *, pids: bool = True
    ) -> None:
        self.container_id = container_id
        self._engine_pid = engine_pid
        # False under gVisor: the host's pids cgroup holds the sandbox's own threads, not the
        # agent's processes (which gVisor's kernel counts), so only the memory counters are read
        self._key = "pids" if pids else "memory"
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._best = {"pids_refused": 0, "pids_peak": 0, "oom_kills": 0, "backstop_hits": 0}
        self._files: dict[str, int] = {}
        self._source = ""
        self._why = "the container's cgroup was never found"
        self._thread = threading.Thread(target=self._loop, name=f"cgroup-{container_id[:12]}", daemon=True)

    def start(self) -> CgroupWatch:
        self._thread.start()
        return self

    def finish(self) -> CapCounters:
        """Stop polling; the highest figures seen, with where they came from."""
        self._done.set()
        self._thread.join(timeout=2)
        with self._lock:
            if not self._source:
                return CapCounters(source="", unavailable=self._why)
            b = self._best
            return CapCounters(
                b["pids_refused"], b["pids_peak"], b["oom_kills"], source=self._source, backstop_hits=b["backstop_hits"]
            )

    # -- the poller ------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            if self._find():
                while not self._done.is_set() and self._read():
                    self._done.wait(POLL_S)
        except Exception:  # evidence is best effort: never let it break a run
            log.exception("reading the cgroup of container %s failed", self.container_id[:12])
        finally:
            for fd in self._files.values():
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _find(self) -> bool:
        """Wait for the container's cgroup (made when the engine starts it). Past a few tries
        at the usual paths the engine is asked for its pid; once it runs and its cgroup is still
        not found, it is not visible from here: give up rather than poll for nothing."""
        tries = 0
        while not self._done.is_set():
            if self._key in (dirs := locate(self.container_id)):
                return self._open(dirs)
            tries += 1
            if tries % FIND_TRIES_BEFORE_ASKING == 0 and self._engine_pid is not None:
                pid = None
                with contextlib.suppress(Exception):
                    pid = self._engine_pid()
                if pid:  # started (0: not yet, or already over)
                    if self._key in (dirs := locate(self.container_id, pid)):
                        return self._open(dirs)
                    self._why = f"the cgroup of container pid {pid} is not visible under {ROOT}"
                    return False
            self._done.wait(POLL_S)
        return False

    def _open(self, dirs: dict[str, Path]) -> bool:
        v2 = _v2()
        wanted: dict[str, Path] = {}
        if self._key == "pids":
            wanted = {
                "pids.events": dirs["pids"] / "pids.events",
                "pids.peak": dirs["pids"] / "pids.peak",  # kernels >= 6.1 (v1 and v2)
                "pids.current": dirs["pids"] / "pids.current",
            }
        elif "pids" in dirs:  # under gVisor: the backstop on the sandbox's own threads (dockerargs)
            wanted["backstop.events"] = dirs["pids"] / "pids.events"
        if "memory" in dirs:
            wanted["memory"] = dirs["memory"] / ("memory.events" if v2 else "memory.oom_control")
        for key, path in wanted.items():
            with contextlib.suppress(OSError):
                self._files[key] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        needed = "pids.events" if self._key == "pids" else "memory"
        if needed not in self._files:
            self._why = f"no readable {wanted[needed].name if needed in wanted else needed} in {dirs[self._key]}"
            return False
        names = ", ".join(k if k != "memory" else wanted["memory"].name for k in self._files)
        self._source = f"cgroup {'v2' if v2 else 'v1'} {names} of the container, read while it ran"
        return True

    def _read(self) -> bool:
        """One poll; False once the cgroup is gone (its files answer ENODEV / ENOENT)."""
        seen: dict[str, int] = {}
        try:
            for key, fd in self._files.items():
                text = os.pread(fd, 4096, 0).decode(errors="replace")
                if key == "pids.events":
                    seen["pids_refused"] = _fields(text).get("max", 0)
                elif key == "backstop.events":
                    seen["backstop_hits"] = _fields(text).get("max", 0)
                elif key in ("pids.peak", "pids.current"):
                    seen["pids_peak"] = max(seen.get("pids_peak", 0), _fields("v " + text.strip()).get("v", 0))
                else:
                    seen["oom_kills"] = _fields(text).get("oom_kill", 0)
        except OSError:
            return False
        with self._lock:
            for k, v in seen.items():
                self._best[k] = max(self._best[k], v)
        return True
