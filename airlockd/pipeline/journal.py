"""The commit journal: what a transaction intends, written before the workspace is touched.

One JSON document per transaction, `state_journal/<txid>.json`:

    {"format": "airlockd-commit-journal/1", "txid": "...", "workspace": "/abs/path",
     "state": "applying" | "committed",
     "ops": [{"path": "a/b.txt", "base": Entry|null, "new": Entry|null,
              "tmp": ".airlock-tmp-<txid>-<n>"|null, "backup": "files/<n>"|null}, ...],
     "mkdirs": [["a/new", 493], ...],
     "applied": ["a/b.txt", ...]}

`base` / `new` are `Entry.to_json()`. `tmp` is the temp file's name in the target's own
directory; `backup` is relative to `state_backups/<txid>/`. `mkdirs` lists every directory the
transaction creates (explicit ones and missing parents), shallow first, with its final mode.
`applied` is filled in when `state` becomes "committed" (the marker written after the last
operation). After the commit the journal moves to `state_backups/<txid>/record.json`, where
`undo` finds it. JSON is written with `ensure_ascii=True`, so names that carry surrogate-escaped
non-UTF-8 bytes round-trip exactly.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from airlockd.errors import CommitError, NotFoundError
from airlockd.fsutil import atomic_write_bytes, fsync_dir, syncfs
from airlockd.pipeline.manifest import Entry, Kind

FORMAT = "airlockd-commit-journal/1"
TMP_PREFIX = ".airlock-tmp-"
RECORD = "record.json"
CHUNK = 1 << 20
_TXID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def check_txid(txid: str) -> None:
    """Refuse a transaction id that could not safely name a file (it never touches the disk)."""
    if not _TXID.fullmatch(txid):
        raise CommitError(f"invalid transaction id {txid!r}: use 1-64 letters, digits, '.', '_' or '-'")


def journal_path(state_journal: Path, txid: str) -> Path:
    return state_journal / f"{txid}.json"


def backup_dir(state_backups: Path, txid: str) -> Path:
    return state_backups / txid


def temp_name(txid: str, tag: str) -> str:
    """A temp file name that recovery recognises as this transaction's leftover."""
    return f"{TMP_PREFIX}{txid}-{tag}"


def _entry_json(e: Entry | None) -> dict[str, Any] | None:
    """`Entry.to_json()` without dataclasses.asdict's deep copies (a tenth of a 1,000-file commit)."""
    if e is None:
        return None
    out: dict[str, Any] = {"kind": e.kind.value, "mode": e.mode, "size": e.size}
    if e.sha256 is not None:
        out["sha256"] = e.sha256
    if e.target is not None:
        out["target"] = e.target
    return out


@dataclass(frozen=True)
class JournalOp:
    path: str
    base: Entry | None
    new: Entry | None
    tmp: str | None = None  # temp file name in the target's directory (new files only)
    backup: str | None = None  # relative to the backup dir (existing files only)


@dataclass
class Journal:
    """A transaction's intent, its progress marker and, once committed, its undo record."""

    txid: str
    workspace: str
    ops: list[JournalOp]
    mkdirs: list[tuple[str, int]]
    state: str = "applying"
    applied: list[str] = field(default_factory=list)

    @property
    def committed(self) -> bool:
        return self.state == "committed"

    def to_bytes(self) -> bytes:
        doc = {
            "format": FORMAT,
            "txid": self.txid,
            "workspace": self.workspace,
            "state": self.state,
            "ops": [
                {
                    "path": op.path,
                    "base": _entry_json(op.base),
                    "new": _entry_json(op.new),
                    "tmp": op.tmp,
                    "backup": op.backup,
                }
                for op in self.ops
            ],
            "mkdirs": [[p, m] for p, m in self.mkdirs],
            "applied": self.applied,
        }
        # ensure_ascii (the default) escapes lone surrogates, so undecodable names survive.
        return json.dumps(doc, ensure_ascii=True, separators=(",", ":")).encode("ascii")

    @classmethod
    def from_bytes(cls, data: bytes, where: Path) -> Journal:
        try:
            doc = json.loads(data)
            if doc.get("format") != FORMAT:
                raise ValueError(f"unknown format {doc.get('format')!r}")
            ops = [
                JournalOp(
                    o["path"],
                    Entry.from_json_or_none(o["base"]),
                    Entry.from_json_or_none(o["new"]),
                    o["tmp"],
                    o["backup"],
                )
                for o in doc["ops"]
            ]
            mkdirs = [(str(p), int(m)) for p, m in doc["mkdirs"]]
            return cls(doc["txid"], doc["workspace"], ops, mkdirs, doc["state"], doc["applied"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CommitError(
                f"unreadable commit journal {where}: {exc}",
                hint="inspect it by hand; airlockd never guesses what a damaged journal meant",
            ) from exc

    def write(self, path: Path) -> None:
        atomic_write_bytes(path, self.to_bytes())


def pending_journals(state_journal: Path) -> list[Path]:
    """Journals left behind by an interrupted commit, oldest txid first.

    Half-written journal temps (`.<txid>.json.tmp-<pid>`) are removed: a journal that never
    reached its final name means the workspace was never touched.
    """
    if not state_journal.is_dir():
        return []
    found = []
    for child in sorted(state_journal.iterdir()):
        if child.name.startswith(".") and ".json.tmp-" in child.name:
            child.unlink(missing_ok=True)
        elif child.suffix == ".json" and not child.name.startswith("."):
            found.append(child)
    return found


def load_record(state_backups: Path, txid: str) -> Journal:
    """The committed journal of `txid`, kept with its backups for undo."""
    check_txid(txid)
    path = backup_dir(state_backups, txid) / RECORD
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NotFoundError(
            f"no committed transaction {txid} (its record {path} is missing)",
            hint="only a transaction that committed, and whose backups are kept, can be undone",
        ) from None
    record = Journal.from_bytes(data, path)
    if not record.committed:
        raise CommitError(f"transaction {txid} never committed; there is nothing to undo")
    return record


# --- replaying a journal: verification, rollback, recovery ------------------------------------


def matches(path: str | os.PathLike[str], expected: Entry | None) -> bool:
    """Whether the live `path` is exactly `expected` (type, mode, size, SHA-256); no follow."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return expected is None
    if expected is None or stat.S_IMODE(st.st_mode) != expected.mode:
        return False
    if expected.kind is Kind.DIR:
        return stat.S_ISDIR(st.st_mode)
    if not stat.S_ISREG(st.st_mode) or st.st_size != expected.size:
        return False
    try:
        return hash_copy(path, None) == expected.sha256
    except OSError:
        return False


def hash_copy(source: str | os.PathLike[str], dest_fd: int | None) -> str:
    """SHA-256 of a regular file (never through a symlink), copying it to `dest_fd` if given."""
    # O_NONBLOCK: a FIFO put where a file was expected must not hang the daemon.
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(source))
        h = hashlib.sha256()
        while chunk := os.read(fd, CHUNK):
            h.update(chunk)
            view = memoryview(chunk)
            while dest_fd is not None and view:
                view = view[os.write(dest_fd, view) :]
        return h.hexdigest()
    finally:
        os.close(fd)


def link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Keep `src`'s current inode (hard link) or a copy of it at `dst`. Never follows links."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:  # another filesystem, or hard links refused (protected_hardlinks)
        shutil.copy2(src, dst, follow_symlinks=False)


def close_journal(journal: Journal, jpath: Path, bdir: Path) -> None:
    """Move a committed journal to the backup dir, where it is the undo record."""
    bdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.replace(jpath, bdir / RECORD)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        journal.write(bdir / RECORD)
        jpath.unlink()
    fsync_dir(bdir)
    fsync_dir(jpath.parent)


def discard(jpath: Path, bdir: Path) -> None:
    """Forget a rolled-back transaction: backups first, the journal last (recovery re-runs)."""
    shutil.rmtree(bdir, ignore_errors=True)
    jpath.unlink(missing_ok=True)
    fsync_dir(jpath.parent)


def roll_back(ws: Path, journal: Journal, bdir: Path) -> list[str]:
    """Put every path back to its base, from live state and the journal (idempotent).

    Returns the paths that do not verify against their base afterwards (empty: verified). Never
    removes a file it cannot prove it wrote (a created path is removed only if it holds the
    new content).
    """
    _remove_temps(ws, journal)
    made = [p for p, _ in journal.mkdirs]
    made_set = set(made)
    dirs = sorted(
        (op for op in journal.ops if op.base is not None and op.base.kind is Kind.DIR),
        key=lambda o: (o.path.count("/"), o.path),
    )
    for path in [op.path for op in dirs] + made:
        with contextlib.suppress(OSError):
            if path not in made_set and not os.path.lexists(ws / path):
                os.mkdir(ws / path, 0o700)  # a deleted directory comes back before its files
            if _is_real_dir(ws, path):
                os.chmod(ws / path, 0o700)  # writable while files go back in or come out
    for n, op in enumerate(journal.ops):
        target = ws / op.path
        with contextlib.suppress(OSError):
            if op.base is not None and op.base.kind is Kind.FILE:
                if not matches(target, op.base) and op.backup is not None:
                    tmp = target.parent / temp_name(journal.txid, f"r{n}")
                    link_or_copy(bdir / op.backup, tmp)
                    os.replace(tmp, target)
            elif op.base is None and op.new is not None and op.new.kind is Kind.FILE and matches(target, op.new):
                os.unlink(target)  # ours: it holds exactly the content this transaction wrote
    for path in reversed(made):
        with contextlib.suppress(OSError):
            os.rmdir(ws / path)  # only if empty: a stranger's file keeps it (and fails verify)
    for op in reversed(dirs):
        with contextlib.suppress(OSError):
            if op.base is not None and _is_real_dir(ws, op.path):
                os.chmod(ws / op.path, op.base.mode)
    syncfs(ws)
    bad = [op.path for op in journal.ops if not matches(ws / op.path, op.base)]
    return bad + [p for p in made if p not in bad and os.path.lexists(ws / p)]


def _remove_temps(ws: Path, journal: Journal) -> None:
    """Remove this transaction's temp files from every directory it wrote into."""
    # exact tags only: "tx1-undo"'s temps also start with "tx1-" and are not ours to remove
    ours = re.compile(re.escape(temp_name(journal.txid, "")) + r"r?[0-9]+")
    parents = {str(Path(op.path).parent) for op in journal.ops}
    for rel in sorted(parents):
        if not _is_real_dir(ws, rel):
            continue
        with os.scandir(ws / rel) as it:
            for de in it:
                if ours.fullmatch(de.name) and not de.is_dir(follow_symlinks=False):
                    os.unlink(de.path)


def _is_real_dir(ws: Path, rel: str) -> bool:
    """Whether every component of `rel` under `ws` is a directory, not a link to one."""
    path = ws
    for part in Path(rel).parts:
        path = path / part
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except OSError:
            return False
    return True


@contextlib.contextmanager
def exclusive(state_journal: Path) -> Iterator[None]:
    """One transaction (or recovery) at a time per state dir, across processes.

    The lock is on the journal directory itself, so taking it writes nothing; the kernel drops
    it when the holder dies, so a crash never leaves it stuck.
    """
    try:
        fd = os.open(state_journal, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise CommitError(
            f"cannot open the commit journal directory {state_journal}: {exc.strerror}; nothing was written",
            hint="check the state directory's permissions and free space",
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Recovery:
    txid: str
    outcome: Literal["rolled_back", "completed"]
    paths: list[str]
    verified: bool


def recover(workspace: Path, state_journal: Path, state_backups: Path) -> list[Recovery]:
    """Finish or roll back every transaction a crash left in `state_journal`.

    A journal marked committed is completed (temps removed, moved to the undo record); any
    other is rolled back to its base and verified by hashes. The journal is removed, except when
    verification fails: then it stays, with the backups, for a person to look at. Never touches
    a path the journals do not name, apart from this transaction's recognisable temp files.
    """
    out: list[Recovery] = []
    if not state_journal.is_dir():
        return out
    with exclusive(state_journal):
        for jpath in pending_journals(state_journal):
            journal = Journal.from_bytes(jpath.read_bytes(), jpath)
            if os.path.realpath(journal.workspace) != os.path.realpath(workspace):
                raise CommitError(
                    f"journal {jpath} belongs to workspace {journal.workspace}, not {workspace}",
                    hint="run recovery for that workspace (its state dir is separate)",
                )
            bdir = backup_dir(state_backups, journal.txid)
            if journal.committed:
                _remove_temps(workspace, journal)
                new_of = {op.path: op.new for op in journal.ops}
                bad = [p for p in journal.applied if not matches(workspace / p, new_of[p])]
                close_journal(journal, jpath, bdir)
                out.append(Recovery(journal.txid, "completed", journal.applied, not bad))
            else:
                bad = roll_back(workspace, journal, bdir)
                if not bad:
                    discard(jpath, bdir)
                paths = [op.path for op in journal.ops]
                out.append(Recovery(journal.txid, "rolled_back", paths, not bad))
    return out
