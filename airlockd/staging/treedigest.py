"""A Merkle digest of a tree of manifest entries that can be updated in O(changes × depth).

Like git's tree hashing: every directory has a digest, SHA-256 over its children sorted by name,
each child contributing an unambiguous record

    b"N" + u64(len(name)) + name                 name: UTF-8, lone surrogates passed through
    b"E" + u64(len(json)) + json  |  b"-"        the entry's canonical JSON, or no entry
    b"T" + 32-byte digest         |  b"-"        the digest of what is below it, or nothing below

(u64: 8 bytes, big-endian). The root digest (`hexdigest`) is the root directory's and covers
every node. Every field is tagged and length-prefixed or of fixed length, so a directory's byte
stream parses back into exactly one list of children: two different trees cannot give the same
stream, whatever their names hold (a newline, a "/": a name is one path component).

`nodes` map relative POSIX paths ("src/a.py", no leading, trailing or doubled "/") to `Entry`s.
A path's parent directories need not be nodes themselves: a parent absent from `nodes` is an
implicit directory — no entry of its own (`b"-"`), not counted by `len()`, and gone as soon as
nothing is below it. The digest does not rely on kinds to shape the tree: were a file given
nodes below it, they would be hashed below it.

`update` keeps a children index per directory and marks the changed directories and their
ancestors dirty; `hexdigest` recomputes only those, deepest first. The cost is proportional to
the changed paths × depth × fan-out of the touched directories (plus the size of a removed
subtree, which has to be forgotten), never a walk of all nodes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from airlockd.pipeline.manifest import Entry, Kind

SCHEME = "merkle-sha256-v1"

_NONE = b"-"
_EMPTY = hashlib.sha256(b"").digest()


def _name(name: str) -> bytes:
    # injective over every `str` (surrogatepass), unlike surrogateescape: two different names
    # never encode to the same bytes
    return name.encode("utf-8", "surrogatepass")


def _entry_json(entry: Entry) -> bytes:
    """`json.dumps(entry.to_json(), sort_keys=True, separators=(",", ":"))`, ASCII, byte for byte;
    written out for the usual field types (the JSON encoder took most of a from-scratch digest)."""
    kind, mode, size, sha, target = entry.kind, entry.mode, entry.size, entry.sha256, entry.target
    if (
        isinstance(kind, Kind)
        and type(mode) is int
        and type(size) is int
        and (sha is None or (sha.isascii() and sha.isalnum()))
    ):
        out = f'{{"kind":"{kind.value}","mode":{mode}'
        if sha is not None:
            out += f',"sha256":"{sha}"'
        out += f',"size":{size}'
        if target is not None:
            out += f',"target":{json.dumps(target)}'
        return (out + "}").encode("ascii")
    return json.dumps(entry.to_json(), sort_keys=True, separators=(",", ":")).encode("ascii")


def _prefixed(tag: bytes, data: bytes) -> bytes:
    return tag + len(data).to_bytes(8, "big") + data


def _split(path: str) -> tuple[str, str]:
    """(parent, name); the root's path is ""."""
    parent, _, name = path.rpartition("/")
    return parent, name


def _check(path: str) -> None:
    if not path or path.startswith("/") or path.endswith("/") or "//" in path or "\0" in path:
        raise ValueError(f"not a relative path of the tree: {path!r}")


class TreeDigest:
    """Merkle digest of `nodes` (path -> Entry), kept up to date by `update`.

    `recomputed` counts the directory digests computed so far (the root included), for callers
    and tests that want to see what an update cost.
    """

    __slots__ = ("_dirty", "_kids", "_nodes", "_records", "_tree", "recomputed")

    def __init__(self) -> None:
        self._nodes: dict[str, Entry] = {}
        self._kids: dict[str, set[str]] = {}  # directory path ("" = root) -> names of its children
        self._tree: dict[str, bytes] = {}  # directory path -> digest, valid unless in _dirty
        self._records: dict[str, bytes] = {}  # path -> its name and entry fields (computed lazily)
        self._dirty: set[str] = {""}  # closed upwards: a dirty directory's ancestors are dirty
        self.recomputed = 0

    @classmethod
    def of(cls, nodes: Mapping[str, Entry]) -> TreeDigest:
        digest = cls()
        digest.update(nodes)
        return digest

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, path: object) -> bool:
        return path in self._nodes

    def get(self, path: str) -> Entry | None:
        return self._nodes.get(path)

    def copy(self) -> TreeDigest:
        """An independent copy: updating either leaves the other as it was."""
        other = TreeDigest.__new__(TreeDigest)
        other._nodes = dict(self._nodes)
        other._kids = {d: set(names) for d, names in self._kids.items()}
        other._tree = dict(self._tree)
        other._records = dict(self._records)  # bytes are immutable: sharing them is safe
        other._dirty = set(self._dirty)
        other.recomputed = self.recomputed
        return other

    # -- changes ------------------------------------------------------------------------------

    def update(self, changed: Mapping[str, Entry | None]) -> None:
        """Set the given nodes; `None` removes a node and everything under it.

        Applied in sorted path order (a directory before what is below it). Setting a node that
        is not a directory first removes whatever was below that path (a file has no children), so
        `{"a": file_entry}` replaces a directory "a" and its contents with a file, while
        `{"a": file_entry, "a/b": ...}` in one call still sets both.
        """
        for path in sorted(changed):
            _check(path)
            entry = changed[path]
            if entry is None:
                self._remove(path)
            else:
                self._set(path, entry)

    def _set(self, path: str, entry: Entry) -> None:
        if entry.kind is not Kind.DIR and path in self._kids:
            self._drop_below(path)
        old = self._nodes.get(path)
        if old == entry:
            return
        self._nodes[path] = entry
        self._records.pop(path, None)
        if old is None and path not in self._kids:  # a new member of its parent
            self._link(path)
        self._touch(_split(path)[0])

    def _remove(self, path: str) -> None:
        held = path in self._kids  # an implicit directory is a member of its parent too
        if held:
            self._drop_below(path)
        if self._nodes.pop(path, None) is None and not held:
            return  # nothing there
        self._records.pop(path, None)
        self._unlink(path)

    def _link(self, path: str) -> None:
        """Add `path` to its parent's children, creating implicit parents as needed."""
        while True:
            parent, name = _split(path)
            kids = self._kids.get(parent)
            if kids is not None:
                kids.add(name)
                return
            self._kids[parent] = {name}
            if parent == "" or parent in self._nodes:
                return
            path = parent  # an implicit directory that was nothing before: link it too

    def _unlink(self, path: str) -> None:
        """Remove `path` (now neither a node nor holding anything) from its parent; an implicit
        parent left empty goes too."""
        while True:
            parent, name = _split(path)
            kids = self._kids[parent]
            kids.discard(name)
            self._touch(parent)
            if kids or parent == "":
                return
            del self._kids[parent]  # nothing below it any more: no subtree digest
            self._tree.pop(parent, None)
            self._dirty.discard(parent)
            if parent in self._nodes:  # an explicit directory stays, now empty
                self._touch(_split(parent)[0])
                return
            path = parent

    def _drop_below(self, path: str) -> None:
        """Forget everything below `path` (the node at `path` itself stays)."""
        stack = [path]
        while stack:
            d = stack.pop()
            for name in self._kids.pop(d, ()):
                child = f"{d}/{name}"
                self._nodes.pop(child, None)
                self._records.pop(child, None)
                stack.append(child)
            self._tree.pop(d, None)
            self._dirty.discard(d)
        self._touch(_split(path)[0])  # `path` lost its subtree: its record in the parent changed

    def _touch(self, directory: str) -> None:
        """The children of `directory` changed: it and its ancestors need new digests."""
        while directory not in self._dirty:
            self._dirty.add(directory)
            if directory == "":
                return
            directory = _split(directory)[0]

    # -- digest -------------------------------------------------------------------------------

    def hexdigest(self) -> str:
        if self._dirty:
            for d in sorted(self._dirty, key=lambda p: p.count("/") + (p != ""), reverse=True):
                if d in self._kids:
                    self._tree[d] = self._compute(d)
                    self.recomputed += 1
            self._dirty.clear()
        return self._tree.get("", _EMPTY).hex()

    def _compute(self, directory: str) -> bytes:
        parts: list[bytes] = []
        prefix = f"{directory}/" if directory else ""
        nodes, records, trees = self._nodes, self._records, self._tree
        for name in sorted(self._kids[directory]):
            path = prefix + name
            record = records.get(path)
            if record is None:  # name and entry: kept until the node changes
                entry = nodes.get(path)
                record = _prefixed(b"N", _name(name)) + (
                    _NONE if entry is None else _prefixed(b"E", _entry_json(entry))
                )
                if entry is not None:
                    records[path] = record
            parts.append(record)
            sub = trees.get(path)
            parts.append(_NONE if sub is None else b"T" + sub)
        return hashlib.sha256(b"".join(parts)).digest()
