"""Stage: the private copy of the live workspace one run works on.

`stage` copies the workspace into a fresh directory, leaving withheld files *absent* (not hidden)
and recording the base manifest while it copies: each file is read once, and that one buffer is
hashed, scanned for secrets and written. What it records, and the rules it names, are
staging/records.py; reading the copy back after the agent ran is staging/readback.py.

The walk uses directory file descriptors (`openat` and friends, `O_NOFOLLOW` everywhere), so a
symlink is never followed, a directory swapped for a link mid-walk is never entered, and path
length never limits depth.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

from airlockd.pipeline.manifest import Entry, Kind
from airlockd.policy import Level, Policy
from airlockd.redact import Redactor
from airlockd.staging.archiveformats import sniff
from airlockd.staging.archives import MIN_IDENTITY as MIN_SOLID
from airlockd.staging.archives import ArchiveScan, ArchiveScanner
from airlockd.staging.fdtree import CHUNK, O_DIR, O_DST, O_SRC, open_dir, read_all, walk_fds, write_all
from airlockd.staging.gitcopy import RULE as GIT_RULE
from airlockd.staging.gitcopy import git_data, is_git_dir, is_git_entry
from airlockd.staging.records import (
    IN_NAME,
    VALUE_IN_NAME,
    Ident,
    StageResult,
    StagingError,
    Withheld,
    identity_of,
    link_escapes,
    os_rule,
    special_rule,
    values_text,
)
from airlockd.staging.secretscan import policy_scanner

READ_WHOLE = 8 << 20  # files up to this size are read in one buffer; larger ones stream
REDACT_READ = 1 << 20  # at most this much of a withheld file feeds the redactor
_PROGRESS_EVERY = 512
_O_COPY = (O_DST & ~os.O_WRONLY) | os.O_RDWR  # a streamed copy is read back (archives)
_PLAIN = Redactor()  # the detectors' patterns, for a walk given no redactor


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
        self.scanner = policy_scanner(policy.withhold)
        self.withheld_path = policy.withhold_match
        # Only labels above the clearance matter: a path is above it when any of them matches.
        self.above = policy.above(clearance)
        self.archives = ArchiveScanner(
            self._judge_member,
            self.scanner,
            self._mask,
            max_bytes=policy.withhold.archive_scan_mb << 20,
            max_members=policy.withhold.archive_max_members,
        )
        self.result = StageResult(base={})
        self.dirs: dict[str, os.stat_result] = {}  # source stat of every copied directory
        self.linked: dict[str, tuple[int, int]] = {}  # staged files with other links: their node
        self.members: dict[str, dict[str, str]] = {}  # staged archives: member sha256 -> member path

    # -- decisions ------------------------------------------------------------------------------

    rules: dict[tuple[str, bool], str | None] | None = None  # a keeper's verdicts on paths, kept

    def _path_rule(self, rel: str, is_dir: bool) -> str | None:
        """The rule that keeps a path of the tree out, or None (a verdict rests on the path and
        the policy alone: a keeper keeps them across refreshes, under one policy digest; whether
        it carries a withheld value is judged each time, on the values known then)."""
        rules = self.rules
        if rules is None:
            rule = self._judge_path(rel, is_dir)
        else:
            key = (rel, is_dir)
            if key not in rules:
                rules[key] = self._judge_path(rel, is_dir)
            rule = rules[key]
        if rule is None and rel not in self._no_values and self._carries_value(rel):
            return VALUE_IN_NAME
        return rule

    def _carries_value(self, rel: str) -> bool:
        return self.redactor is not None and self.redactor.names_known > 0 and self.redactor.in_name(rel)

    def _target_rule(self, src: int, name: str) -> str | None:
        """The rule that keeps a symlink out for its target (the agent reads it with readlink, and
        records hold it): a secret a detector finds there, or a withheld value it carries."""
        target = os.readlink(name, dir_fd=src)
        hit = self.scanner.first_hit(os.fsencode(target))
        if hit is not None:
            return f"{IN_NAME}{hit}"
        return VALUE_IN_NAME if self._carries_value(target) else None

    def _judge_member(self, rel: str, is_dir: bool) -> str | None:
        """An archive member's path, judged as a tree's."""
        rule = self._judge_path(rel, is_dir)
        return VALUE_IN_NAME if rule is None and self._carries_value(rel) else rule

    def _judge_path(self, rel: str, is_dir: bool) -> str | None:
        probe = rel + "/" if is_dir else rel
        if self.withheld_path(probe):
            return f"withhold:{self.withheld_path.which(probe)}"
        if self.above(probe):
            return f"label:{self.policy.label_of(probe).value}>{self.clearance.value}"
        if rel in self._clean_names:
            return None
        hit = self.scanner.first_hit(os.fsencode(rel))
        if hit is not None:
            return f"{IN_NAME}{hit}"
        return None

    _clean_names: frozenset[str] = frozenset()  # the current directory's paths, when none holds a secret
    _no_values: frozenset[str] = frozenset()  # the same, when none carries a withheld value

    def _names_without_secrets(self, rels: list[str]) -> frozenset[str]:
        """`rels` (one directory's entries) when the detectors find nothing in them all, one per
        line: one scan per directory instead of one per name. A name a detector fires on makes
        the scan fire too (every built-in detector that matches a string matches a text holding
        it as a line: their anchors are `\b`, lookarounds on word characters and multi-line `^`),
        so only then is each name scanned alone. A workspace's own detectors may anchor anywhere:
        with any, every name is scanned alone."""
        if not rels or self.policy.withhold.custom:
            return frozenset()
        if self.scanner.first_hit(os.fsencode("\n".join(rels))) is not None:
            return frozenset()
        return frozenset(rels)

    def _mask(self, path: str) -> str:
        return (self.redactor or _PLAIN).text(path)

    def _shown(self, rel: str, rule: str | None = None) -> str:
        """`rel` as records show it: masked when a detector fires on the name (the withheld list
        is stored, audited and shown; a secret in a name must not be)."""
        if rule is not None and not rule.startswith(IN_NAME):
            return rel
        if rule is None and self.scanner.first_hit(os.fsencode(rel)) is None and not self._carries_value(rel):
            return rel
        return self._mask(rel)

    def _withhold(self, rel: str, rule: str, data: bytes | None = None) -> None:
        self.result.withheld.append(Withheld(rel, rule))
        text = values_text(data[:REDACT_READ]) if self.redactor is not None and data is not None else None
        if self.redactor is not None and text is not None:
            self.redactor.add_file_values(text)

    def _skip(self, rel: str, rule: str) -> None:
        self.result.skipped.append(Withheld(rel, rule))

    # -- the walk -------------------------------------------------------------------------------

    def run(self, src_root: int, dst_root: int) -> None:
        """Depth first, holding two descriptors per level; a directory's mode, owner and times
        are set once everything inside it is done (so a read-only one is filled first). Then,
        on the finished manifest: links that escape, and copies of withheld files, go.

        One thread on purpose: handing writes and hashes to a pool of 2-4 threads made the
        benchmark tree (tests/bench) 40-60% slower on 2 cores; the GIL hand-offs cost more than
        the system calls they overlap."""
        known = self.redactor.names_known if self.redactor is not None else 0
        self._descend(src_root, dst_root, "")
        self._drop_escaping_links(dst_root)
        self.drop_identity_copies(dst_root, self.result.base, self.result.ids)
        if self.redactor is not None and self.redactor.names_known > known:
            self.drop_names_with_values(dst_root, list(self.result.base))
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
        rels = [prefix + de.name for de in entries]
        self._clean_names = self._names_without_secrets(rels)
        self._no_values = frozenset(rels) if not rels or not self._carries_value("\n".join(rels)) else frozenset()
        for de in entries:
            rel = prefix + de.name
            if is_git_entry(de.name):  # history holds every secret ever committed; never read
                self.result.withheld.append(Withheld(rel, GIT_RULE))
                continue
            try:
                is_dir = de.is_dir(follow_symlinks=False)
                rule = self._path_rule(rel, is_dir)
                if is_dir and rule is None and is_git_dir(src, de.name):
                    rule = GIT_RULE  # a repository under another name: its history, as .git's
                if is_dir:
                    if rule is not None:
                        self._withhold_tree(src, de.name, rel, rule)
                    else:
                        subdirs.append(rel)
                elif rule is not None:
                    self._withhold_file(src, de.name, rel, rule)
                elif de.is_file(follow_symlinks=False):
                    self._copy_file(src, dst, de.name, rel)
                elif de.is_symlink():
                    rule = self._target_rule(src, de.name)
                    if rule is None:
                        self._copy_link(src, dst, de.name, rel)
                    else:
                        self._withhold(self._shown(rel, rule), rule)
                else:
                    self._skip(rel, special_rule(de.stat(follow_symlinks=False).st_mode))
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

    def identify(self, src: int, name: str, top: str, path: str) -> tuple[Ident | None, bytes | None]:
        """Read a withheld file (never copied) for its identity and, with a redactor, its first
        bytes; (None, None) when it is not a regular file or cannot be read."""
        try:
            fd = os.open(name, O_SRC, dir_fd=src)
        except OSError:
            return None, None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, None
            h = hashlib.sha256()
            head = b""
            size = 0
            solid = False
            while chunk := os.read(fd, CHUNK):
                h.update(chunk)
                size += len(chunk)
                solid = solid or bool(chunk.strip())
                if len(head) < REDACT_READ:
                    head += chunk[: REDACT_READ - len(head)]
        except OSError:
            return None, None
        finally:
            os.close(fd)
        sha = h.hexdigest() if solid and size >= MIN_SOLID else None
        stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns) if st.st_nlink > 1 else None
        return Ident(top, path, (st.st_dev, st.st_ino), sha, stamp), head if self.redactor is not None else None

    def _withhold_file(self, src: int, name: str, rel: str, rule: str) -> None:
        shown = self._shown(rel, rule)
        ident, head = self.identify(src, name, shown, shown)
        if ident is not None:
            self.result.ids.append(ident)
        self._withhold(shown, rule, head)

    def _withhold_tree(self, src: int, name: str, rel: str, rule: str) -> None:
        """Record a pruned directory; read (never copy) the files under it for their identities
        and, with a redactor, their values."""
        shown = self._shown(rel, rule)
        self._withhold(shown, rule)
        try:
            top = os.open(name, O_DIR, dir_fd=src)
            try:
                for fd, sub, de in walk_fds(top):
                    if not de.is_file(follow_symlinks=False):
                        continue
                    ident, head = self.identify(fd, de.name, shown, self._shown(f"{rel}/{sub}"))
                    if ident is not None:
                        self.result.ids.append(ident)
                    text = values_text(head) if self.redactor is not None and head is not None else None
                    if self.redactor is not None and text is not None:
                        self.redactor.add_file_values(text)
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

    def note_node(self, rel: str, st: os.stat_result) -> None:
        """Remember a staged file's node when it has other links (one may be a withheld file)."""
        if st.st_nlink > 1:
            self.linked[rel] = (st.st_dev, st.st_ino)

    def archive_verdict(self, rel: str, data: bytes) -> str | None:
        """The archive rule that withholds `data` (a whole file), or None; a scanned archive's
        member hashes are kept for the identity pass. A git bundle or packfile is history."""
        if (kind := git_data(data[:16])) is not None:
            return f"{GIT_RULE}:{kind}"
        if sniff(data) is None:
            return None
        return self._kept(rel, self.archives.scan_bytes(data))

    def _kept(self, rel: str, scan: ArchiveScan | None) -> str | None:
        if scan is None:
            return None
        if scan.rule is None and scan.members:
            self.members[rel] = scan.members
        return scan.rule

    def archive_verdict_fd(self, rel: str, fd: int) -> str | None:
        """As `archive_verdict`, for a big file read back from the copy open as `fd`."""
        if (kind := git_data(os.pread(fd, 16, 0))) is not None:
            return f"{GIT_RULE}:{kind}"
        return self._kept(rel, self.archives.scan_fd(fd))

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
                self._skip(rel, "raced" if stat.S_ISDIR(st.st_mode) else special_rule(st.st_mode))
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
        verdict = self.archive_verdict(rel, data)
        if verdict is not None:
            self._withhold(rel, verdict)
            return
        out = os.open(name, O_DST, 0o600, dir_fd=dst)
        try:
            write_all(out, data)
            self._settle(out, st)
        finally:
            os.close(out)
        self.note_node(rel, st)
        self.result.base[rel] = Entry(Kind.FILE, stat.S_IMODE(st.st_mode), len(data), hashlib.sha256(data).hexdigest())
        self._count(len(data))

    def _count(self, size: int) -> None:
        self.result.files += 1
        self.result.bytes += size
        if self.progress is not None and self.result.files % _PROGRESS_EVERY == 0:
            self.progress(self.result.files, self.result.bytes)

    def _stream(self, fd: int, dst: int, name: str, rel: str, st: os.stat_result) -> None:
        """Copy a large file chunk by chunk (hash, scan with overlap, write), then judge the
        copy as an archive; on a secret, remove the partial copy and withhold it."""
        h = hashlib.sha256()
        size = 0
        tail = b""
        out = os.open(name, _O_COPY, 0o600, dir_fd=dst)
        try:
            rule = None
            while chunk := os.read(fd, CHUNK):
                window = tail + chunk
                hit = self.scanner.first_hit(window)
                if hit is not None:
                    rule = f"detector:{hit}"
                    break
                h.update(chunk)
                write_all(out, chunk)
                size += len(chunk)
                tail = window[-self.scanner.overlap :]
            else:
                window = b""
                rule = self.archive_verdict_fd(rel, out)
            if rule is not None:
                os.close(out)
                out = -1
                os.unlink(name, dir_fd=dst)
                self._withhold(rel, rule, window or None)
                return
            self._settle(out, st)
        finally:
            if out >= 0:
                os.close(out)
        self.note_node(rel, st)
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
            self.unstage(dst_root, rel, "symlink-escape")

    def drop_identity_copies(self, dst_root: int, staged: Iterable[str], ids: Iterable[Ident]) -> None:
        """Take out of the copy every file of `staged` that is a hard link of a withheld file,
        a copy of one's content, or an archive holding one (`ids`: the withheld files known)."""
        ids = list(ids)
        if not ids:
            return
        shas = {i.sha256 for i in ids if i.sha256}
        nodes = {i.node for i in ids}
        base = self.result.base
        for rel in list(staged):
            entry = base.get(rel)
            if entry is None:
                continue
            rule = identity_of(entry, self.linked.get(rel), self.members.get(rel), shas, nodes)
            if rule is not None:
                self.unstage(dst_root, rel, rule)

    def drop_names_with_values(self, dst_root: int, staged: list[str]) -> None:
        """Take out of the copy every path of `staged` (or link whose target) that carries a
        withheld value learnt after the walk judged it (a file whose content a detector
        withheld, read later in the walk): the shallowest node whose path carries it, with all
        under it. One search of all the paths when none does (the common case)."""
        base = self.result.base
        targets = {rel: e.target for rel in staged if (e := base.get(rel)) is not None and e.target}
        if not staged or not self._carries_value("\n".join([*staged, *targets.values()])):
            return
        tops: list[str] = []
        for rel in sorted(staged, key=lambda r: (r.count("/"), r)):
            if rel not in base or any(rel.startswith(t + "/") for t in tops):
                continue
            if self._carries_value(rel) or (rel in targets and self._carries_value(targets[rel])):
                tops.append(rel)
        for top in tops:
            under = [r for r in base if r.startswith(top + "/")]
            for rel in sorted(under, key=lambda r: r.count("/"), reverse=True):
                self._unstage_quietly(dst_root, rel)
            self._unstage_quietly(dst_root, top)
            self.result.withheld.append(Withheld(self._mask(top), VALUE_IN_NAME))

    def _unstage_quietly(self, dst_root: int, rel: str) -> None:
        """unstage, recording nothing (the top of what goes is recorded once, masked)."""
        mark = len(self.result.withheld)
        if self.result.base[rel].kind is Kind.DIR:
            parent_rel, _, name = rel.rpartition("/")
            fd = open_dir(dst_root, parent_rel)
            try:
                have = os.fstat(fd)
                os.fchmod(fd, 0o700)
                try:
                    os.rmdir(name, dir_fd=fd)
                finally:
                    os.fchmod(fd, stat.S_IMODE(have.st_mode))
                    os.utime(fd, ns=(have.st_atime_ns, have.st_mtime_ns))
            finally:
                os.close(fd)
            del self.result.base[rel]
            self.dirs.pop(rel, None)
            return
        self.unstage(dst_root, rel, VALUE_IN_NAME)
        del self.result.withheld[mark:]
        self.forget(rel)

    def forget(self, rel: str) -> None:
        """Keep no record of `rel` (its path carries a secret): a mirror drops its cache line."""

    def unstage(self, dst_root: int, rel: str, rule: str) -> None:
        """Remove a staged node from the copy and the manifest and record it withheld by `rule`;
        a settled read-only directory is opened up for the unlink and settled again."""
        parent_rel, _, name = rel.rpartition("/")
        fd = open_dir(dst_root, parent_rel)
        try:
            have = os.fstat(fd)
            if have.st_mode & 0o300 != 0o300:
                os.fchmod(fd, 0o700)
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            finally:
                os.fchmod(fd, stat.S_IMODE(have.st_mode))
                os.utime(fd, ns=(have.st_atime_ns, have.st_mtime_ns))
        finally:
            os.close(fd)
        entry = self.result.base.pop(rel)
        if entry.kind is Kind.FILE:
            self.result.files -= 1
            self.result.bytes -= entry.size
        self.linked.pop(rel, None)
        self.members.pop(rel, None)
        self.result.withheld.append(Withheld(rel, rule))


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

    Withheld files are absent from the copy: paths matching the policy's withhold patterns (any
    case, any depth: pathmatch.py), files whose content or name a withhold detector finds a secret
    in, anything labelled above `clearance` (directories that match are pruned whole), archives
    holding any of these or that cannot be scanned whole (staging/archives.py), hard links and byte-
    identical copies of a file withheld by path, and symlinks that can resolve outside the
    workspace. A path whose name carries a secret is recorded masked. Fifos, sockets and devices are
    skipped, as are nodes that vanish or change type mid-walk. Modes (setuid and exec bits too) and
    times are kept; with `owner`, every created node is chowned to it. With `redactor`, the values
    of withheld text files are registered there and nowhere else. `progress(files, bytes)` is called
    now and then and at the end.

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
