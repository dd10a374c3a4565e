"""Evidence for one run: what a person needs to decide, in one JSON-ready dict.

`evidence(service, run_id)` backs `airlockd show RUN --json` and the LSP `airlock.getEvidence`.
Everything in it comes from the run record, the audit log and the kept policy revision, all
already redacted; it is redacted once more on the way out. The live-tree digest is the proof that
the live workspace did not move while the run was only proposed: computed at staging and again
before the first approve / reject touches anything.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airlockd.names import under
from airlockd.pipeline.manifest import scan
from airlockd.protocol import EvidenceDocument
from airlockd.records import RunRecord, RunState
from airlockd.staging.treedigest import SCHEME, TreeDigest

if TYPE_CHECKING:
    from airlockd.runs.service import Service

TOKENS_UNMETERED = "not metered: the model gateway is not built yet, so no run has metered model access"


def live_tree(workspace: Path, excluded: list[str]) -> dict[str, Any]:
    """Digest of the live tree: the Merkle digest (`treedigest`, scheme `SCHEME`) of the type,
    mode, size, content SHA-256 or link target of every node, withheld paths (and what is under
    them) left out."""
    skip_set = {p.rstrip("/") for p in excluded}

    def skip(rel: str, is_dir: bool) -> bool:
        return rel in skip_set or any(under(rel, p) for p in skip_set if p)

    manifest = scan(workspace, skip)
    digest = TreeDigest.of(manifest).hexdigest()
    return {"sha256": digest, "entries": len(manifest), "scheme": SCHEME, "at": round(time.time(), 3)}


def schemes_differ(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    """Why two live-tree digests cannot be compared, or None if they can. A run staged by an older
    airlockd kept a flat digest (no "scheme" key): comparing it with a Merkle one would report a
    change that did not happen."""
    a, b = before.get("scheme"), after.get("scheme")
    if a == b:
        return None
    return (
        f"the digests were taken with different schemes ({a or 'flat, older airlockd'} before,"
        f" {b or 'flat, older airlockd'} after), so they cannot be compared"
    )


def _excluded(rec: RunRecord) -> list[str]:
    return [w["path"] for w in rec.withheld]


def _workspace_proof(service: Service, rec: RunRecord) -> dict[str, Any]:
    before = rec.live_tree.get("before")
    after = rec.live_tree.get("after")
    out: dict[str, Any] = {
        "what": (
            "Merkle digest (SHA-256 per directory over its children's names, type, mode, size, content hash"
            " or link target and subdirectory digests) of the live workspace, withheld paths excluded"
        ),
        "before": before,
        "after": after,
    }
    if before is None:
        out["unchanged"] = None
        out["note"] = "the run was not staged, so the live workspace was never read"
        return out
    if after is None and rec.state is RunState.PROPOSED:
        out["now"] = live_tree(service.workspace, _excluded(rec))  # still proposed: measured now, not kept
        if why := schemes_differ(before, out["now"]):
            out["unchanged"], out["note"] = None, f"still proposed, but {why}"
            return out
        out["unchanged"] = out["now"]["sha256"] == before["sha256"]
        out["note"] = "still proposed: compared with the live workspace as it is now"
        return out
    if after is None:
        out["unchanged"] = None
        out["note"] = "no approve or reject was made while the run was proposed"
        return out
    if why := schemes_differ(before, after):
        out["unchanged"], out["note"] = None, why
        return out
    out["unchanged"] = after["sha256"] == before["sha256"]
    out["note"] = (
        "the live workspace was the same when the first decision was made"
        if out["unchanged"]
        else "the live workspace changed while the run was proposed (not by airlockd: it writes only on approve)"
    )
    return out


def evidence(service: Service, run_id: str) -> dict[str, Any]:
    """Everything that explains one run's outcome; redacted, never holding file contents."""
    rec = service.store.get_run(run_id)
    kept = service.state.policies / f"{rec.policy_revision}.json"
    rules: dict[str, dict[str, Any]] = {}
    for f in rec.files:
        r = rules.setdefault(f.rule, {"rule": f.rule, "decision": f.decision.value, "reason": f.reason, "paths": []})
        r["paths"].append(f.path)
    effective = rec.container.get("effective") or {}
    timeline = list(service.audit.events(run=rec.id))
    out = {
        "run": rec.id,
        "agent": rec.agent,
        "state": rec.state.value,
        "mode": rec.mode,
        "policy": {
            "revision": rec.policy_revision,
            "file": str(kept) if kept.exists() else None,
            "show": f"airlockd policy show {rec.policy_revision}",
            "current": rec.policy_revision == service.loaded.revision,
        },
        "admission": {
            "prompt_sha256": rec.prompt_sha256,
            "injection_markers": rec.injection_markers,
            "detail": rec.transitions[0].detail if rec.transitions else "",
        },
        "rules": sorted(rules.values(), key=lambda r: r["rule"]),
        "decisions": [
            {"path": f.path, "change": f.change, "decision": f.decision.value, "rule": f.rule, "state": f.state.value}
            for f in rec.files
        ],
        "classifier": rec.classifier,
        "withheld": [{"path": w["path"], "rule": w["rule"]} for w in rec.withheld],
        "container": {
            # the engine's record (runc, or runsc: gVisor's kernel between the agent and the host's)
            "runtime": effective.get("runtime") or rec.container.get("runtime") or "runc",
            "network_mode": effective.get("network_mode"),
            # "none" in the namespace of the run's holder (made ahead, loopback only): sandbox/docker.py
            **({"network_shared_with": shared} if (shared := effective.get("network_shared_with")) else {}),
            "cap_drop": effective.get("cap_drop"),
            "cap_add": effective.get("cap_add"),
            "privileged": effective.get("privileged"),
            "read_only_root": effective.get("read_only_root"),
            "security_opt": effective.get("security_opt"),
            "user": effective.get("user"),
            "image_id": effective.get("image_id"),
            "exit_code": rec.container.get("exit_code"),
        },
        "resources": {
            "effective": {
                **{k: effective.get(k) for k in ("cpus", "memory_bytes", "memory_swap_bytes", "pids_limit", "tmpfs")},
                # the process cap under gVisor (RLIMIT_NPROC in its kernel; no pids cgroup there)
                "nproc": ((effective.get("ulimits") or {}).get("nproc") or [None, None])[1],
            },
            "peak": dict(getattr(rec, "peak", {}) or {}),
            "duration_s": rec.container.get("duration_s"),
            "output_bytes": rec.output_bytes,
            "limit_hit": rec.limit.model_dump() if rec.limit else None,
        },
        "tokens": {
            "used": rec.tokens,
            "source": getattr(rec, "tokens_source", None) or TOKENS_UNMETERED,
        },
        "egress": rec.egress or None,
        "workspace": _workspace_proof(service, rec),
        "timeline": timeline,
    }
    doc = EvidenceDocument.model_validate(out)  # the wire's shape, checked before it leaves
    return dict(service.redactor.value(doc.wire()))
