"""What a process knows of a fresh repository it wrote (staging/gitcopy.py): each file's index
entry, each directory's tree and its entries in git's order, how often each object is
referenced, the store's contents and the split index; and the walk of a tree's files."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field

from airlockd.pipeline.manifest import Entry
from airlockd.staging.githead import Head, is_git_entry
from airlockd.staging.gitindex import SplitIndex
from airlockd.staging.gitobjects import Pack

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class IndexEntry:
    """One file of the index: the node's `lstat` key, its object id and its index entry bytes."""

    key: tuple[int, int, int, int, int, int]  # ino, mtime_ns, size, st_mode, uid, gid
    oid: bytes
    packed: bytes


def node_key(st: os.stat_result) -> tuple[int, int, int, int, int, int]:
    return (st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode, st.st_uid, st.st_gid)


@dataclass
class RepoState:
    """What a process knows of one repository it wrote: every file's index entry, every tree's
    id, how often each object is referenced, the store's contents, the split index, and the
    identity of the index file it wrote last (which vouches for the rest)."""

    files: dict[str, IndexEntry] = field(default_factory=dict)
    trees: dict[str, bytes] = field(default_factory=dict)  # directory ("" the root) -> tree id
    children: dict[str, set[str]] = field(default_factory=dict)  # directory -> names of entries
    # directory -> its tree's entries, keyed in git's order (a directory's name ends in "/")
    items: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    commit: bytes = b""
    head: Head | None = None  # the HEAD written last
    index_id: tuple[int, int, int] = (0, 0, 0)  # ino, size, mtime_ns of the index written
    manifest: dict[str, Entry] = field(default_factory=dict)  # what the tree's files were, as given
    refs: dict[bytes, int] = field(default_factory=dict)  # object -> references (files, trees, HEAD)
    unreferenced: set[bytes] = field(default_factory=set)  # objects whose count fell to 0 since
    index: SplitIndex = field(default_factory=SplitIndex)
    have: set[bytes] | None = None  # the store's objects, loose ones, packs, dead objects
    loose: set[bytes] = field(default_factory=set)
    packs: dict[str, Pack] = field(default_factory=dict)
    dead: set[bytes] = field(default_factory=set)
    scanned: bool = False  # built by a scan of the whole tree: the store may hold anything else too

    def ref(self, oid: bytes) -> None:
        self.refs[oid] = self.refs.get(oid, 0) + 1

    def unref(self, oid: bytes) -> None:
        n = self.refs.get(oid, 0) - 1
        if n > 0:
            self.refs[oid] = n
        else:
            self.refs.pop(oid, None)
            self.unreferenced.add(oid)

    def set_file(self, rel: str, entry: IndexEntry) -> None:
        self.ref(entry.oid)
        self.files[rel] = entry
        self.index.changed.add(rel)
        parent, _, name = rel.rpartition("/")
        raw = name.encode("utf-8", "surrogateescape")
        mode = entry.key[3]
        kind = b"120000 " if stat.S_ISLNK(mode) else (b"100755 " if mode & stat.S_IXUSR else b"100644 ")
        self.items.setdefault(parent, {})[raw] = kind + raw + b"\0" + entry.oid

    def pop_file(self, rel: str) -> IndexEntry:
        old = self.files.pop(rel)
        self.unref(old.oid)
        self.index.changed.add(rel)
        parent, _, name = rel.rpartition("/")
        self._drop_item(parent, name.encode("utf-8", "surrogateescape"))
        return old

    def set_tree(self, d: str, oid: bytes | None) -> None:
        """Directory `d`'s tree now `oid` (None: gone), its entry in its parent's items too."""
        parent, _, name = d.rpartition("/")
        raw = name.encode("utf-8", "surrogateescape")
        if not d:  # the root: no parent to name it
            if oid is not None:
                self.trees[d] = oid
            else:
                self.trees.pop(d, None)
        elif oid is None:
            self.trees.pop(d, None)
            self._drop_item(parent, raw + b"/")
        else:
            self.trees[d] = oid
            self.items.setdefault(parent, {})[raw + b"/"] = b"40000 " + raw + b"\0" + oid

    def _drop_item(self, parent: str, key: bytes) -> None:
        items = self.items.get(parent)
        if items is not None:
            items.pop(key, None)
            if not items:
                del self.items[parent]


def parent_of(rel: str) -> str:
    return rel.rpartition("/")[0]


def walk_tree(root: int, prefix: str = "") -> Iterator[tuple[str, os.DirEntry[str], int]]:
    """(relative path, entry, its directory's fd) of every file and symlink under directory fd
    `root`, `.git` skipped at every depth (a nested repository is only files here). The fd is
    open while the entry is being handled."""
    stack = [(os.dup(root), prefix)]
    try:
        while stack:
            fd, rel = stack.pop()
            try:
                with os.scandir(fd) as it:
                    entries = list(it)
                for de in entries:
                    if is_git_entry(de.name):
                        continue
                    sub = f"{rel}/{de.name}" if rel else de.name
                    if de.is_dir(follow_symlinks=False):
                        try:
                            stack.append((os.open(de.name, _O_DIR, dir_fd=fd), sub))
                        except OSError:
                            continue
                    elif de.is_file(follow_symlinks=False) or de.is_symlink():
                        yield sub, de, fd
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)


def files_under(state: RepoState, rel: str) -> list[str]:
    """The files of `state` at `rel` or below it."""
    if rel in state.files:
        return [rel]
    if rel not in state.children:
        return []
    out = []
    todo = [rel]
    while todo:
        d = todo.pop()
        for name in state.children.get(d, ()):
            sub = f"{d}/{name}"
            if sub in state.files:
                out.append(sub)
            else:
                todo.append(sub)
    return out


def link_file(children: dict[str, set[str]], rel: str, dirty: set[str] | None = None) -> None:
    """Record `rel` (a file) and its ancestors in the directory index."""
    while True:
        parent, _, name = rel.rpartition("/")
        sibs = children.setdefault(parent, set())
        if dirty is not None:
            dirty.add(parent)
        if name in sibs:
            return
        sibs.add(name)
        if not parent:
            return
        rel = parent


def unlink_file(children: dict[str, set[str]], rel: str, dirty: set[str]) -> None:
    """Forget `rel` (a file) and every ancestor left empty."""
    while True:
        parent, _, name = rel.rpartition("/")
        sibs = children.get(parent)
        dirty.add(parent)
        if sibs is None:
            return
        sibs.discard(name)
        if sibs or not parent:
            return
        del children[parent]
        rel = parent
