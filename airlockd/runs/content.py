"""What a proposal holds, read back from the run's folder: the base each change was made against
(kept at inspection), the proposed bytes, a file's hunks with their review state, and the diff.
Reading only: deciding is review.py's."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from airlockd.names import display, under
from airlockd.pipeline.hunks import Hunk, hunks, is_binary, unified_diff
from airlockd.pipeline.manifest import Entry, Kind, sha256_file
from airlockd.records import ConflictCause, FileReview, FileState, RunRecord
from airlockd.staging.stagers import proposed_path
from airlockd.state import StateDir
from airlockd.store import Store


class ProposalContent:
    """The files of proposals: the workspace they were made against, the state dir that keeps them."""

    def __init__(self, *, workspace: Path, state: StateDir, store: Store) -> None:
        self.workspace, self.state, self.store = workspace, state, store

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
        rec = self.store.get_run(run_id)
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
