"""The launcher: run processes forked from a warm process behave as freshly started ones."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airlockd.runs import carrier
from airlockd.runs.launcher import Launcher, argv_for


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AIRLOCK_STATE_DIR", str(tmp_path / "state"))
    w = tmp_path / "ws"
    w.mkdir()
    return w


async def _run(launcher: Launcher, argv: list[str], stdin: bytes = b"") -> tuple[int, bytes, bytes, int]:
    proc = await launcher.spawn(argv)
    assert proc is not None
    proc.stdin.write(stdin)
    proc.stdin.close()
    out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
    return await proc.wait(), out, err, proc.pid


def test_forked_processes_answer_like_started_ones(ws: Path) -> None:
    """A forked run process fails as `python -m airlockd.runs.carrier` started afresh does."""
    argv = argv_for(ws, "nope")
    started = subprocess.run(
        [sys.executable, "-m", carrier.MODULE, *argv], capture_output=True, input=b"[]", timeout=60
    )
    assert started.returncode == 1 and b"no run 'nope'" in started.stderr and started.stdout == b""

    async def main() -> None:
        launcher = Launcher()
        await launcher.start(ws)
        try:
            code, out, err, pid = await _run(launcher, argv, b"[]")
            assert (code, out) == (started.returncode, started.stdout) and b"no run 'nope'" in err
            assert pid not in (0, os.getpid(), launcher.proc.pid if launcher.proc else 0)
            # several at once: each its own process with its own pipes
            many = await asyncio.gather(*(_run(launcher, argv, b"[]") for _ in range(4)))
            assert [m[0] for m in many] == [1] * 4 and len({m[3] for m in many}) == 4
        finally:
            await launcher.stop()
        assert launcher.proc is not None and launcher.proc.returncode == 0  # it ended with its socket
        assert await launcher.spawn(argv) is None  # the caller starts its own

    asyncio.run(main())


def test_stdin_reaches_the_forked_process(ws: Path) -> None:
    """`--values-on-stdin` reads what the daemon wrote before anything else: a run that does not
    exist fails after the values were read, with the usual error."""

    async def main() -> None:
        launcher = Launcher()
        await launcher.start(ws)
        try:
            argv = argv_for(ws, "r0")
            code, _out, err, _ = await _run(launcher, argv, b'["a-secret-value"]')
            assert code != 0 and b"no run 'r0'" in err
            code, _, err, _ = await _run(launcher, argv, b"not json")
            assert code != 0 and (b"JSONDecodeError" in err or b"Expecting value" in err)
        finally:
            await launcher.stop()

    asyncio.run(main())


def test_a_dead_launcher_is_reported_not_waited_for(ws: Path) -> None:
    async def main() -> None:
        launcher = Launcher()
        await launcher.start(ws)
        assert launcher.proc is not None
        launcher.proc.kill()
        await launcher.proc.wait()
        for _ in range(100):  # its socket closes with it
            if not launcher.alive:
                break
            await asyncio.sleep(0.01)
        assert await launcher.spawn(argv_for(ws, "r0")) is None
        await launcher.stop()

    asyncio.run(main())


def test_a_run_process_that_said_all_lets_its_reader_go_on_before_it_ends() -> None:
    """The daemon tells its clients a run is done when the run's event stream ends: that is when
    the process has said all (its holder is let go of after), not when it exits. The standard
    streams never close their descriptor, so closing `sys.stdout` alone would not end the
    stream; a child started after (which inherits descriptor 1) does not hold it open either."""
    prog = (
        "import os, subprocess, sys, time\n"
        "from airlockd.runs.carrier import _said_all\n"
        "print('last word', flush=True)\n"
        "_said_all(sys.stdout)\n"
        "os.write(1, b'never read')\n"
        "child = subprocess.Popen(['sleep', '30'])\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE, start_new_session=True)
    try:
        t0 = time.monotonic()
        out = proc.stdout.read() if proc.stdout is not None else b""  # to the stream's end
        assert out == b"last word\n" and time.monotonic() - t0 < 20
        assert proc.poll() is None  # still there, letting go of what it holds
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # and its child
        proc.wait()


def test_a_run_process_reads_what_the_daemon_learned_up_to_its_word_to_stage() -> None:
    """The daemon's lines after the first (what it learned while it prepared) are learned, up to
    READY; an input that ends without the word says the daemon left, so the process learns the
    values itself (carrier.carry)."""
    import io

    from airlockd.redact import Redactor

    red = Redactor()
    said = io.StringIO('{"values": ["s3cr3t-value-one"], "in_names": []}\n' + carrier.READY + "\nnever read\n")
    assert carrier.until_ready(said, red.restore)
    assert "s3cr3t-value-one" not in red.text("x s3cr3t-value-one y") and said.readline() == "never read\n"
    cut = Redactor()
    assert not carrier.until_ready(io.StringIO('["s3cr3t-value-two"]\n'), cut.restore)
    assert "s3cr3t-value-two" not in cut.text("s3cr3t-value-two")
