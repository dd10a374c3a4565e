"""Classification: one decision per change, by deterministic rules.

Built-in invariants come first and always deny; no policy can weaken them. Then the first
matching `[[rules]]` entry decides; a change no rule matches is `review`. The final decision is
the stricter of the rule's and any invariant floor (`auto` < `review` < `deny`).
"""

from __future__ import annotations

import stat
from collections.abc import Collection
from dataclasses import dataclass

from airlockd.pipeline.manifest import Change, ChangeKind, ChangeSet, Entry, Kind
from airlockd.policy import POLICY_FILE, Decision, Policy

AGENT_HOMES = (".codex", ".claude")


@dataclass(frozen=True)
class Classified:
    change: Change
    decision: Decision
    rule: str
    reason: str


def _name_problem(path: str) -> str | None:
    if not path or path.startswith("/"):
        return "absolute or empty path"
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "path climbs out of the workspace or has empty components"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid UTF-8"
    if not path.isprintable():
        return "name contains a newline or another control character"
    return None


def _invariant(c: Change, policy: Policy, withheld: Collection[str]) -> tuple[str, str] | None:
    """(rule, reason) of the first built-in invariant the change breaks, or None."""
    path = c.path
    if problem := _name_problem(path):
        return "invariant:unsafe-name", problem
    parts = path.split("/")
    after: Entry | None = c.after
    before: Entry | None = c.before
    if ".git" in parts:
        return "invariant:git-dir", "the repository's .git directory is never writable by an agent"
    if any(p in AGENT_HOMES or p.startswith(".aider") for p in parts):
        return "invariant:agent-home", "agent homes (.codex, .claude, .aider*) hold agent state and credentials"
    if path in withheld or policy.withhold_spec.match_file(path):
        return "invariant:withheld", "withheld paths are never written from a staging copy"
    if path == POLICY_FILE:
        return "invariant:policy-file", "an agent must never rewrite its own policy"
    if policy.protected_spec.match_file(path):
        return "invariant:protected-instructions", "instruction files steer future agents"
    if after is not None and after.kind is Kind.SYMLINK:
        return "invariant:symlink", f"symlink to {after.target!r} created or changed"
    if before is not None and before.kind is Kind.SYMLINK and c.change is not ChangeKind.DELETED:
        return "invariant:symlink", "an existing symlink was replaced"
    if after is not None and after.kind in (Kind.FIFO, Kind.SOCKET, Kind.DEVICE):
        return "invariant:special-file", f"{after.kind.value} files are never committed"
    if after is not None and after.mode & (stat.S_ISUID | stat.S_ISGID):
        return "invariant:setuid", "setuid/setgid bits are never committed"
    cap = policy.defaults.max_file_bytes
    if after is not None and after.kind is Kind.FILE and after.size > cap:
        return "invariant:size-cap", f"{after.size} bytes is over the policy's cap of {cap}"
    return None


def classify(changes: ChangeSet, policy: Policy, withheld: Collection[str]) -> list[Classified]:
    """Exactly one decision per change; deterministic for a given policy and change set."""
    folded: dict[str, list[str]] = {}
    for c in changes:
        folded.setdefault(c.path.casefold(), []).append(c.path)
    out = []
    for c in changes:
        inv = _invariant(c, policy, withheld)
        if inv is not None:
            out.append(Classified(c, Decision.DENY, *inv))
            continue
        decision, rule, reason = Decision.REVIEW, "default", "no rule matches: a person decides"
        is_dir = any(e is not None and e.kind is Kind.DIR for e in (c.before, c.after))
        subject = c.path + "/" if is_dir else c.path  # so "docs/" patterns match the folder itself
        for n, (spec, r) in enumerate(policy.rule_specs):
            if spec.match_file(subject):
                decision, rule, reason = r.action, r.id or f"rules[{n}]", r.reason
                break
        if c.change is ChangeKind.MODE_CHANGED and decision is Decision.AUTO:
            decision, reason = Decision.REVIEW, f"{reason}; mode changes are reviewed"
        twins = [p for p in folded[c.path.casefold()] if p != c.path]
        if twins and decision is Decision.AUTO:
            decision, rule = Decision.REVIEW, "invariant:case-collision"
            reason = f"differs only by case from {twins[0]!r}; a case-insensitive checkout would clash"
        out.append(Classified(c, decision, rule, reason))
    return out
