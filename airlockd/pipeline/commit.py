"""The commit engine: apply approved changes to the live workspace all-or-nothing.

Order of a transaction (each step is a `checkpoint`):

1. conflict check: every target equals its `base` (lstat + SHA-256), every parent inside the
   workspace is a real directory or absent. Any mismatch raises `ConflictError`; nothing written.
2. journal `state_journal/<txid>.json` (intent, base entries, temp and backup names, dirs to make).
3. backups of every existing target in `state_backups/<txid>/files/` (hard link, else copy).
4. new directories, then every new file into a temp beside its target, hash verified.
5. one `syncfs` barrier, every `os.replace`, then deferred deletes (files, then empty dirs
   deepest first), directory modes, and a second barrier.
6. the journal is marked committed, then moved to `state_backups/<txid>/record.json` (for undo).

Any failure in 3-5 rolls back from the journal and verifies the result by hashes. `recover()`
does the same for a journal left by a crash. This module never writes through a symlinked parent
(refused up front; one swapped in by another process during the commit is not defended against),
never opens a symlink it finds, never writes outside the workspace and the two state directories,
and never runs external programs.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import signal
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from airlockd.errors import CommitError, ConflictError
from airlockd.fsutil import syncfs
from airlockd.names import brief, display
from airlockd.pipeline.journal import (
    Journal,
    JournalOp,
    Recovery,
    backup_dir,
    check_txid,
    close_journal,
    discard,
    exclusive,
    hash_copy,
    journal_path,
    link_or_copy,
    load_record,
    matches,
    recover,
    roll_back,
    temp_name,
)
from airlockd.pipeline.manifest import Entry, Kind

__all__ = [
    "CommitResult",
    "FileOp",
    "Recovery",  # recover() lives with the journal it replays; the service imports it from here
    "commit",
    "recover",
    "undo",
    "undo_ops",
]

log = logging.getLogger(__name__)

IMPLICIT_DIR_MODE = 0o755  # a missing parent no op describes; the umask must not decide it
NAME_MAX = 255  # bytes in one path component (Linux filesystems)
PATH_MAX = 4096  # bytes in a path the kernel accepts, its terminating NUL included
_checkpoints = itertools.count(1)  # counted per process, for AIRLOCK_CRASH_AT


@dataclass(frozen=True)
class FileOp:
    """One path's change: live must equal `base` now and becomes `new` (None: absent)."""

    path: str
    base: Entry | None
    new: Entry | None
    source: Path | None = None  # host file holding the new content (new files only)


@dataclass
class CommitResult:
    txid: str
    applied: list[str]
    backup_dir: Path


def commit(
    workspace: Path,
    state_journal: Path,
    state_backups: Path,
    txid: str,
    ops: list[FileOp],
    *,
    checkpoint: Callable[[str], None] | None = None,
) -> CommitResult:
    """Apply `ops` to `workspace` as one transaction, or not at all.

    Raises ConflictError (nothing written, not even the journal) when the live tree is not the
    ops' base, CommitError when the ops are malformed (nothing written) or when applying failed
    (the workspace was rolled back and verified; the message says if verification failed).
    A `checkpoint` that raises before the committed marker rolls back like any other failure.
    """
    check_txid(txid)
    ordered = _validated(ops)
    _check_lengths(workspace, txid, ordered)
    state_journal.mkdir(parents=True, exist_ok=True)
    with exclusive(state_journal):
        jpath, bdir = journal_path(state_journal, txid), backup_dir(state_backups, txid)
        if jpath.exists() or bdir.exists():
            raise CommitError(f"transaction {txid} already exists; nothing was written")
        conflicts, parents = _conflicts(workspace, ordered)
        if conflicts:
            shown = _some([f"{brief(p)} ({why})" for p, why in conflicts])
            raise ConflictError(
                f"{len(conflicts)} path(s) changed since the proposal was made, nothing was written: {shown}",
                paths=[p for p, _ in conflicts],
                hint="look at the proposal again against the current files",
            )
        journal = _plan(workspace, txid, ordered, parents)
        try:
            journal.write(jpath)
        except OSError as exc:
            msg = f"cannot write the commit journal ({exc}); nothing was written"
            raise CommitError(msg) from exc
        cp = _checkpointer(checkpoint)
        try:
            cp("journal")
            applied = _apply(workspace, journal, {op.path: op.source for op in ordered}, bdir, cp)
            journal.state, journal.applied = "committed", applied
            journal.write(jpath)
        except BaseException as exc:
            _rolled_back_or_raise(workspace, journal, jpath, bdir, exc)
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt and friends keep their meaning, after the rollback
            raise CommitError(
                f"commit {txid} failed ({_reason(exc)}); the workspace was restored and "
                f"verified against the base hashes",
                txid=txid,
            ) from exc
        # Past the committed marker a failure (even a raising checkpoint) must not roll back:
        # recover() finishes such a journal.
        cp("committed")
        try:
            close_journal(journal, jpath, bdir)
        except OSError as exc:
            # The change has landed; only filing its undo record failed. The committed journal
            # stays where recover() (run at every start, and by `airlockd recover`) files it.
            log.warning("commit %s landed, but its undo record could not be filed yet (%s)", txid, exc.strerror)
            return CommitResult(txid, applied, bdir)
        cp("recorded")
    return CommitResult(txid, applied, bdir)


def undo_ops(workspace: Path, state_backups: Path, txid: str) -> list[FileOp]:
    """The FileOps that reverse committed transaction `txid`, sourced from its backups.

    Raises ConflictError naming every file changed since the commit (its hash is no longer the
    committed one), NotFoundError when no record of `txid` is kept. Never writes anything.
    """
    record = load_record(state_backups, txid)
    bdir = backup_dir(state_backups, txid)
    by_path = {op.path: op for op in record.ops}
    ops: list[FileOp] = []
    for path in record.applied:
        op = by_path[path]
        source = bdir / op.backup if op.backup is not None else None
        ops.append(FileOp(path, op.new, op.base, source))
    for path, mode in record.mkdirs:  # parents made implicitly: remove them too (if still there)
        if path not in by_path and os.path.lexists(workspace / path):
            ops.append(FileOp(path, Entry(Kind.DIR, mode), None))
    changed = [op.path for op in ops if not matches(workspace / op.path, op.base)]
    if changed:
        raise ConflictError(
            f"cannot undo {txid}: changed since it was applied: " + _some([brief(p) for p in changed]),
            paths=changed,
            hint="undo only reverses files nobody edited after the commit",
        )
    return ops


def undo(
    workspace: Path,
    state_journal: Path,
    state_backups: Path,
    txid: str,
    *,
    undo_txid: str | None = None,
    checkpoint: Callable[[str], None] | None = None,
) -> CommitResult:
    """Reverse committed transaction `txid` through commit() (same journal and rollback)."""
    ops = undo_ops(workspace, state_backups, txid)
    undo_txid = undo_txid or f"{txid}-undo"
    return commit(workspace, state_journal, state_backups, undo_txid, ops, checkpoint=checkpoint)


# --- checking -------------------------------------------------------------------------------


def _validated(ops: list[FileOp]) -> list[FileOp]:
    """The ops sorted by path, or CommitError for a change set this engine must not apply."""
    problems: list[str] = []
    by_path: dict[str, FileOp] = {}
    for op in ops:
        p, name = op.path, brief(op.path)
        parts = p.split("/")
        if not p or p.startswith("/") or "\0" in p or any(x in ("", ".", "..") for x in parts):
            problems.append(f"{name}: not a relative path inside the workspace")
        if p in by_path:
            problems.append(f"{name}: appears twice")
        by_path[p] = op
        entries = [e for e in (op.base, op.new) if e is not None]
        if not entries:
            problems.append(f"{name}: neither a base nor a new entry")
        if any(e.kind not in (Kind.FILE, Kind.DIR) for e in entries):
            problems.append(f"{name}: only files and directories can be committed")
        if op.base and op.new and op.base.kind != op.new.kind:
            problems.append(f"{name}: type change (split it into a delete and a create)")
        if op.new and op.new.kind is Kind.FILE and (op.source is None or not op.new.sha256):
            problems.append(f"{name}: a new file needs a source and a SHA-256")
    for op in ops:
        parts = op.path.split("/")
        for i in range(1, len(parts)):
            anc = by_path.get("/".join(parts[:i]))
            if op.new and anc and (anc.new is None or anc.new.kind is not Kind.DIR):
                problems.append(f"{brief(op.path)}: written under a path that is not a dir")
    if problems:
        raise CommitError("refused to commit, nothing was written: " + _some(problems))
    return sorted(ops, key=lambda o: o.path)


def _some(problems: list[str], most: int = 20) -> str:
    """The first `most` problems, and how many more: an error of bounded size."""
    more = f"; and {len(problems) - most} more" if len(problems) > most else ""
    return "; ".join(problems[:most]) + more


def _check_lengths(workspace: Path, txid: str, ops: list[FileOp]) -> None:
    """Refuse, before anything is written, a name the kernel would refuse half way through
    (ENAMETOOLONG): a component over NAME_MAX bytes, a path (or the temp file beside it) over
    PATH_MAX once joined to the workspace."""
    root = len(os.fsencode(workspace)) + 1
    problems = []
    for n, op in enumerate(ops):
        raw = os.fsencode(op.path)
        longest = max(len(part) for part in raw.split(b"/"))
        tmp = len(temp_name(txid, str(n)))
        if longest > NAME_MAX:
            problems.append(f"{brief(op.path)}: a name of {longest} bytes (at most {NAME_MAX})")
        elif root + len(raw) + tmp >= PATH_MAX:
            problems.append(
                f"{brief(op.path)}: a path of {root + len(raw)} bytes in the workspace (at most {PATH_MAX - 1 - tmp})"
            )
    if problems:
        raise CommitError(
            "refused to commit, nothing was written: " + _some(problems),
            hint="these names cannot exist in the workspace's filesystem; reject those files",
        )


def _parent_status(workspace: Path, path: str, cache: dict[str, str]) -> tuple[str, str]:
    """('dir' | 'missing' | what is in the way, at which ancestor) for `path`'s parents."""
    rel = ""
    for part in path.split("/")[:-1]:
        rel = f"{rel}/{part}" if rel else part
        status = cache.get(rel)
        if status is None:
            try:
                mode = os.lstat(workspace / rel).st_mode
            except FileNotFoundError:
                status = "missing"
            else:
                status = "dir" if stat.S_ISDIR(mode) else "symlink" if stat.S_ISLNK(mode) else "file, not a directory"
            cache[rel] = status
        if status != "dir":
            return status, rel
    return "dir", rel


def _conflicts(workspace: Path, ops: list[FileOp]) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """(path, why) for every op whose live state is not its base; and the parent statuses."""
    cache: dict[str, str] = {}
    out: list[tuple[str, str]] = []
    root = os.fspath(workspace)
    for op in ops:
        status, where = _parent_status(workspace, op.path, cache)
        if status not in ("dir", "missing"):
            out.append((op.path, f"parent {display(where)} is a {status}"))
        elif not matches(f"{root}/{op.path}", op.base):
            exists = os.path.lexists(workspace / op.path)
            why = "appeared" if op.base is None else "changed" if exists else "was removed"
            out.append((op.path, _unreadable(f"{root}/{op.path}", op.base) or f"{why} since the base was recorded"))
    return out, cache


def _unreadable(path: str, base: Entry | None) -> str | None:
    """Why a live file that looks like its base could not be compared, if it could not be read."""
    if base is None or base.kind is not Kind.FILE:
        return None
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size != base.size:
            return None
        hash_copy(path, None)
    except OSError as exc:
        return f"cannot be read to compare it with its base: {exc.strerror}"
    return None


def _plan(workspace: Path, txid: str, ops: list[FileOp], parents: dict[str, str]) -> Journal:
    """The journal for `ops`: temp and backup names, and every directory to create."""
    jops: list[JournalOp] = []
    mkdirs: dict[str, int] = {}
    for n, op in enumerate(ops):
        new_file = op.new is not None and op.new.kind is Kind.FILE
        old_file = op.base is not None and op.base.kind is Kind.FILE
        tmp = temp_name(txid, str(n)) if new_file else None
        jops.append(JournalOp(op.path, op.base, op.new, tmp, f"files/{n}" if old_file else None))
        if op.new is not None and op.base is None and op.new.kind is Kind.DIR:
            mkdirs[op.path] = op.new.mode
        if op.new is not None:
            parts, missing = op.path.split("/"), False
            for i in range(1, len(parts)):
                anc = "/".join(parts[:i])
                # the check stops at the first missing ancestor: everything below is missing too
                missing = missing or parents.get(anc) == "missing"
                if missing:
                    mkdirs.setdefault(anc, IMPLICIT_DIR_MODE)
    ordered = sorted(mkdirs.items(), key=lambda kv: (kv[0].count("/"), kv[0]))
    return Journal(txid, os.fspath(workspace), jops, ordered)


# --- applying -------------------------------------------------------------------------------


def _checkpointer(callback: Callable[[str], None] | None) -> Callable[[str], None]:
    def cp(label: str) -> None:
        if callback is not None:
            callback(label)
        crash_at = os.environ.get("AIRLOCK_CRASH_AT")
        if next(_checkpoints) == int(crash_at or 0):
            os.kill(os.getpid(), signal.SIGKILL)  # the crash test's kill point

    return cp


def _apply(
    ws: Path,
    journal: Journal,
    sources: dict[str, Path | None],
    bdir: Path,
    cp: Callable[[str], None],
) -> list[str]:
    """Do everything the journal says; return the applied paths. Leaves rollback to the caller."""
    (bdir / "files").mkdir(parents=True, mode=0o700)
    root, backups = os.fspath(ws), os.fspath(bdir)  # plain strings: 1,000s of Path objects cost
    for op in journal.ops:
        if op.backup is not None:
            link_or_copy(f"{root}/{op.path}", f"{backups}/{op.backup}")
            cp(f"backup {display(op.path)}")
    for path, _ in journal.mkdirs:
        # 0o700 until the files are in: a final mode without write bit would block them.
        os.mkdir(f"{root}/{path}", 0o700)
        cp(f"mkdir {display(path)}")
    writes = [(op, f"{root}/{op.path}", _tmp_path(root, op)) for op in journal.ops if op.tmp is not None]
    for op, _, tmp in writes:
        _write_temp(sources[op.path], tmp, op.new, op.path)
        cp(f"write {display(op.path)}")
    # One filesystem-wide barrier instead of an fsync per file: the temps' data and the backups
    # must be durable before any rename makes them the only copy (1 syncfs, not 2,000 fsyncs).
    _barrier(ws, bdir)
    for op, target, tmp in writes:
        os.replace(tmp, target)
        cp(f"replace {display(op.path)}")
    applied = {op.path for op, _, _ in writes}
    for op in journal.ops:  # deletions are deferred: files first...
        if op.new is None and op.base is not None and op.base.kind is Kind.FILE:
            os.unlink(ws / op.path)
            applied.add(op.path)
            cp(f"delete {display(op.path)}")
    for op in sorted(journal.ops, key=lambda o: (-o.path.count("/"), o.path)):
        if op.new is None and op.base is not None and op.base.kind is Kind.DIR:
            try:  # ...then directories, deepest first, only if empty
                os.rmdir(ws / op.path)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                continue  # something outside this transaction (a withheld file, say) lives there
            applied.add(op.path)
            cp(f"rmdir {display(op.path)}")
    modes = dict(journal.mkdirs)
    for op in journal.ops:
        if op.base is not None and op.new is not None and op.new.kind is Kind.DIR:
            modes[op.path] = op.new.mode
    for path, mode in sorted(modes.items(), key=lambda kv: (-kv[0].count("/"), kv[0])):
        os.chmod(ws / path, mode)  # chmod, not the mkdir mode argument: the umask must not apply
        cp(f"chmod {display(path)}")
    applied.update(op.path for op in journal.ops if op.path in modes)
    _barrier(ws, bdir)  # every rename and delete durable before the committed marker
    return [op.path for op in journal.ops if op.path in applied]


def _tmp_path(root: str, op: JournalOp) -> str:
    assert op.tmp is not None
    return os.path.join(os.path.dirname(f"{root}/{op.path}"), op.tmp)


def _write_temp(source: Path | None, tmp: str, new: Entry | None, path: str) -> None:
    """Copy `source` to a new temp file with `new`'s mode, checking the SHA-256 on the way."""
    assert source is not None and new is not None  # _validated guarantees both for new files
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        digest = hash_copy(source, fd)
        os.fchmod(fd, new.mode)  # exact mode, whatever the umask
    finally:
        os.close(fd)
    if digest != new.sha256:
        raise CommitError(
            f"{display(path)}: the new content's SHA-256 is {digest[:12]}…, the approved one "
            f"{(new.sha256 or '')[:12]}… (its source {source} changed after inspection)"
        )


def _barrier(ws: Path, bdir: Path) -> None:
    syncfs(ws)
    if bdir.exists() and os.stat(bdir).st_dev != os.stat(ws).st_dev:
        syncfs(bdir)


# --- rolling back ---------------------------------------------------------------------------


def _rolled_back_or_raise(ws: Path, journal: Journal, jpath: Path, bdir: Path, exc: BaseException) -> None:
    bad = roll_back(ws, journal, bdir)
    if bad:
        raise CommitError(
            f"commit {journal.txid} failed ({_reason(exc)}) and the rollback could NOT be "
            f"verified for: {', '.join(display(p) for p in bad)}",
            hint=f"the journal {jpath} and the backups in {bdir} are kept; restore by hand",
            txid=journal.txid,
            paths=bad,
        ) from exc
    discard(jpath, bdir)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, CommitError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"
