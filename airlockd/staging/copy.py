"""Stage and inspect: the private copy of the live workspace one run works on.

`stage` copies the workspace into a fresh directory, leaving withheld files *absent* (not hidden)
and recording the base manifest while it copies: each file is read once, and that one buffer is
hashed, scanned for secrets and written. `inspect` rescans the copy after the agent ran and diffs
it against that base; it recomputes every hash from the filesystem and trusts nobody's account.

Both walk with directory file descriptors (`openat` and friends, `O_NOFOLLOW` everywhere), so a
symlink is never followed, a directory swapped for a link mid-walk is never entered, and path
length never limits depth.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from airlockd.errors import AirlockError
from airlockd.pipeline.manifest import ChangeSet, Entry, Kind, Manifest, diff, kind_of
from airlockd.policy import Level, Policy
from airlockd.redact import Redactor
from airlockd.staging.fdtree import CHUNK, O_DIR, O_DST, O_SRC, entry_at, open_dir, read_all, walk_fds, write_all
from airlockd.staging.gitcopy import RULE as GIT_RULE
from airlockd.staging.gitcopy import is_git_entry
from airlockd.staging.secretscan import SecretScanner

READ_WHOLE = 8 << 20  # files up to this size are read in one buffer; larger ones stream
REDACT_READ = 1 << 20  # at most this much of a withheld file feeds the redactor
MAX_LINK_HOPS = 40  # like the kernel's ELOOP limit
_PROGRESS_EVERY = 512


class StagingError(AirlockError):
    """The staging copy could not be made or read; nothing partial is used."""

    kind = "staging"


@dataclass(frozen=True)
class Withheld:
    """A path kept out of the copy (or skipped) and the rule that did it, e.g. "withhold:.env",
    "detector:private-key", "label:secret>internal", "symlink-escape", "special-file:fifo"."""

    path: str
    rule: str


@dataclass
class StageResult:
    """What `stage` made: the manifest of the copy (directories included), what it kept out
    (`withheld`) or could not copy (`skipped`), and how many regular files and bytes it wrote."""

    base: Manifest
    withheld: list[Withheld] = field(default_factory=list)
    skipped: list[Withheld] = field(default_factory=list)
    files: int = 0
    bytes: int = 0


def _special(mode: int) -> str:
    return f"special-file:{kind_of(mode).value}"


def os_rule(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "vanished"
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "raced"  # replaced by a link or a non-directory between listing and opening
    return f"unreadable:{errno.errorcode.get(exc.errno or 0, exc.errno)}"


def is_text(data: bytes) -> bool:
    return b"\0" not in data[:8192]


def link_escapes(link: str, target: str, tree: Manifest) -> bool:
    """Whether symlink `link` (a relative path in `tree`) with `target` can resolve outside the
    tree's root. Absolute targets escape. Components that are links in `tree` are followed (with
    the kernel's hop limit); missing ones are taken lexically, so a `..` that would climb above the
    root counts as escaping. Pure: reads `tree`, never the filesystem."""
    if not target or target.startswith("/"):
        return True
    cur = link.split("/")[:-1]
    todo = target.split("/")[::-1]
    hops = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not cur:
                return True
            cur.pop()
            continue
        cur.append(part)
        entry = tree.get("/".join(cur))
        if entry is not None and entry.kind is Kind.SYMLINK:
            hops += 1
            sub = entry.target or ""
            if hops > MAX_LINK_HOPS or not sub or sub.startswith("/"):
                return True
            cur.pop()
            todo.extend(sub.split("/")[::-1])
    return False


class _AnyPattern:
    """Whether any of `patterns` (gitignore style) matches, as one regex search. Negations are
    ignored on purpose: a workspace's "!.env" cannot carve a hole in the default withhold list
    (a workspace may withhold more, never less)."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.spec = pathspec.PathSpec.from_lines("gitignore", [p for p in patterns if not p.startswith("!")])
        self.regex: re.Pattern[str] | None = None
        regexes = [getattr(p, "regex", None) for p in self.spec.patterns if getattr(p, "include", None)]
        if all(isinstance(r, re.Pattern) and isinstance(r.pattern, str) for r in regexes):
            # pathspec names a group in every pattern; one regex cannot repeat a name.
            parts = [re.sub(r"\(\?P<\w+>", "(?:", r.pattern) for r in regexes if r is not None]
            self.regex = re.compile("|".join(f"(?:{x})" for x in parts) or "(?!)")

    def __call__(self, path: str) -> bool:
        if self.regex is not None:
            return self.regex.search(path) is not None
        return bool(self.spec.match_file(path))  # pathspec changed its internals: slower, same

    def which(self, path: str) -> str:
        """The last pattern that matches `path` (the one gitignore would credit)."""
        hits = [p for p in self.spec.patterns if getattr(p, "include", None) and p.match_file(path) is not None]
        return str(getattr(hits[-1], "pattern", "?")) if hits else "?"


class StagingWalk:
    def __init__(
        self,
        policy: Policy,
        clearance: Level,
        owner: tuple[int, int] | None,
        redactor: Redactor | None,
        progress: Callable[[int, int], None] | None,
    ) -> None:
        self.policy = policy
        self.clearance = clearance
        self.owner = owner
        self.redactor = redactor
        self.progress = progress
        self.scanner = SecretScanner(policy.withhold.detectors, [d.detector for d in policy.withhold.custom])
        self.withheld_path = _AnyPattern(policy.withhold.patterns)
        # Only labels above the clearance matter: a path is above it when any of them matches.
        self.above = _AnyPattern(p for p, lvl in policy.labels.items() if lvl.rank > clearance.rank)
        self.result = StageResult(base={})
        self.dirs: dict[str, os.stat_result] = {}  # source stat of every copied directory

    # -- decisions ------------------------------------------------------------------------------

    def _path_rule(self, rel: str, is_dir: bool) -> str | None:
        probe = rel + "/" if is_dir else rel
        if self.withheld_path(probe):
            return f"withhold:{self.withheld_path.which(probe)}"
        if self.above(probe):
            return f"label:{self.policy.label_of(probe).value}>{self.clearance.value}"
        return None

    def _withhold(self, rel: str, rule: str, data: bytes | None = None) -> None:
        self.result.withheld.append(Withheld(rel, rule))
        if self.redactor is not None and data is not None and is_text(data):
            self.redactor.add_file_values(data[:REDACT_READ].decode("utf-8", "replace"))

    def _skip(self, rel: str, rule: str) -> None:
        self.result.skipped.append(Withheld(rel, rule))

    # -- the walk -------------------------------------------------------------------------------

    def run(self, src_root: int, dst_root: int) -> None:
        """Depth first, holding two descriptors per level; a directory's mode, owner and times
        are set once everything inside it is done (so a read-only one is filled first).

        One thread on purpose: handing writes and hashes to a pool of 2-4 threads made the
        benchmark tree (tests/bench) 40-60% slower on 2 cores; the GIL hand-offs cost more than
        the system calls they overlap."""
        self._descend(src_root, dst_root, "")
        self._drop_escaping_links(dst_root)
        if self.progress is not None:
            self.progress(self.result.files, self.result.bytes)

    def _descend(self, src_top: int, dst_top: int, top: str) -> None:
        """Fill the directory `top` (open as `src_top`/`dst_top`, which the caller settles and
        closes) and everything below it."""
        prefix = top + "/" if top else ""
        stack = [(src_top, dst_top, top, iter(self._fill(src_top, dst_top, prefix)))]
        try:
            while stack:
                src, dst, rel, subdirs = stack[-1]
                nxt = next(subdirs, None)
                if nxt is None:
                    stack.pop()
                    if src != src_top:
                        try:
                            self._settle(dst, self.dirs[rel])
                        finally:
                            os.close(src)
                            os.close(dst)
                    continue
                child = self._enter(src, dst, nxt)
                if child is not None:
                    stack.append((*child, nxt, iter(self._fill(*child, nxt + "/"))))
        finally:
            for src, dst, _, _ in stack:
                if src != src_top:
                    os.close(src)
                    os.close(dst)

    def _enter(self, src: int, dst: int, rel: str) -> tuple[int, int] | None:
        name = rel.rpartition("/")[2]
        try:
            child_src = os.open(name, O_DIR, dir_fd=src)
        except OSError as exc:
            self._skip(rel, os_rule(exc))
            return None
        try:
            st = os.fstat(child_src)
            os.mkdir(name, 0o700, dir_fd=dst)
            child_dst = os.open(name, O_DIR, dir_fd=dst)
        except BaseException:
            os.close(child_src)
            raise
        self.result.base[rel] = Entry(Kind.DIR, stat.S_IMODE(st.st_mode))
        self.dirs[rel] = st
        return child_src, child_dst

    def _fill(self, src: int, dst: int, prefix: str) -> list[str]:
        """Copy the non-directory entries of one directory; return its subdirectories to enter."""
        try:
            with os.scandir(src) as it:
                entries = sorted(it, key=lambda de: de.name)
        except OSError as exc:
            self._skip(prefix.rstrip("/"), os_rule(exc))
            return []
        subdirs: list[str] = []
        for de in entries:
            rel = prefix + de.name
            if is_git_entry(de.name):  # history holds every secret ever committed; never read
                self.result.withheld.append(Withheld(rel, GIT_RULE))
                continue
            try:
                is_dir = de.is_dir(follow_symlinks=False)
                rule = self._path_rule(rel, is_dir)
                if is_dir:
                    if rule is not None:
                        self._withhold_tree(src, de.name, rel, rule)
                    else:
                        subdirs.append(rel)
                elif rule is not None:
                    self._withhold(rel, rule, self._peek(src, de.name))
                elif de.is_file(follow_symlinks=False):
                    self._copy_file(src, dst, de.name, rel)
                elif de.is_symlink():
                    self._copy_link(src, dst, de.name, rel)
                else:
                    self._skip(rel, _special(de.stat(follow_symlinks=False).st_mode))
            except FileNotFoundError:
                self._skip(rel, "vanished")
        return subdirs

    def _peek(self, src: int, name: str) -> bytes | None:
        """The first bytes of a withheld regular file, for the redactor only; never copied."""
        if self.redactor is None:
            return None
        try:
            fd = os.open(name, O_SRC, dir_fd=src)
        except OSError:
            return None
        try:
            return os.read(fd, REDACT_READ) if stat.S_ISREG(os.fstat(fd).st_mode) else None
        finally:
            os.close(fd)

    def _withhold_tree(self, src: int, name: str, rel: str, rule: str) -> None:
        """Record a pruned directory; with a redactor, read (never copy) the files under it."""
        self._withhold(rel, rule)
        if self.redactor is None:
            return
        try:
            top = os.open(name, O_DIR, dir_fd=src)
            try:
                for fd, _, de in walk_fds(top):
                    data = self._peek(fd, de.name) if de.is_file(follow_symlinks=False) else None
                    if data is not None and is_text(data):
                        self.redactor.add_file_values(data.decode("utf-8", "replace"))
            finally:
                os.close(top)
        except OSError:
            return  # best effort: the directory stays out of the copy either way

    # -- nodes ----------------------------------------------------------------------------------

    def _copy_link(self, src: int, dst: int, name: str, rel: str) -> None:
        st = os.lstat(name, dir_fd=src)
        target = os.readlink(name, dir_fd=src)
        os.symlink(target, name, dir_fd=dst)
        if self.owner is not None:
            os.chown(name, *self.owner, dir_fd=dst, follow_symlinks=False)
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dst, follow_symlinks=False)
        self.result.base[rel] = Entry(Kind.SYMLINK, stat.S_IMODE(st.st_mode), 0, None, target)

    def _copy_file(self, src: int, dst: int, name: str, rel: str) -> None:
        # Errors reading the source skip the file; errors writing the copy abort the staging.
        try:
            fd = os.open(name, O_SRC, dir_fd=src)
        except OSError as exc:
            self._skip(rel, os_rule(exc))
            return
        try:
            try:
                st = os.fstat(fd)
                whole = stat.S_ISREG(st.st_mode) and st.st_size <= READ_WHOLE
                data = read_all(fd, st.st_size) if whole else b""
            except OSError as exc:
                self._skip(rel, os_rule(exc))
                return
            if not stat.S_ISREG(st.st_mode):
                self._skip(rel, "raced" if stat.S_ISDIR(st.st_mode) else _special(st.st_mode))
                return
            if not whole:
                self._stream(fd, dst, name, rel, st)
                return
        finally:
            os.close(fd)
        hit = self.scanner.first_hit(data)
        if hit is not None:
            self._withhold(rel, f"detector:{hit}", data)
            return
        out = os.open(name, O_DST, 0o600, dir_fd=dst)
        try:
            write_all(out, data)
            self._settle(out, st)
        finally:
            os.close(out)
        self.result.base[rel] = Entry(Kind.FILE, stat.S_IMODE(st.st_mode), len(data), hashlib.sha256(data).hexdigest())
        self._count(len(data))

    def _count(self, size: int) -> None:
        self.result.files += 1
        self.result.bytes += size
        if self.progress is not None and self.result.files % _PROGRESS_EVERY == 0:
            self.progress(self.result.files, self.result.bytes)

    def _stream(self, fd: int, dst: int, name: str, rel: str, st: os.stat_result) -> None:
        """Copy a large file chunk by chunk (hash, scan with overlap, write); on a secret, remove
        the partial copy and withhold it."""
        h = hashlib.sha256()
        size = 0
        tail = b""
        out = os.open(name, O_DST, 0o600, dir_fd=dst)
        try:
            while chunk := os.read(fd, CHUNK):
                window = tail + chunk
                hit = self.scanner.first_hit(window)
                if hit is not None:
                    os.close(out)
                    out = -1
                    os.unlink(name, dir_fd=dst)
                    self._withhold(rel, f"detector:{hit}", window)
                    return
                h.update(chunk)
                write_all(out, chunk)
                size += len(chunk)
                tail = window[-self.scanner.overlap :]
            self._settle(out, st)
        finally:
            if out >= 0:
                os.close(out)
        self.result.base[rel] = Entry(Kind.FILE, stat.S_IMODE(st.st_mode), size, h.hexdigest())
        self._count(size)

    def _settle(self, fd: int, st: os.stat_result) -> None:
        # chown before chmod: chown clears setuid/setgid, and the mode must be kept as is.
        if self.owner is not None:
            os.fchown(fd, *self.owner)
        os.fchmod(fd, stat.S_IMODE(st.st_mode))
        os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))

    # -- after the walk -------------------------------------------------------------------------

    def _drop_escaping_links(self, dst_root: int) -> None:
        """Remove the links that can resolve outside the tree, judged on the finished copy's
        manifest (not the live workspace, which may be changing)."""
        base = self.result.base
        links = [(rel, e.target or "") for rel, e in base.items() if e.kind is Kind.SYMLINK]
        for rel in [rel for rel, target in links if link_escapes(rel, target, base)]:
            parent_rel, _, name = rel.rpartition("/")
            fd = open_dir(dst_root, parent_rel)
            try:
                st = self.dirs.get(parent_rel)
                if st is not None and st.st_mode & 0o300 != 0o300:
                    os.fchmod(fd, 0o700)  # a read-only directory, already settled
                os.unlink(name, dir_fd=fd)
                if st is not None:
                    self._settle(fd, st)
            finally:
                os.close(fd)
            del base[rel]
            self.result.withheld.append(Withheld(rel, "symlink-escape"))


def _open_dest(dest: Path) -> int:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(dest, 0o700)
    except FileExistsError:
        if not dest.is_dir() or dest.is_symlink() or any(dest.iterdir()):
            raise StagingError(
                f"staging destination {dest} exists and is not an empty directory",
                hint="remove it, or stage into a new directory",
            ) from None
    return os.open(dest, O_DIR)


def stage(
    workspace: Path,
    dest: Path,
    policy: Policy,
    clearance: Level,
    *,
    owner: tuple[int, int] | None = None,
    redactor: Redactor | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> StageResult:
    """Copy `workspace` into `dest` (created; must not exist or be empty) for one run.

    Withheld files are absent from the copy: paths matching the policy's withhold patterns,
    files whose content a withhold detector finds a secret in, anything labelled above
    `clearance` (directories that match are pruned whole), and symlinks that can resolve outside
    the workspace. Fifos, sockets and devices are skipped, as are nodes that vanish or change
    type mid-walk. Modes (setuid and exec bits too) and times are kept; with `owner`, every created
    node is chowned to it. With `redactor`, the values of withheld text files are registered
    there and nowhere else. `progress(files, bytes)` is called now and then and at the end.

    Returns the base manifest of the copy as written (hashed from the very bytes written). Never
    follows a symlink, never writes to the workspace, never copies xattrs, ACLs or hard links
    (a hard-linked file becomes independent copies). Raises StagingError when the copy cannot be
    made; what was copied so far stays in `dest` for the caller to discard.
    """
    ws = os.path.realpath(workspace)
    if os.path.commonpath([ws, os.path.realpath(dest)]) == ws:
        raise StagingError(f"staging destination {dest} is inside the workspace {workspace}")
    try:
        src_root = os.open(ws, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise StagingError(f"cannot open workspace {workspace}: {exc.strerror}") from None
    stager = StagingWalk(policy, clearance, owner, redactor, progress)
    try:
        root_st = os.fstat(src_root)
        dst_root = _open_dest(dest)
        try:
            stager.run(src_root, dst_root)
            stager._settle(dst_root, root_st)
        finally:
            os.close(dst_root)
    except OSError as exc:
        raise StagingError(
            f"staging into {dest} failed: {exc}",
            hint="check free space and permissions of the state directory",
        ) from None
    finally:
        os.close(src_root)
    return stager.result


def scan_tree(root: Path) -> Manifest:
    """Manifest of everything under `root`, every hash computed now from the bytes on disk.

    Never follows a symlink and never opens a fifo or device. A node that vanishes during the scan
    is left out; one that cannot be read raises `StagingError` (an unreadable corner is never
    silently taken for an unchanged one)."""
    out: Manifest = {}
    try:
        root_fd = os.open(root, O_DIR)
        try:
            for fd, rel, de in walk_fds(root_fd):
                try:
                    out[rel] = entry_at(fd, de.name, de.stat(follow_symlinks=False))
                except FileNotFoundError:
                    continue
        finally:
            os.close(root_fd)
    except OSError as exc:
        raise StagingError(
            f"cannot read {exc.filename or root} in the staging copy {root}: {exc.strerror}",
            hint="the agent may have changed permissions; the run cannot be inspected",
        ) from None
    return out


def inspect(staging: Path, base: Manifest) -> ChangeSet:
    """The changes from `base` to what is on disk in `staging` now.

    Rescans and rehashes the whole copy; never trusts a hash, a list of changes or anything else
    the agent says."""
    return diff(base, scan_tree(staging))
