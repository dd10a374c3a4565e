"""What a proposal holds, read back from the run's folder: the base each change was made against
(kept at inspection), the proposed bytes, a file's hunks with their review state, and the diff;
and the secrets a proposal carries (`find_secrets`), for the classifier's `secret-in-*`
invariants. Reading only: deciding is review.py's. Whatever text leaves here for a person (the
diff) has passed the run's redactor."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Generator, Iterable
from pathlib import Path

from airlockd.names import display, under
from airlockd.pipeline.classify import WITHHELD_VALUE, Secret
from airlockd.pipeline.hunks import Hunk, hunks, is_binary, unified_diff
from airlockd.pipeline.manifest import Change, Entry, Kind, sha256_file
from airlockd.records import ConflictCause, FileReview, FileState, RunRecord
from airlockd.redact import Redactor, find_secrets
from airlockd.staging.secretscan import SecretScanner
from airlockd.staging.stagers import proposed_path
from airlockd.state import StateDir
from airlockd.store import Store


class ProposalContent:
    """The files of proposals: the workspace they were made against, the state dir that keeps them."""

    def __init__(self, *, workspace: Path, state: StateDir, store: Store, redactor: Redactor) -> None:
        self.workspace, self.state, self.store = workspace, state, store
        self.redactor = redactor

    def keep_base_blobs(self, run_id: str, files: list[FileReview]) -> None:
        """Copy the live content each modified/deleted file was changed against, for diffs and
        hunks. A live file that no longer matches the staged base is already a conflict."""
        for n, f in enumerate(files):
            if f.state is not FileState.DENIED and not keep_base_blob(self.workspace, self.state.run_dir(run_id), n, f):
                f.state, f.conflict = FileState.CONFLICTED, ConflictCause.MOVED

    def hunk_texts(self, rec: RunRecord, f: FileReview) -> tuple[str, str] | None:
        """(base, proposed) text of a modified text file, or None when the change has no hunks
        (created, deleted, binary, not a file, or its base is no longer kept)."""
        if f.change != "modified" or f.kind != Kind.FILE.value or f.state is FileState.DENIED:
            return None
        old, new = self.contents(rec, f)
        if old is None or new is None or is_binary(old) or is_binary(new):
            return None
        return old.decode(), new.decode()

    def hunk_states(self, rec: RunRecord, f: FileReview) -> list[tuple[Hunk, str]] | None:
        """Each hunk of a file with its review state; None when the change has no hunks."""
        texts = self.hunk_texts(rec, f)
        if texts is None:
            return None
        default = {FileState.PENDING: "pending", FileState.CONFLICTED: "conflicted"}.get(f.state, f.state.value)
        out = []
        for h in hunks(*texts):
            state = f.hunks.get(h.id, "pending")
            out.append((h, default if state == "pending" else state))
        return out

    def contents(self, rec: RunRecord, f: FileReview) -> tuple[bytes | None, bytes | None]:
        """(base, proposed) bytes of one file change; None where the side does not exist."""
        run_dir = self.state.run_dir(rec.id)
        old = (run_dir / "base" / f.base_blob).read_bytes() if f.base_blob else None
        new = None
        after = Entry.from_json_or_none(f.after)
        if after is not None and after.kind is Kind.FILE:
            src = proposed_path(run_dir, f.path)  # the upper layer or the copy
            new = src.read_bytes() if os.path.lexists(src) else None
        return old, new

    def diff(self, run_id: str, path: str | None = None) -> str:
        """The unified diff of a proposal (or of the changes under `path`), redacted."""
        return self.redactor.text(self._diff(run_id, path))

    def _diff(self, run_id: str, path: str | None) -> str:
        rec = self.store.get_run(run_id)
        if rec.compacted_at is not None:
            from airlockd.errors import StateError

            raise StateError(
                f"run {rec.id} was compacted by retention: its contents are gone, only its summary is kept",
                hint="`airlockd show` lists its changes and their digests; [retention] sets how long runs stay whole",
            )
        parts = []
        for f in rec.files:
            if path and not under(f.path, path.strip("/")):
                continue
            head = f"# {display(f.path)}: {f.change}, {f.decision.value} ({f.rule}: {f.reason}) [{f.state.value}]"
            if f.kind != Kind.FILE.value or f.state is FileState.DENIED:
                parts.append(head + "\n")
                continue
            old, new = self.contents(rec, f)
            if (old and is_binary(old)) or (new and is_binary(new)):
                parts.append(head + f"\nBinary files a/{display(f.path)} and b/{display(f.path)} differ\n")
                continue
            if old is None and f.before is not None:
                parts.append(head + "\n(base content unavailable: the live file changed since staging)\n")
                continue
            if new is None and f.after is not None:
                parts.append(head + "\n(staging copy no longer kept)\n")
                continue
            text = unified_diff(
                f.path, (old or b"").decode(), (new or b"").decode(), created=old is None, deleted=new is None
            )
            parts.append(head + "\n" + text)
        return "\n".join(parts)


def keep_base_blob(workspace: Path, run_dir: Path, n: int, f: FileReview) -> bool:
    """Keep a copy of the live file `f` was changed against (`run_dir/base/N`), for its diff and
    hunks, when the live file is that base; False when it is not (or cannot be read). A change
    with no file before it, or one whose copy is kept already, needs none (True)."""
    before = Entry.from_json_or_none(f.before)
    if f.base_blob or before is None or before.kind is not Kind.FILE:
        return True
    blobs = run_dir / "base"
    blobs.mkdir(exist_ok=True)
    blob = blobs / str(n)
    try:
        shutil.copyfile(workspace / f.path, blob, follow_symlinks=False)
        if sha256_file(blob) == before.sha256:
            f.base_blob = str(n)
            return True
    except OSError:
        pass
    blob.unlink(missing_ok=True)
    return False


CHUNK = 1 << 20  # bytes of a proposed file scanned at once


def find_secrets_in(
    run_dir: Path, changes: Iterable[Change], scanner: SecretScanner, redactor: Redactor, *, max_bytes: int
) -> dict[str, Secret]:
    """The secret each change carries, path -> Secret: in its name (any detector, or a value
    `redactor` knows), else in the proposed bytes of a created or modified regular file (one of
    `scanner`'s detectors, the policy's own included, or a known value) or the target of a
    symlink (as a name). A file over `max_bytes` is not read (the size cap denies it). Reads the
    staging copy only; never returns or keeps the value found."""
    found: dict[str, Secret] = {}
    for c in changes:
        in_name = _secret_in_name(c.path, redactor)
        if in_name is not None:
            found[c.path] = Secret(in_name, in_name=True)
            continue
        after = c.after
        if after is not None and after.kind is Kind.SYMLINK:  # a link's content is its target
            in_target = _secret_in_name(after.target or "", redactor)
            if in_target is not None:
                found[c.path] = Secret(in_target)
            continue
        if after is None or after.kind is not Kind.FILE or after.size > max_bytes:
            continue
        hit = scan_file(proposed_path(run_dir, c.path), scanner, redactor)
        if hit is not None:
            found[c.path] = Secret(hit)
    return found


def _secret_in_name(path: str, redactor: Redactor) -> str | None:
    if redactor.known_in(path):
        return WITHHELD_VALUE
    hits = find_secrets(path)
    return hits[0][0] if hits else None


def scan_bytes(data: bytes, scanner: SecretScanner, redactor: Redactor) -> str | None:
    """The first of `scanner`'s detectors that fires on `data`, else WITHHELD_VALUE when it holds
    a value `redactor` knows, else None."""
    hit = scanner.first_hit(data)
    if hit is None and redactor.known_in(data.decode("utf-8", "replace")):
        hit = WITHHELD_VALUE
    return hit


def scan_file(path: Path, scanner: SecretScanner, redactor: Redactor) -> str | None:
    """The first detector that fires on the regular file at `path` (read in chunks, with an
    overlap wider than any detector's match, so none hides across a chunk's edge), or
    WITHHELD_VALUE for a value `redactor` knows (sought in the stream folded as it comes, so
    neither an edge nor whitespace it is spread over hides one); None when clean or unreadable
    (not a regular file: never follows a link)."""
    known = redactor.known_scan()
    tail = b""
    with contextlib.closing(regular_chunks(path)) as chunks:
        for chunk in chunks:
            window = tail + chunk
            hit = scanner.first_hit(window)
            if hit is None and known.feed(chunk):
                hit = WITHHELD_VALUE
            if hit is not None:
                return hit
            tail = window[-scanner.overlap :]
    return None


def regular_chunks(path: Path, limit: int | None = None) -> Generator[bytes, None, None]:
    """The bytes of the regular file at `path`, CHUNK at a time (with `limit`, that many and one
    more at most); nothing for a node that is not a regular file, never through a link, and
    nothing more once a read fails."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        left = -1 if limit is None else limit + 1
        while left != 0 and (chunk := os.read(fd, CHUNK if left < 0 else min(CHUNK, left))):
            yield chunk
            left = -1 if left < 0 else left - len(chunk)
    except OSError:
        return
    finally:
        os.close(fd)


# What in a text file acts on a terminal, reorders what a person reads or is not drawn at all
# (UTF-8 bytes): ESC (ANSI and OSC sequences: concealed text, cursor moves, clipboard writes),
# the C1 CSI/OSC introducers, backspace and a carriage return that is not a line end (both
# overwrite what was shown), bidirectional controls ("Trojan source"), line separators (a line
# end to JavaScript, none to an editor), tag characters (text a model reads and a person does
# not), vertical tabs, blank fillers and zero-width characters (an identifier that looks like
# another). A byte-order mark at the start and zero-width joiners (emoji) are ordinary.
_HIDDEN_BYTES = (
    ("a terminal escape (ESC)", re.compile(rb"\x1b")),
    ("a C1 control character", re.compile(rb"\xc2[\x80-\x9f]")),
    ("a bidirectional control character", re.compile(rb"\xd8\x9c|\xe2\x80[\x8e\x8f\xaa-\xae]|\xe2\x81[\xa6-\xa9]")),
    ("a backspace or a carriage return that overwrites a line", re.compile(rb"\x08|\r(?!\n)")),
    ("a line or paragraph separator (U+2028, U+2029)", re.compile(rb"\xe2\x80[\xa8\xa9]")),
    ("invisible tag characters (U+E0000-E007F)", re.compile(rb"\xf3\xa0[\x80\x81][\x80-\xbf]")),
    ("a vertical tab", re.compile(rb"\x0b")),
    ("a blank filler (Hangul filler)", re.compile(rb"\xe1\x85[\x9f\xa0]|\xe3\x85\xa4|\xef\xbe\xa0")),
    (
        "a zero-width space, word joiner or byte-order mark",
        re.compile(rb"\xe2\x80\x8b|\xe2\x81\xa0|(?s:.)\xef\xbb\xbf"),
    ),
)


def hidden_in(run_dir: Path, changes: Iterable[Change], *, max_bytes: int) -> dict[str, str]:
    """path -> what hides in the proposed text of each created or modified regular file (the
    first kind found, by `_HIDDEN_BYTES`); binary files (shown as binary, never as text) and
    files over `max_bytes` (denied by the size cap) are not read. Reads each file once, through
    a descriptor that never follows a link."""
    found: dict[str, str] = {}
    for c in changes:
        after = c.after
        if after is None or after.kind is not Kind.FILE or after.sha256 is None or after.size > max_bytes:
            continue
        with contextlib.closing(regular_chunks(proposed_path(run_dir, c.path), max_bytes)) as chunks:
            data = b"".join(chunks)
        if not data or is_binary(data):
            continue
        for what, pattern in _HIDDEN_BYTES:
            if pattern.search(data):
                found[c.path] = what
                break
    return found
