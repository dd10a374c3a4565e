"""Screening after the deterministic steps: names that hold secrets, and the model-assisted
classifier, which may raise a staged file's label or a change's decision but never lower either."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airlockd.policy import Decision
from airlockd.records import FileReview, FileState, RunRecord
from airlockd.staging import stagers

if TYPE_CHECKING:
    from airlockd.runs.service import Service


def _classifier(svc: Service) -> Any:
    cfg = svc.policy.classifier
    if not cfg.enabled:
        return None
    from airlockd.runs.classifier import Classifier

    return Classifier(cfg)


def labels_on(svc: Service) -> bool:
    """Whether the model classifier may raise labels at staging (it reads the whole base)."""
    cfg = svc.policy.classifier
    return bool(cfg.enabled and cfg.labels)


def classify_labels(
    svc: Service, rec: RunRecord, staging: Path, result: Any, hide: Callable[[str], None] | None = None
) -> None:
    """Model-assisted labels (raise only): a staged file the model rates above the agent's
    clearance is removed from the staging copy before the agent starts, and withheld."""
    clf = _classifier(svc)
    if clf is None or not clf.cfg.labels:
        return
    from airlockd.pipeline.manifest import Kind
    from airlockd.policy import Level
    from airlockd.staging.records import Withheld

    clearance = svc.policy.clearance_for(rec.agent)
    asked = 0
    for path, entry in sorted(result.base.items()):
        if entry.kind is not Kind.FILE or asked >= clf.cfg.max_files:
            continue
        try:
            data = (staging / path).read_bytes()[: clf.cfg.max_bytes]
        except OSError:
            continue
        if b"\0" in data[:8192]:
            continue
        asked += 1
        v = clf.label(path, data, svc.policy.label_of(path))
        if v.to is None:
            _failed(svc, rec, path, v.error)
            continue
        withhold = Level(v.to).rank > clearance.rank
        raised = {
            "what": "label",
            "path": path,
            "from": v.frm,
            "to": v.to,
            "reason": svc.redactor.text(v.reason),
            "withheld": withhold,
            "source": clf.source,
        }
        if withhold:  # absent, not hidden: gone from the copy before the agent starts
            svc.redactor.add_file_values(data.decode("utf-8", "replace"))
            hide(path) if hide is not None else (staging / path).unlink()
            del result.base[path]
            result.withheld.append(Withheld(path, f"classifier:label={v.to}"))
        _raised(svc, rec, raised)


def _failed(svc: Service, rec: RunRecord, path: str, error: str | None) -> None:
    if error:
        svc.audit.append(
            "classifier.failed", run=rec.id, agent=rec.agent, policy=rec.policy_revision, path=path, error=error
        )


def _raised(svc: Service, rec: RunRecord, raised: dict[str, Any]) -> None:
    svc.store.update_run(rec.id, lambda r: r.classifier.append(raised))
    svc.audit.append("classifier.raised", run=rec.id, agent=rec.agent, policy=rec.policy_revision, **raised)


def screen_changes(svc: Service, rec: RunRecord, files: list[FileReview]) -> list[FileReview]:
    """Changes after the deterministic rules: a name holding a secret is denied (and masked:
    the store never holds it); the model classifier may then raise, never lower, a decision."""
    for f in files:
        masked = svc.redactor.text(f.path)
        if masked != f.path:
            f.path, f.decision, f.state = masked, Decision.DENY, FileState.DENIED
            if f.rule != "invariant:secret-in-name":  # classify's reason names the detector; keep it
                f.rule, f.reason = "invariant:secret-in-name", "the path holds a secret"
    clf = _classifier(svc)
    if clf is None or not clf.cfg.decisions:
        return files
    run_dir = svc.state.run_dir(rec.id)
    for f in files:
        if f.decision is Decision.DENY:
            continue
        data = None
        if f.after and f.after.get("kind") == "file":
            try:
                data = stagers.proposed_path(run_dir, f.path).read_bytes()[: clf.cfg.max_bytes]
            except OSError:
                data = None
        v = clf.decision(f.path, f.change, data, f.decision)
        if v.to is None or Decision(v.to).rank <= f.decision.rank:  # the rule of rules: never lower
            _failed(svc, rec, f.path, v.error)
            continue
        new = Decision(v.to)
        raised = {
            "what": "decision",
            "path": f.path,
            "from": f.decision.value,
            "to": new.value,
            "reason": svc.redactor.text(v.reason),
            "rule": f.rule,
            "source": clf.source,
        }
        f.decision, f.rule, f.reason = new, clf.source, raised["reason"] or f"raised by {clf.source}"
        if new is Decision.DENY:
            f.state = FileState.DENIED
        _raised(svc, rec, raised)
    return files
