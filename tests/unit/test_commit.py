"""The commit engine on real trees in tmp_path: apply, conflict, rollback, undo, recovery, names."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from commitops import ops_from_changes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airlockd.errors import CommitError, ConflictError, NotFoundError
from airlockd.pipeline.commit import FileOp, commit, recover, undo, undo_ops
from airlockd.pipeline.journal import RECORD, TMP_PREFIX, Journal
from airlockd.pipeline.manifest import Entry, Kind, Manifest, diff, entry_for, scan

Tree = dict[str, "bytes | int"]  # path -> file content, or a directory's mode


def build(root: Path, tree: Tree) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, value in sorted(tree.items()):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(value, int):
            path.mkdir(exist_ok=True)
            path.chmod(value)
        else:
            path.write_bytes(value)
            path.chmod(0o644)
    return root


def staged(ws: Path, tmp: Path, edit: Callable[[Path], object]) -> Path:
    """A staging copy of `ws` with `edit` applied, as the agent would leave it."""
    staging = tmp / "staging"
    shutil.copytree(ws, staging, symlinks=True)
    edit(staging)
    return staging


def ops_between(ws: Path, staging: Path) -> list[FileOp]:
    return ops_from_changes(diff(scan(ws), scan(staging)), staging)


class State:
    def __init__(self, tmp: Path) -> None:
        self.journal = tmp / "state" / "journal"
        self.backups = tmp / "state" / "backups"

    def commit(self, ws: Path, txid: str, ops: list[FileOp], **kw: Callable[[str], None]) -> list[str]:
        return commit(ws, self.journal, self.backups, txid, ops, **kw).applied

    def journals(self) -> list[str]:
        return sorted(p.name for p in self.journal.iterdir()) if self.journal.exists() else []


def temps(ws: Path) -> list[str]:
    return [rel for rel in scan(ws) if rel.rsplit("/", 1)[-1].startswith(TMP_PREFIX)]


BASE: Tree = {
    "keep.txt": b"keep\n",
    "src/app.py": b"print('v1')\n",
    "src/util/helpers.py": b"def f(): pass\n",
    "src/util/old.py": b"old\n",
    "docs/guide/intro.md": b"# intro\n",
    "docs/guide/more.md": b"# more\n",
    "docs/readme.md": b"readme\n",
}


def agent_edit(s: Path) -> None:
    (s / "src/app.py").write_bytes(b"print('v2')\n")
    (s / "src/util/helpers.py").write_bytes(b"def f(): return 1\n")
    (s / "src/util/helpers.py").chmod(0o755)
    (s / "src/util/old.py").unlink()
    shutil.rmtree(s / "docs/guide")
    (s / "new/deep/er").mkdir(parents=True)
    (s / "new").chmod(0o750)
    (s / "new/deep/er/file.txt").write_bytes(b"fresh\n")
    (s / "src/new.py").write_bytes(b"x = 1\n")
    (s / "src/new.py").chmod(0o600)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    return build(tmp_path / "ws", BASE)


def test_create_modify_delete_in_nested_folders(ws: Path, tmp_path: Path) -> None:
    staging = staged(ws, tmp_path, agent_edit)
    state = State(tmp_path)
    ops = ops_between(ws, staging)
    applied = state.commit(ws, "tx1", ops)
    assert scan(ws) == scan(staging)
    assert set(applied) == {op.path for op in ops}
    assert state.journals() == []  # the journal became the undo record
    record = Journal.from_bytes((state.backups / "tx1" / RECORD).read_bytes(), state.backups)
    assert record.committed and record.applied == applied
    assert temps(ws) == []


def test_modes_are_exact_whatever_the_umask(ws: Path, tmp_path: Path) -> None:
    def edit(s: Path) -> None:
        (s / "bin").mkdir()
        (s / "bin").chmod(0o751)
        (s / "bin/tool").write_bytes(b"#!/bin/sh\n")
        (s / "bin/tool").chmod(0o4755)
        (s / "keep.txt").chmod(0o664)

    staging = staged(ws, tmp_path, edit)
    old = os.umask(0o077)
    try:
        State(tmp_path).commit(ws, "tx1", ops_between(ws, staging))
    finally:
        os.umask(old)
    assert entry_for(ws / "bin").mode == 0o751
    assert entry_for(ws / "bin/tool").mode == 0o4755
    assert entry_for(ws / "keep.txt").mode == 0o664
    assert scan(ws) == scan(staging)


def test_missing_parents_are_created(ws: Path, tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    src.write_bytes(b"hi")
    new = entry_for(src)
    State(tmp_path).commit(ws, "tx1", [FileOp("a/b/c.txt", None, new, src)])
    assert (ws / "a/b/c.txt").read_bytes() == b"hi"
    assert entry_for(ws / "a/b").mode == 0o755


def assert_nothing_written(ws: Path, before: Manifest, state: State) -> None:
    assert scan(ws) == before
    assert state.journals() == []
    assert not state.backups.exists()


def test_conflict_when_live_file_changed_after_base(ws: Path, tmp_path: Path) -> None:
    staging = staged(ws, tmp_path, agent_edit)
    ops = ops_between(ws, staging)
    (ws / "src/app.py").write_bytes(b"print('edited by a person')\n")
    (ws / "src/util/old.py").write_bytes(b"touched\n")
    before, state = scan(ws), State(tmp_path)
    with pytest.raises(ConflictError) as err:
        state.commit(ws, "tx1", ops)
    assert sorted(err.value.paths) == ["src/app.py", "src/util/old.py"]
    assert "src/app.py" in err.value.message and "src/util/old.py" in err.value.message
    assert_nothing_written(ws, before, state)


def test_conflict_when_a_file_appeared(ws: Path, tmp_path: Path) -> None:
    staging = staged(ws, tmp_path, agent_edit)
    ops = ops_between(ws, staging)
    (ws / "src/new.py").write_bytes(b"mine\n")
    before, state = scan(ws), State(tmp_path)
    with pytest.raises(ConflictError) as err:
        state.commit(ws, "tx1", ops)
    assert err.value.paths == ["src/new.py"]
    assert "appeared" in err.value.message
    assert_nothing_written(ws, before, state)


def test_conflict_when_a_parent_is_a_symlink_out_of_the_workspace(ws: Path, tmp_path: Path) -> None:
    staging = staged(ws, tmp_path, agent_edit)
    ops = ops_between(ws, staging)
    outside = build(tmp_path / "outside", {"x": b"x"})
    shutil.rmtree(ws / "new", ignore_errors=True)
    (ws / "new").symlink_to(outside, target_is_directory=True)
    before, state = scan(ws), State(tmp_path)
    with pytest.raises(ConflictError) as err:
        state.commit(ws, "tx1", ops)
    assert "new/deep/er/file.txt" in err.value.paths
    assert "symlink" in err.value.message
    assert sorted(os.listdir(outside)) == ["x"]
    assert_nothing_written(ws, before, state)


def test_conflict_when_a_parent_is_a_file(ws: Path, tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    src.write_bytes(b"hi")
    before, state = scan(ws), State(tmp_path)
    with pytest.raises(ConflictError, match="not a directory"):
        state.commit(ws, "tx1", [FileOp("keep.txt/inner", None, entry_for(src), src)])
    assert_nothing_written(ws, before, state)


@pytest.mark.parametrize(
    "op",
    [
        FileOp("../escape", None, Entry(Kind.DIR, 0o755)),
        FileOp("/abs", None, Entry(Kind.DIR, 0o755)),
        FileOp("a//b", None, Entry(Kind.DIR, 0o755)),
        FileOp("link", None, Entry(Kind.SYMLINK, 0o777, target="/etc")),
        FileOp("keep.txt", Entry(Kind.FILE, 0o644, 5, "0" * 64), Entry(Kind.DIR, 0o755)),
        FileOp("f", None, Entry(Kind.FILE, 0o644, 1, "0" * 64), None),
    ],
)
def test_malformed_ops_are_refused_before_anything_is_written(ws: Path, tmp_path: Path, op: FileOp) -> None:
    before, state = scan(ws), State(tmp_path)
    with pytest.raises(CommitError, match="nothing was written"):
        state.commit(ws, "tx1", [op])
    assert_nothing_written(ws, before, state)


def assert_rolled_back(ws: Path, before: Manifest, state: State, err: CommitError) -> None:
    assert "restored and verified" in err.message
    assert scan(ws) == before
    assert state.journals() == []
    assert not (state.backups / "tx1").exists()


def test_source_with_wrong_hash_rolls_back(ws: Path, tmp_path: Path) -> None:
    staging = staged(ws, tmp_path, agent_edit)
    ops = ops_between(ws, staging)
    (staging / "src/new.py").write_bytes(b"x = 2\n")  # staging changed after inspection
    before, state = scan(ws), State(tmp_path)
    with pytest.raises(CommitError) as err:
        state.commit(ws, "tx1", ops)
    assert "src/new.py" in err.value.message and "SHA-256" in err.value.message
    assert_rolled_back(ws, before, state, err.value)


def test_failing_replace_rolls_back_and_verifies(ws: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    staging = staged(ws, tmp_path, agent_edit)
    ops = ops_between(ws, staging)
    real_replace, calls = os.replace, []

    def flaky(src: str | os.PathLike[str], dst: str | os.PathLike[str], **kw: int | None) -> None:
        calls.append(dst)
        in_ws = [c for c in calls if Path(c).is_relative_to(ws)]
        if Path(dst).is_relative_to(ws) and len(in_ws) == 3:  # two files are already in place
            raise OSError(5, "injected I/O error", str(dst))
        real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "replace", flaky)
    before, state = scan(ws), State(tmp_path)
    with pytest.raises(CommitError, match="injected I/O error") as err:
        state.commit(ws, "tx1", ops)
    assert len(calls) > 4  # journal, 3 replaces, then the rollback restored src/app.py
    assert_rolled_back(ws, before, state, err.value)


@pytest.mark.parametrize("where", ["journal", "backup", "mkdir", "write", "replace", "delete", "rmdir", "chmod"])
def test_failure_at_every_kind_of_step_rolls_back(ws: Path, tmp_path: Path, where: str) -> None:
    staging = staged(ws, tmp_path, agent_edit)
    ops = ops_between(ws, staging)
    seen: list[str] = []
    nth = {"journal": 1, "rmdir": 1}.get(where, 2)  # the 2nd when there are several: some done

    def checkpoint(label: str) -> None:
        if label.split(" ")[0] == where:
            seen.append(label)
            if len(seen) == nth:
                raise RuntimeError(f"boom at {label}")

    before, state = scan(ws), State(tmp_path)
    with pytest.raises(CommitError, match="boom at") as err:
        state.commit(ws, "tx1", ops, checkpoint=checkpoint)
    assert_rolled_back(ws, before, state, err.value)


def test_checkpoints_cover_every_operation(ws: Path, tmp_path: Path) -> None:
    staging = staged(ws, tmp_path, agent_edit)
    seen: list[str] = []
    State(tmp_path).commit(ws, "tx1", ops_between(ws, staging), checkpoint=seen.append)
    kinds = [s.split(" ")[0] for s in seen]
    assert kinds[0] == "journal" and kinds[-2:] == ["committed", "recorded"]
    assert "replace src/app.py" in seen and "rmdir docs/guide" in seen and "mkdir new/deep/er" in seen
    assert kinds.count("backup") == 5 and kinds.count("delete") == 3 and kinds.count("write") == 4


def test_a_raising_checkpoint_after_the_marker_leaves_a_committed_journal(ws: Path, tmp_path: Path) -> None:
    staging = staged(ws, tmp_path, agent_edit)

    def checkpoint(label: str) -> None:
        if label == "committed":
            raise RuntimeError("daemon stopped")

    state = State(tmp_path)
    with pytest.raises(RuntimeError):
        state.commit(ws, "tx1", ops_between(ws, staging), checkpoint=checkpoint)
    assert state.journals() == ["tx1.json"]
    [rec] = recover(ws, state.journal, state.backups)
    assert (rec.txid, rec.outcome, rec.verified) == ("tx1", "completed", True)
    assert scan(ws) == scan(staging)
    assert state.journals() == [] and (state.backups / "tx1" / RECORD).exists()
    assert undo_ops(ws, state.backups, "tx1")  # the recovered record is good for undo


def test_deleting_a_directory_that_keeps_a_withheld_file_leaves_it(ws: Path, tmp_path: Path) -> None:
    (ws / "docs/guide/.env").write_bytes(b"SECRET=1\n")
    ops = [
        FileOp("docs/guide/intro.md", entry_for(ws / "docs/guide/intro.md"), None),
        FileOp("docs/guide/more.md", entry_for(ws / "docs/guide/more.md"), None),
        FileOp("docs/guide", entry_for(ws / "docs/guide"), None),
    ]
    applied = State(tmp_path).commit(ws, "tx1", ops)
    assert applied == ["docs/guide/intro.md", "docs/guide/more.md"]
    assert sorted(os.listdir(ws / "docs/guide")) == [".env"]


def test_undo_restores_the_old_tree(ws: Path, tmp_path: Path) -> None:
    before = scan(ws)
    staging = staged(ws, tmp_path, agent_edit)
    state = State(tmp_path)
    state.commit(ws, "tx1", ops_between(ws, staging))
    result = undo(ws, state.journal, state.backups, "tx1")
    assert scan(ws) == before
    assert result.txid == "tx1-undo" and state.journals() == []
    # an undo is a transaction too: it can itself be undone
    undo(ws, state.journal, state.backups, "tx1-undo")
    assert scan(ws) == scan(staging)


def test_undo_is_refused_when_a_file_changed_since(ws: Path, tmp_path: Path) -> None:
    staging = staged(ws, tmp_path, agent_edit)
    state = State(tmp_path)
    state.commit(ws, "tx1", ops_between(ws, staging))
    (ws / "src/app.py").write_bytes(b"print('edited after the commit')\n")
    (ws / "new/deep/er/file.txt").unlink()
    after = scan(ws)
    with pytest.raises(ConflictError) as err:
        undo(ws, state.journal, state.backups, "tx1")
    assert sorted(err.value.paths) == ["new/deep/er/file.txt", "src/app.py"]
    assert "src/app.py" in err.value.message and "new/deep/er/file.txt" in err.value.message
    assert scan(ws) == after and state.journals() == []


def test_undo_of_an_unknown_transaction(ws: Path, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        undo_ops(ws, State(tmp_path).backups, "nope")


def test_a_transaction_id_is_used_once(ws: Path, tmp_path: Path) -> None:
    staging = staged(ws, tmp_path, lambda s: (s / "a.txt").write_bytes(b"a"))
    state = State(tmp_path)
    state.commit(ws, "tx1", ops_between(ws, staging))
    with pytest.raises(CommitError, match="already exists"):
        state.commit(ws, "tx1", [])
    with pytest.raises(CommitError, match="invalid transaction id"):
        state.commit(ws, "../tx", [])


HOSTILE = [
    "with space.txt",
    "new\nline.txt",
    "ünïcødé/日本語.md",
    os.fsdecode(b"bytes-\xff\xfe.bin"),
    "-rf",
    "--help/-x",
    " lead and trail ",
    "tab\there",
    os.fsdecode(b"dir-\xc3\x28/file"),
]


def test_hostile_names_commit_conflict_and_undo(ws: Path, tmp_path: Path) -> None:
    build(ws, {HOSTILE[0]: b"old", HOSTILE[3]: b"old bytes", HOSTILE[4]: b"dash"})
    before = scan(ws)

    def edit(s: Path) -> None:
        for name in HOSTILE:
            (s / name).parent.mkdir(parents=True, exist_ok=True)
            (s / name).write_bytes(name.encode("utf-8", "surrogateescape") * 3)
        (s / HOSTILE[4]).unlink()

    staging = staged(ws, tmp_path, edit)
    state = State(tmp_path)
    state.commit(ws, "tx1", ops_between(ws, staging))
    assert scan(ws) == scan(staging)
    (ws / HOSTILE[3]).write_bytes(b"changed")
    with pytest.raises(ConflictError) as err:
        undo(ws, state.journal, state.backups, "tx1")
    assert err.value.paths == [HOSTILE[3]]
    assert "bytes-\\udcff\\udcfe.bin" in err.value.message  # displayed escaped, never raw bytes
    (ws / HOSTILE[3]).write_bytes(HOSTILE[3].encode("utf-8", "surrogateescape") * 3)
    undo(ws, state.journal, state.backups, "tx1")
    assert scan(ws) == before


_name = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="/\0"), min_size=1, max_size=8).filter(
    lambda n: n not in (".", "..") and len(n.encode()) < 100
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    old=st.dictionaries(st.lists(_name, min_size=1, max_size=3).map("/".join), st.binary(max_size=64), max_size=6),
    new=st.dictionaries(st.lists(_name, min_size=1, max_size=3).map("/".join), st.binary(max_size=64), max_size=6),
)
def test_any_tree_commits_and_undoes_exactly(old: dict[str, bytes], new: dict[str, bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws, staging = root / "ws", root / "staging"
        for tree, where in ((old, ws), (new, staging)):
            where.mkdir()
            for rel, data in tree.items():
                try:
                    (where / rel).parent.mkdir(parents=True, exist_ok=True)
                    (where / rel).write_bytes(data)
                except (FileExistsError, NotADirectoryError, IsADirectoryError):
                    pass  # a name that is a file in one path and a directory in another
        before, after = scan(ws), scan(staging)
        ops = ops_from_changes(diff(before, after), staging)
        if any(op.base and op.new and op.base.kind != op.new.kind for op in ops):
            return  # type changes are refused by design (tested above)
        state = State(root)
        state.commit(ws, "tx1", ops)
        assert scan(ws) == after
        undo(ws, state.journal, state.backups, "tx1")
        assert scan(ws) == before
