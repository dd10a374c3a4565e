"""A Sandbox without an engine: `act(workspace)` plays the agent on the staging copy."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airlockd.policy import Limits
from airlockd.sandbox.base import TAIL_BYTES, CapCounters, ContainerSpec, ExitInfo, Sandbox
from airlockd.staging import overlay

EFFECTIVE = {
    "image": "fake",
    "image_id": "sha256:fake",
    "user": "1000:1000",
    "network_mode": "none",
    "read_only_root": True,
    "cap_drop": ["ALL"],
    "cap_add": None,
    "privileged": False,
    "security_opt": ["no-new-privileges"],
    "init": True,
    "memory_bytes": 1 << 30,
    "memory_swap_bytes": 1 << 30,
    "pids_limit": 256,
    "cpus": 1.0,
    "tmpfs": {"/tmp": "size=256m"},
    "mounts": [],
}


@dataclass
class _Running:
    spec: ContainerSpec
    signal: threading.Event = field(default_factory=threading.Event)  # stop / kill delivered
    done: threading.Event = field(default_factory=threading.Event)
    info: ExitInfo | None = None


@dataclass
class FakeSandbox:
    """The `Sandbox` Protocol without an engine (mypy holds it to the Protocol: see `_check`).

    `act(workspace)` plays the agent on the staging copy, in the thread that called `run`; it
    returns what the agent printed. An act that should run until stopped calls `block(run_id)`.
    Stop, kill, reap, attach, labelled_runs and stats follow the runs in progress the way the
    engine follows containers. What it cannot do, it does not pretend: it runs no process, so it
    enforces no memory / pids / cpu cap, ignores no SIGTERM, and reports no kernel counters."""

    act: Callable[[Path], bytes | None] = lambda ws: None
    timed_out: bool = False  # report every run as ended by its wall time
    runtimes: tuple[str, ...] = ("runc",)  # what the fake engine "has" (`runtime_refusal`)
    seen: list[ContainerSpec] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _requested: dict[str, str] = field(default_factory=dict)  # run_id -> "stop" / "kill"
    _running: dict[str, _Running] = field(default_factory=dict)

    def run(self, spec: ContainerSpec, on_output: Callable[[bytes], None] | None = None) -> ExitInfo:
        self.seen.append(spec)
        with self._lock:
            asked = self._requested.get(spec.run_id)
            if asked is None:
                self._running[spec.run_id] = _Running(spec)
        if asked is not None:  # a stop that arrived before the start: the agent never runs
            self._requested.pop(spec.run_id, None)
            return self._exit(spec, None, b"", asked, 0.0, timed_out=False)
        started = time.monotonic()
        try:
            out = self._act(spec) or b""
            with self._lock:
                asked = self._requested.pop(spec.run_id, None)
                hit_wall = self._running[spec.run_id].signal.is_set() and asked is None
            kept = out[: spec.limits.output_bytes]
            if kept and on_output is not None:
                on_output(kept)
            code = {"stop": 143, "kill": 137}.get(asked or "", 137 if hit_wall or self.timed_out else 0)
            info = self._exit(spec, code, out, asked, time.monotonic() - started, timed_out=hit_wall or self.timed_out)
            self._running[spec.run_id].info = info
            return info
        finally:
            with self._lock:
                running = self._running.pop(spec.run_id)
            running.done.set()

    def _act(self, spec: ContainerSpec) -> bytes | None:
        ov = spec.workspace_overlay
        if ov is None:
            return self.act(spec.workspace)
        # what the engine does with the run's overlay volume, done here with the kernel
        merged = ov.upper.parent.parent / "merged"
        overlay.mount(ov.lower, ov.upper, ov.work, merged)
        try:
            return self.act(merged)
        finally:
            overlay.unmount(merged)
            merged.rmdir()

    def _exit(
        self, spec: ContainerSpec, code: int | None, out: bytes, asked: str | None, took: float, *, timed_out: bool
    ) -> ExitInfo:
        lim = spec.limits
        effective = {
            **EFFECTIVE,
            "user": spec.user,
            "memory_bytes": lim.memory_mb * 2**20,
            "memory_swap_bytes": lim.memory_mb * 2**20,
            "pids_limit": lim.pids,
            "cpus": lim.cpus,
            "tmpfs": {"/tmp": f"size={lim.tmpfs_mb}m,mode=1777"},
        }
        return ExitInfo(
            container_id="f" * 64,
            exit_code=code,
            oom_killed=False,
            timed_out=timed_out,
            output_limited=len(out) > lim.output_bytes,
            stopped=asked,
            duration_s=round(took, 3) or 0.1,
            output_bytes=len(out),
            output_tail=out[: lim.output_bytes][-TAIL_BYTES:],
            effective=effective,
            counters=CapCounters(unavailable="the fake sandbox runs no process: no cgroup counts anything"),
        )

    def block(self, run_id: str) -> None:
        """For an act: run until stopped, killed or past the wall time (then the run timed out)."""
        with self._lock:
            running = self._running[run_id]
        if not running.signal.wait(running.spec.limits.wall_time_s):
            running.signal.set()  # nobody asked: the wall time ended it

    def _signal(self, run_id: str, kind: str, grace_s: float) -> bool:
        with self._lock:
            if kind == "kill":
                self._requested[run_id] = kind
            else:
                self._requested.setdefault(run_id, kind)
            running = self._running.get(run_id)
        if running is not None:
            running.signal.set()
            running.done.wait(grace_s + 5)  # like the engine's stop: returns once it has ended
        return running is not None

    def stop(self, run_id: str, grace_s: float) -> bool:
        return self._signal(run_id, "stop", grace_s)

    def kill(self, run_id: str) -> bool:
        return self._signal(run_id, "kill", 0)

    def stats(self, run_id: str) -> dict[str, float] | None:
        with self._lock:
            if run_id not in self._running:
                return None
        # the shape the engine gives; the figures are not measured (no process runs)
        return {"cpu_pct": 0.0, "mem_bytes": 0.0, "mem_max_bytes": 0.0, "pids": 1.0}

    def ping(self) -> None:
        pass

    def runtime_refusal(self, runtime: str, *, host_sockets: bool) -> str | None:
        from airlockd.sandbox import runtimes

        table = {r: {"runtimeArgs": runtimes.GVISOR_ARGS} for r in self.runtimes}  # as ensure-docker registers it
        return runtimes.refusal(table, runtime, host_sockets=host_sockets)

    def attach(
        self,
        run_id: str,
        limits: Limits,
        *,
        output_so_far: int = 0,
        on_output: Callable[[bytes], None] | None = None,
    ) -> ExitInfo | None:
        with self._lock:
            running = self._running.get(run_id)
        if running is None:
            return None
        running.done.wait(limits.wall_time_s + 5)
        return running.info

    def labelled_runs(self, workspace: str, *, holders: bool = True) -> list[str]:  # it holds none
        with self._lock:
            return sorted(
                r for r, run in self._running.items() if run.spec.labels.get("airlockd.workspace") == workspace
            )

    def held_upper(self, image: str, workspace: str) -> None:
        return None  # the fake's runs are staged by the host's own means

    def reap(self, run_id: str) -> int:
        with self._lock:
            found = run_id in self._running
        if found:
            self.kill(run_id)
        return int(found)


_check: Sandbox = FakeSandbox()  # mypy (make lint) holds the fake to every method of the Protocol


def workspace(root: Path, extra_policy: str = "") -> Path:
    ws = root / "project"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("A = 1\n")
    (ws / "notes.txt").write_text("plain notes\n")
    (ws / ".env").write_text("DB_PASSWORD=Zq8-withheld-value-xK31\n")
    (ws / "policies.toml").write_text('[agents.bot]\ncommand = ["true"]\n' + extra_policy)
    return ws


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]


@pytest.fixture(autouse=True)
def _unmount_staging(_state_dir: Path) -> Iterator[None]:
    """Runs left proposed keep their staging copy on a tmpfs (when root): unmount them after."""
    yield
    for line in Path("/proc/mounts").read_text().splitlines():
        target = line.split()[1]
        if target.startswith(str(_state_dir)):
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
