"""DockerSandbox against the real engine: isolation, limits, stop / kill, and no leftovers."""

from __future__ import annotations

import ipaddress
import os
import socket
import textwrap
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airlockd.errors import EngineError, UsageError
from airlockd.policy import Limits
from airlockd.sandbox import ContainerSpec, ExitInfo, Sandbox
from airlockd.sandbox.docker import DockerSandbox
from airlockd.sandbox.image import apt_mirror, ensure_image

pytestmark = pytest.mark.docker

AGENT_UID = 1000
DEFAULT_LIMITS = Limits.model_validate({})


@pytest.fixture(scope="module")
def client() -> Any:
    import docker

    return docker.from_env()


@pytest.fixture(scope="module")
def image(client: Any) -> str:
    return ensure_image(client)


@pytest.fixture(scope="module")
def sandbox(client: Any) -> DockerSandbox:
    return DockerSandbox(client)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("staged copy\n")
    if os.geteuid() == 0:
        for p in (ws, ws / "README.md"):
            os.chown(p, AGENT_UID, AGENT_UID)
    else:
        ws.chmod(0o777)
    return ws


@pytest.fixture
def run(
    sandbox: DockerSandbox, image: str, workspace: Path, client: Any, runtime: str
) -> Iterator[Callable[..., ExitInfo]]:
    """Run argv in a fresh container under `runtime` (each test runs under runc and runsc:
    conftest.py); afterwards, no container of that run may be left."""
    run_ids: list[str] = []

    def _run(
        argv: list[str],
        *,
        on_output: Callable[[bytes], None] | None = None,
        run_id: str | None = None,
        stdin_file: Path | None = None,
        **limits: Any,
    ) -> ExitInfo:
        run_id = run_id or f"t-{uuid.uuid4().hex[:12]}"
        run_ids.append(run_id)
        spec = ContainerSpec(
            run_id=run_id,
            image=image,
            argv=argv,
            workspace=workspace,
            limits=Limits.model_validate({"wall_time_s": 30, **limits}),
            stdin_file=stdin_file,
            runtime=runtime,
        )
        info = sandbox.run(spec, on_output=on_output)
        assert info.effective["runtime"] == runtime, info.effective
        return info

    yield _run
    for run_id in run_ids:
        left = client.containers.list(all=True, filters={"label": f"airlockd.run={run_id}"})
        assert left == [], f"container(s) left behind for {run_id}: {left}"


def sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", textwrap.dedent(script)]


def py(script: str) -> list[str]:
    return ["python3", "-c", textwrap.dedent(script)]


def lines(info: ExitInfo) -> list[str]:
    return info.output_tail.decode().splitlines()


def test_is_a_sandbox(sandbox: DockerSandbox) -> None:
    assert isinstance(sandbox, Sandbox)
    sandbox.ping()


def test_agent_writes_workspace_as_uid_1000(run: Callable[..., ExitInfo], workspace: Path) -> None:
    info = run(sh("id -u; id -g; pwd; cat README.md; echo made > /workspace/new.txt"))
    assert info.exit_code == 0, info.output_tail
    assert lines(info) == ["1000", "1000", "/workspace", "staged copy"]
    made = workspace / "new.txt"
    assert made.read_text() == "made\n"
    assert made.stat().st_uid == AGENT_UID


def test_root_filesystem_is_read_only(run: Callable[..., ExitInfo]) -> None:
    info = run(
        sh("""
        for p in /etc/airlock /usr/local/bin/x /airlock /var/tmp/x; do
          if touch "$p" 2>/dev/null; then echo "WROTE $p"; else echo "ro $p"; fi
        done
        grep ' / ' /proc/mounts | grep -q '[ ,]ro[ ,]' && echo root-mounted-ro
        """)
    )
    assert info.exit_code == 0
    assert not [x for x in lines(info) if x.startswith("WROTE")], info.output_tail
    assert "root-mounted-ro" in lines(info)
    assert info.effective["read_only_root"] is True


def test_tmp_is_a_bounded_tmpfs_and_home_lives_there(run: Callable[..., ExitInfo]) -> None:
    info = run(
        sh("""
        grep ' /tmp ' /proc/mounts | cut -d' ' -f3
        echo "HOME=$HOME"
        echo hi > "$HOME/.agentrc" && echo home-writable
        dd if=/dev/zero of=/tmp/fill bs=1M count=32 2>&1 | grep -o 'No space left on device'
        du -m /tmp/fill | cut -f1
        """),
        tmpfs_mb=8,
    )
    out = lines(info)
    assert out[:3] == ["tmpfs", "HOME=/tmp/home", "home-writable"]
    assert out[3] == "No space left on device"
    assert int(out[4]) <= 8
    assert info.effective["tmpfs"] == {"/tmp": "size=8m,mode=1777"}


def test_no_privileges(run: Callable[..., ExitInfo], runtime: str) -> None:
    # the no_new_privs bit by prctl(PR_GET_NO_NEW_PRIVS): gVisor's /proc/self/status has no line for it
    nnp = "python3 -c 'import ctypes; print(\"NoNewPrivs:\\t%d\" % ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'"
    info = run(sh(f"id -u; grep -E '^(CapEff|CapPrm|CapBnd):' /proc/self/status; {nnp}"))
    status = dict(line.split(":\t") for line in lines(info)[1:])
    assert lines(info)[0] == "1000"
    assert int(status["CapEff"], 16) == 0
    assert int(status["CapPrm"], 16) == 0
    assert int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"] == "1"
    eff = info.effective
    # under runsc, airlockd's own seccomp profile (sandbox/seccomp.py); under runc, the engine's default
    profile = [] if runtime == "runc" else ["seccomp=airlockd-gvisor"]
    assert (eff["cap_drop"], eff["security_opt"], eff["user"]) == (
        ["ALL"],
        ["no-new-privileges", *profile],
        "1000:1000",
    )
    assert eff["privileged"] is False and eff["init"] is True


@pytest.fixture
def host_server() -> Iterator[tuple[int, list[str]]]:
    """A TCP server on all the host's addresses (loopback included); records who connects."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", 0))
    srv.listen()
    srv.settimeout(0.2)
    seen: list[str] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, addr = srv.accept()
            except TimeoutError:
                continue
            seen.append(addr[0])
            conn.close()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    # Sanity: the server answers on the host's loopback.
    socket.create_connection(("127.0.0.1", srv.getsockname()[1]), timeout=2).close()
    time.sleep(0.3)
    seen.clear()
    yield srv.getsockname()[1], seen
    stop.set()
    t.join()
    srv.close()


def test_network_is_loopback_only(
    run: Callable[..., ExitInfo], host_server: tuple[int, list[str]], client: Any
) -> None:
    port, seen = host_server
    subnet = client.networks.get("bridge").attrs["IPAM"]["Config"][0]["Subnet"]
    bridge_gateway = str(next(ipaddress.ip_network(subnet).hosts()))
    # A name this host resolves (its own apt mirror), so a failure inside means no DNS there.
    mirror_host = urllib.parse.urlparse(apt_mirror("bookworm")[0]).hostname or "localhost"
    try:
        socket.getaddrinfo(mirror_host, 80)
        host_resolves = True
    except OSError:
        host_resolves = False
    info = run(
        py(f"""
        import os, socket
        print("ifaces", sorted(os.listdir("/sys/class/net")))
        for host in ("127.0.0.1", "{bridge_gateway}"):
            try:
                socket.create_connection((host, {port}), timeout=3).close()
                print("CONNECTED", host)
            except OSError as exc:
                print("blocked", host, type(exc).__name__)
        try:
            socket.getaddrinfo("{mirror_host}", 80)
            print("RESOLVED")
        except OSError as exc:
            print("no-dns", type(exc).__name__)
        """)
    )
    out = lines(info)
    assert info.exit_code == 0, info.output_tail
    assert out[0] == "ifaces ['lo']"
    assert out[1].startswith("blocked 127.0.0.1 ConnectionRefusedError")
    assert out[2].startswith(f"blocked {bridge_gateway}")
    assert out[3].startswith("no-dns")
    assert seen == []
    assert info.effective["network_mode"] == "none"
    if not host_resolves:
        pytest.skip("the host cannot resolve its own mirror either: the DNS check proved little")


def test_stdin_file_is_the_agents_standard_input(run: Callable[..., ExitInfo], tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("line one\nline two: $HOME `x` 'q'\n")
    info = run(["cat"], stdin_file=prompt)
    assert info.exit_code == 0
    assert info.output_tail.decode() == prompt.read_text()
    # Without a stdin file, standard input is empty: a reader does not hang.
    info = run(["cat"], wall_time_s=10)
    assert (info.exit_code, info.timed_out, info.output_tail) == (0, False, b"")


def test_wall_time_kills_the_run(run: Callable[..., ExitInfo]) -> None:
    info = run(["sleep", "100"], wall_time_s=2)
    assert info.timed_out is True
    assert info.exit_code == 137
    assert 2 <= info.duration_s < 10
    assert info.limit_hit == "wall_time"


def test_memory_hog_is_oom_killed(run: Callable[..., ExitInfo], runtime: str) -> None:
    info = run(py("b = bytearray(512 << 20)\nprint('survived')"), memory_mb=64)
    # the run ends over its memory limit by the engine's word or the kernel's counter (read while
    # it ran): under gVisor the engine's flag comes from the sandbox's shim, and a loaded machine
    # has seen it arrive after the exit (CI), so either source must say it, as the run's end does
    assert info.limit_hit == "memory", (info.oom_killed, info.counters)
    if runtime == "runc":
        assert info.oom_killed is True, info
    assert info.exit_code == 137
    assert b"survived" not in info.output_tail
    assert info.effective["memory_bytes"] == info.effective["memory_swap_bytes"] == 64 << 20


def test_output_over_the_limit_ends_the_run(run: Callable[..., ExitInfo]) -> None:
    delivered: list[bytes] = []
    info = run(["yes"], output_bytes=64 * 1024, on_output=delivered.append)
    assert info.output_limited is True
    assert info.limit_hit == "output"
    assert info.output_bytes > 64 * 1024
    assert sum(map(len, delivered)) == 64 * 1024  # nothing past the limit reaches the caller
    assert len(info.output_tail) == 64 * 1024
    assert set(info.output_tail.split(b"\n")[:-1]) == {b"y"}
    assert info.duration_s < 10


def _started(
    sandbox: DockerSandbox, run: Callable[..., ExitInfo], argv: list[str], run_id: str
) -> tuple[threading.Thread, dict[str, ExitInfo]]:
    """Start `argv` on a thread and return once it has printed 'ready'."""
    ready = threading.Event()
    result: dict[str, ExitInfo] = {}

    def on_output(chunk: bytes) -> None:
        if b"ready" in chunk:
            ready.set()

    t = threading.Thread(target=lambda: result.setdefault("info", run(argv, run_id=run_id, on_output=on_output)))
    t.start()
    assert ready.wait(20), "the agent never said ready"
    return t, result


STUBBORN = py("""
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(100)
""")


def test_stop_kills_a_process_that_ignores_sigterm_after_the_grace(
    sandbox: DockerSandbox, run: Callable[..., ExitInfo]
) -> None:
    run_id = f"t-{uuid.uuid4().hex[:12]}"
    t, result = _started(sandbox, run, STUBBORN, run_id)
    t0 = time.monotonic()
    sandbox.stop(run_id, grace_s=2)
    took = time.monotonic() - t0
    t.join(20)
    assert 1.8 <= took < 5, took
    info = result["info"]
    assert (info.stopped, info.exit_code, info.timed_out) == ("stop", 137, False)


def test_stop_reaches_the_agent_through_docker_init(sandbox: DockerSandbox, run: Callable[..., ExitInfo]) -> None:
    run_id = f"t-{uuid.uuid4().hex[:12]}"
    t, result = _started(sandbox, run, sh("echo ready; exec sleep 100"), run_id)
    t0 = time.monotonic()
    sandbox.stop(run_id, grace_s=10)
    took = time.monotonic() - t0
    t.join(20)
    assert took < 8, f"SIGTERM was not forwarded to the agent (took {took:.1f} s; the grace is 10 s)"
    assert (result["info"].stopped, result["info"].exit_code) == ("stop", 143)


def test_kill_and_stats(sandbox: DockerSandbox, run: Callable[..., ExitInfo], runtime: str) -> None:
    run_id = f"t-{uuid.uuid4().hex[:12]}"
    busy = py("print('ready', flush=True)\nwhile True: pass")
    t, result = _started(sandbox, run, busy, run_id)
    sample = sandbox.stats(run_id)
    assert sample is not None
    if runtime == "runc":
        assert set(sample) == {"cpu_pct", "mem_bytes", "mem_max_bytes", "pids"}
        assert sample["pids"] >= 2  # docker-init and python
    else:  # the host's count is gVisor's own threads: never reported as the agent's processes
        assert set(sample) == {"cpu_pct", "mem_bytes", "mem_max_bytes"}
    assert sample["mem_bytes"] > 0
    assert sample["cpu_pct"] > 20
    t0 = time.monotonic()
    sandbox.kill(run_id)
    t.join(20)
    assert time.monotonic() - t0 < 8  # generous: a busy CI machine; the point is no grace period
    assert (result["info"].stopped, result["info"].exit_code) == ("kill", 137)
    assert sandbox.stats(run_id) is None


def test_kill_before_start_means_never_started(
    sandbox: DockerSandbox, run: Callable[..., ExitInfo], workspace: Path
) -> None:
    run_id = f"t-{uuid.uuid4().hex[:12]}"
    sandbox.kill(run_id)
    info = run(sh("touch /workspace/ran"), run_id=run_id)
    assert (info.stopped, info.exit_code) == ("kill", None)
    assert not (workspace / "ran").exists()


def test_engine_refusal_is_an_engine_error_and_leaves_nothing(
    sandbox: DockerSandbox, image: str, workspace: Path, client: Any
) -> None:
    run_id = f"t-{uuid.uuid4().hex[:12]}"
    spec = ContainerSpec(run_id, image, ["true"], workspace, DEFAULT_LIMITS, user="no-such-user")
    with pytest.raises(EngineError) as err:
        sandbox.run(spec)
    assert "no-such-user" in str(err.value) and "fix:" in str(err.value)
    assert client.containers.list(all=True, filters={"label": f"airlockd.run={run_id}"}) == []


def test_only_network_none_is_accepted(sandbox: DockerSandbox, image: str, workspace: Path) -> None:
    spec = ContainerSpec("t-net", image, ["true"], workspace, DEFAULT_LIMITS, network="bridge")
    with pytest.raises(UsageError):
        sandbox.run(spec)


def test_missing_image_says_how_to_build_it(sandbox: DockerSandbox, workspace: Path) -> None:
    spec = ContainerSpec("t-img", "airlockd-runtime:does-not-exist", ["true"], workspace, DEFAULT_LIMITS)
    with pytest.raises(EngineError, match="airlockd runtime build"):
        sandbox.run(spec)


def test_unreachable_engine_is_an_engine_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(EngineError, match="ensure-docker"):
        DockerSandbox(timeout=2).ping()


def test_a_namespace_to_join_that_has_a_network_is_refused_before_the_start(
    sandbox: DockerSandbox, image: str, workspace: Path, client: Any
) -> None:
    """`network_of` names the run's holder, which has no network; a container of that name with
    a network (a look-alike, or the engine's default) is read back from the engine after the
    creation, and the agent's container is removed without ever starting."""
    other = client.containers.run(image, ["sleep", "60"], detach=True, name=f"airlockd-test-net-{uuid.uuid4().hex[:8]}")
    run_id = f"t-{uuid.uuid4().hex[:12]}"
    try:
        assert other.attrs["HostConfig"]["NetworkMode"] != "none"  # the first engine's default: its bridge
        spec = ContainerSpec(
            run_id=run_id, image=image, argv=["touch", "ran"], workspace=workspace,
            limits=Limits.model_validate({"wall_time_s": 30}), network_of=other.name,
        )  # fmt: skip
        with pytest.raises(EngineError, match="not none: it is not started"):
            sandbox.run(spec)
        assert not (workspace / "ran").exists()
        assert client.containers.list(all=True, filters={"label": f"airlockd.run={run_id}"}) == []
    finally:
        other.remove(force=True)
