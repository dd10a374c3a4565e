"""The fresh repository a staging copy gets instead of the workspace's `.git` (staging/gitcopy.py):
no byte of a secret from the workspace's history (loose objects, packs, stash, reflog) reaches
either stager's copy; one commit on the workspace's branch, `git fsck --strict` clean, its tree
exactly the staged files, nothing unreachable; the mirror keeps it so across refreshes and
hard-link clones of its generations."""

from __future__ import annotations

import os
import subprocess
import zlib
from pathlib import Path

import pytest
from githistory import SECRET, git, history_workspace

from airlockd.policy import Level, Policy, load_policy
from airlockd.staging import gitcopy
from airlockd.staging.copy import stage
from airlockd.staging.keeper import MirrorKeeper
from airlockd.staging.mirror import Mirror


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    return load_policy(tmp_path / "no-workspace").policy


def assert_no_secret(copy: Path) -> None:
    """No file of `copy` holds SECRET, loose objects decompressed, every object git can read."""
    for p in copy.rglob("*"):
        if p.is_symlink() or not p.is_file():
            continue
        data = p.read_bytes()
        assert SECRET.encode() not in data, p
        if "/.git/objects/" in str(p) and len(p.parent.name) == 2:
            assert SECRET.encode() not in zlib.decompress(data), p
    objs = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"], cwd=copy, capture_output=True, check=True
    ).stdout
    assert objs and SECRET.encode() not in objs


def assert_fresh_repo(copy: Path, files: set[str], branch: str | None = "feature/x") -> str:
    """One commit, on `branch`, fsck-clean, its tree exactly `files`, nothing unreachable; the
    commit id."""
    commits = git(copy, "log", "--all", "--format=%H %an <%ae> %P").split("\n")[:-1]
    assert len(commits) == 1 and commits[0].endswith(" airlockd <airlockd@localhost> "), commits
    if branch:
        assert git(copy, "symbolic-ref", "HEAD").strip() == f"refs/heads/{branch}"
    else:
        assert git(copy, "symbolic-ref", "HEAD", check=False) == ""
    assert git(copy, "for-each-ref", "--format=%(refname)").split() == ([f"refs/heads/{branch}"] if branch else [])
    git(copy, "fsck", "--strict", "--no-progress")
    assert git(copy, "fsck", "--unreachable", "--no-progress") == ""
    assert set(git(copy, "ls-tree", "-r", "--name-only", "-z", "HEAD").split("\0")[:-1]) == files
    reachable = git(copy, "rev-list", "--objects", "--all").splitlines()
    stored = git(copy, "cat-file", "--batch-all-objects", "--batch-check").splitlines()
    assert len(reachable) == len(stored)
    assert git(copy, "status", "--porcelain") == ""
    assert not (copy / ".git/logs").exists() and not (copy / ".git/hooks").exists()
    assert "remote" not in (copy / ".git/config").read_text()
    return commits[0].split()[0]


def staged_files(copy: Path) -> set[str]:
    out = set()
    for p in copy.rglob("*"):
        rel = p.relative_to(copy).as_posix()
        if rel.split("/")[0] != ".git" and (p.is_symlink() or p.is_file()):
            out.add(rel)
    return out


@pytest.mark.parametrize("packed", [False, True], ids=["loose", "packed"])
def test_copy_holds_a_fresh_repository_and_no_history(tmp_path: Path, policy: Policy, packed: bool) -> None:
    ws = history_workspace(tmp_path, packed=packed)
    copy = tmp_path / "copy"
    res = stage(ws, copy, policy, Level.INTERNAL)
    assert [w.rule for w in res.withheld if w.path == ".git"] == ["git-history"]
    written = gitcopy.build_copy(copy, ws, None)
    assert_no_secret(copy)
    files = staged_files(copy)
    assert files == {"src/app.py", "README.md"}  # .env is withheld by name
    commit = assert_fresh_repo(copy, files)
    assert {p for p in written if not p.startswith(".git/objects/")} >= {".git", ".git/HEAD", ".git/index"}
    again = tmp_path / "again"
    stage(ws, again, policy, Level.INTERNAL)
    gitcopy.build_copy(again, ws, None)
    assert git(again, "rev-parse", "HEAD").strip() == commit  # same tree, same commit


@pytest.mark.parametrize("packed", [False, True], ids=["loose", "packed"])
def test_mirror_holds_a_fresh_repository_kept_exact_across_refreshes(
    tmp_path: Path, policy: Policy, packed: bool
) -> None:
    ws = history_workspace(tmp_path, packed=packed)
    mirror = Mirror(tmp_path / "mirror")
    view = mirror.refresh(ws, policy, Level.INTERNAL, run_id="r1", is_live=lambda r: True)
    assert_no_secret(view.tree)
    first = assert_fresh_repo(view.tree, {"src/app.py", "README.md"})
    old_tree = view.tree
    # a change while run r1 holds the generation: the refresh clones it with hard links
    (ws / "src" / "app.py").write_text("KEY = 2\n")
    (ws / "README.md").unlink()
    (ws / "docs").mkdir()
    (ws / "docs" / "guide.md").write_text("guide\n")
    os.symlink("guide.md", ws / "docs" / "link.md")
    view2 = mirror.refresh(ws, policy, Level.INTERNAL, run_id="r2", is_live=lambda r: True)
    assert view2.tree != old_tree and view2.stats.cloned
    second = assert_fresh_repo(view2.tree, {"src/app.py", "docs/guide.md", "docs/link.md"})
    assert second != first
    assert assert_fresh_repo(old_tree, {"src/app.py", "README.md"}) == first  # the clone left it whole
    assert git(old_tree, "show", "HEAD:src/app.py") == "KEY = None\n" and not (old_tree / "docs").exists()
    # another process (no state in memory): rebuilt from the index on disk, the same commit
    gitcopy.MIRRORS.forget(mirror.root)
    view3 = mirror.refresh(ws, policy, Level.INTERNAL)
    assert git(view3.tree, "rev-parse", "HEAD").strip() == second
    assert_no_secret(view3.tree)


def test_keeper_incremental_refresh_keeps_the_repository_exact(tmp_path: Path, policy: Policy) -> None:
    ws = history_workspace(tmp_path, packed=False)
    keeper = MirrorKeeper(ws, tmp_path / "state")
    if keeper.start() is not None:
        pytest.skip(f"no inotify: {keeper.why}")
    try:
        view = keeper.refresh(policy, Level.INTERNAL)
        assert_fresh_repo(view.tree, {"src/app.py", "README.md"})
        (ws / "src" / "app.py").write_text("KEY = 3\n")
        (ws / "src" / "new.py").write_text("NEW = 1\n")
        (ws / "README.md").unlink()
        git(ws, "checkout", "-q", "-b", "other")  # the branch follows the workspace's HEAD
        view = keeper.refresh(policy, Level.INTERNAL)
        assert view.stats.read >= 2  # incremental: the keeper read only what changed
        assert_fresh_repo(view.tree, {"src/app.py", "src/new.py"}, branch="other")
        assert git(view.tree, "show", "HEAD:src/app.py") == "KEY = 3\n"
        assert_no_secret(view.tree)
    finally:
        keeper.close()


def test_agent_git_use_in_the_copy(tmp_path: Path, policy: Policy) -> None:
    ws = history_workspace(tmp_path, packed=False)
    copy = tmp_path / "copy"
    stage(ws, copy, policy, Level.INTERNAL)
    gitcopy.build_copy(copy, ws, None)
    (copy / "src" / "app.py").write_text("KEY = 'changed'\n")
    assert git(copy, "status", "--porcelain") == " M src/app.py\n"
    assert "+KEY = 'changed'" in git(copy, "diff")
    git(copy, "commit", "-qam", "agent change")
    assert len(git(copy, "log", "--format=%H").split()) == 2
    git(copy, "fsck", "--strict", "--no-progress")


def test_head_detached_worktree_and_no_repository(tmp_path: Path, policy: Policy) -> None:
    ws = history_workspace(tmp_path, packed=False)
    git(ws, "checkout", "-q", "--detach")
    copy = tmp_path / "detached"
    stage(ws, copy, policy, Level.INTERNAL)
    gitcopy.build_copy(copy, ws, None)
    assert_fresh_repo(copy, {"src/app.py", "README.md"}, branch=None)
    git(ws, "checkout", "-q", "feature/x")
    wt = tmp_path / "wt"
    git(ws, "worktree", "add", "-q", "-b", "topic", str(wt))
    assert (wt / ".git").is_file()
    assert gitcopy.workspace_head(wt) == gitcopy.Head("topic")
    copy = tmp_path / "wt-copy"
    stage(wt, copy, policy, Level.INTERNAL)
    gitcopy.build_copy(copy, wt, None)
    assert_fresh_repo(copy, {"src/app.py", "README.md"}, branch="topic")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.txt").write_text("a\n")
    copy = tmp_path / "plain-copy"
    stage(plain, copy, policy, Level.INTERNAL)
    assert gitcopy.build_copy(copy, plain, None) == {} and not (copy / ".git").exists()


def test_objects_are_what_git_writes(tmp_path: Path) -> None:
    data = os.urandom(200_000) + b"\n"
    (tmp_path / "f").write_bytes(data)
    want = subprocess.run(["git", "hash-object", str(tmp_path / "f")], capture_output=True, text=True).stdout.strip()
    assert gitcopy.blob_id(data) == want
    raw = b"".join(gitcopy.stored_zlib(b"blob %d\0" % len(data), data))
    assert zlib.decompress(raw) == b"blob %d\0" % len(data) + data
    assert zlib.decompress(b"".join(gitcopy.stored_zlib(b"blob 0\0", b""))) == b"blob 0\0"
