"""A run's base tree, asked only about the paths that matter (`base.Base`): `ManifestBase` from a
manifest (the copy stager's `base.json`), `LowerBase` from an overlay run's lower layer itself (its
mirror generation, which stays referenced until inspection is done, and is exactly the base but for
the paths the stager hid)."""

from __future__ import annotations

import bisect
import errno
import os
from collections.abc import Iterable
from pathlib import Path

from airlockd.pipeline.classify import fold
from airlockd.pipeline.manifest import Entry, Kind, Manifest
from airlockd.staging.fdtree import O_DIR, entry_at, open_dir, walk_fds
from airlockd.staging.records import StagingError


def _folds(paths: Iterable[str]) -> set[str]:
    """The folded forms of `paths` and of all their parent directories."""
    out: set[str] = set()
    for p in paths:
        parts = p.split("/")
        out.update(fold("/".join(parts[:i])) for i in range(1, len(parts) + 1))
    return out


class ManifestBase:
    """A base given as a manifest (the copy stager's `base.json`; tests)."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self._keys: list[str] | None = None

    def get(self, rel: str) -> Entry | None:
        return self.manifest.get(rel)

    def below(self, rel: str) -> list[str]:
        if self._keys is None:
            self._keys = sorted(self.manifest)
        keys = self._keys
        if not rel:
            return list(keys)
        prefix = rel + "/"
        out = []
        for i in range(bisect.bisect_left(keys, prefix), len(keys)):
            if not keys[i].startswith(prefix):
                break
            out.append(keys[i])
        return out

    def twins(self, paths: Iterable[str]) -> list[str]:
        want = _folds(paths)
        return sorted(p for p in self.manifest if fold(p) in want) if want else []


_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)
_Trie = dict[str, "_Trie"]


class LowerBase:
    """The base of an overlay run, read from its lower layer (the run's mirror generation, whose
    every node is the base's: content, mode and kind) less the paths `hide()` recorded. Each
    question reads only the nodes it is about, through directory descriptors opened one
    component at a time without following links: a symlinked directory is never entered, so a
    path through one is absent, as in a manifest."""

    def __init__(self, lower: Path, hidden: Iterable[str] = ()) -> None:
        self.lower = lower
        self.hidden = frozenset(hidden)
        self._barren: set[str] = set()  # paths known to have nothing below them in the lower

    def _is_hidden(self, rel: str) -> bool:
        if not self.hidden:
            return False
        parts = rel.split("/")
        return any("/".join(parts[:i]) in self.hidden for i in range(1, len(parts) + 1))

    def _open(self, rel: str) -> int | None:
        """A descriptor of directory `rel` of the lower layer; None when there is none there."""
        try:
            root = os.open(self.lower, O_DIR)
            try:
                return open_dir(root, rel)
            finally:
                os.close(root)
        except OSError as exc:
            if exc.errno in _ABSENT:
                return None
            raise self._error(exc) from None

    def _error(self, exc: OSError) -> StagingError:
        return StagingError(
            f"cannot read {exc.filename or self.lower} in the mirror generation {self.lower}: {exc.strerror}",
            hint="the run's lower layer must stay in place until it is inspected",
        )

    def get(self, rel: str) -> Entry | None:
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts) or self._is_hidden(rel):
            return None
        if any("/".join(parts[:i]) in self._barren for i in range(1, len(parts))):
            return None
        parent, _, name = rel.rpartition("/")
        fd = self._open(parent)
        if fd is None:
            self._barren.add(parent)
            return None
        try:
            entry = entry_at(fd, name, os.stat(name, dir_fd=fd, follow_symlinks=False))
        except OSError as exc:
            if exc.errno not in _ABSENT:
                raise self._error(exc) from None
            self._barren.add(rel)
            return None
        finally:
            os.close(fd)
        if entry.kind is not Kind.DIR:
            self._barren.add(rel)
        return entry

    def below(self, rel: str) -> list[str]:
        parts = rel.split("/") if rel else []
        if any(p in ("", ".", "..") for p in parts):
            return []
        fd = self._open(rel)
        if fd is None:
            return []
        prefix = rel + "/" if rel else ""
        try:
            out = [prefix + sub for _, sub, _ in walk_fds(fd)]
        except OSError as exc:
            raise self._error(exc) from None
        finally:
            os.close(fd)
        return sorted(p for p in out if not self._is_hidden(p))

    def twins(self, paths: Iterable[str]) -> list[str]:
        """Found by descending only the directories along `paths`, matching each name folded:
        O(depth x fan-out), never the whole tree."""
        paths = list(paths)
        want = _folds(paths)
        trie: _Trie = {}  # folded name -> what to look for below it
        for p in paths:
            node = trie
            for part in p.split("/"):
                node = node.setdefault(fold(part), {})
        out: list[str] = []
        root = self._open("") if trie else None
        if root is None:
            return []
        stack: list[tuple[int, str, _Trie]] = [(root, "", trie)]
        try:
            while stack:
                fd, prefix, node = stack.pop()
                try:
                    with os.scandir(fd) as it:
                        hits = [(de.name, de.is_dir(follow_symlinks=False), fold(de.name)) for de in it]
                    for name, is_dir, key in hits:
                        if key not in node:
                            continue
                        rel = prefix + name
                        if fold(rel) in want and not self._is_hidden(rel):
                            out.append(rel)
                        sub = node[key]
                        if not (is_dir and sub):
                            continue
                        try:
                            stack.append((os.open(name, O_DIR, dir_fd=fd), rel + "/", sub))
                        except OSError as exc:
                            if exc.errno not in _ABSENT:
                                raise
                finally:
                    os.close(fd)
        except OSError as exc:
            raise self._error(exc) from None
        finally:
            for fd, _, _ in stack:
                os.close(fd)
        return sorted(out)
