"""The values in the live workspace's withheld files, read so they can be masked, never kept.

Staging learns them too, but a prompt is stored before staging starts (and possibly in another
process): `learn` fills a process's Redactor first, so the prompt, its errors and its audit
events are masked, and a prompt quoting a withheld value is refused at admission. Only the
Redactor's memory holds them; nothing here writes anywhere.

`learn` walks the whole tree (0.2-0.6 s on 20,000 files). A process that watches the workspace
(the mirror keeper) knows what was withheld at its last refresh and what may have changed since:
`learn_since` reads the same files by looking at those paths alone.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from airlockd.pipeline.manifest import walk
from airlockd.policy import Level, Policy
from airlockd.redact import MASK, Redactor
from airlockd.staging.githead import is_git_entry
from airlockd.staging.records import values_text
from airlockd.staging.secretscan import policy_scanner
from airlockd.staging.watcher import Changes

READ_LIMIT = 1 << 20  # per file, as staging reads them
PRUNE = frozenset({".git", "node_modules", ".venv", "__pycache__"})  # never withheld wholesale; skip for speed

Hit = Callable[[str, bool], bool]  # (relative path, is a directory) -> withheld by a path rule
Target = tuple[str, str]  # (relative path, path to open)


def learn(workspace: Path, policy: Policy, clearance: Level, redactor: Redactor, also: Iterable[str] = ()) -> list[str]:
    """Register the values of every path-withheld text file (by withhold pattern, a label above
    `clearance` or a secret in its name: staging's own path rules) with `redactor`; the relative
    paths read. Copies of these (withheld by identity) hold the same values: not read again.
    `also`: paths staging withheld (recorded with the runs) that these rules cannot find without
    reading every file: withheld for their content, or under a directory this walk skips
    (`node_modules/pkg/.env`); a file, or every file under a directory."""
    targets = _walked(workspace, "", _path_rules(policy, clearance))
    return _read(redactor, targets + _recorded(workspace, also, {rel for rel, _ in targets}))


def learn_since(
    workspace: Path,
    policy: Policy,
    clearance: Level,
    redactor: Redactor,
    withheld: Iterable[str],
    changes: Changes,
    also: Iterable[str] = (),
) -> list[str]:
    """What `learn` reads, found without a walk of the tree: `withheld` are the paths withheld
    when the tree was last known whole (under the same policy and clearance), `changes` what may
    have changed since. A path that did not change is withheld now as it was then, so only the
    changed ones are judged by the path rules, with their folders (a withheld folder counts by
    every file under it); the folders in `changes.trees` are walked as `learn` walks. `withheld`
    and `also` are read as `learn` reads `also`. The relative paths read."""
    hit = _path_rules(policy, clearance)
    targets: dict[str, str] = {}
    for rel in sorted(changes.paths | changes.trees):
        targets.update(_changed(workspace, rel, rel in changes.trees, hit))
    return _read(redactor, [*targets.items(), *_recorded(workspace, [*withheld, *also], set(targets))])


def _path_rules(policy: Policy, clearance: Level) -> Hit:
    withhold = policy.withhold_match
    above = policy.above(clearance)
    names = policy_scanner(policy.withhold)

    def hit(rel: str, is_dir: bool) -> bool:
        probe = rel + "/" if is_dir else rel
        return withhold(probe) or above(probe) or names.first_hit(os.fsencode(rel)) is not None

    return hit


def _walked(workspace: Path, top: str, hit: Hit) -> list[Target]:
    """The files under folder `top` ("" for the whole tree) that a path rule withholds, by their
    own path or a folder's; a folder named in PRUNE is not entered."""
    prefix = top + "/" if top else ""
    withheld_dirs: list[str] = []

    def skip(rel: str, is_dir: bool) -> bool:
        if is_dir and os.path.basename(rel) in PRUNE:
            return True
        if is_dir and hit(prefix + rel, True):
            withheld_dirs.append(prefix + rel)
            return True
        return False

    targets = [
        (prefix + rel, de.path)
        for rel, de in walk(workspace / top, skip)
        if de.is_file(follow_symlinks=False) and hit(prefix + rel, False)
    ]
    for d in withheld_dirs:
        targets.extend(_files_at(workspace, d))
    return targets


def _changed(workspace: Path, rel: str, whole: bool, hit: Hit) -> list[Target]:
    """The files `learn`'s walk reads at `rel`, a path that changed: nothing below a folder the
    walk does not enter (PRUNE, a repository below a withheld folder); below a withheld folder,
    or withheld itself, every file there; else, for a folder that appeared (`whole`), a walk."""
    if rel == "":
        return _walked(workspace, "", hit)
    parts = rel.split("/")
    for i, name in enumerate(parts[:-1]):
        if name in PRUNE:
            return []
        if hit("/".join(parts[: i + 1]), True):
            return [] if any(is_git_entry(p) for p in parts[i + 1 :]) else _files_at(workspace, rel)
    where = workspace / rel
    is_dir = where.is_dir() and not where.is_symlink()
    if is_dir and parts[-1] in PRUNE:
        return []
    if hit(rel, is_dir):
        return _files_at(workspace, rel)
    return _walked(workspace, rel, hit) if is_dir and whole else []


def _recorded(workspace: Path, paths: Iterable[str], seen: set[str]) -> list[Target]:
    """What `paths` (recorded as withheld, masked names matched against the tree) hold now, but
    for what is in `seen` and a repository's history (its lines are no values)."""
    targets: list[Target] = []
    for rel in _unmasked(workspace, paths):
        parts = rel.split("/")
        if rel in seen or rel.startswith("/") or ".." in parts or any(is_git_entry(p) for p in parts):
            continue
        targets.extend(_files_at(workspace, rel))
    return targets


def _read(redactor: Redactor, targets: Iterable[Target]) -> list[str]:
    """Register the values of each target that is a text file (links not followed); the relative
    paths read."""
    read: list[str] = []
    for rel, path in targets:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            data = os.read(fd, READ_LIMIT)
        except OSError:
            continue
        finally:
            os.close(fd)
        text = values_text(data)
        if text is not None:
            redactor.add_file_values(text)
            read.append(rel)
    return read


MATCHES = 64  # paths a masked record may stand for, at most


def _unmasked(workspace: Path, paths: Iterable[str]) -> list[str]:
    """`paths`, each recorded one that is masked (a component held a value: `[REDACTED]/deploy/x`)
    matched against the tree, its mask any text: a component at a time, so only folders that fit
    are listed, and at most MATCHES paths each."""
    out: list[str] = []
    for rel in paths:
        if MASK not in rel:
            out.append(rel)
            continue
        found = [""]
        for part in rel.split("/"):
            if MASK not in part:
                found = [f"{d}/{part}" if d else part for d in found]
                continue
            fits = re.compile(".+".join(re.escape(p) for p in part.split(MASK)), re.DOTALL)
            step: list[str] = []
            for d in found:
                try:
                    names = os.listdir(workspace / d if d else workspace)
                except OSError:
                    continue
                step += [f"{d}/{n}" if d else n for n in names if fits.fullmatch(n)]
            found = step[:MATCHES]
        out += found
    return out


def _files_at(workspace: Path, rel: str) -> list[Target]:
    """`rel` if it is a file, every file under it if it is a folder (not a repository's), else
    nothing; links are not followed."""
    where = workspace / rel
    try:
        mode = os.lstat(where).st_mode
    except OSError:
        return []
    if stat.S_ISREG(mode):
        return [(rel, str(where))]
    if not stat.S_ISDIR(mode):
        return []
    try:
        return [
            (f"{rel}/{sub}", de.path)
            for sub, de in walk(where, lambda sub, is_dir: is_dir and is_git_entry(os.path.basename(sub)))
            if de.is_file(follow_symlinks=False)
        ]
    except OSError:
        return []
