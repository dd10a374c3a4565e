"""Classification: exactly one decision per change, by deterministic rules. Pure: no I/O.

Built-in invariants come first and no policy can weaken them: they set a floor (`deny` for most,
`review` for a few) that the final decision never goes under. Then the first `[[rules]]` entry
whose patterns match decides; a change no rule matches is `review` ("default"). The final
decision is the stricter of the two (`auto` < `review` < `deny`), and its rule is the one that
set it (the invariant on a tie).

Path invariants compare case-insensitively where a case-insensitive checkout (macOS, Windows)
would make two spellings the same file: `.GIT/config` is `.git/config` there. Withheld and
protected patterns count when any positive pattern matches: a `!negation` cannot unprotect.
Withhold patterns are staging's own matcher (pathmatch.py), so they also match at any depth:
a proposal creating `sub/.ENV` is as denied as `.env`.

Secrets: the caller reads what classify never does (the proposed bytes, the run's redactor) and
hands over, path by path, a `Secret` found in a change's content or in its name. Either is
`deny` (`secret-in-content`, `secret-in-name`) above every other rule: the reason names the
detector or "a value of a withheld file", never the value. A modified file is denied even when
its base held the same value: the base was staged, so no detector fired on it, and a withheld
value that also sits in a staged file is still one the redactor masks wherever it is shown, so
the change could not be reviewed as it is.

What a reviewer might misread is at least `review`: a name with look-alike letters
(`sеtup.py`, Cyrillic е: `confusable-name`), proposed text holding terminal escapes,
bidirectional controls or line-overwriting returns (`hidden-characters`), a created file or
directory that group or others may write (`writable-by-others`), and a created executable
(`executable`).

Directories: a created or deleted directory follows the changes inside it (the strictest of
them), so `mkdir src/pkg` + `src/pkg/a.py` is as `auto` as the file; an empty one goes through
the rules like a file (patterns see `path/`). Mode changes and type changes are at least
`review`. Every directory still gets the path invariants of its own name.
"""

from __future__ import annotations

import stat
import unicodedata
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from airlockd.names import confusable, display, has_hidden
from airlockd.pathmatch import matcher
from airlockd.pipeline.manifest import Change, ChangeKind, ChangeSet, Entry, Kind
from airlockd.policy import POLICY_FILE, Decision, Policy

AGENT_HOMES = (".codex", ".claude")  # and any component starting with ".aider"
# Bidirectional controls reorder what a person reads ("Trojan source"): as bad as a newline.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_SPECIAL = (Kind.FIFO, Kind.SOCKET, Kind.DEVICE)
PATH_MAX = 4096  # Linux: a path the kernel takes in one piece, its final NUL included


@dataclass(frozen=True)
class Classified:
    change: Change
    decision: Decision
    rule: str
    reason: str


WITHHELD_VALUE = "withheld-value"  # Secret.found_by for an exact value of a withheld file


@dataclass(frozen=True)
class Secret:
    """What the caller found in a change: `found_by` is a detector's name (redact.DETECTORS) or
    WITHHELD_VALUE; `in_name` when it is in the path itself rather than the content."""

    found_by: str
    in_name: bool = False

    def describe(self) -> str:
        what = "a value of a withheld file" if self.found_by == WITHHELD_VALUE else f"a {self.found_by} secret"
        where = "the path" if self.in_name else "the proposed content"
        return f"{where} carries {what}"


@dataclass(frozen=True)
class _Verdict:
    decision: Decision
    rule: str
    reason: str


def _deny(rule: str, reason: str) -> _Verdict:
    return _Verdict(Decision.DENY, f"invariant:{rule}", reason)


def _review(rule: str, reason: str) -> _Verdict:
    return _Verdict(Decision.REVIEW, f"invariant:{rule}", reason)


def _stricter(a: _Verdict | None, b: _Verdict) -> _Verdict:
    """The verdict with the higher decision; `a` (the earlier, an invariant) on a tie."""
    return b if a is None or b.decision.rank > a.decision.rank else a


def _secret_verdict(secret: Secret | None) -> _Verdict | None:
    if secret is None:
        return None
    rule = "secret-in-name" if secret.in_name else "secret-in-content"
    return _deny(rule, f"{secret.describe()}; a change carrying a secret never lands")


def _hidden_verdict(what: str) -> _Verdict:
    return _review("hidden-characters", f"the proposed text holds {what}, which can hide what a reviewer sees")


def _name_problem(path: str) -> _Verdict | None:
    if not path or path.startswith("/"):
        return _deny("unsafe-name", "absolute or empty path")
    if any(p in ("", ".", "..") for p in path.split("/")):
        return _deny("unsafe-name", "path climbs out of the workspace or has empty components")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return _deny("unsafe-name", "name is not valid UTF-8")
    size = len(path.encode("utf-8", "surrogateescape"))
    if size >= PATH_MAX:
        return _deny(
            "unsafe-name", f"a path of {size} bytes: longer than any path a workspace can hold ({PATH_MAX - 1})"
        )
    if any(unicodedata.category(ch) == "Cc" or ch in _BIDI for ch in path):
        return _deny("unsafe-name", "name contains a newline, a control or a bidirectional character")
    if not path.isprintable() or has_hidden(path, keep=""):
        return _review("unusual-name", "name contains invisible or unassigned characters")
    return None


class _Classifier:
    def __init__(self, policy: Policy, withheld: Collection[str], known: Iterable[str]) -> None:
        self.policy = policy
        self.withheld = {w.strip("/").casefold() for w in withheld}
        self.withhold = policy.withhold_match  # staging's own matcher: any case, any depth
        self.protected = matcher(policy.defaults.protected_files)
        self.folded: dict[str, set[str]] = {}
        for p in known:
            self.folded.setdefault(fold(p), set()).add(p)

    def invariants(self, c: Change) -> _Verdict | None:
        """The strictest built-in invariant the change meets, or None."""
        floor = _name_problem(c.path)
        if floor is not None and floor.decision is Decision.DENY:
            return floor
        for deny in (self._path_invariant(c), self._node_invariant(c)):
            if deny is not None:
                return deny
        twins = sorted(self.folded.get(fold(c.path), set()) - {c.path})
        if twins:
            floor = _stricter(
                floor,
                _review("case-collision", f"differs only by case from {display(twins[0])!r}"),
            )
        look = confusable(c.path)
        if look is not None:
            floor = _stricter(floor, _review("confusable-name", f"look-alike name: {look}"))
        after = c.after
        if (
            c.change is ChangeKind.CREATED
            and after is not None
            and after.kind in (Kind.FILE, Kind.DIR)
            and after.mode & 0o022
        ):
            floor = _stricter(
                floor,
                _review(
                    "writable-by-others", f"created with mode {after.mode & 0o7777:04o}: group or others may write it"
                ),
            )
        if c.change is ChangeKind.CREATED and after is not None and after.kind is Kind.FILE and after.mode & 0o111:
            floor = _stricter(
                floor, _review("executable", f"a new executable (mode {after.mode & 0o7777:04o}): it runs when invoked")
            )
        if c.change is ChangeKind.MODE_CHANGED:
            floor = _stricter(floor, _review("mode-change", "permission changes are reviewed"))
        if c.change is ChangeKind.TYPE_CHANGED:
            floor = _stricter(floor, _review("type-change", "a path that changed type is reviewed"))
        return floor

    def _path_invariant(self, c: Change) -> _Verdict | None:
        path = c.path
        parts = [p.casefold() for p in path.split("/")]
        is_dir = any(e is not None and e.kind is Kind.DIR for e in (c.before, c.after))
        probe = path + "/" if is_dir else path
        if ".git" in parts:
            return _deny("git-dir", "the repository's .git directory is never writable by an agent")
        if any(p in AGENT_HOMES or p.startswith(".aider") for p in parts):
            return _deny("agent-home", "agent homes (.codex, .claude, .aider*) hold agent state and credentials")
        ancestors = {"/".join(parts[:i]) for i in range(1, len(parts) + 1)}
        if ancestors & self.withheld or self.withhold(probe):
            return _deny("withheld", "withheld paths are never written from a staging copy")
        if path.casefold() == POLICY_FILE:
            return _deny("policy-file", "an agent must never rewrite its own policy")
        if self.protected(probe):
            return _deny("protected-instructions", "instruction files steer future agents")
        return None

    def _node_invariant(self, c: Change) -> _Verdict | None:
        before, after = c.before, c.after
        if after is not None and after.kind is Kind.SYMLINK:
            return _deny("symlink", f"symlink to {display(after.target or '')!r} created or changed")
        if before is not None and before.kind is Kind.SYMLINK:
            return _deny("symlink", "an existing symlink was replaced or removed")
        special = next((e.kind for e in (before, after) if e is not None and e.kind in _SPECIAL), None)
        if special is not None:
            return _deny("special-file", f"{special.value} nodes are never committed")
        if after is not None and _privileged(after):
            return _deny("setuid", "setuid/setgid bits are never committed")
        cap = self.policy.defaults.max_file_bytes
        if after is not None and after.kind is Kind.FILE and after.size > cap:
            return _deny("size-cap", f"{after.size} bytes is over the policy's cap of {cap}")
        if after is not None and after.kind is Kind.FILE and after.sha256 is None:
            return _deny("sparse-file", "a sparse file (mostly holes) is never read, so never committed")
        return None

    def rule(self, c: Change) -> _Verdict:
        is_dir = any(e is not None and e.kind is Kind.DIR for e in (c.before, c.after))
        subject = c.path + "/" if is_dir else c.path  # so "docs/" patterns match the folder itself
        for n, (spec, r) in enumerate(self.policy.rule_specs):
            if spec.match_file(subject):
                return _Verdict(r.action, r.id or f"rules[{n}]", r.reason)
        return _Verdict(Decision.REVIEW, "default", "no rule matches: a person decides")


def fold(path: str) -> str:
    try:
        return unicodedata.normalize("NFC", path).casefold()
    except (UnicodeError, ValueError):  # lone surrogates of an undecodable name
        return path.casefold()


def _privileged(e: Entry) -> bool:
    # setgid on a directory only makes new entries inherit its group (and is inherited itself).
    bits = stat.S_ISUID if e.kind is Kind.DIR else stat.S_ISUID | stat.S_ISGID
    return bool(e.mode & bits)


def _follows_contents(c: Change) -> bool:
    """A directory created or deleted as a whole: its decision follows what is inside."""
    return c.change in (ChangeKind.CREATED, ChangeKind.DELETED) and all(
        e is None or e.kind is Kind.DIR for e in (c.before, c.after)
    )


def classify(
    changes: ChangeSet,
    policy: Policy,
    withheld: Collection[str],
    *,
    base: Collection[str] = (),
    secrets: Mapping[str, Secret] | None = None,
    hidden: Mapping[str, str] | None = None,
) -> list[Classified]:
    """Exactly one decision per change, in the order of `changes`; deterministic for a given
    policy, change set, withheld set, base and secrets.

    `withheld` are the paths staging kept out (a directory covers everything under it); `base`,
    when given, the paths of the staged tree, for case collisions with untouched files;
    `secrets`, the secret the caller found in a change (path -> Secret), each one `deny`;
    `hidden`, what the caller found hiding in a change's proposed text (path -> what: a terminal
    escape, a bidirectional control), each at least `review`. Never
    reads the filesystem; never lets a policy rule lower an invariant's floor."""
    secrets = secrets or {}
    hidden = hidden or {}
    todo = list(changes)
    judge = _Classifier(policy, withheld, [*base, *(c.path for c in todo)])
    verdicts: dict[str, _Verdict] = {}
    inside: dict[str, list[_Verdict]] = {}  # directory -> verdicts of the changes under it
    # Deepest first, so a directory that follows its contents sees their verdicts.
    for c in sorted(todo, key=lambda c: c.path.count("/"), reverse=True):
        floor = _secret_verdict(secrets.get(c.path)) or judge.invariants(c)
        if c.path in hidden and (floor is None or floor.decision is not Decision.DENY):
            floor = _stricter(floor, _hidden_verdict(hidden[c.path]))
        inner = inside.get(c.path, []) if _follows_contents(c) else []
        if floor is not None and floor.decision is Decision.DENY:
            verdict = floor
        elif inner:
            strictest = max(inner, key=lambda v: v.decision.rank)
            what = "created" if c.change is ChangeKind.CREATED else "deleted"
            reason = f"{what} directory: follows the {len(inner)} change(s) inside it, strictest by {strictest.rule}"
            verdict = _stricter(floor, _Verdict(strictest.decision, "directory", reason))
        else:
            verdict = _stricter(floor, judge.rule(c))
        verdicts[c.path] = verdict
        parts = c.path.split("/")
        for i in range(1, len(parts)):
            inside.setdefault("/".join(parts[:i]), []).append(verdict)
    return [Classified(c, *_as_tuple(verdicts[c.path])) for c in todo]


def _as_tuple(v: _Verdict) -> tuple[Decision, str, str]:
    return v.decision, v.rule, v.reason
