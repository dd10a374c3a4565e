"""The commands a daemon decides when one serves the workspace (`run` and the decisions): sent to
it over its control socket (`lsp/client.py`), or, when none serves (or with `--no-daemon`), done in
this process by the same service. Imports little at the top: going to a warm daemon is the fast
path; acting alone imports the service when it needs it. See docs/daemon.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airlockd.cli.show import RunDoc, print_run, run_doc, run_json
from airlockd.cli.streams import FilteredText
from airlockd.errors import AirlockError, UsageError, from_json
from airlockd.interpreter import module_command

if TYPE_CHECKING:
    from airlockd.lsp.client import Daemon


def _state_root(args: argparse.Namespace) -> Path:
    from airlockd.state import StateDir

    return StateDir.for_workspace(Path(args.workspace)).root


def _daemon(args: argparse.Namespace, *, start: bool = False) -> Daemon | None:
    """The daemon serving the workspace, to be its client; with `start`, one started in the
    background when none does. None: act alone (`--no-daemon`, `AIRLOCK_DAEMON=off`)."""
    from airlockd.lsp import client

    if args.no_daemon or client.daemon_policy() == "off":
        return None
    root = _state_root(args)
    daemon = client.Daemon.connect(root)
    if daemon is not None and start:
        daemon = _on_this_engine(daemon, root)
    for _ in range(2) if daemon is None and start else ():
        try:
            daemon = client.start_background(Path(args.workspace).resolve(), root)
        except client.DaemonGone as exc:
            raise AirlockError(str(exc), hint="run with --no-daemon to act without one") from None
        except client.RemoteError as exc:  # it could not start: say why, as it said it
            raise from_json(exc.message, exc.data) from None
        # one that took the workspace first (an editor's opening it, another command's) may run
        # agents elsewhere: the same check (a background one for another engine leaves: again)
        daemon = _on_this_engine(daemon, root)
        if daemon is not None:
            break
    return daemon


def _on_this_engine(daemon: Daemon, root: Path) -> Daemon | None:
    """`daemon`, when its agents run on the engine this command's DOCKER_HOST names. A background
    daemon on another engine is asked to leave (None: start one here); an editor's is an error."""
    from airlockd.enginehost import describe, engine_host
    from airlockd.lsp import client

    doc = client.info(root) or {}
    theirs, ours = doc.get("engine"), engine_host()
    if theirs is None or theirs == ours:  # (a daemon older than this field: as before)
        return daemon
    if doc.get("mode") != "background":
        daemon.close()
        raise UsageError(
            f"the editor's daemon serving this workspace (pid {doc.get('pid')}) runs agents on {describe(theirs)},"
            f" but this command's DOCKER_HOST names {describe(ours)}",
            hint="run it with the editor's DOCKER_HOST, or with --no-daemon to run it here on yours",
        )
    try:
        daemon.request("airlock/handover")  # its runs go on in their own processes
    except (client.DaemonGone, client.RemoteError, OSError):
        pass
    finally:
        daemon.close()
    client.wait_gone(root)
    return None


def _ask(daemon: Daemon, command: str, arguments: dict[str, Any]) -> Any:
    """One command of the daemon; its errors raised as the AirlockErrors they were there."""
    from airlockd.lsp.client import DaemonGone, RemoteError

    try:
        return daemon.command(command, arguments)
    except RemoteError as exc:
        raise from_json(exc.message, exc.data) from None
    except DaemonGone as exc:
        raise AirlockError(
            f"the daemon serving this workspace went away: {exc}", hint="run the command again"
        ) from None


def _hunks(args: argparse.Namespace) -> dict[str, list[str]] | None:
    """`--hunk PATH:ID` (repeatable) as {path: [id, ...]}."""
    out: dict[str, list[str]] = {}
    for spec in args.hunk or ():
        path, sep, hid = spec.rpartition(":")
        if not sep or not path or not hid:
            raise UsageError(f"--hunk {spec!r}: expected PATH:ID", hint="`airlockd show RUN --json` lists the hunk ids")
        out.setdefault(path.strip("/"), []).append(hid)
    return out or None


def _shown(text: str, dropped: int, args: argparse.Namespace) -> None:
    """What the agent printed (`run --follow`): on stdout, on stderr with --json (stdout is the
    run's document then)."""
    out = sys.stderr if args.json else sys.stdout
    if dropped:
        out.write(f"[… {dropped} bytes of the agent's output not shown: it printed faster than it is followed]\n")
    out.write(text)
    out.flush()


def cmd_run(args: argparse.Namespace) -> Any:
    prompt = args.prompt if args.prompt != "-" else sys.stdin.read()
    args.wait = args.wait or args.follow
    daemon = _daemon(args, start=True)
    if daemon is not None:
        return _run_through(daemon, args, prompt)
    svc = service(args, recover=True)
    svc.sweep(folders=False)  # the folders at the daemon's start and at each gc
    rec = svc.submit(args.agent, prompt, mode=args.mode, follow_up=args.follow_up)
    if args.wait:

        def progress(stage: str, msg: str) -> None:
            if not args.json:
                print(f"[{stage}] {msg}", file=sys.stderr)

        if args.follow:
            svc.subscribe(
                lambda event, payload: (
                    _shown(payload["text"], payload.get("dropped", 0), args) if event == "runOutput" else None
                )
            )
        rec = svc.execute(rec.id, progress)
    else:  # the run continues in its own process; `airlockd show RUN` follows it
        import subprocess

        subprocess.Popen(
            module_command("airlockd", "--workspace", str(svc.workspace), "_execute", rec.id),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(svc.state.run_dir(rec.id) / "daemon.log", "ab"),  # noqa: SIM115
        )
    return run_doc(rec)


PROGRESS, RUN_DONE, RUN_OUTPUT = "airlock/progress", "airlock/runDone", "airlock/runOutput"  # lsp/runs.py, status.py


def _run_through(daemon: Daemon, args: argparse.Namespace, prompt: str) -> RunDoc:
    """`run` by the daemon: it admits and carries the run; with --wait, follow it to its end."""
    from airlockd.lsp.client import DaemonGone

    if args.wait:
        daemon.subscribe(PROGRESS, RUN_DONE, *([RUN_OUTPUT] if args.follow else []))
    task: dict[str, Any] = {"agent": args.agent, "prompt": prompt}
    if args.mode:
        task["mode"] = args.mode
    if args.follow_up:
        task["followUp"] = args.follow_up
    run_id = _ask(daemon, "airlock.runTask", task)["runId"]
    if args.wait:
        try:
            while True:
                note = daemon.wait_for(lambda n: (n.get("params") or {}).get("runId") == run_id)
                if note["method"] == RUN_DONE:
                    break
                if note["method"] == RUN_OUTPUT:
                    _shown(str(note["params"].get("text", "")), int(note["params"].get("dropped") or 0), args)
                elif not args.json:
                    print(f"[{note['params']['stage']}] {note['params']['message']}", file=sys.stderr)
        except DaemonGone:  # it handed the workspace over: the run goes on; follow it in the store
            return _wait_in_store(args, run_id)
    return RunDoc(_ask(daemon, "airlock.getRun", {"runId": run_id}))


def _wait_in_store(args: argparse.Namespace, run_id: str) -> RunDoc:
    from airlockd.state import StateDir
    from airlockd.store import Store

    store = Store(StateDir.for_workspace(Path(args.workspace)))
    while (rec := store.get_run(run_id)).state.live:
        time.sleep(0.2)
    return run_doc(rec)


def _selection(args: argparse.Namespace) -> dict[str, Any]:
    chosen: dict[str, Any] = {"runId": args.run}
    if args.path:
        chosen["paths"] = list(args.path)
    if hunks := _hunks(args):
        chosen["hunks"] = hunks
    return chosen


def cmd_approve(args: argparse.Namespace) -> Any:
    daemon = _daemon(args)
    if daemon is not None:
        got = _ask(daemon, "airlock.approve", _selection(args))
        doc = _ask(daemon, "airlock.getRun", {"runId": args.run})
        doc.pop("timeline", None)
        applied, conflicts = got["applied"], got["conflicts"]
    else:
        result = service(args, recover=True).review.approve(args.run, args.path or None, hunks=_hunks(args))
        doc, applied, conflicts = run_json(result.run), result.applied, result.conflicts
    if args.json:
        return {"run": doc, "applied": applied, "conflicts": conflicts}
    from airlockd.names import display

    for p in applied:
        print(f"applied  {display(p)}")
    print_run(doc)
    return None


def cmd_reject(args: argparse.Namespace) -> Any:
    daemon = _daemon(args)
    if daemon is not None:
        _ask(daemon, "airlock.reject", _selection(args))
        return RunDoc(_ask(daemon, "airlock.getRun", {"runId": args.run}))
    return run_doc(service(args, recover=True).review.reject(args.run, args.path or None, hunks=_hunks(args)))


def cmd_undo(args: argparse.Namespace) -> Any:
    daemon = _daemon(args)
    if daemon is not None:
        _ask(daemon, "airlock.undo", {"runId": args.run})
        return RunDoc(_ask(daemon, "airlock.getRun", {"runId": args.run}))
    return run_doc(service(args, recover=True).review.undo(args.run))


def cmd_stop(args: argparse.Namespace) -> Any:
    """Stop or kill a run; by default returns once it has ended, with its final state."""
    kill = args.command == "kill"
    daemon = _daemon(args)
    if daemon is not None:
        verb = "airlock.killRun" if kill else "airlock.stopRun"
        _ask(daemon, verb, {"runId": args.run, "wait": not args.no_wait})
        return RunDoc(_ask(daemon, "airlock.getRun", {"runId": args.run}))
    return run_doc(service(args).stop(args.run, kill=kill, wait=not args.no_wait))


def cmd_release(args: argparse.Namespace) -> Any:
    daemon = _daemon(args)
    if daemon is not None:
        return _ask(daemon, "airlock.releaseAgent", {"agent": args.agent})
    return service(args).release(args.agent)


def service(args: argparse.Namespace, *, recover: bool = False) -> Any:
    """The workspace's Service; `recover` for commands that may write (a run, a decision):
    interrupted commits are finished and dead runs reconciled first. Reading commands never do."""
    from airlockd.runs.service import Service

    log_to_stderr(args)
    svc = Service(Path(args.workspace), actor="cli")
    mask_output()  # the service has learnt the withheld values: whatever is printed from here is masked
    return svc.recover() if recover else svc


class MaskedText(FilteredText):
    """A text stream whose every write passes the redactor first (`scrub`: the patterns and every
    value this process knows): for plain text, the last net `--json` output has in `_emit`."""

    def filter(self, s: str) -> str:
        from airlockd.redact import scrub

        return str(scrub(s))


def mask_output() -> None:
    """Mask what this process prints on stdout and stderr from now on (once). Only for a process
    that acts alone: a daemon's answers are masked by the daemon, and `serve --stdio` owns stdout."""
    if not isinstance(sys.stdout, MaskedText):
        sys.stdout = MaskedText(sys.stdout)
    if not isinstance(sys.stderr, MaskedText):
        sys.stderr = MaskedText(sys.stderr)


# -- commands ---------------------------------------------------------------------------------


def log_to_stderr(args: argparse.Namespace) -> None:
    """Log to stderr, every line masked with what this process knows (once)."""
    import logging

    from airlockd.redact import install_log_redaction

    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.DEBUG if args.verbose else logging.WARNING,
            stream=sys.stderr,
            format="airlockd: %(levelname)s %(name)s: %(message)s",
        )
    install_log_redaction()
