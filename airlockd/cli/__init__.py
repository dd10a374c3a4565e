"""Command line: parses, calls the service, prints. Exit codes live in errors.py.

When a daemon serves the workspace (an editor's `airlockd serve`, or one the CLI started in the
background), the commands that decide or run go to it over its control socket (`lsp/client.py`): the
same code, with the same state, including the editor's unsaved buffers. Otherwise a decision acts
alone, in this process, and a run starts a background daemon that keeps the mirror warm for the
next one (`AIRLOCK_DAEMON=off` or `--no-daemon`: always alone). See docs/daemon.md.

This module imports little at the top: a command that goes to a warm daemon starts in
milliseconds; what acts alone imports the service when it needs it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airlockd import __version__
from airlockd.errors import EXIT_ERROR, EXIT_LIMIT, EXIT_USAGE, AirlockError, NotFoundError, UsageError, from_json

if TYPE_CHECKING:
    from airlockd.lsp.client import Daemon
    from airlockd.records import RunRecord

Handler = Callable[[argparse.Namespace], Any]
_ENDED_BADLY = {"limit_exceeded", "killed", "stopped"}
_LIVE = {"admitted", "staging", "running", "inspecting"}


class RunDoc(dict[str, Any]):
    """One run as the CLI prints it (`--json`: this document; else `_print_run`)."""


def _service(args: argparse.Namespace, *, recover: bool = False) -> Any:
    """The workspace's Service; `recover` for commands that may write (a run, a decision):
    interrupted commits are finished and dead runs reconciled first. Reading commands never do."""
    from airlockd.runs.service import Service

    _log_to_stderr(args)
    svc = Service(Path(args.workspace), actor="cli")
    return svc.recover() if recover else svc


def _hunks(args: argparse.Namespace) -> dict[str, list[str]] | None:
    """`--hunk PATH:ID` (repeatable) as {path: [id, ...]}."""
    out: dict[str, list[str]] = {}
    for spec in args.hunk or ():
        path, sep, hid = spec.rpartition(":")
        if not sep or not path or not hid:
            raise UsageError(f"--hunk {spec!r}: expected PATH:ID", hint="`airlockd show RUN --json` lists the hunk ids")
        out.setdefault(path.strip("/"), []).append(hid)
    return out or None


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
    if daemon is None and start:
        try:
            daemon = client.start_background(Path(args.workspace).resolve(), root)
        except client.DaemonGone as exc:
            raise AirlockError(str(exc), hint="run with --no-daemon to act without one") from None
        except client.RemoteError as exc:  # it could not start: say why, as it said it
            raise from_json(exc.message, exc.data) from None
    return daemon


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


def _run_json(rec: RunRecord) -> dict[str, Any]:
    d = rec.model_dump(mode="json")
    d.pop("transitions", None)
    return d


def _run_doc(rec: RunRecord) -> RunDoc:
    d = rec.model_dump(mode="json")
    d["timeline"] = d.pop("transitions", [])
    return RunDoc(d)


def _print_run(doc: dict[str, Any]) -> None:
    from airlockd.names import display

    print(f"run {doc['id']}  agent {doc['agent']}  mode {doc['mode']}  state {doc['state']}")
    timeline = doc.get("timeline") or []
    if timeline and timeline[-1].get("detail"):
        print(f"  {timeline[-1]['detail']}")
    if hit := doc.get("limit"):
        print(
            f"  limit exceeded: {hit['limit']} measured {hit['measured']} > allowed {hit['allowed']} ({hit['source']})"
        )
    if doc.get("withheld"):
        print(f"  withheld from the agent: {', '.join(display(w['path']) for w in doc['withheld'])}")
    if doc.get("files"):
        print("  changes:")
        for f in doc["files"]:
            print(
                f"    {f['decision']:6} {f['state']:10} {f['change']:12} {display(f['path'])}"
                f"   [{f['rule']}: {f['reason']}]"
            )
    elif doc["state"] in ("proposed", "applied", "rejected"):
        print("  no changes")


# -- commands ---------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> Any:
    prompt = args.prompt if args.prompt != "-" else sys.stdin.read()
    daemon = _daemon(args, start=True)
    if daemon is not None:
        return _run_through(daemon, args, prompt)
    svc = _service(args, recover=True)
    svc.sweep()
    rec = svc.submit(args.agent, prompt, mode=args.mode, follow_up=args.follow_up)
    if args.wait:

        def progress(stage: str, msg: str) -> None:
            if not args.json:
                print(f"[{stage}] {msg}", file=sys.stderr)

        rec = svc.execute(rec.id, progress)
    else:  # the run continues in its own process; `airlockd show RUN` follows it
        import subprocess

        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "airlockd",
                "--workspace",
                str(svc.workspace),
                "_execute",
                rec.id,
            ],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(svc.state.run_dir(rec.id) / "daemon.log", "ab"),  # noqa: SIM115
        )
    return _run_doc(rec)


PROGRESS, RUN_DONE = "airlock/progress", "airlock/runDone"  # lsp/runs.py


def _run_through(daemon: Daemon, args: argparse.Namespace, prompt: str) -> RunDoc:
    """`run` by the daemon: it admits and carries the run; with --wait, follow it to its end."""
    from airlockd.lsp.client import DaemonGone

    if args.wait:
        daemon.subscribe(PROGRESS, RUN_DONE)
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
                if not args.json:
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
    return _run_doc(rec)


def cmd_execute(args: argparse.Namespace) -> Any:
    """Internal: carry one run in this process (`run` without --wait starts it): the lifecycle's
    run process (airlockd/runs/carrier.py)."""
    from airlockd.runs.carrier import carry

    rec = carry(
        Path(args.workspace),
        args.run,
        resume=args.resume,
        events=args.events,
        values_on_stdin=args.values_on_stdin,
    )
    return None if rec is None else _run_doc(rec)


def cmd_runs(args: argparse.Namespace) -> Any:
    runs = _service(args).store.list_runs()
    if args.json:
        return [_run_json(r) for r in runs]
    for r in runs:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created_at))
        print(f"{r.id}  {when}  {r.agent:12} {r.state.value:22} {len(r.files):3} changes  {r.prompt[:50]!r}")
    return None


def cmd_show(args: argparse.Namespace) -> Any:
    svc = _service(args)
    rec = svc.store.get_run(args.run)
    if args.json:
        d = _run_json(rec)
        d["transitions"] = [t.model_dump(mode="json") for t in rec.transitions]
        d["timeline"] = list(svc.audit.events(run=rec.id))
        d["policy_sources"] = list(svc.loaded.sources)
        from airlockd.evidence.document import evidence

        d["evidence"] = evidence(svc, rec.id)
        d["policy"] = d["evidence"]["policy"]
        d["hunks"] = _hunk_list(svc, rec)
        return d
    from airlockd.names import display

    _print_run(_run_doc(rec))
    for path, hs in _hunk_list(svc, rec).items():
        print(f"  hunks of {display(path)} (decide one with --hunk {display(path)}:ID):")
        for h in hs:
            print(f"    {h['id']}  line {h['line']}  {h['state']}")
    print("  timeline:")
    for t in rec.transitions:
        print(f"    {time.strftime('%H:%M:%S', time.localtime(t.at))} {t.state.value} {t.detail}")
    if rec.container:
        c = rec.container
        print(f"  container: exit {c.get('exit_code')} in {c.get('duration_s')} s, image {c.get('image')}")
    log = svc.state.run_dir(rec.id) / "output.log"
    if log.exists() and log.stat().st_size:
        print(f"  agent output (redacted, not evidence): {log}")
    return None


def _hunk_list(svc: Any, rec: RunRecord) -> dict[str, list[dict[str, Any]]]:
    """path -> its hunks (id, first line in the base, review state), for files that have hunks."""
    out = {}
    for f in rec.files:
        states = svc.review.hunk_states(rec, f)
        if states:
            out[f.path] = [{"id": h.id, "line": h.old_start + 1, "state": s} for h, s in states]
    return out


def cmd_diff(args: argparse.Namespace) -> Any:
    text = _service(args).review.diff(args.run, args.path)
    if args.json:
        return {"run": args.run, "diff": text}
    sys.stdout.write(text)
    return None


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
        result = _service(args, recover=True).review.approve(args.run, args.path or None, hunks=_hunks(args))
        doc, applied, conflicts = _run_json(result.run), result.applied, result.conflicts
    if args.json:
        return {"run": doc, "applied": applied, "conflicts": conflicts}
    from airlockd.names import display

    for p in applied:
        print(f"applied  {display(p)}")
    _print_run(doc)
    return None


def cmd_reject(args: argparse.Namespace) -> Any:
    daemon = _daemon(args)
    if daemon is not None:
        _ask(daemon, "airlock.reject", _selection(args))
        return RunDoc(_ask(daemon, "airlock.getRun", {"runId": args.run}))
    return _run_doc(_service(args, recover=True).review.reject(args.run, args.path or None, hunks=_hunks(args)))


def cmd_undo(args: argparse.Namespace) -> Any:
    daemon = _daemon(args)
    if daemon is not None:
        _ask(daemon, "airlock.undo", {"runId": args.run})
        return RunDoc(_ask(daemon, "airlock.getRun", {"runId": args.run}))
    return _run_doc(_service(args, recover=True).review.undo(args.run))


def cmd_stop(args: argparse.Namespace) -> Any:
    """Stop or kill a run; by default returns once it has ended, with its final state."""
    kill = args.command == "kill"
    daemon = _daemon(args)
    if daemon is not None:
        verb = "airlock.killRun" if kill else "airlock.stopRun"
        _ask(daemon, verb, {"runId": args.run, "wait": not args.no_wait})
        return RunDoc(_ask(daemon, "airlock.getRun", {"runId": args.run}))
    return _run_doc(_service(args).stop(args.run, kill=kill, wait=not args.no_wait))


def cmd_agents(args: argparse.Namespace) -> Any:
    agents = _service(args).agents()
    if args.json:
        return agents
    for a in agents:
        q = f"QUARANTINED ({a['reason']})" if a["quarantined"] else "ok"
        print(f"{a['agent']:14} {a['adapter']:8} runs {a['runsUsed']:4}  tokens {a['tokensUsed']:8}  {q}")
    return None


def cmd_release(args: argparse.Namespace) -> Any:
    daemon = _daemon(args)
    if daemon is not None:
        return _ask(daemon, "airlock.releaseAgent", {"agent": args.agent})
    return _service(args).release(args.agent)


def cmd_audit(args: argparse.Namespace) -> Any:
    from airlockd.evidence import signing

    if args.verify_export:  # needs the export and the public key, nothing of this machine's state
        if not args.public_key_file:
            raise UsageError("--verify-export needs --public-key-file KEY (what `airlockd audit --public-key` prints)")
        try:
            key = signing.load_public_key(Path(args.public_key_file).read_bytes())
        except OSError as exc:
            raise UsageError(f"cannot read the public key {args.public_key_file}: {exc.strerror}") from None
        check = signing.verify_export(Path(args.verify_export), key, Path(args.signature) if args.signature else None)
        if not check.ok:
            raise AirlockError(f"export NOT verified: {check.problem}", events=check.events)
        if args.json:
            return {"ok": True, "events": check.events}
        print(f"export verified: signature valid, {check.events} events, hash chain intact")
        return None
    svc = _service(args)
    if args.public_key:
        pem = signing.public_pem(signing.signing_key(svc.state.root))
        return {"public_key": pem} if args.json else print(pem, end="")
    if args.export:
        dest = Path(args.export)
        n = signing.export(svc.audit, signing.signing_key(svc.state.root), dest)
        out = {"exported": str(dest), "signature": str(signing.sig_path(dest)), "events": n}
        if args.json:
            return out
        print(f"{n} events -> {dest}, signature -> {signing.sig_path(dest)}")
        print("verify with: airlockd audit --verify-export FILE --public-key-file KEY.pub (see docs/audit.md)")
        return None
    if args.verify:
        brk = svc.audit.verify()
        if brk is None:
            n = sum(1 for _ in svc.audit.events())
            return {"ok": True, "events": n} if args.json else print(f"audit chain intact: {n} events")
        raise AirlockError(
            f"audit chain broken at line {brk.line} (seq {brk.seq}): {brk.problem}",
            hint="the audit log was edited after it was written; keep a copy for investigation",
            line=brk.line,
            seq=brk.seq,
        )
    events = list(svc.audit.events(run=args.run))
    if args.json:
        return events
    for ev in events:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ev["at"]))
        print(f"{ev['seq']:6} {when} {ev['kind']:22} {ev.get('run') or '-':14} {json.dumps(ev['data'])}")
    return None


def cmd_policy(args: argparse.Namespace) -> Any:
    """The exact merged policy a revision stands for, as kept when a run first used it."""
    from airlockd.state import StateDir

    state = StateDir.for_workspace(Path(args.workspace))
    rev = args.revision
    if rev is None:
        from airlockd.policy import load_policy

        rev = load_policy(state.workspace).revision
    hits = sorted(state.policies.glob(f"{rev}*.json")) if state.policies.is_dir() and rev.isalnum() else []
    if len(hits) != 1:
        kept = sorted(p.stem for p in state.policies.glob("*.json")) if state.policies.is_dir() else []
        raise (UsageError if hits else NotFoundError)(
            f"{'ambiguous' if hits else 'no kept'} policy revision {rev!r}",
            hint=f"kept revisions: {', '.join(kept) or 'none yet (a run keeps its revision)'}",
        )
    path = hits[0]
    policy = json.loads(path.read_text())
    if args.json:
        return {"revision": path.stem, "file": str(path), "policy": policy}
    print(f"# policy revision {path.stem} ({path})")
    print(json.dumps(policy, indent=2, sort_keys=True))
    return None


def cmd_runtime(args: argparse.Namespace) -> Any:
    from airlockd.runs.runtime import build

    built = build(
        force=args.force, with_codex=getattr(args, "with_codex", False), progress=lambda m: print(m, file=sys.stderr)
    )
    return built if args.json else print("\n".join(built.values()))


def cmd_doctor(args: argparse.Namespace) -> Any:
    from airlockd.runs.doctor import run_checks

    checks = run_checks(Path(args.workspace))
    if args.json:
        return {"ok": all(c["ok"] for c in checks), "checks": checks}
    for c in checks:
        print(f"[{'ok' if c['ok'] else 'FAIL':4}] {c['name']}: {c['detail']}")
        if not c["ok"] and c.get("fix"):
            print(f"       fix: {c['fix']}")
    return None if all(c["ok"] for c in checks) else EXIT_ERROR


def cmd_demo(args: argparse.Namespace) -> Any:
    from airlockd.cli.demo import run_demo

    return run_demo(Path(args.demo_dir) if args.demo_dir else None)


def cmd_serve(args: argparse.Namespace) -> Any:
    """The LSP daemon. Never prints to stdout: in stdio mode stdout carries the protocol."""
    from airlockd.lsp.transport import serve

    return serve(
        Path(args.workspace), tcp=args.tcp, background=args.background, idle_s=args.idle, ready_fd=args.ready_fd
    )


# -- parser -----------------------------------------------------------------------------------


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with `only`, the sub-command of that name alone is made in full
    (the others' arguments go to a scratch parser): a quarter of a command's start-up otherwise."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--workspace",
        default=argparse.SUPPRESS,
        help="project folder (default: the current directory)",
    )
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="one JSON document on stdout")
    common.add_argument(
        "--no-daemon",
        action="store_true",
        default=argparse.SUPPRESS,
        help="act in this process even when a daemon serves the workspace (also AIRLOCK_DAEMON=off)",
    )
    p = argparse.ArgumentParser(
        prog="airlockd", parents=[common], description="Run coding agents without trusting them."
    )
    p.add_argument("--version", action="version", version=f"airlockd {__version__}")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Handler, help: str | None) -> argparse.ArgumentParser:
        if only is not None and name != only:
            return argparse.ArgumentParser(add_help=False)  # a scratch pad, never parsed
        # no help: an internal command, left out of the listing
        sp = sub.add_parser(name, parents=[common], help=help) if help else sub.add_parser(name, parents=[common])
        sp.set_defaults(fn=fn)
        return sp

    sp = add("run", cmd_run, "admit and start a run")
    sp.add_argument("--agent", required=True)
    sp.add_argument("--mode", choices=["review", "auto"])
    sp.add_argument("--follow-up", metavar="RUN")
    sp.add_argument("--wait", action="store_true", help="block until the run is proposed or ends")
    sp.add_argument("prompt", help="the task ('-' reads it from standard input)")
    sp = add("_execute", cmd_execute, None)  # internal: the process that carries one run
    sp.add_argument("--resume", action="store_true")
    sp.add_argument("--events", action="store_true")
    sp.add_argument("--values-on-stdin", action="store_true")
    sp.add_argument("run")
    add("runs", cmd_runs, "list runs")
    add("show", cmd_show, "one run with its changes, decisions and evidence").add_argument("run")
    sp = add("diff", cmd_diff, "unified diff of a proposal")
    sp.add_argument("run")
    sp.add_argument("path", nargs="?")
    for name, fn, what in (("approve", cmd_approve, "commit"), ("reject", cmd_reject, "discard")):
        sp = add(name, fn, f"{what} all pending changes, or the chosen paths / hunks")
        sp.add_argument("run")
        sp.add_argument(
            "--path",
            action="append",
            metavar="P",
            help="a file or folder of the proposal (repeatable); a file with hunks decided already: its pending hunks",
        )
        sp.add_argument(
            "--hunk",
            action="append",
            metavar="P:ID",
            help="one hunk of a file, by the id `show --json` / the editor gives (repeatable)",
        )
    add("undo", cmd_undo, "reverse what a run applied").add_argument("run")
    for name, what in (("stop", "graceful stop: SIGTERM, grace period, then kill"), ("kill", "immediate kill")):
        sp = add(name, cmd_stop, f"{what}; returns when the run has ended, with its final state")
        sp.add_argument("run")
        sp.add_argument("--no-wait", action="store_true", help="return at once, with the state the run is in then")
    add("agents", cmd_agents, "agents with usage and quarantine")
    add("release", cmd_release, "lift an agent's quarantine").add_argument("agent")
    sp = add("audit", cmd_audit, "the audit timeline")
    sp.add_argument("--verify", action="store_true", help="check the hash chain")
    sp.add_argument("--run", help="only this run's events")
    sp.add_argument("--export", metavar="FILE", help="write the log as JSON Lines plus FILE.sig (Ed25519)")
    sp.add_argument("--public-key", action="store_true", help="print the public half of the signing key (PEM)")
    sp.add_argument("--verify-export", metavar="FILE", help="check an export with the public key alone")
    sp.add_argument("--public-key-file", metavar="KEY", help="with --verify-export: PEM, or raw base64")
    sp.add_argument("--signature", metavar="SIG", help="with --verify-export: the signature (default FILE.sig)")
    sp = add("policy", cmd_policy, "kept policy revisions")
    sp.add_argument("action", choices=["show"])
    sp.add_argument("revision", nargs="?", help="a revision or its prefix (default: the one in force)")
    sp = add("runtime", cmd_runtime, "the agent runtime image")
    sp.add_argument("action", choices=["build"])
    sp.add_argument("--force", action="store_true", help="rebuild even when the image exists")
    sp.add_argument(
        "--with-codex", action="store_true", help="also build the image with the Codex CLI (npm @openai/codex)"
    )
    add("doctor", cmd_doctor, "check the engine, image, policy and state directory")
    sp = add("demo", cmd_demo, "a sample workspace and a scripted agent, end to end")
    sp.add_argument("--dir", dest="demo_dir", help="where to create the sample workspace")
    sp = add("serve", cmd_serve, "the LSP server (stdio by default)")
    how = sp.add_mutually_exclusive_group()
    how.add_argument("--stdio", action="store_true", help="speak LSP on stdin/stdout (the default)")
    how.add_argument(
        "--tcp", metavar="HOST:PORT", help="listen on loopback; clients present the token in the state dir"
    )
    how.add_argument(
        "--background",
        action="store_true",
        help="no editor: serve the CLI on the control socket only, and leave when idle (the CLI starts it)",
    )
    sp.add_argument("--idle", type=float, metavar="S", help="with --background: leave after S seconds idle")
    sp.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)  # client.start_background's pipe
    return p


def _emit(result: Any, as_json: bool) -> int:
    if isinstance(result, int) and not isinstance(result, bool):
        return result
    if as_json and result is not None:
        from airlockd.redact import scrub

        out = scrub(result)  # stored data is masked already; this is the last net
        print(json.dumps(out, indent=2, default=str))
    elif isinstance(result, RunDoc):
        _print_run(result)
    elif isinstance(result, dict) and not as_json:
        print(json.dumps(result, indent=2, default=str))
    if isinstance(result, RunDoc) and result.get("state") in _ENDED_BADLY:
        return EXIT_LIMIT
    return 0


# The commands a daemon serving the workspace decides: importing the service (or even `logging`)
# is left to the path that acts alone, so that going to the daemon starts in milliseconds.
_ROUTED = frozenset({"run", "approve", "reject", "undo", "stop", "kill", "release"})


def _log_to_stderr(args: argparse.Namespace) -> None:
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


_COMMANDS = frozenset(
    [
        "run",
        "_execute",
        "runs",
        "show",
        "diff",
        "approve",
        "reject",
        "undo",
        "stop",
        "kill",
        "agents",
        "release",
        "audit",
        "policy",
        "runtime",
        "doctor",
        "demo",
        "serve",
    ]
)


def _command_of(argv: Sequence[str] | None) -> str | None:
    """The sub-command named in `argv` (the first word that is not an option or the value of
    --workspace), when it is one this CLI knows; else None (then the whole parser is made)."""
    words = list(sys.argv[1:] if argv is None else argv)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--workspace":
            i += 2
            continue
        if word in ("-h", "--help"):
            return None
        if not word.startswith("-"):
            return word if word in _COMMANDS else None
        i += 1
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(_command_of(argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) if exc.code in (0, None) else EXIT_USAGE
    args.workspace = getattr(args, "workspace", None) or os.getcwd()
    args.json = getattr(args, "json", False)
    args.no_daemon = getattr(args, "no_daemon", False)
    if args.command not in _ROUTED:  # those log only once they act alone (`_service`)
        _log_to_stderr(args)
    try:
        return _emit(args.fn(args), args.json)
    except AirlockError as exc:
        from airlockd.redact import scrub

        if args.json:  # error text may quote input or agent output: masked like everything else
            print(json.dumps(scrub(exc.to_json()), indent=2, default=str))
        else:
            print(f"airlockd: {scrub(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("airlockd: interrupted", file=sys.stderr)
        return 130
