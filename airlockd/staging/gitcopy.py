"""A fresh repository of exactly the staged tree, in place of the workspace's real `.git`.

The workspace's `.git` never enters a staging copy (`copy.StagingWalk` withholds every entry
named `.git`, rule `git-history`, without reading it): its objects, packs, reflogs and stashes
hold every secret ever committed. Instead the copy gets a repository of its own: one commit with
no parent whose tree is the staged files (withheld ones absent), on the workspace's branch name
(HEAD read from `.git/HEAD`, or through a `gitdir:` file; a detached HEAD gives a detached
commit; a workspace that is no repository gets no `.git` at all), author and committer
`airlockd <airlockd@localhost>` at a fixed date, so identical trees give identical commits. No
reflogs, no other refs, no remotes, no hooks, a minimal config; the object store holds the
objects reachable from that commit (and, in a mirror between walks, nothing but earlier versions
of its own staged files: see `mirrorrepo.MirrorRepos.refresh`). Everything is owned by the run's owner, so the agent can
`git status`, `git diff`, `git add` and `git commit` as its own uid.

The objects are written here, not by the `git` binary (`git add` of the 20,000-file benchmark
tree takes 7 s): a cold build puts them in one packfile, each later refresh in a small one
(staging/gitobjects.py; zlib streams of *stored* blocks, no compression: writing an object costs a
copy); the index (staging/gitindex.py) carries each file's `lstat` data, so `git status` in the
container trusts it without reading the files (with `core.trustctime=false`: a hard-link clone
of a mirror generation changes every ctime, never a file's inode, mtime or size).

The mirror (staging/mirror.py) keeps its repository (staging/mirrorrepo.py) in each generation and brings it up to date
on every refresh (`mirrorrepo.MirrorRepos.refresh`): a file whose node is unchanged keeps its object, the
trees above a change are rewritten, a split index records what changed, objects no longer
referenced are marked dead (counted, so a refresh costs what changed, not the tree's size) and
removed by the next purge (see `mirrorrepo.MirrorRepos.refresh`). Within a process that
state is kept in memory (vouched for by the index file's identity); another process rebuilds it
from the index on disk. Generations are hard-link clones (`cp -al`): no file is ever written in
place (new objects and packs are new files, dead ones unlinked; the index, the shared index,
HEAD and the branch ref are new files renamed into place), so a clone never changes under a
run that mounts the other.

`ENABLED` is for the benchmark only (tests/bench): staging with and without the repository.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from airlockd.pipeline.manifest import Entry, Kind, Manifest
from airlockd.staging.fdtree import read_all, write_all
from airlockd.staging.githead import DOTGIT, RULE, Head, git_data, is_git_dir, is_git_entry, workspace_head
from airlockd.staging.gitindex import git_mode, index_file, pack_entry, read_index
from airlockd.staging.gitobjects import ObjectStore, blob_id, object_id, stored_zlib
from airlockd.staging.gitstate import (
    IndexEntry,
    RepoState,
    files_under,
    link_file,
    node_key,
    parent_of,
    unlink_file,
    walk_tree,
)
from airlockd.staging.packer import Packed, Packer

__all__ = [
    "DOTGIT",
    "RULE",
    "Head",
    "blob_id",
    "build_copy",
    "git_data",
    "is_git_dir",
    "is_git_entry",
    "object_id",
    "stored_zlib",
    "workspace_head",
]

ENABLED = True  # the benchmark's switch: staging without the fresh repository, for its baseline

IDENT = b"airlockd <airlockd@localhost> 946684800 +0000"  # 2000-01-01: a fixed, valid date
MESSAGE = b"airlockd: the staged workspace (a fresh repository: no history)\n"
CONFIG = (
    b"[core]\n"
    b"\trepositoryformatversion = 0\n"
    b"\tfilemode = true\n"
    b"\tbare = false\n"
    b"\tlogallrefupdates = false\n"
    b"\ttrustctime = false\n"
    b"[gc]\n"
    b"\tauto = 0\n"
    b"[splitIndex]\n"
    b"\tsharedIndexExpire = never\n"
)
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# -- one repository ---------------------------------------------------------------------------------


class Repo:
    """The fresh repository at `root/.git` of the tree at `root`. `split` writes a split index
    (the mirror's, refreshed often); otherwise the index is written whole (a one-off copy's)."""

    def __init__(
        self, root: Path, owner: tuple[int, int] | None, *, manifest: bool = False, split: bool = False
    ) -> None:
        self.root = root
        self.dotgit = root / DOTGIT
        self.owner = owner
        self.split = split
        self.written: dict[str, Entry] | None = {} if manifest else None
        self.store = ObjectStore(self.dotgit, owner, self.written)

    # -- the whole tree -------------------------------------------------------------------------

    def build(
        self,
        head: Head,
        state: RepoState | None = None,
        changed: Iterable[str] | None = None,
        packer: Packer | None = None,
    ) -> RepoState:
        """Write (or bring up to date) the repository of the tree at `root` for `head`. With a
        `state` this process wrote and `changed` (the paths that may differ since), only those
        are looked at; otherwise every node is `lstat`ed and a file whose node the index on disk
        (or `state`, or the `packer` of a cold build) vouches for keeps its object. Returns the
        state to pass next time."""
        if state is not None and changed is not None and packer is None:
            if state.head is None:
                self._skeleton()
            self.store.adopt(state.have or set(), state.loose, state.packs, state.dead)
            self._update(state, changed)
        else:
            packed = packer.finish() if packer is not None else None
            self._skeleton()
            state = self._scan(state, packed)
        return state

    def _skeleton(self) -> None:
        new = not (self.dotgit / "refs").is_dir()
        for d in (self.dotgit, self.dotgit / "objects", self.dotgit / "refs", self.dotgit / "refs" / "heads"):
            try:
                os.mkdir(d, 0o755)
                self._own(d)
            except FileExistsError:
                if not d.is_dir() or d.is_symlink():
                    raise
        if new:
            (self.dotgit / "refs" / "tags").mkdir(mode=0o755)
            self._own(self.dotgit / "refs" / "tags")
        self._replace("config", CONFIG)

    def _scan(self, known: RepoState | None, packed: dict[str, Packed] | None = None) -> RepoState:
        """A state of every node under `root`, objects reused where the node is unchanged (or
        is the one `packed` read); the objects written go into one new pack."""
        prev: dict[str, tuple[bytes, tuple[int, int, int, int, int, int]]] = {}
        if known is not None:
            prev = {p: (e.oid, e.key) for p, e in known.files.items()}
        else:
            for p, (oid, ino, mtime, size, gmode, uid) in read_index(str(self.dotgit)).items():
                prev[p] = (oid, (ino, mtime, size & 0xFFFFFFFF, gmode, uid, -1))
        state = RepoState(scanned=True)
        self.store.begin_pack()
        try:
            root = os.open(self.root, _O_DIR)
            try:
                for rel, de, fd in walk_tree(root):
                    st = de.stat(follow_symlinks=False)
                    got = packed.get(rel) if packed else None
                    same = got is not None and got[1:] == (st.st_size, st.st_ino, st.st_mtime_ns)
                    if got is not None and same and stat.S_ISREG(st.st_mode):
                        state.set_file(rel, IndexEntry(node_key(st), got[0], pack_entry(_name(rel), st, got[0])))
                        continue
                    self._file(state, rel, st, prev.get(rel), _reader(fd, de.name))
            finally:
                os.close(root)
            for rel in state.files:
                link_file(state.children, rel)
            self._trees(state, set(state.children) | {""})
        except BaseException:
            self.store.abandon()
            raise
        return state  # the pack is finished by `commit`, with the commit in it

    def _file(
        self,
        state: RepoState,
        rel: str,
        st: os.stat_result,
        prev: tuple[bytes, tuple[int, int, int, int, int, int]] | None,
        read: Callable[[], bytes | None],
    ) -> None:
        key = node_key(st)
        oid = None
        if prev is not None:
            p_oid, p_key = prev
            if p_key[5] == -1:  # from an index on disk: git mode for st_mode, no gid
                if p_key[:3] == (key[0], key[1], key[2] & 0xFFFFFFFF) and p_key[3] == git_mode(st.st_mode):
                    oid = p_oid if p_key[4] == st.st_uid and p_oid in self.store.listing() else None
            elif p_key == key:
                oid = p_oid
        if oid is None:
            data = read()
            if data is None:
                return  # vanished or unreadable: not in the commit
            oid = self.store.put(b"blob", data)
        state.set_file(rel, IndexEntry(key, oid, pack_entry(_name(rel), st, oid)))

    def _update(self, state: RepoState, changed: Iterable[str]) -> None:
        """Look again at `changed` paths (each a file, a directory, or gone) only."""
        dirty: set[str] = set()
        prev: dict[str, tuple[bytes, tuple[int, int, int, int, int, int]]] = {}
        root = os.open(self.root, _O_DIR)
        try:
            for rel in sorted(set(changed), key=lambda p: p.count("/")):
                if any(is_git_entry(part) for part in rel.split("/")):
                    continue
                for gone in files_under(state, rel):
                    old = state.pop_file(gone)
                    prev[gone] = (old.oid, old.key)
                    unlink_file(state.children, gone, dirty)
                dirty.add(parent_of(rel))
                try:
                    st = os.stat(rel, dir_fd=root, follow_symlinks=False)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                if stat.S_ISDIR(st.st_mode):
                    try:
                        sub = os.open(rel, _O_DIR, dir_fd=root)
                    except OSError:
                        continue
                    try:
                        for path, de, fd in walk_tree(sub, rel):
                            fst = de.stat(follow_symlinks=False)
                            self._file(state, path, fst, prev.get(path), _reader(fd, de.name))
                            link_file(state.children, path, dirty)
                    finally:
                        os.close(sub)
                elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                    self._file(state, rel, st, prev.get(rel), _reader(root, rel))
                    link_file(state.children, rel, dirty)
        finally:
            os.close(root)
        self._trees(state, dirty)

    def _trees(self, state: RepoState, dirty: set[str]) -> None:
        """Recompute the trees of `dirty` directories and all their ancestors, deepest first."""
        todo = set()
        for d in dirty:
            while True:
                todo.add(d)
                if not d:
                    break
                d = parent_of(d)
        for d in sorted(todo, key=lambda d: (d.count("/"), d), reverse=True):
            items = state.items.get(d)
            old = state.trees.get(d)
            if not items and d:  # no file below it any more: git keeps no empty directory
                if old is not None:
                    state.set_tree(d, None)
                    state.unref(old)
                continue
            data = b"".join([items[k] for k in sorted(items)]) if items else b""
            new = self.store.put(b"tree", data)
            if new != old:
                state.ref(new)
                if old is not None:
                    state.unref(old)
                state.set_tree(d, new)

    # -- refs, index, pruning -------------------------------------------------------------------

    def commit(self, state: RepoState, head: Head) -> bytes:
        """The commit of `state`'s root tree, HEAD on it, the index written, every object no
        longer reachable marked dead (removed at the next purge). Returns the
        commit id."""
        root_tree = state.trees.get("")
        if root_tree is None:
            root_tree = self.store.put(b"tree", b"")
            if root_tree not in state.refs:
                state.ref(root_tree)  # the empty tree of an empty workspace: HEAD's
        body = b"tree %s\nauthor %s\ncommitter %s\n\n%s" % (root_tree.hex().encode(), IDENT, IDENT, MESSAGE)
        commit = self.store.put(b"commit", body)
        if commit != state.commit:
            state.ref(commit)
            if state.commit:
                state.unref(state.commit)
        moved = commit != state.commit or head != state.head
        state.commit = commit
        ref = f"refs/heads/{head.branch}" if head.branch else None
        if head != state.head:
            self._clear_refs(ref)
        if moved:
            if ref is not None:
                if head != state.head:
                    self._mkdirs(Path(ref).parent)
                self._replace(ref, commit.hex().encode() + b"\n")
                if head != state.head:
                    self._replace("HEAD", f"ref: {ref}\n".encode())
            else:
                self._replace("HEAD", commit.hex().encode() + b"\n")
        state.head = head
        if self.split:
            if state.index.changed or not state.index.shared_id:
                files = state.files
                state.index.write(
                    str(self.dotgit),
                    lambda p: e.packed if (e := files.get(p)) is not None else None,
                    lambda: {p: e.packed for p, e in files.items()},
                    self.owner,
                )
            ist = os.lstat(self.dotgit / "index")
            state.index_id = (ist.st_ino, ist.st_size, ist.st_mtime_ns)
        else:
            names = sorted(state.files, key=lambda p: p.encode("utf-8", "surrogateescape"))
            self._replace("index", index_file(state.files[p].packed for p in names))
            state.index.changed = set()
        if state.scanned:
            self.store.keep_only(set(state.refs))
            state.scanned = False
        else:
            self.store.remove([oid for oid in state.unreferenced if oid not in state.refs])
        state.unreferenced = set()
        self.store.end_pack()
        self._keep(state)
        return commit

    def _keep(self, state: RepoState) -> None:
        state.have, state.loose, state.packs, state.dead = (
            self.store.have,
            self.store.loose,
            self.store.packs,
            self.store.dead,
        )

    def purge(self, state: RepoState, *, small_only: bool = False) -> int:
        """The dead objects removed, the small packs joined (see MirrorRepos.refresh)."""
        gone = self.store.purge(small_only=small_only)
        self._keep(state)
        return gone

    def _clear_refs(self, ref: str | None) -> None:
        """Every ref but `ref` removed, and every file of a repository's history (a `.git`
        another process left, or one this process finds for the first time)."""
        heads = self.dotgit / "refs" / "heads"
        for p in sorted(heads.rglob("*"), reverse=True) if heads.is_dir() else []:
            rel = p.relative_to(self.dotgit).as_posix()
            if rel != ref and not (ref or "").startswith(rel + "/"):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        for stale in ("packed-refs", "ORIG_HEAD", "FETCH_HEAD", "MERGE_HEAD", "logs", "hooks", "info"):
            p = self.dotgit / stale
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()

    def _replace(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        """Write `rel` in `.git` by a new file renamed over the old (never in place)."""
        path = self.dotgit / rel
        tmp = path.with_name(path.name + ".airlockd-tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, _O_NEW, mode)
        try:
            write_all(fd, data)
            if self.owner is not None:
                os.fchown(fd, *self.owner)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if self.written is not None:
            self.written[rel] = Entry(Kind.FILE, mode, len(data), hashlib.sha256(data).hexdigest())

    def _mkdirs(self, rel: Path) -> None:
        cur = self.dotgit
        for part in rel.parts:
            cur = cur / part
            try:
                os.mkdir(cur, 0o755)
                self._own(cur)
            except FileExistsError:
                pass

    def _own(self, path: Path) -> None:
        if self.owner is not None:
            os.chown(path, *self.owner, follow_symlinks=False)

    def manifest(self) -> Manifest:
        """Every node of the `.git` written (paths under `.git/`), for a copy's base manifest."""
        out: Manifest = {DOTGIT: Entry(Kind.DIR, 0o755)}
        for dirpath, dirnames, _ in os.walk(self.dotgit):
            for d in dirnames:
                rel = (Path(dirpath) / d).relative_to(self.root).as_posix()
                out[rel] = Entry(Kind.DIR, stat.S_IMODE(os.lstat(self.root / rel).st_mode))
        for rel, e in (self.written or {}).items():
            out[f"{DOTGIT}/{rel}"] = e
        return out


def _name(rel: str) -> bytes:
    return rel.encode("utf-8", "surrogateescape")


def _reader(dir_fd: int, name: str) -> Callable[[], bytes | None]:
    return lambda: _content_at(dir_fd, name)


def _content_at(dir_fd: int, name: str) -> bytes | None:
    """A staged node's content: a file's bytes, a symlink's target (`name` under `dir_fd`)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            return os.fsencode(os.readlink(name, dir_fd=dir_fd))
        fd = os.open(name, _O_READ, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return read_all(fd, st.st_size)
    except OSError:
        return None
    finally:
        os.close(fd)


# -- the stagers' entry points ------------------------------------------------------------------


def build_copy(staging: Path, workspace: Path, owner: tuple[int, int] | None) -> Manifest:
    """The fresh repository of a full staging copy (after every file that stays out is out);
    returns the manifest of the `.git` written (empty when the workspace is no repository)."""
    if not ENABLED:
        return {}
    head = workspace_head(workspace)
    if head is None:
        return {}
    repo = Repo(staging, owner, manifest=True)
    state = repo.build(head)
    repo.commit(state, head)
    return repo.manifest()
