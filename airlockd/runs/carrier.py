"""The process that carries one run from admitted to its end: `python -m airlockd.runs.carrier`.

The daemon starts one per run (forked by the launcher, or as a plain process when there is none);
the CLI's internal `_execute` (a run started without `--wait`) and a re-attached run call the same
`carry`. It is the lifecycle's own entry point, so nothing below the doors ever imports a door to
start a run.

With `events`, every Service event and progress step is one JSON line on stdout (the daemon relays
them to the editor) and nothing else is written there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TextIO

from airlockd.errors import EXIT_LIMIT, EXIT_USAGE, AirlockError
from airlockd.protocol import ProgressEvent, RunEvent
from airlockd.records import RunRecord, RunState
from airlockd.redact import install_log_redaction, scrub
from airlockd.runs.service import Service

MODULE = "airlockd.runs.carrier"  # `python -m MODULE ARGV`: a run process without the launcher
READY = '"ready"'  # the daemon's last line on a run process's stdin: what it prepares is ready


def argv_for(workspace: Path, run_id: str, *, events: bool = False, values_on_stdin: bool = False) -> list[str]:
    """The arguments `main` takes to carry `run_id` (the same forked or started)."""
    flags = ["--events"] * events + ["--values-on-stdin"] * values_on_stdin
    return ["--workspace", str(workspace), *flags, run_id]


def carry(
    workspace: Path, run_id: str, *, resume: bool = False, events: bool = False, values_on_stdin: bool = False
) -> RunRecord | None:
    """Carry (or, with `resume`, re-attach to) one run until it is proposed or ends; the final
    record, or None with `events` (then the events are the report). `values_on_stdin`: the
    withheld values the starting daemon has learned, as JSON lines on stdin (Redactor.export),
    stand in for a walk of the workspace, and its last line, READY, is its word to stage."""
    if values_on_stdin:
        # started by a daemon, which recovered at its start and reconciles dead runs as it goes.
        # Its first line: what it has learned to mask. This process makes itself ready and claims
        # the run on it while the daemon prepares the run's view and spare holder; then a line with
        # what the daemon learned meanwhile and READY, its word to stage (`ready`). Nothing at all:
        # the daemon was gone before it said anything, and this process learns the values itself.
        svc = Service(workspace, actor="cli", known_values=_known(sys.stdin.readline()))
    else:
        svc = Service(workspace, actor="cli").recover()

    def ready() -> None:
        if values_on_stdin and not until_ready(sys.stdin, svc.redactor.restore):
            # its input ended before the word: the daemon left (or was cancelled) while it
            # prepared, maybe after it learned values this process was never told: learned here
            svc.learn_withheld_again()

    if resume:
        ready()  # nothing is prepared for a run re-attached to: all the daemon knows, first
    if not events:
        try:
            return svc.resume(run_id) if resume else svc.execute(run_id, ready=ready)
        finally:
            svc.close()
    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but event lines may reach the daemon's pipe
    heard = [True]

    def send(event: RunEvent) -> None:
        if not heard[0]:
            return
        try:
            out.write(event.line())
            out.flush()
        except (BrokenPipeError, ValueError):  # the daemon left (handed over): the run goes on
            heard[0] = False

    def progress(stage: str, message: str) -> None:
        send(RunEvent(ProgressEvent(type="progress", stage=RunState(stage), message=svc.redactor.text(message))))

    svc.subscribe(lambda event, payload: send(RunEvent.of_service(event, payload)))
    try:
        svc.resume(run_id, progress) if resume else svc.execute(run_id, progress, ready=ready)
    finally:
        heard[0] = False
        _said_all(out)  # the daemon tells its clients now, while the holder is let go of
        svc.close()
    return None


def until_ready(stream: Iterable[str], restore: Callable[[dict[str, list[str]] | list[str]], None]) -> bool:
    """Read the daemon's lines up to its word READY, each what it learned to mask (`restore`d);
    False when the input ends without the word."""
    for line in stream:
        if line.strip() == READY:
            return True
        restore(_known(line) or [])
    return False


def _known(line: str) -> dict[str, list[str]] | list[str] | None:
    """One line of what the daemon has learned to mask (`Redactor.export`); None for none."""
    if not line.strip():
        return None
    known = json.loads(line)
    return known if isinstance(known, dict | list) else []


def _said_all(out: TextIO) -> None:
    """End the event stream: the pipe's write end is let go of here, not only the Python file
    (the standard streams never close their descriptor), so the daemon reads its end now rather
    than when this process exits. Descriptor 1 then points at /dev/null, so nothing written there
    later, by this process or a child, reaches the pipe or a file opened meanwhile."""
    with contextlib.suppress(OSError, ValueError):
        out.flush()
    with contextlib.suppress(OSError, ValueError):
        fd = out.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
    with contextlib.suppress(OSError, ValueError):
        out.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Exit codes as the command line's: 0, 1 error, 2 usage, 4 the run ended badly."""
    p = argparse.ArgumentParser(prog="python -m " + MODULE, description="carry one admitted run")
    p.add_argument("--workspace", required=True)
    p.add_argument("--resume", action="store_true", help="re-attach to the run's container")
    p.add_argument("--events", action="store_true", help="report events as JSON lines on stdout")
    p.add_argument("--values-on-stdin", action="store_true", help="learned withheld values, JSON on stdin")
    p.add_argument("run")
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) if exc.code in (0, None) else EXIT_USAGE
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="airlockd: %(levelname)s %(name)s: %(message)s"
    )
    install_log_redaction()
    try:
        rec = carry(
            Path(args.workspace),
            args.run,
            resume=args.resume,
            events=args.events,
            values_on_stdin=args.values_on_stdin,
        )
    except AirlockError as exc:
        print(f"airlockd: {scrub(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("airlockd: interrupted", file=sys.stderr)
        return 130
    return EXIT_LIMIT if rec is not None and rec.state.value in ("limit_exceeded", "killed", "stopped") else 0


if __name__ == "__main__":
    sys.exit(main())
