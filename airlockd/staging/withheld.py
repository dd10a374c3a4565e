"""The values in the live workspace's withheld files, read so they can be masked, never kept.

Staging learns them too, but a prompt is stored before staging starts (and possibly in another
process): `learn` fills a process's Redactor first, so the prompt, its errors and its audit
events are masked, and a prompt quoting a withheld value is refused at admission. Only the
Redactor's memory holds them; nothing here writes anywhere.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from airlockd.pipeline.manifest import walk
from airlockd.policy import Level, Policy
from airlockd.redact import MASK, Redactor
from airlockd.staging.githead import is_git_entry
from airlockd.staging.records import values_text
from airlockd.staging.secretscan import policy_scanner

READ_LIMIT = 1 << 20  # per file, as staging reads them
PRUNE = frozenset({".git", "node_modules", ".venv", "__pycache__"})  # never withheld wholesale; skip for speed


def learn(workspace: Path, policy: Policy, clearance: Level, redactor: Redactor, also: Iterable[str] = ()) -> list[str]:
    """Register the values of every path-withheld text file (by withhold pattern, a label above
    `clearance` or a secret in its name: staging's own path rules) with `redactor`; the relative
    paths read. Copies of these (withheld by identity) hold the same values: not read again.
    `also`: paths staging withheld (recorded with the runs) that these rules cannot find without
    reading every file: withheld for their content, or under a directory this walk skips
    (`node_modules/pkg/.env`); a file, or every file under a directory."""
    withhold = policy.withhold_match
    above = policy.above(clearance)
    names = policy_scanner(policy.withhold)
    withheld_dirs: list[str] = []

    def hit(rel: str, is_dir: bool) -> bool:
        probe = rel + "/" if is_dir else rel
        return withhold(probe) or above(probe) or names.first_hit(os.fsencode(rel)) is not None

    def skip(rel: str, is_dir: bool) -> bool:
        if is_dir and os.path.basename(rel) in PRUNE:
            return True
        if is_dir and hit(rel, True):
            withheld_dirs.append(rel)
            return True
        return False

    read: list[str] = []
    targets = [
        (rel, de.path) for rel, de in walk(workspace, skip) if de.is_file(follow_symlinks=False) and hit(rel, False)
    ]
    for d in withheld_dirs:
        targets.extend((rel_d, de.path) for rel_d, de in _files_under(workspace / d, d))
    seen = {rel for rel, _ in targets}
    for rel in _unmasked(workspace, also):
        parts = rel.split("/")
        if rel in seen or rel.startswith("/") or ".." in parts or any(is_git_entry(p) for p in parts):
            continue  # history is never read (its lines are no values)
        where = workspace / rel
        if where.is_dir() and not where.is_symlink():
            targets.extend((rel_d, de.path) for rel_d, de in _files_under(where, rel))
        else:
            targets.append((rel, str(where)))
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


def _files_under(root: Path, prefix: str) -> list[tuple[str, os.DirEntry[str]]]:
    try:
        return [
            (f"{prefix}/{rel}", de)
            for rel, de in walk(root, lambda rel, is_dir: is_dir and is_git_entry(os.path.basename(rel)))
            if de.is_file(follow_symlinks=False)
        ]
    except OSError:
        return []
