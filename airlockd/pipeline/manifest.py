"""Manifests of a tree (path -> type, mode, size, SHA-256) and the change set between two of them.

Paths are relative, '/'-separated `str`s as `os.fsdecode` gives them: a name that is not UTF-8
keeps its bytes as surrogate escapes, so it round-trips to the filesystem and never crashes the
scan. `names.display()` renders any name safely for people.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


class Kind(StrEnum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    FIFO = "fifo"
    SOCKET = "socket"
    DEVICE = "device"


def kind_of(mode: int) -> Kind:
    if stat.S_ISREG(mode):
        return Kind.FILE
    if stat.S_ISDIR(mode):
        return Kind.DIR
    if stat.S_ISLNK(mode):
        return Kind.SYMLINK
    if stat.S_ISFIFO(mode):
        return Kind.FIFO
    if stat.S_ISSOCK(mode):
        return Kind.SOCKET
    return Kind.DEVICE


@dataclass(frozen=True, slots=True)
class Entry:
    """One node of a tree. `sha256` for files only; `target` for symlinks only."""

    kind: Kind
    mode: int  # permission bits incl. setuid/setgid/sticky (stat.S_IMODE)
    size: int = 0
    sha256: str | None = None
    target: str | None = None

    def same_content(self, other: Entry) -> bool:
        return (
            self.kind == other.kind
            and self.sha256 == other.sha256
            and self.target == other.target
            and self.size == other.size
        )

    def to_json(self) -> dict[str, Any]:
        # what asdict() gave (same keys, same order), built directly: asdict's deep copy made
        # saving a 20,000-entry manifest cost more than refreshing the mirror it describes
        d = {"kind": self.kind, "mode": self.mode, "size": self.size, "sha256": self.sha256, "target": self.target}
        return {k: v for k, v in d.items() if v is not None}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Entry:
        return cls(Kind(d["kind"]), d["mode"], d.get("size", 0), d.get("sha256"), d.get("target"))

    @classmethod
    def from_json_or_none(cls, d: dict[str, Any] | None) -> Entry | None:
        """`from_json`, or None where the record has no node (an absent path)."""
        return cls.from_json(d) if d else None


Manifest = dict[str, Entry]


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def entry_for(path: str | os.PathLike[str], st: os.stat_result | None = None) -> Entry:
    """Entry for one path, never following a symlink."""
    st = st or os.lstat(path)
    kind = kind_of(st.st_mode)
    mode = stat.S_IMODE(st.st_mode)
    if kind is Kind.FILE:
        return Entry(kind, mode, st.st_size, sha256_file(path))
    if kind is Kind.SYMLINK:
        return Entry(kind, mode, 0, None, os.readlink(path))
    return Entry(kind, mode)


def walk(root: Path, skip: Callable[[str, bool], bool] | None = None) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Yield (relative path, DirEntry) for every node under root, depth first, links not followed.

    `skip(rel, is_dir)` prunes a node (and, for a directory, everything below it).
    """
    stack = [("", str(root))]
    while stack:
        rel_dir, abs_dir = stack.pop()
        with os.scandir(abs_dir) as it:
            entries = sorted(it, key=lambda e: e.name)
        for de in entries:
            rel = f"{rel_dir}{de.name}"
            is_dir = de.is_dir(follow_symlinks=False)
            if skip is not None and skip(rel, is_dir):
                continue
            yield rel, de
            if is_dir:
                stack.append((rel + "/", de.path))


def scan(root: Path, skip: Callable[[str, bool], bool] | None = None) -> Manifest:
    """Manifest of everything under `root` (the root itself excluded)."""
    return {rel: entry_for(de.path, de.stat(follow_symlinks=False)) for rel, de in walk(root, skip)}


class ChangeKind(StrEnum):
    CREATED = "created"
    MODIFIED = "modified"
    DELETED = "deleted"
    MODE_CHANGED = "mode_changed"
    TYPE_CHANGED = "type_changed"


@dataclass(frozen=True, slots=True)
class Change:
    path: str
    change: ChangeKind
    before: Entry | None
    after: Entry | None

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "change": self.change.value,
            "before": self.before.to_json() if self.before else None,
            "after": self.after.to_json() if self.after else None,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Change:
        return cls(
            d["path"],
            ChangeKind(d["change"]),
            Entry.from_json_or_none(d.get("before")),
            Entry.from_json_or_none(d.get("after")),
        )


@dataclass(slots=True)
class ChangeSet:
    changes: list[Change] = field(default_factory=list)

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes)

    def __len__(self) -> int:
        return len(self.changes)

    def by_path(self) -> dict[str, Change]:
        return {c.path: c for c in self.changes}


def diff(base: Manifest, after: Manifest) -> ChangeSet:
    """What changed from `base` to `after`. Directories appear only when created, deleted or
    re-typed; a file written back with identical content and mode is no change."""
    out: list[Change] = []
    for path in sorted(base.keys() | after.keys()):
        b, a = base.get(path), after.get(path)
        if b is None and a is not None:
            out.append(Change(path, ChangeKind.CREATED, None, a))
        elif a is None and b is not None:
            out.append(Change(path, ChangeKind.DELETED, b, None))
        elif a is not None and b is not None:
            if a.kind != b.kind:
                out.append(Change(path, ChangeKind.TYPE_CHANGED, b, a))
            elif a.kind is Kind.DIR:
                if a.mode != b.mode:
                    out.append(Change(path, ChangeKind.MODE_CHANGED, b, a))
            elif not a.same_content(b):
                out.append(Change(path, ChangeKind.MODIFIED, b, a))
            elif a.mode != b.mode:
                out.append(Change(path, ChangeKind.MODE_CHANGED, b, a))
    return ChangeSet(out)


def save_manifest(manifest: Manifest, path: Path) -> None:
    import json

    from airlockd.fsutil import atomic_write_bytes

    data = {k: v.to_json() for k, v in manifest.items()}
    atomic_write_bytes(path, json.dumps(data, sort_keys=True).encode())


def load_manifest(path: Path) -> Manifest:
    import json

    return {k: Entry.from_json(v) for k, v in json.loads(path.read_bytes()).items()}
