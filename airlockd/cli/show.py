"""A run as the command line shows it: the document `--json` prints, and its human form."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airlockd.records import RunRecord

ENDED_BADLY = frozenset({"limit_exceeded", "killed", "stopped"})  # exit code 4


class RunDoc(dict[str, Any]):
    """One run as the CLI prints it (`--json`: this document; else `_print_run`)."""


def run_json(rec: RunRecord) -> dict[str, Any]:
    d = rec.model_dump(mode="json")
    d.pop("transitions", None)
    return d


def run_doc(rec: RunRecord) -> RunDoc:
    d = rec.model_dump(mode="json")
    d["timeline"] = d.pop("transitions", [])
    return RunDoc(d)


def print_run(doc: dict[str, Any]) -> None:
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
    if egress := doc.get("egress"):
        reached = ", ".join(f"{display(h['host'])} ({h['bytes']} bytes)" for h in egress.get("hosts", [])) or "nothing"
        print(f"  package broker: {egress.get('tunnels', 0)} tunnels to {reached}; {egress.get('refused', 0)} refused")
        for r in egress.get("refusals", []):
            where = f"{r.get('host')}:{r.get('port')}" if r.get("host") is not None else str(r.get("target"))
            print(f"    refused {display(where)}: {r.get('status')} {display(str(r.get('reason', '')))}")
    if doc.get("files"):
        print("  changes:")
        for f in doc["files"]:
            print(
                f"    {f['decision']:6} {f['state']:10} {f['change']:12} {display(f['path'])}"
                f"   [{f['rule']}: {f['reason']}]"
            )
            for mark in f.get("marks") or []:
                print(f"           ! {mark}")
    elif doc["state"] in ("proposed", "applied", "rejected"):
        print("  no changes")
