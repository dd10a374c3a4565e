"""Command line: parses, calls the service, prints. Exit codes live in errors.py.

When a daemon serves the workspace, the commands that run or decide go to it (cli/decide.py);
the rest read the state and print (cli/show.py shows a run). See docs/daemon.md.

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
from airlockd.cli.decide import (
    cmd_approve,
    cmd_reject,
    cmd_release,
    cmd_run,
    cmd_stop,
    cmd_undo,
    log_to_stderr,
    service,
)
from airlockd.cli.show import ENDED_BADLY, RunDoc, print_run, run_doc, run_json
from airlockd.errors import EXIT_ERROR, EXIT_LIMIT, EXIT_USAGE, AirlockError, NotFoundError, UsageError

if TYPE_CHECKING:
    from airlockd.records import RunRecord

Handler = Callable[[argparse.Namespace], Any]


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
    return None if rec is None else run_doc(rec)


def cmd_runs(args: argparse.Namespace) -> Any:
    from airlockd.cli.listing import list_runs
    from airlockd.state import StateDir

    return list_runs(args, StateDir.for_workspace(Path(args.workspace)))


def cmd_gc(args: argparse.Namespace) -> Any:
    from airlockd.runs.retention import collect

    svc = service(args, recover=True)  # an interrupted commit is finished or rolled back first
    report = collect(svc, apply=args.apply)
    if args.json:
        return report
    from airlockd.cli.listing import print_gc

    print_gc(report)
    return None


def cmd_show(args: argparse.Namespace) -> Any:
    svc = service(args)
    rec = svc.store.get_run(args.run)
    if args.json:
        d = run_json(rec)
        d["transitions"] = [t.model_dump(mode="json") for t in rec.transitions]
        d["timeline"] = list(svc.audit.events(run=rec.id))
        d["policy_sources"] = list(svc.loaded.sources)
        from airlockd.evidence.document import evidence

        d["evidence"] = evidence(svc, rec.id)
        d["policy"] = d["evidence"]["policy"]
        d["hunks"] = _hunk_list(svc, rec)
        return d
    from airlockd.names import display

    print_run(run_doc(rec))
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


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive whole number")
    return n


def _hunk_list(svc: Any, rec: RunRecord) -> dict[str, list[dict[str, Any]]]:
    """path -> its hunks (id, first line in the base, review state), for files that have hunks."""
    out = {}
    for f in rec.files:
        states = svc.content.hunk_states(rec, f)
        if states:
            out[f.path] = [{"id": h.id, "line": h.old_start + 1, "state": s} for h, s in states]
    return out


def cmd_diff(args: argparse.Namespace) -> Any:
    text = service(args).content.diff(args.run, args.path)
    if args.json:
        return {"run": args.run, "diff": text}
    sys.stdout.write(text)
    return None


def cmd_agents(args: argparse.Namespace) -> Any:
    agents = service(args).agents()
    if args.json:
        return agents
    for a in agents:
        q = f"QUARANTINED ({a['reason']})" if a["quarantined"] else "ok"
        print(f"{a['agent']:14} {a['adapter']:8} runs {a['runsUsed']:4}  tokens {a['tokensUsed']:8}  {q}")
    return None


def _verify_audit(svc: Any, args: argparse.Namespace) -> Any:
    """The chain, the head, then the signed checkpoints; says what that proves and what not."""
    from airlockd.evidence import signing

    brk = svc.audit.verify()
    if brk is not None:
        where = f"{brk.file} " if brk.file else ""
        raise AirlockError(
            f"audit chain broken at {where}line {brk.line} (seq {brk.seq}): {brk.problem}",
            hint="the audit log was edited after it was written; keep a copy for investigation",
            line=brk.line,
            seq=brk.seq,
            file=brk.file,
        )
    if args.public_key_file:
        try:
            key = signing.load_public_key(Path(args.public_key_file).read_bytes())
        except OSError as exc:
            raise UsageError(f"cannot read the public key {args.public_key_file}: {exc.strerror}") from None
        source = args.public_key_file
    else:
        key = signing.signing_key(svc.state.root).public_key()
        source = "this state directory's own key"
    check = signing.verify_checkpoints(svc.audit, key)
    if not check.ok:
        raise AirlockError(
            f"audit NOT verified: {check.problem}",
            hint="the chain and the head file agree, but the signed checkpoints do not: keep a copy for investigation",
            events=check.events,
        )
    unproven = []
    if check.last_seq is None or check.last_seq < check.dropped + check.events - 1:
        after = "all events" if check.last_seq is None else f"events after seq {check.last_seq}"
        unproven.append(f"{after} rest on the head file alone (no signed checkpoint covers them yet)")
    if not args.public_key_file:
        unproven.append(
            "the checkpoints were checked with the key in the state directory: someone who can read it "
            "could re-sign a rewritten log; pass --public-key-file with a copy of the public key kept elsewhere"
        )
    out = {
        "ok": True,
        "events": check.events,
        "dropped": check.dropped,
        "checkpoints": check.checkpoints,
        "lastCheckpoint": check.last_seq,
        "key": source,
        "unproven": unproven,
    }
    if args.json:
        return out
    earlier = f"; {check.dropped} earlier ones dropped by retention under signed anchors" if check.dropped else ""
    print(f"audit chain intact: {check.events} events (none edited, removed, inserted or reordered{earlier})")
    print("head: the log ends with the last event airlockd wrote")
    covered = f", the last covering seq {check.last_seq}" if check.last_seq is not None else ""
    print(f"signed checkpoints: {check.checkpoints} verified with {source}{covered}")
    for line in unproven:
        print(f"not proven: {line}")
    return None


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
            return {"ok": True, "events": check.events, "firstSeq": check.first_seq}
        print(f"export verified: signature valid, {check.events} events, hash chain intact")
        if check.first_seq:
            print(f"it starts at seq {check.first_seq}: the events before were dropped by retention before the export")
        return None
    svc = service(args)
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
        return _verify_audit(svc, args)
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

    agents = [a.strip() for part in args.with_agents or [] for a in part.split(",") if a.strip()]
    if args.with_codex:
        agents.append("codex")
    built = build(force=args.force, agents=agents, progress=lambda m: print(m, file=sys.stderr))
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
    sp.add_argument(
        "--follow",
        action="store_true",
        help="--wait, printing what the agent prints as it works (its own account: redacted, never evidence)",
    )
    sp.add_argument("prompt", help="the task ('-' reads it from standard input)")
    sp = add("_execute", cmd_execute, None)  # internal: the process that carries one run
    sp.add_argument("--resume", action="store_true")
    sp.add_argument("--events", action="store_true")
    sp.add_argument("--values-on-stdin", action="store_true")
    sp.add_argument("run")
    sp = add("runs", cmd_runs, "list runs, newest first")
    sp.add_argument("--limit", type=_positive, default=50, metavar="N", help="at most N runs (default 50)")
    sp.add_argument("--all", action="store_true", help="every run (no limit)")
    sp.add_argument("--state", action="append", metavar="S", help="only runs in state S (repeatable, or S1,S2)")
    sp.add_argument("--agent", metavar="NAME", help="only the runs of this agent")
    sp.add_argument("--since", metavar="WHEN", help="admitted since: 2026-12-01, 2026-12-01T09:30, 3d, 12h, 30m")
    sp.add_argument("--before", metavar="RUN", help="the page after this run (the last one a listing printed)")
    sp = add("gc", cmd_gc, "compact finished runs past the retention policy (dry run unless --apply)")
    sp.add_argument("--apply", action="store_true", help="do it (default: say what it would do)")
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
    sp.add_argument(
        "--public-key-file", metavar="KEY", help="with --verify or --verify-export: the public key, PEM or raw base64"
    )
    sp.add_argument("--signature", metavar="SIG", help="with --verify-export: the signature (default FILE.sig)")
    sp = add("policy", cmd_policy, "kept policy revisions")
    sp.add_argument("action", choices=["show"])
    sp.add_argument("revision", nargs="?", help="a revision or its prefix (default: the one in force)")
    sp = add("runtime", cmd_runtime, "the agent runtime image")
    sp.add_argument("action", choices=["build"])
    sp.add_argument("--force", action="store_true", help="rebuild even when the image exists")
    sp.add_argument(
        "--with",
        dest="with_agents",
        action="append",
        metavar="AGENTS",
        help="also build an image with each of these agent CLIs, comma separated (codex, claude)",
    )
    sp.add_argument("--with-codex", action="store_true", help="the same as --with codex")
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
        print_run(result)
    elif isinstance(result, dict) and not as_json:
        print(json.dumps(result, indent=2, default=str))
    if isinstance(result, RunDoc) and result.get("state") in ENDED_BADLY:
        return EXIT_LIMIT
    return 0


# The commands a daemon serving the workspace decides: importing the service (or even `logging`)
# is left to the path that acts alone, so that going to the daemon starts in milliseconds.
_ROUTED = frozenset({"run", "approve", "reject", "undo", "stop", "kill", "release"})


# Commands whose output is a protocol or our own styling, not agent-written text for a person.
_RAW_OUTPUT = frozenset({"serve", "_execute", "demo"})

_COMMANDS = frozenset(
    [
        "run",
        "_execute",
        "runs",
        "gc",
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
    if not args.json and args.command not in _RAW_OUTPUT:
        from airlockd.cli.streams import escape_output

        escape_output()  # a person reads this: nothing an agent wrote may act on the terminal
    if args.command not in _ROUTED | {"runs"}:  # those log only once they act (`_service`, listing)
        log_to_stderr(args)
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
