"""The `Sandbox` contract, run against the fake (tests/unit/fakesandbox.py, what the unit tests
stand on) and the real `DockerSandbox`: the same scenarios, the same assertions. Each agent is
given twice, as the command the engine runs and as the act the fake plays; where the fake cannot
honestly do something (it runs no process), the test says so and skips for the fake only."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fakesandbox import FakeSandbox

from airlockd.policy import Limits
from airlockd.sandbox.base import ContainerSpec, ExitInfo, Sandbox
from airlockd.sandbox.docker import DockerSandbox

AGENT_UID = 1000
WS_LABEL = "airlockd.workspace"


@dataclass(frozen=True)
class Agent:
    """One behaviour: `argv` for the engine, `act(fake, run_id, workspace)` for the fake."""

    argv: list[str]
    act: Callable[[FakeSandbox, str, Path], bytes | None]


def _write(fake: FakeSandbox, run_id: str, ws: Path) -> bytes:
    (ws / "new.txt").write_text("made\n")
    return b"hello\n"


def _until_stopped(fake: FakeSandbox, run_id: str, ws: Path) -> bytes:
    fake.block(run_id)
    return b"ready\n"


WRITE = Agent(["/bin/sh", "-c", "echo made > /workspace/new.txt; echo hello"], _write)
UNTIL_STOPPED = Agent(["/bin/sh", "-c", "echo ready; exec sleep 100"], _until_stopped)  # SIGTERM ends it
FLOOD = Agent(["yes"], lambda fake, run_id, ws: b"y\n" * 100_000)


@dataclass
class Backend:
    name: str
    sandbox: Sandbox
    workspace: Path
    image: str
    threads: list[threading.Thread] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    @property
    def fake(self) -> FakeSandbox | None:
        return self.sandbox if isinstance(self.sandbox, FakeSandbox) else None

    def cannot(self, why: str) -> None:
        """Skip for the fake only, saying why (the engine runs the same test for real)."""
        if self.fake is not None:
            pytest.skip(f"the fake sandbox cannot: {why}")

    def spec(self, agent: Agent, run_id: str, **limits: Any) -> ContainerSpec:
        if (fake := self.fake) is not None:
            fake.act = lambda ws: agent.act(fake, run_id, ws)
        return ContainerSpec(
            run_id=run_id,
            image=self.image,
            argv=agent.argv,
            workspace=self.workspace,
            limits=Limits.model_validate({"wall_time_s": 30, **limits}),
            labels={WS_LABEL: str(self.workspace)},
        )

    def run(self, agent: Agent, run_id: str | None = None, **limits: Any) -> ExitInfo:
        return self.sandbox.run(self.spec(agent, run_id or new_id(), **limits))

    def start(self, agent: Agent, **limits: Any) -> tuple[str, dict[str, ExitInfo]]:
        """Run `agent` on a thread; return once its container is running."""
        run_id, result = new_id(), {}
        spec = self.spec(agent, run_id, **limits)

        def go() -> None:
            try:
                result["info"] = self.sandbox.run(spec)
            except Exception as exc:  # recorded: a test that expects none asserts on it
                self.errors.append(exc)

        t = threading.Thread(target=go, daemon=True)
        t.start()
        self.threads.append(t)
        deadline = time.monotonic() + 30
        while self.sandbox.stats(run_id) is None:
            assert time.monotonic() < deadline and t.is_alive(), f"{run_id} never ran: {self.errors}"
            time.sleep(0.05)
        return run_id, result

    def join(self) -> None:
        for t in self.threads:
            t.join(30)
            assert not t.is_alive(), "a run did not end"


def new_id() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["fake", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    ws = tmp_path / "ws"
    ws.mkdir()
    if request.param == "fake":
        b = Backend("fake", FakeSandbox(), ws, "fake")
    else:
        from airlockd.sandbox.image import image_tag

        request.getfixturevalue("_image")
        if os.geteuid() == 0:
            os.chown(ws, AGENT_UID, AGENT_UID)
        else:
            ws.chmod(0o777)
        b = Backend("docker", DockerSandbox(), ws, image_tag())
    yield b
    b.join()
    assert b.sandbox.labelled_runs(str(ws)) == [], "a container was left behind"


# -- run ---------------------------------------------------------------------------------------


def test_is_a_sandbox_and_answers(backend: Backend) -> None:
    assert isinstance(backend.sandbox, Sandbox)
    backend.sandbox.ping()


def test_run_reports_exit_output_and_what_it_wrote(backend: Backend) -> None:
    got: list[bytes] = []
    info = backend.sandbox.run(backend.spec(WRITE, new_id()), on_output=got.append)
    assert (info.exit_code, info.stopped, info.timed_out, info.oom_killed) == (0, None, False, False)
    assert info.output_tail == b"hello\n" and info.output_bytes == 6 and b"".join(got) == b"hello\n"
    assert info.limit_hit is None and info.container_id
    assert (backend.workspace / "new.txt").read_text() == "made\n"


def test_limits_are_reported_in_exit_info(backend: Backend) -> None:
    info = backend.run(WRITE, memory_mb=96, pids=48, cpus=0.5, tmpfs_mb=12)
    eff = info.effective
    assert eff["memory_bytes"] == eff["memory_swap_bytes"] == 96 << 20
    assert (eff["pids_limit"], eff["cpus"]) == (48, 0.5)
    assert eff["tmpfs"] == {"/tmp": "size=12m,mode=1777"}
    assert (eff["network_mode"], eff["read_only_root"], eff["cap_drop"]) == ("none", True, ["ALL"])
    assert eff["security_opt"] == ["no-new-privileges"] and eff["user"] == "1000:1000"


def test_wall_time_ends_the_run(backend: Backend) -> None:
    info = backend.run(UNTIL_STOPPED, wall_time_s=2)
    assert (info.timed_out, info.limit_hit, info.exit_code, info.stopped) == (True, "wall_time", 137, None)
    assert 2 <= info.duration_s < 10


def test_output_past_its_limit_ends_the_run(backend: Backend) -> None:
    got: list[bytes] = []
    info = backend.sandbox.run(backend.spec(FLOOD, new_id(), output_bytes=64 * 1024), on_output=got.append)
    assert info.output_limited and info.limit_hit == "output"
    assert info.output_bytes > 64 * 1024 and sum(map(len, got)) == 64 * 1024  # nothing past it delivered


def test_a_fork_refused_at_the_pids_cap_is_counted(backend: Backend) -> None:
    backend.cannot("refuse a fork: it runs no process, so no cgroup counts one")
    bomb = (
        "import subprocess\nps = []\ntry:\n    while True: ps.append(subprocess.Popen(['sleep', '5']))\n"
        "except OSError as e: print('refused after', len(ps))"
    )
    info = backend.run(Agent(["python3", "-c", bomb], _write), pids=48)
    assert info.exit_code == 0 and b"refused after" in info.output_tail  # it gave up at once, cleanly
    assert info.counters.pids_refused > 0 and info.counters.pids_peak == 48, info.counters
    assert "pids.events" in info.counters.source and info.limit_hit == "pids"


def test_memory_past_the_cap_is_oom_killed(backend: Backend) -> None:
    backend.cannot("allocate memory under a cgroup: it runs no process")
    info = backend.run(Agent(["python3", "-c", "b = bytearray(512 << 20)"], _write), memory_mb=64)
    # the engine's OOMKilled flag or the kernel's own count read from the cgroup: under heavy load
    # the engine's flag was once seen missing from a run the kernel had killed (exit 137)
    assert (info.oom_killed or info.counters.oom_kills) and info.limit_hit == "memory", info
    assert info.exit_code == 137


# -- stop, kill, reap --------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_stop_before_the_start_means_never_started(backend: Backend, how: str) -> None:
    run_id = new_id()
    backend.sandbox.stop(run_id, 0) if how == "stop" else backend.sandbox.kill(run_id)
    info = backend.run(WRITE, run_id)
    assert (info.stopped, info.exit_code) == (how, None)
    assert not (backend.workspace / "new.txt").exists()


def test_stop_after_the_start_returns_once_it_has_ended(backend: Backend) -> None:
    run_id, result = backend.start(UNTIL_STOPPED)
    assert backend.sandbox.stop(run_id, grace_s=10) is True  # it reached the running container
    assert backend.sandbox.stats(run_id) is None  # ended when stop returned (the agent obeys SIGTERM)
    backend.join()
    assert (result["info"].stopped, result["info"].exit_code) == ("stop", 143)
    assert result["info"].limit_hit is None and not backend.errors


def test_kill(backend: Backend) -> None:
    run_id, result = backend.start(UNTIL_STOPPED)
    t0 = time.monotonic()
    assert backend.sandbox.kill(run_id) is True
    backend.join()
    assert time.monotonic() - t0 < 8
    assert (result["info"].stopped, result["info"].exit_code) == ("kill", 137) and not backend.errors
    # a run that is gone (or has no container yet): a no-op, which says it reached nothing
    assert backend.sandbox.kill(run_id) is False
    assert backend.sandbox.stop(run_id, 1) is False


def test_reap_kills_and_removes_a_runs_containers(backend: Backend) -> None:
    run_id, _ = backend.start(UNTIL_STOPPED)
    assert backend.sandbox.reap(run_id) == 1  # as for a run whose owner died (its follower may fail)
    backend.join()
    assert backend.sandbox.stats(run_id) is None
    assert backend.sandbox.reap(run_id) == 0


def test_labelled_runs_lists_the_workspaces_containers(backend: Backend) -> None:
    run_id, _ = backend.start(UNTIL_STOPPED)
    assert backend.sandbox.labelled_runs(str(backend.workspace)) == [run_id]
    assert backend.sandbox.labelled_runs(str(backend.workspace / "other")) == []
    backend.sandbox.kill(run_id)
    backend.join()
    assert backend.sandbox.labelled_runs(str(backend.workspace)) == []


def test_stats_while_running_and_none_after(backend: Backend) -> None:
    assert backend.sandbox.stats(new_id()) is None
    run_id, _ = backend.start(UNTIL_STOPPED)
    sample = backend.sandbox.stats(run_id)
    assert sample is not None and set(sample) == {"cpu_pct", "mem_bytes", "mem_max_bytes", "pids"}
    assert all(isinstance(v, float) for v in sample.values())
    if backend.fake is None:  # the figures themselves: only an engine measures them
        assert sample["pids"] >= 2 and sample["mem_bytes"] > 0
    backend.sandbox.kill(run_id)
    backend.join()
    assert backend.sandbox.stats(run_id) is None


def test_attach_follows_a_running_container_to_its_end(backend: Backend) -> None:
    assert backend.sandbox.attach(new_id(), Limits.model_validate({})) is None  # no container
    run_id, _ = backend.start(UNTIL_STOPPED)
    # another process's sandbox takes over (the fake cannot be two processes: the same one attaches)
    other = backend.sandbox if backend.fake is not None else DockerSandbox()
    attached: dict[str, ExitInfo | None] = {}
    t = threading.Thread(target=lambda: attached.setdefault("info", other.attach(run_id, Limits.model_validate({}))))
    t.start()
    time.sleep(1)  # attached and waiting
    assert t.is_alive(), "attach returned while the container was running"
    other.kill(run_id)
    t.join(30)
    backend.join()  # the first follower may fail once its container is removed under it
    info = attached["info"]
    assert info is not None and (info.stopped, info.exit_code) == ("kill", 137)
    assert other.attach(run_id, Limits.model_validate({})) is None  # removed at the end
