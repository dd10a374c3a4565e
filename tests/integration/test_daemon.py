"""The daemon the CLI starts when none serves the workspace: started by a run, reused by the next
command, left when idle, handed over to an editor's daemon; and its control socket, which only
this user reaches and which a malformed or oversized message does not hurt."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from airlockd.lsp.client import Daemon
from airlockd.state import StateDir

pytestmark = pytest.mark.docker

POLICY = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    [agents.bot.limits]
    wall_time_s = 60
    grace_s = 1
    """
)


@pytest.fixture
def ws(tmp_path: Path, _image: None) -> Path:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "policies.toml").write_text(POLICY)
    (ws / "a.txt").write_text("a\n")
    return ws


def cli(ws: Path, *argv: str, env: dict[str, str] | None = None, timeout: float = 180) -> tuple[int, Any, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "airlockd", "--workspace", str(ws), "--json", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "AIRLOCK_DAEMON": "auto", **(env or {})},
        timeout=timeout,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


def info(ws: Path) -> dict[str, Any] | None:
    path = StateDir.for_workspace(ws).root / "serve.json"
    return json.loads(path.read_text()) if path.exists() else None


def gone(pid: int, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_run_starts_a_background_daemon_that_later_commands_use(ws: Path) -> None:
    code, run, err = cli(ws, "run", "--agent", "bot", "--wait", "echo hi > hi.txt")
    assert code == 0 and run["state"] == "proposed", err
    first = info(ws)
    assert first is not None and first["mode"] == "background"
    code, run2, err = cli(ws, "run", "--agent", "bot", "--wait", "echo ho > ho.txt")
    assert code == 0 and run2["state"] == "proposed", err
    assert info(ws)["pid"] == first["pid"]  # type: ignore[index]  # the same daemon: its mirror is warm
    code, out, err = cli(ws, "approve", run["id"])
    assert code == 0 and out["applied"] == ["hi.txt"], err
    assert (ws / "hi.txt").read_text() == "hi\n"
    log = StateDir.for_workspace(ws).root / "daemon.log"
    assert "Traceback" not in log.read_text()
    # with it off, the CLI acts alone even though the daemon is there
    code, out, err = cli(ws, "reject", run2["id"], env={"AIRLOCK_DAEMON": "off"})
    assert code == 0 and out["state"] == "rejected", err


def test_the_background_daemon_leaves_when_idle(ws: Path) -> None:
    code, _, err = cli(ws, "run", "--agent", "bot", "--wait", "true", env={"AIRLOCK_DAEMON_IDLE_S": "1"})
    assert code == 0, err
    pid = info(ws)["pid"]  # type: ignore[index]
    assert gone(pid), "the idle daemon did not leave"
    root = StateDir.for_workspace(ws).root
    assert not (root / "serve.json").exists() and not (root / "control.sock").exists()
    code, _run, err = cli(ws, "run", "--agent", "bot", "--wait", "true")  # a new one starts
    assert code == 0 and info(ws)["pid"] != pid, err  # type: ignore[index]


def test_a_daemon_that_cannot_start_says_why(ws: Path) -> None:
    (ws / "policies.toml").write_text(POLICY + "\n[defaults]\nmdoe = 'auto'\n")
    code, out, err = cli(ws, "run", "--agent", "bot", "--wait", "true")
    assert code == 1 and out["error"] == "policy", (code, out, err)
    assert "defaults.mdoe" in out["message"]
    assert info(ws) is None


def test_an_editors_daemon_takes_over_and_the_run_in_flight_goes_on(ws: Path) -> None:
    code, run, err = cli(ws, "run", "--agent", "bot", "sleep 2; echo late > late.txt")
    assert code == 0 and run["state"] == "admitted", err
    background = info(ws)["pid"]  # type: ignore[index]
    editor = subprocess.Popen(
        [sys.executable, "-m", "airlockd", "--workspace", str(ws), "serve", "--stdio"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (info(ws) or {}).get("mode") != "stdio":
            time.sleep(0.05)
        assert (info(ws) or {}).get("pid") == editor.pid, "the editor's daemon did not take the workspace"
        assert gone(background)
        # the run the background daemon carried goes on in its own process, to its proposal
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            code, shown, err = cli(ws, "show", run["id"])
            if shown and shown["state"] not in ("admitted", "staging", "running", "inspecting"):
                break
            time.sleep(0.2)
        assert shown["state"] == "proposed", shown
        assert [f["path"] for f in shown["files"]] == ["late.txt"]
        # and the CLI now talks to the editor's daemon
        code, out, err = cli(ws, "approve", run["id"])
        assert code == 0 and out["applied"] == ["late.txt"], err
        assert (info(ws) or {}).get("pid") == editor.pid
    finally:
        editor.stdin.close()  # type: ignore[union-attr]
        editor.wait(30)
        editor.stdout.close()  # type: ignore[union-attr]
        editor.stderr.close()  # type: ignore[union-attr]


def _output(ws: Path, run_id: str) -> str:
    return (StateDir.for_workspace(ws).root / "runs" / run_id / "output.log").read_text()


def test_a_run_for_another_engine_is_never_served_by_a_daemon_on_this_one(ws: Path, podman_engine: str) -> None:
    """A daemon runs agents on the engine of its own DOCKER_HOST. A run whose DOCKER_HOST names
    another engine is not handed to it: a background daemon leaves and one for that engine serves;
    an editor's daemon is an error that says so, and nothing runs."""
    code, run, err = cli(ws, "run", "--agent", "bot", "--wait", "cat /proc/self/cgroup")
    assert code == 0 and run["state"] == "applied", err  # no changes
    first = info(ws)
    assert first is not None and first["engine"] == ""  # this machine's engine
    assert "libpod" not in _output(ws, run["id"])
    code, run2, err = cli(
        ws, "run", "--agent", "bot", "--wait", "cat /proc/self/cgroup", env={"DOCKER_HOST": podman_engine}
    )
    assert code == 0 and run2["state"] == "applied", err
    assert "libpod" in _output(ws, run2["id"])  # it ran on Podman
    second = info(ws)
    assert second is not None and second["engine"] == podman_engine and second["pid"] != first["pid"]
    assert gone(first["pid"])
    editor = subprocess.Popen(
        [sys.executable, "-m", "airlockd", "--workspace", str(ws), "serve", "--stdio"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != "DOCKER_HOST"},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (info(ws) or {}).get("mode") != "stdio":
            time.sleep(0.05)
        assert (info(ws) or {}).get("pid") == editor.pid
        code, out, err = cli(
            ws, "run", "--agent", "bot", "--wait", "echo no > no.txt", env={"DOCKER_HOST": podman_engine}
        )
        assert code == 2 and out["error"] == "usage", (code, out, err)
        assert podman_engine in out["message"] and "this machine's engine" in out["message"], out
        assert "--no-daemon" in out["hint"]
        code, runs, err = cli(ws, "runs")
        assert code == 0 and len(runs) == 2, runs  # nothing more was admitted
    finally:
        editor.stdin.close()  # type: ignore[union-attr]
        editor.wait(30)
        editor.stdout.close()  # type: ignore[union-attr]
        editor.stderr.close()  # type: ignore[union-attr]


def _raw(path: Path, payload: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(str(path))
        s.sendall(payload)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_the_control_socket_is_this_users_and_survives_bad_input(ws: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("another user knocking needs root to become that user: the pass as root runs this")
    code, _run, err = cli(ws, "run", "--agent", "bot", "--wait", "true")
    assert code == 0, err
    root = StateDir.for_workspace(ws).root
    sock = root / "control.sock"
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(root.stat().st_mode) & 0o077 == 0
    # a frame claiming 1 GiB is refused before a byte of it is read; garbage is a parse error
    out = _raw(sock, b"Content-Length: 1073741824\r\n\r\n{")
    assert b"oversized" in out and b"-32700" in out
    out = _raw(sock, b"Content-Length: 3\r\n\r\nxyz")
    assert b"-32700" in out
    # an unknown command and a bad argument are errors that name what is wrong
    daemon = Daemon.connect(root)
    assert daemon is not None
    with pytest.raises(Exception, match="unknown command"):
        daemon.command("airlock.nope", {})
    with pytest.raises(Exception, match="runId"):
        daemon.command("airlock.approve", {"runId": ""})
    assert daemon.request("airlock/hello")["mode"] == "background"
    daemon.close()
    # another user cannot reach it
    probe = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX)\n"
        "try:\n s.connect(sys.argv[1]); print('connected')\n"
        "except OSError as e: print('refused', e.errno)\n"
    )
    other = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", probe, str(sock)],
        capture_output=True,
        text=True,
    )
    assert "refused" in other.stdout, (other.stdout, other.stderr)
    code, out, err = cli(ws, "runs")  # and the daemon still serves
    assert code == 0 and len(out) == 1, err


def test_a_stop_that_comes_before_the_container_still_stops_it(ws: Path) -> None:
    """`stop --no-wait` from another process, sent the moment the run is recorded running (its
    container may not exist yet, so that process's one delivery may reach nothing): the process
    carrying the run carries the stop out itself; the run ends in seconds, not at its own end."""
    from airlockd.store import Store

    code, run, err = cli(ws, "run", "--agent", "bot", "sleep 30")
    assert code == 0, err
    store = Store(StateDir.for_workspace(ws))
    deadline = time.monotonic() + 60
    while store.get_run(run["id"]).state.value != "running" and time.monotonic() < deadline:
        time.sleep(0.005)
    t0 = time.monotonic()
    code, out, err = cli(ws, "--no-daemon", "stop", "--no-wait", run["id"])
    assert code in (0, 4), (code, out, err)
    while store.get_run(run["id"]).state.live and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    final = store.get_run(run["id"])
    assert final.state.value == "stopped" and final.stopped_by == "cli"
    assert time.monotonic() - t0 < 15, "the stop waited for the agent's own end"


def test_two_commands_that_start_a_daemon_at_once_share_one(ws: Path) -> None:
    """Two terminals, no daemon yet: both start one; the one that loses the workspace's lock says
    so on its pipe and its command talks to the winner. Both runs are proposed; one daemon serves."""
    argv = [sys.executable, "-m", "airlockd", "--workspace", str(ws), "--json", "run", "--agent", "bot", "--wait"]
    env = {**os.environ, "AIRLOCK_DAEMON": "auto"}
    procs = [
        subprocess.Popen([*argv, f"echo {n} > f{n}.txt"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        for n in (1, 2)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()
        assert json.loads(out)["state"] == "proposed"
    daemons = subprocess.run(
        ["pgrep", "-f", "--", f"--workspace {ws} serve --background"], capture_output=True, text=True
    )
    assert len(daemons.stdout.split()) == 1, daemons.stdout
    assert info(ws)["pid"] == int(daemons.stdout.split()[0])  # type: ignore[index]


def test_a_daemon_killed_outright_leaves_nothing_in_the_way(ws: Path) -> None:
    """SIGKILL leaves serve.json and a dead socket behind: the next command takes them for what
    they are (nobody answers) and starts a daemon of its own."""
    import signal

    code, _, err = cli(ws, "run", "--agent", "bot", "--wait", "true")
    assert code == 0, err
    dead = info(ws)["pid"]  # type: ignore[index]
    os.kill(dead, signal.SIGKILL)
    assert gone(dead)
    root = StateDir.for_workspace(ws).root
    assert (root / "control.sock").exists() and (root / "serve.json").exists()  # left as they were
    code, run, err = cli(ws, "run", "--agent", "bot", "--wait", "echo again > again.txt")
    assert code == 0 and run["state"] == "proposed", err
    assert info(ws)["pid"] != dead  # type: ignore[index]
    code, out, err = cli(ws, "approve", run["id"])
    assert code == 0 and out["applied"] == ["again.txt"], err
