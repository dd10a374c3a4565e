"""A fresh repository of exactly the staged tree, in place of the workspace's real `.git`.

The workspace's `.git` never enters a staging copy (`copy.StagingWalk` withholds every entry
named `.git`, rule `git-history`, without reading it): its objects, packs, reflogs and stashes
hold every secret ever committed. Instead the copy gets a repository of its own: one commit with
no parent whose tree is the staged files (withheld ones absent), on the workspace's branch name
(HEAD read from `.git/HEAD`, or through a `gitdir:` file; a detached HEAD gives a detached
commit; a workspace that is no repository gets no `.git` at all), author and committer
`airlockd <airlockd@localhost>` at a fixed date, so identical trees give identical commits. No
reflogs, no other refs, no remotes, no hooks, a minimal config; the object store holds exactly
the objects reachable from that commit. Everything is owned by the run's owner, so the agent can
`git status`, `git diff`, `git add` and `git commit` as its own uid.

The objects are written here, not by the `git` binary (`git add` of the 20,000-file benchmark
tree takes 7 s; this writer, 1 s): loose objects whose zlib streams are *stored* blocks (no
compression: writing an object costs a copy, and the store about the tree's size), trees and
the commit, and an index (version 2) carrying each file's `lstat` data, so `git status` in the
container trusts it without reading the files (with `core.trustctime=false`: a hard-link clone
of a mirror generation changes every ctime, never a file's inode, mtime or size).

The mirror (staging/mirror.py) keeps its repository in each generation and brings it up to date
on every refresh (`MirrorRepos.refresh`): a file whose node is unchanged keeps its object, the
trees above a change are rewritten, objects no longer reachable are removed. Within a process
that state is kept in memory (vouched for by the index file's identity); another process rebuilds
it from the index on disk. Generations are hard-link clones (`cp -al`): an object file is never
written in place (new objects are new files, dead ones unlinked), and the index, HEAD and the
branch ref are replaced by rename, so a clone never changes under a run that mounts the other.

`ENABLED` is for the benchmark only (tests/bench): staging with and without the repository.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from airlockd.pipeline.manifest import Entry, Kind, Manifest
from airlockd.staging.fdtree import write_all

ENABLED = True  # the benchmark's switch: staging without the fresh repository, for its baseline

DOTGIT = ".git"
RULE = "git-history"
IDENT = b"airlockd <airlockd@localhost> 946684800 +0000"  # 2000-01-01: a fixed, valid date
MESSAGE = b"airlockd: the staged workspace (a fresh repository: no history)\n"
DEFAULT_BRANCH = "main"
CONFIG = (
    b"[core]\n"
    b"\trepositoryformatversion = 0\n"
    b"\tfilemode = true\n"
    b"\tbare = false\n"
    b"\tlogallrefupdates = false\n"
    b"\ttrustctime = false\n"
    b"[gc]\n"
    b"\tauto = 0\n"
)
_HEAD_READ = 4096
_BRANCH = re.compile(r"(?!.*\.\.)(?!.*//)(?!.*@\{)(?![-./])(?!.*[./]$)(?!.*\.lock(?:/|$))[A-Za-z0-9._/+-]{1,200}")
_HEX = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def is_git_entry(name: str) -> bool:
    """Whether a directory entry is a repository's `.git` (a directory, or a `gitdir:` file)."""
    return name == DOTGIT


def is_git_dir(parent_fd: int, name: str) -> bool:
    """Whether directory `name` under `parent_fd` is a repository of git's own layout under
    any other name (a bare clone `backup.git`, a `.jj/repo/store/git`, a moved `.git`): a `HEAD`
    file beside `objects/` and `refs/` directories. Its history is as secret as `.git`'s."""
    try:
        head = os.stat(f"{name}/HEAD", dir_fd=parent_fd, follow_symlinks=False)
        objects = os.stat(f"{name}/objects", dir_fd=parent_fd, follow_symlinks=False)
        refs = os.stat(f"{name}/refs", dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(head.st_mode) and stat.S_ISDIR(objects.st_mode) and stat.S_ISDIR(refs.st_mode)


def git_data(head: bytes) -> str | None:
    """What git history a file holds, by its first bytes: a bundle (`git bundle create`) or a
    packfile; None for anything else."""
    if head.startswith((b"# v2 git bundle\n", b"# v3 git bundle\n")):
        return "bundle"
    if head[:4] == b"PACK" and head[4:8] in (b"\0\0\0\x02", b"\0\0\0\x03"):
        return "packfile"
    return None


# -- the workspace's HEAD -------------------------------------------------------------------------


@dataclass(frozen=True)
class Head:
    """Where the workspace's HEAD is: a branch name, or detached (`branch` None)."""

    branch: str | None


def workspace_head(workspace: Path) -> Head | None:
    """The workspace's HEAD, read from `.git/HEAD` (or the HEAD of the directory a `gitdir:` file
    names); None when the workspace is no repository. A branch name git would not take, or a
    HEAD that cannot be read, is `main`. Reads two small files; never follows `.git` if a link."""
    dotgit = workspace / DOTGIT
    try:
        st = os.lstat(dotgit)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        gitdir = dotgit
    elif stat.S_ISREG(st.st_mode):
        text = _read_small(dotgit)
        if text is None or not text.startswith("gitdir:"):
            return None
        gitdir = workspace / text[len("gitdir:") :].strip()
    else:
        return None
    head = _read_small(gitdir / "HEAD")
    if head is None:
        return Head(DEFAULT_BRANCH)
    head = head.strip()
    if head.startswith("ref: refs/heads/"):
        name = head[len("ref: refs/heads/") :].strip()
        return Head(name if _BRANCH.fullmatch(name) else DEFAULT_BRANCH)
    if _HEX.fullmatch(head):
        return Head(None)
    return Head(DEFAULT_BRANCH)


def _read_small(path: Path) -> str | None:
    try:
        fd = os.open(path, _O_READ)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, _HEAD_READ).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


# -- objects --------------------------------------------------------------------------------------


def object_id(kind: bytes, data: bytes) -> bytes:
    """The git (SHA-1) id of an object, 20 bytes."""
    h = hashlib.sha1(b"%s %d\0" % (kind, len(data)))
    h.update(data)
    return h.digest()


def blob_id(data: bytes) -> str:
    """The git blob id (hex) of `data`, as `git hash-object` gives it."""
    return object_id(b"blob", data).hex()


def stored_zlib(header: bytes, data: bytes) -> list[bytes | memoryview]:
    """`header + data` as a zlib stream of stored (uncompressed) deflate blocks, in pieces."""
    out: list[bytes | memoryview] = [b"\x78\x01", struct.pack("<BHH", 0, len(header), len(header) ^ 0xFFFF), header]
    view = memoryview(data)
    n = len(data)
    if n == 0:
        out.append(b"\x01\x00\x00\xff\xff")
    for i in range(0, n, 0xFFFF):
        chunk = view[i : i + 0xFFFF]
        out.append(struct.pack("<BHH", 1 if i + 0xFFFF >= n else 0, len(chunk), len(chunk) ^ 0xFFFF))
        out.append(chunk)
    out.append(struct.pack(">I", zlib.adler32(data, zlib.adler32(header))))
    return out


class ObjectStore:
    """The loose objects of one repository: written once each (a new file, read-only), removed
    when no longer reachable."""

    def __init__(self, dotgit: Path, owner: tuple[int, int] | None, digests: dict[str, Entry] | None) -> None:
        self.dir = dotgit / "objects"
        self.owner = owner
        self.have: set[bytes] | None = None  # what is on disk (None: not listed yet)
        self.digests = digests  # with a manifest to fill: each written file's entry (copy stager)
        self._fanout: set[str] = set()

    def listing(self) -> set[bytes]:
        if self.have is None:
            have: set[bytes] = set()
            try:
                with os.scandir(self.dir) as it:
                    fans = [de.name for de in it if len(de.name) == 2 and de.is_dir(follow_symlinks=False)]
            except FileNotFoundError:
                fans = []
            for fan in fans:
                self._fanout.add(fan)
                with os.scandir(self.dir / fan) as it:
                    for de in it:
                        if len(de.name) == 38:
                            try:
                                have.add(bytes.fromhex(fan + de.name))
                            except ValueError:
                                continue
            self.have = have
        return self.have

    def put(self, kind: bytes, data: bytes, oid: bytes | None = None) -> bytes:
        oid = oid or object_id(kind, data)
        have = self.listing()
        if oid in have:
            return oid
        hx = oid.hex()
        fan = self.dir / hx[:2]
        if hx[:2] not in self._fanout:
            try:
                os.mkdir(fan, 0o755)
                self._own(fan)
            except FileExistsError:
                pass
            self._fanout.add(hx[:2])
        raw = b"".join(stored_zlib(b"%s %d\0" % (kind, len(data)), data))
        fd = os.open(fan / hx[2:], _O_NEW, 0o444)
        try:
            write_all(fd, raw)
            if self.owner is not None:
                os.fchown(fd, *self.owner)
        finally:
            os.close(fd)
        if self.digests is not None:
            self.digests[f"objects/{hx[:2]}/{hx[2:]}"] = Entry(
                Kind.FILE, 0o444, len(raw), hashlib.sha256(raw).hexdigest()
            )
        have.add(oid)
        return oid

    def keep_only(self, reachable: set[bytes]) -> int:
        """Remove every loose object not in `reachable`; how many went."""
        gone = 0
        for oid in list(self.listing() - reachable):
            hx = oid.hex()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dir / hx[:2] / hx[2:])
            self.listing().discard(oid)
            gone += 1
        return gone

    def _own(self, path: Path) -> None:
        if self.owner is not None:
            os.chown(path, *self.owner, follow_symlinks=False)


# -- the index ------------------------------------------------------------------------------------


@dataclass
class IndexEntry:
    """One file of the index: the node's `lstat` key, its object id and git mode, packed."""

    key: tuple[int, int, int, int, int, int]  # ino, mtime_ns, size, st_mode, uid, gid
    oid: bytes
    packed: bytes


def _git_mode(st_mode: int) -> int:
    if stat.S_ISLNK(st_mode):
        return 0o120000
    return 0o100755 if st_mode & stat.S_IXUSR else 0o100644


def _key(st: os.stat_result) -> tuple[int, int, int, int, int, int]:
    return (st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode, st.st_uid, st.st_gid)


def _pack_entry(name: bytes, st: os.stat_result, oid: bytes) -> bytes:
    m32 = 0xFFFFFFFF
    head = struct.pack(
        ">10I",
        int(st.st_ctime) & m32,
        st.st_ctime_ns % 1_000_000_000,
        int(st.st_mtime) & m32,
        st.st_mtime_ns % 1_000_000_000,
        st.st_dev & m32,
        st.st_ino & m32,
        _git_mode(st.st_mode),
        st.st_uid & m32,
        st.st_gid & m32,
        st.st_size & m32,
    )
    body = head + oid + struct.pack(">H", min(len(name), 0xFFF)) + name
    return body + b"\0" * (8 - len(body) % 8)


def _parse_index(data: bytes) -> dict[str, tuple[bytes, int, int, int, int, int]]:
    """path -> (oid, ino, mtime_ns, size, git mode, uid) of a version 2 index (stage 0 only); an
    index that is not one is empty (everything is then read again)."""
    out: dict[str, tuple[bytes, int, int, int, int, int]] = {}
    if len(data) < 32 or data[:4] != b"DIRC" or hashlib.sha1(data[:-20]).digest() != data[-20:]:
        return out
    version, count = struct.unpack(">II", data[4:12])
    if version != 2:
        return out
    pos = 12
    for _ in range(count):
        f = struct.unpack(">10I", data[pos : pos + 40])
        oid = data[pos + 40 : pos + 60]
        (flags,) = struct.unpack(">H", data[pos + 60 : pos + 62])
        end = data.index(b"\0", pos + 62)
        name = data[pos + 62 : end].decode("utf-8", "surrogateescape")
        if flags & 0x3000 == 0:
            out[name] = (oid, f[5], f[2] * 1_000_000_000 + f[3], f[9], f[6], f[7])
        pos += (62 + (end - pos - 62) + 8) // 8 * 8
    return out


# -- one repository ---------------------------------------------------------------------------------


@dataclass
class RepoState:
    """What a process knows of one repository it wrote: every file's index entry, every tree's
    id, and the identity of the index file it wrote last (which vouches for the rest)."""

    files: dict[str, IndexEntry] = field(default_factory=dict)
    trees: dict[str, bytes] = field(default_factory=dict)  # directory ("" the root) -> tree id
    children: dict[str, set[str]] = field(default_factory=dict)  # directory -> names of entries
    commit: bytes = b""
    index_id: tuple[int, int, int] = (0, 0, 0)  # ino, size, mtime_ns of the index written
    manifest: dict[str, Entry] = field(default_factory=dict)  # what the tree's files were, as given
    objects: set[bytes] | None = None  # the loose objects on disk (exactly the reachable ones)
    order: list[str] | None = None  # the index's order of `files` (None: to sort again)


def _parent(rel: str) -> str:
    return rel.rpartition("/")[0]


def _walk_tree(root: int, prefix: str = "") -> Iterator[tuple[str, os.DirEntry[str]]]:
    """(relative path, entry) of every file and symlink under directory fd `root`, `.git`
    skipped at every depth (a nested repository is only files here)."""
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
                            stack.append(
                                (os.open(de.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd), sub)
                            )
                        except OSError:
                            continue
                    elif de.is_file(follow_symlinks=False) or de.is_symlink():
                        yield sub, de
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)


class Repo:
    """The fresh repository at `root/.git` of the tree at `root`."""

    def __init__(self, root: Path, owner: tuple[int, int] | None, *, manifest: bool = False) -> None:
        self.root = root
        self.dotgit = root / DOTGIT
        self.owner = owner
        self.written: dict[str, Entry] | None = {} if manifest else None
        self.store = ObjectStore(self.dotgit, owner, self.written)

    # -- the whole tree -------------------------------------------------------------------------

    def build(self, head: Head, state: RepoState | None = None, changed: Iterable[str] | None = None) -> RepoState:
        """Write (or bring up to date) the repository of the tree at `root` for `head`. With a
        `state` this process wrote and `changed` (the paths that may differ since), only those
        are looked at; otherwise every node is `lstat`ed and a file whose node the index on disk
        (or `state`) vouches for keeps its object. Returns the state to pass next time."""
        self._skeleton()
        if state is not None and changed is not None:
            self.store.have = state.objects
            self._update(state, changed)
        else:
            state = self._scan(state)
        return state

    def _skeleton(self) -> None:
        new = not self.dotgit.is_dir()
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

    def _scan(self, known: RepoState | None) -> RepoState:
        """A state of every node under `root`, objects reused where the node is unchanged."""
        prev: dict[str, tuple[bytes, tuple[int, int, int, int, int, int]]] = {}
        if known is not None:
            prev = {p: (e.oid, e.key) for p, e in known.files.items()}
        else:
            try:
                raw = (self.dotgit / "index").read_bytes()
            except OSError:
                raw = b""
            for p, (oid, ino, mtime, size, gmode, uid) in _parse_index(raw).items():
                prev[p] = (oid, (ino, mtime, size & 0xFFFFFFFF, gmode, uid, -1))
        state = RepoState()
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for rel, de in _walk_tree(root):
                st = de.stat(follow_symlinks=False)
                self._file(state, rel, st, prev.get(rel), lambda rel=rel: _content(str(self.root / rel)))
        finally:
            os.close(root)
        for rel in state.files:
            _link(state.children, rel)
        self._trees(state, set(state.children) | {""})
        return state

    def _file(
        self,
        state: RepoState,
        rel: str,
        st: os.stat_result,
        prev: tuple[bytes, tuple[int, int, int, int, int, int]] | None,
        read: object,
    ) -> None:
        key = _key(st)
        oid = None
        if prev is not None:
            p_oid, p_key = prev
            if p_key[5] == -1:  # from an index on disk: git mode for st_mode, no gid
                if p_key[:3] == (key[0], key[1], key[2] & 0xFFFFFFFF) and p_key[3] == _git_mode(st.st_mode):
                    oid = p_oid if p_key[4] == st.st_uid else None
            elif p_key == key:
                oid = p_oid
        if oid is None:
            data = read() if callable(read) else b""
            if data is None:
                return  # vanished or unreadable: not in the commit
            oid = self.store.put(b"blob", data)
        state.files[rel] = IndexEntry(key, oid, _pack_entry(rel.encode("utf-8", "surrogateescape"), st, oid))

    def _update(self, state: RepoState, changed: Iterable[str]) -> None:
        """Look again at `changed` paths (each a file, a directory, or gone) only."""
        dirty: set[str] = set()
        before = set(state.files) if state.order is not None else None
        prev: dict[str, tuple[bytes, tuple[int, int, int, int, int, int]]] = {}
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            for rel in sorted(set(changed), key=lambda p: p.count("/")):
                if any(is_git_entry(part) for part in rel.split("/")):
                    continue
                for gone in _under(state, rel):
                    old = state.files.pop(gone)
                    prev[gone] = (old.oid, old.key)
                    _unlink(state.children, gone, dirty)
                dirty.add(_parent(rel))
                try:
                    st = os.stat(rel, dir_fd=root, follow_symlinks=False)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                if stat.S_ISDIR(st.st_mode):
                    try:
                        sub = os.open(rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
                    except OSError:
                        continue
                    try:
                        for path, de in _walk_tree(sub, rel):
                            fst = de.stat(follow_symlinks=False)
                            read = lambda p=path: _content(str(self.root / p))  # noqa: E731
                            self._file(state, path, fst, prev.get(path), read)
                            _link(state.children, path, dirty)
                    finally:
                        os.close(sub)
                elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                    self._file(state, rel, st, prev.get(rel), lambda rel=rel: _content(str(self.root / rel)))
                    _link(state.children, rel, dirty)
        finally:
            os.close(root)
        self._trees(state, dirty)
        if before is None or before != state.files.keys():
            state.order = None

    def _trees(self, state: RepoState, dirty: set[str]) -> None:
        """Recompute the trees of `dirty` directories and all their ancestors, deepest first."""
        todo = set()
        for d in dirty:
            while True:
                todo.add(d)
                if not d:
                    break
                d = _parent(d)
        for d in sorted(todo, key=lambda d: (d.count("/"), d), reverse=True):
            names = state.children.get(d, set())
            items = []
            for name in names:
                rel = f"{d}/{name}" if d else name
                f = state.files.get(rel)
                if f is not None:
                    mode = (
                        b"120000" if stat.S_ISLNK(f.key[3]) else (b"100755" if f.key[3] & stat.S_IXUSR else b"100644")
                    )
                    items.append((name.encode("utf-8", "surrogateescape"), mode, f.oid))
                elif rel in state.trees:
                    items.append((name.encode("utf-8", "surrogateescape") + b"/", b"40000", state.trees[rel]))
            if not items and d:
                state.trees.pop(d, None)
                continue
            items.sort(key=lambda it: it[0])
            data = b"".join(mode + b" " + name.rstrip(b"/") + b"\0" + oid for name, mode, oid in items)
            state.trees[d] = self.store.put(b"tree", data)
        # directories with no file below them: gone from the trees (git keeps no empty directory)
        for d in [d for d in state.trees if d and d not in todo and d not in state.children]:
            del state.trees[d]

    # -- refs, index, pruning -------------------------------------------------------------------

    def commit(self, state: RepoState, head: Head) -> bytes:
        """The commit of `state`'s root tree, HEAD on it, the index written, every object no
        longer reachable removed. Returns the commit id."""
        root_tree = state.trees.get("") or self.store.put(b"tree", b"")
        body = b"tree %s\nauthor %s\ncommitter %s\n\n%s" % (root_tree.hex().encode(), IDENT, IDENT, MESSAGE)
        state.commit = self.store.put(b"commit", body)
        ref = f"refs/heads/{head.branch}" if head.branch else None
        heads = self.dotgit / "refs" / "heads"
        for p in sorted(heads.rglob("*"), reverse=True) if heads.is_dir() else []:
            rel = p.relative_to(self.dotgit).as_posix()
            if rel != ref and not (ref or "").startswith(rel + "/"):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        if ref is not None:
            self._mkdirs(Path(ref).parent)
            self._replace(ref, state.commit.hex().encode() + b"\n")
            self._replace("HEAD", f"ref: {ref}\n".encode())
        else:
            self._replace("HEAD", state.commit.hex().encode() + b"\n")
        for stale in ("packed-refs", "ORIG_HEAD", "FETCH_HEAD", "MERGE_HEAD", "logs", "hooks", "info"):
            p = self.dotgit / stale
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
        if state.order is None or len(state.order) != len(state.files):  # a path came or went
            state.order = sorted(state.files, key=lambda p: p.encode("utf-8", "surrogateescape"))
        entries = [state.files[p].packed for p in state.order]
        body = b"DIRC" + struct.pack(">II", 2, len(entries)) + b"".join(entries)
        self._replace("index", body + hashlib.sha1(body).digest(), mode=0o644)
        ist = os.lstat(self.dotgit / "index")
        state.index_id = (ist.st_ino, ist.st_size, ist.st_mtime_ns)
        reachable = {e.oid for e in state.files.values()} | set(state.trees.values()) | {state.commit}
        if not state.trees:
            reachable.add(root_tree)
        self.store.keep_only(reachable)
        state.objects = self.store.have
        return state.commit

    def _replace(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        """Write `rel` in `.git` by a new file renamed over the old (never in place)."""
        path = self.dotgit / rel
        tmp = path.with_name(path.name + ".airlockd-tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, _O_NEW, mode)
        try:
            os.write(fd, data)
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


def _content(path: str) -> bytes | None:
    """A staged node's content: a file's bytes, a symlink's target."""
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return os.fsencode(os.readlink(path))
        fd = os.open(path, _O_READ)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, max(1 << 20, st.st_size + 1)):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def _under(state: RepoState, rel: str) -> list[str]:
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


def _link(children: dict[str, set[str]], rel: str, dirty: set[str] | None = None) -> None:
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


def _unlink(children: dict[str, set[str]], rel: str, dirty: set[str]) -> None:
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


class MirrorRepos:
    """Each mirror's fresh repository, as this process last wrote it (keyed by the mirror root)."""

    def __init__(self) -> None:
        self._states: dict[str, RepoState] = {}
        self._lock = threading.Lock()

    def refresh(
        self,
        mirror_root: Path,
        tree: Path,
        workspace: Path,
        owner: tuple[int, int] | None,
        base: Manifest | None = None,
    ) -> None:
        """Bring the repository in the mirror generation `tree` up to date with that tree. With
        `base` (the mirror's whole manifest) and a state this process wrote whose index is still
        the one on disk, only the paths whose entries differ are looked at."""
        if not ENABLED:
            return
        head = workspace_head(workspace)
        key = str(mirror_root)
        with self._lock:
            if head is None:
                self._states.pop(key, None)
                if (tree / DOTGIT).is_dir() and not (tree / DOTGIT).is_symlink():
                    shutil.rmtree(tree / DOTGIT)
                return
            repo = Repo(tree, owner)
            state = self._states.pop(key, None)
            changed = None
            if state is not None and base is not None and self._vouched(tree, state):
                changed = _differs(state.manifest, base)
            else:
                state = None
            state = repo.build(head, state, changed)
            repo.commit(state, head)
            state.manifest = dict(base) if base is not None else {}
            self._states[key] = state

    @staticmethod
    def _vouched(tree: Path, state: RepoState) -> bool:
        try:
            st = os.lstat(tree / DOTGIT / "index")
        except OSError:
            return False
        return (st.st_ino, st.st_size, st.st_mtime_ns) == state.index_id

    def forget(self, mirror_root: Path) -> None:
        with self._lock:
            self._states.pop(str(mirror_root), None)


def _differs(old: Manifest, new: Manifest) -> list[str]:
    """The paths whose entries differ between two manifests (same objects are not compared)."""
    out = [rel for rel, e in new.items() if old.get(rel) is not e and old.get(rel) != e]
    out.extend(rel for rel in old.keys() - new.keys())
    return out


MIRRORS = MirrorRepos()
