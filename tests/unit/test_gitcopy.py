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
from airlockd.redact import Redactor
from airlockd.staging import gitcopy, mirrorrepo
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


def assert_not_in_store(tree: Path, needle: bytes) -> None:
    """No object of `tree`'s repository (as git reads them) and no file of its `.git` holds
    `needle`."""
    objs = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch"], cwd=tree, capture_output=True, check=True
    ).stdout
    assert needle not in objs
    for p in (tree / ".git").rglob("*"):
        if p.is_file():
            assert needle not in p.read_bytes(), p


def assert_fresh_repo(
    copy: Path, files: set[str], branch: str | None = "feature/x", earlier: frozenset[str] = frozenset()
) -> str:
    """One commit, on `branch`, fsck-clean, its tree exactly `files`, nothing unreachable but
    objects of `earlier` (earlier versions of staged files, in a pack between walks); the
    commit id."""
    commits = git(copy, "log", "--all", "--format=%H %an <%ae> %P").split("\n")[:-1]
    assert len(commits) == 1 and commits[0].endswith(" airlockd <airlockd@localhost> "), commits
    if branch:
        assert git(copy, "symbolic-ref", "HEAD").strip() == f"refs/heads/{branch}"
    else:
        assert git(copy, "symbolic-ref", "HEAD", check=False) == ""
    assert git(copy, "for-each-ref", "--format=%(refname)").split() == ([f"refs/heads/{branch}"] if branch else [])
    git(copy, "fsck", "--strict", "--no-progress")
    unreachable = {line.split()[-1] for line in git(copy, "fsck", "--unreachable", "--no-progress").splitlines()}
    assert unreachable <= earlier, unreachable - earlier
    assert set(git(copy, "ls-tree", "-r", "--name-only", "-z", "HEAD").split("\0")[:-1]) == files
    reachable = git(copy, "rev-list", "--objects", "--all").splitlines()
    stored = git(copy, "cat-file", "--batch-all-objects", "--batch-check").splitlines()
    assert len(reachable) + len(unreachable) == len(stored)
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
    mirrorrepo.MIRRORS.forget(mirror.root)
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
        first = frozenset(line.split()[0] for line in git(view.tree, "rev-list", "--objects", "--all").splitlines())
        (ws / "src" / "app.py").write_text("KEY = 3\n")
        (ws / "src" / "new.py").write_text("NEW = 1\n")
        (ws / "README.md").unlink()
        git(ws, "checkout", "-q", "-b", "other")  # the branch follows the workspace's HEAD
        view = keeper.refresh(policy, Level.INTERNAL)
        assert view.stats.read >= 2  # incremental: the keeper read only what changed
        # earlier versions of the files stay in the cold build's pack until the next walk
        assert_fresh_repo(view.tree, {"src/app.py", "src/new.py"}, branch="other", earlier=first)
        assert git(view.tree, "show", "HEAD:src/app.py") == "KEY = 3\n"
        assert_no_secret(view.tree)
        (ws / "src" / "app.py").write_text("KEY = 4\n")
        view = keeper.refresh(policy, Level.INTERNAL)
        assert git(view.tree, "status", "--porcelain") == ""  # the split index, as git reads it
        view = keeper.refresh(policy, Level.INTERNAL, walk=True)  # a walk purges the pack
        assert_fresh_repo(view.tree, {"src/app.py", "src/new.py"}, branch="other")
        assert git(view.tree, "show", "HEAD:src/app.py") == "KEY = 4\n"
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


# -- the split index, the pack, and what a purge keeps out -------------------------------------------


def _ls_files(tree: Path) -> dict[str, str]:
    out = {}
    for line in git(tree, "ls-files", "-s", "-z").split("\0")[:-1]:
        meta, path = line.split("\t", 1)
        out[path] = meta.split()[1]
    return out


def test_split_index_across_many_refreshes_reads_as_git_reads_it(tmp_path: Path) -> None:
    """Random adds, edits and removals over refreshes, past a rewrite of the shared index: git
    reads the split index as exactly the tree, `git status` is clean, another process reads it
    back the same, and git's own writes (the agent's `git add`) keep working on it."""
    import random

    from airlockd.staging.gitindex import SHARE_AGAIN, read_index

    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    tree = tmp_path / "tree"
    tree.mkdir()
    rnd = random.Random(7)
    live: set[str] = set()
    for i in range(300):
        rel = f"d{i % 7}/sub{i % 3}/f{i}.txt"
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(f"file {i}\n")
        live.add(rel)
    head = gitcopy.Head("main")
    repo = gitcopy.Repo(tree, None, split=True)
    state = repo.build(head)
    repo.commit(state, head)
    shared_ids = {state.index.shared_id}
    for step in range(40):
        changed = []
        for _ in range(rnd.randint(1, 12)):
            op = rnd.random()
            if op < 0.4 and live:
                rel = rnd.choice(sorted(live))
                (tree / rel).write_text(f"edit {step} {rnd.random()}\n")
            elif op < 0.7 and live:
                rel = rnd.choice(sorted(live))
                (tree / rel).unlink()
                live.discard(rel)
            else:
                rel = f"n{step % 5}/new{step}-{rnd.randint(0, 10**6)}.txt"
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                (tree / rel).write_text(f"new {step}\n")
                live.add(rel)
            changed.append(rel)
        repo = gitcopy.Repo(tree, None, split=True)
        state = repo.build(head, state, changed)
        repo.commit(state, head)
        shared_ids.add(state.index.shared_id)
        assert git(tree, "status", "--porcelain", "--untracked-files=no") == "", step
        on_disk = read_index(str(tree / ".git"))
        assert set(on_disk) == live and set(_ls_files(tree)) == live
        assert {p: v[0].hex() for p, v in on_disk.items()} == _ls_files(tree)
    assert len(shared_ids) > 1, f"the shared index was never written again (SHARE_AGAIN={SHARE_AGAIN})"
    shared = sorted(p.name for p in (tree / ".git").glob("sharedindex.*"))
    assert shared == [f"sharedindex.{state.index.shared_id.hex()}"]
    commit = state.commit
    # another process: the state rebuilt from the split index on disk gives the same commit
    repo = gitcopy.Repo(tree, None, split=True)
    again = repo.build(head)
    assert repo.commit(again, head) == commit
    git(tree, "fsck", "--strict", "--no-progress")
    # the agent's git on the split index
    some = sorted(live)[0]
    (tree / some).write_text("agent\n")
    git(tree, "add", some)
    git(tree, "commit", "-qm", "agent")
    assert git(tree, "status", "--porcelain", "--untracked-files=no") == ""


def test_pack_verifies_and_a_purge_keeps_only_what_is_reachable(tmp_path: Path) -> None:
    from airlockd.staging.gitobjects import read_pack

    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(50):
        (tree / f"f{i}.bin").write_bytes(os.urandom(70_000 + i))  # several stored blocks each
    (tree / "empty").write_bytes(b"")
    head = gitcopy.Head("main")
    repo = gitcopy.Repo(tree, None, split=True)
    state = repo.build(head)
    repo.commit(state, head)
    (pack,) = (tree / ".git/objects/pack").glob("*.pack")
    assert "ok" in subprocess.run(["git", "verify-pack", "-v", str(pack)], capture_output=True, text=True).stdout
    name = pack.name[:-5]
    back = read_pack(pack.parent, name)
    assert back is not None and back.objects == state.packs[name].objects
    assert back.size == state.packs[name].size == pack.stat().st_size - 20  # where its objects end
    old = gitcopy.blob_id((tree / "f3.bin").read_bytes())
    (tree / "f3.bin").write_bytes(b"now other bytes\n")
    (tree / "f4.bin").unlink()
    repo = gitcopy.Repo(tree, None, split=True)
    state = repo.build(head, state, ["f3.bin", "f4.bin"])
    repo.commit(state, head)
    assert bytes.fromhex(old) in state.dead  # packed: dead until the purge
    assert repo.purge(state) >= 2
    assert not state.dead
    stored = git(tree, "cat-file", "--batch-all-objects", "--batch-check").splitlines()
    assert not [s for s in stored if s.startswith(old)]
    git(tree, "fsck", "--strict", "--no-progress")
    assert git(tree, "fsck", "--unreachable", "--no-progress") == ""
    for p in (tree / ".git/objects/pack").glob("*.pack"):
        subprocess.run(["git", "verify-pack", str(p)], check=True, capture_output=True)


def test_joins_leave_the_packs_geometric_and_a_purge_still_removes_every_dead_object(tmp_path: Path) -> None:
    """A join takes the smallest packs while the next is under twice their sum: a cold build's
    big trees pack waits until the refreshes' packs add up to half of it, instead of being
    rewritten at every join; a full purge still leaves no dead object in any pack."""
    from airlockd.staging.gitobjects import Pack, small_packs, to_join

    def pack(name: str, size: int) -> Pack:
        return Pack(name, {name.encode().ljust(20, b"-"): (12, size - 12, 0)})

    refreshes = [pack(f"r{i}", 10_000) for i in range(9)]
    trees, blobs = pack("trees", 1_400_000), [pack(f"b{i}", 32 << 20) for i in range(7)]
    assert to_join([*blobs, trees, *refreshes]) == refreshes
    assert to_join([*blobs, trees, pack("joined", 800_000), *refreshes[:2]]) == [*refreshes[:2]]
    joins = [pack("j1", 400_000), pack("j2", 350_000), pack("j3", 300_000)]
    assert [p.name for p in to_join([*blobs, trees, *joins])] == ["j3", "j2", "j1", "trees"]

    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(300):
        (tree / f"f{i}.txt").write_text(f"file {i}\n" * 900)  # a cold pack of 2.5 MB: small, but not as a refresh
    head = gitcopy.Head("main")
    repo = gitcopy.Repo(tree, None, split=True)
    state = repo.build(head)
    repo.commit(state, head)
    olds: set[str] = set()
    rewritten = everything = 0  # objects rewritten by the joins; by joins of every small pack
    for step in range(200):
        rel = f"f{step % 7}.txt"
        olds.add(gitcopy.blob_id((tree / rel).read_bytes()))
        (tree / rel).write_text(f"step {step}\n")
        repo = gitcopy.Repo(tree, None, split=True)
        state = repo.build(head, state, [rel])
        repo.commit(state, head)
        if len(small_packs(state.packs.values())) > mirrorrepo.MAX_PACKS:
            rewritten += sum(len(p.objects) for p in to_join(state.packs.values()))
            everything += sum(len(p.objects) for p in small_packs(state.packs.values()))
            repo.purge(state, small_only=True)
        assert len(small_packs(state.packs.values())) <= mirrorrepo.MAX_PACKS
    assert rewritten * 2 < everything
    repo.purge(state)
    live = {gitcopy.blob_id((tree / f"f{i}.txt").read_bytes()) for i in range(7)}
    stored = {line.split()[0] for line in git(tree, "cat-file", "--batch-all-objects", "--batch-check").splitlines()}
    assert not (olds - live) & stored
    assert git(tree, "fsck", "--unreachable", "--no-progress") == ""
    git(tree, "fsck", "--strict", "--no-progress")


def test_after_a_walk_in_another_process_the_keeper_brings_the_repository_up_by_what_changed(
    tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon walks in another process every few minutes; that process leaves the
    generation's repository to the keeper, which updates it by what the walk changed with the
    state it keeps (it used to rescan the whole tree on the next run's refresh: 0.6 s on the
    benchmark tree), and purges as every walk does."""
    from airlockd.runs.mirrors import walk_elsewhere
    from airlockd.state import StateDir

    ws = history_workspace(tmp_path, packed=False)
    monkeypatch.setenv("AIRLOCK_STATE_DIR", str(tmp_path / "states"))
    safe = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
    for key, value in safe.items():  # as root, the walk's process gives the mirror to the agent's uid
        monkeypatch.setenv(key, value)
    state = StateDir.for_workspace(ws).ensure()
    scans: list[int] = []
    real_scan = gitcopy.Repo._scan
    monkeypatch.setattr(gitcopy.Repo, "_scan", lambda self, *a, **k: scans.append(1) or real_scan(self, *a, **k))
    keeper = MirrorKeeper(ws, state.root, walker=walk_elsewhere(ws))
    if keeper.start() is not None:
        pytest.skip(f"no inotify: {keeper.why}")
    try:
        keeper.refresh(policy, Level.INTERNAL)  # the cold build elsewhere, then one rescan here
        assert scans == [1]
        old = gitcopy.blob_id((ws / "src/app.py").read_bytes())
        (ws / "src/app.py").write_text("KEY = 'edited'\n")
        keeper.refresh(policy, Level.INTERNAL)
        os.utime(ws / "README.md", ns=(1_600_000_000 * 10**9,) * 2)  # same bytes, a new mtime: no event
        view = keeper.refresh(policy, Level.INTERNAL, walk=True)  # the periodic walk, elsewhere
        stored = git(view.tree, "cat-file", "--batch-all-objects", "--batch-check")
        assert old not in stored  # the walk's purge happened
        # the walk gave README.md a new node; the index says so (attack review: it kept the old)
        assert git(view.tree, "diff-files", "--name-only") == ""
        before = frozenset(line.split()[0] for line in git(view.tree, "rev-list", "--objects", "--all").splitlines())
        (ws / "README.md").write_text("# project, edited after the walk\n")
        view = keeper.refresh(policy, Level.INTERNAL)
        assert scans == [1]  # never the whole tree again
        assert_fresh_repo(view.tree, {"src/app.py", "README.md"}, earlier=before)  # until the next purge
        assert git(view.tree, "show", "HEAD:README.md") == "# project, edited after the walk\n"
    finally:
        keeper.close()


def test_ewah_bitmaps_round_trip() -> None:
    import random

    from airlockd.staging.gitindex import ewah, ewah_bits

    rnd = random.Random(3)
    for n in (0, 1, 5, 64, 200, 3000):
        bits = sorted(rnd.sample(range(max(n * 3, 1) + 130), n))
        data = ewah(bits) + b"tail"
        got, end = ewah_bits(data, 0)
        assert got == bits and data[end:] == b"tail"
    assert ewah_bits(ewah(range(0, 640)), 0)[0] == list(range(640))  # consecutive literal words


def test_a_copy_of_a_withheld_file_leaves_the_mirrors_pack(tmp_path: Path, policy: Policy) -> None:
    """A clean file in the cold build's pack whose bytes then become a withheld file's (a new
    `.env` with the same content): the file is withheld by identity, and the repository holds
    no object with those bytes, packed or loose."""
    ws = history_workspace(tmp_path, packed=False)
    value = "TOKEN=" + "a-value-that-is-withheld-" + "9d2e"
    (ws / "notes.txt").write_text(value + "\n")
    keeper = MirrorKeeper(ws, tmp_path / "state")
    if keeper.start() is not None:
        pytest.skip(f"no inotify: {keeper.why}")
    try:
        view = keeper.refresh(policy, Level.INTERNAL)
        assert "notes.txt" in git(view.tree, "ls-files")
        (ws / "sub").mkdir()
        (ws / "sub" / ".env").write_text(value + "\n")
        view = keeper.refresh(policy, Level.INTERNAL)
        assert not (view.tree / "notes.txt").exists()
        assert_not_in_store(view.tree, value.encode())
    finally:
        keeper.close()


def test_earlier_versions_of_a_file_withheld_by_content_leave_the_store(tmp_path: Path, policy: Policy) -> None:
    """A file that becomes withheld by its content (a token added): every earlier version of it
    leaves the mirror's store at that refresh, also one no run was shown (found by the attack
    review: the store kept them until the next walk, and the password they hold is by then a
    withheld file's value)."""
    ws = history_workspace(tmp_path, packed=False)
    password = "pw-" + "5f1e9c" * 4
    token = "ghp_" + "Q7x" * 12
    keeper = MirrorKeeper(ws, tmp_path / "state")
    if keeper.start() is not None:
        pytest.skip(f"no inotify: {keeper.why}")
    try:
        (ws / "config.py").write_text('HOST = "db.local"\n')
        keeper.refresh(policy, Level.INTERNAL)
        (ws / "config.py").write_text(f'DB_PASSWORD = "{password}"\nHOST = "db.local"\n')
        view = keeper.refresh(policy, Level.INTERNAL)
        assert password in git(view.tree, "show", "HEAD:config.py")
        (ws / "config.py").write_text(f'DB_PASSWORD = "{password}"\nTOKEN = "{token}"\n')
        view = keeper.refresh(policy, Level.INTERNAL)
        assert not (view.tree / "config.py").exists()
        assert_not_in_store(view.tree, password.encode())
        git(view.tree, "fsck", "--strict", "--no-progress")
    finally:
        keeper.close()


def test_a_withheld_file_changed_through_a_link_outside_the_workspace(tmp_path: Path, policy: Policy) -> None:
    """`.env` is a hard link to a file outside the workspace, rewritten there (no event inside)
    to hold what a clean file held: the next refresh walks, the clean file's copy is withheld
    and its bytes leave the mirror's store (found by the attack review)."""
    ws = history_workspace(tmp_path, packed=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "envfile").write_text("TOKEN=first-value-of-the-env-file\n")
    os.link(outside / "envfile", ws / ".env.local")
    notes = "SERVICE_PASSWORD=" + "an-old-password-" + "77e1\n"
    (ws / "notes.txt").write_text(notes)
    keeper = MirrorKeeper(ws, tmp_path / "state")
    if keeper.start() is not None:
        pytest.skip(f"no inotify: {keeper.why}")
    try:
        view = keeper.refresh(policy, Level.INTERNAL)
        assert (view.tree / "notes.txt").exists() and not (view.tree / ".env.local").exists()
        (ws / "notes.txt").write_text("nothing to see\n")
        keeper.refresh(policy, Level.INTERNAL)
        (outside / "envfile").write_text(notes)  # through the link outside: no event in the workspace
        view = keeper.refresh(policy, Level.INTERNAL)
        assert_not_in_store(view.tree, b"an-old-password-")
    finally:
        keeper.close()


def test_a_cold_build_packs_what_the_walk_read_and_keeps_out_what_it_dropped(
    tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mirror's cold build packs each file as its walk stages it (the repository's scan
    reads nothing again), and a file the walk then drops (a byte copy of `.env`, known only once
    the walk is done) leaves no object behind."""
    ws = history_workspace(tmp_path, packed=False)
    env = "TOKEN=" + "the-value-of-dot-env-" + "3c9a\n"
    (ws / ".env").write_text(env)
    (ws / "aaa-copy.txt").write_text(env)  # staged first, dropped at the walk's end
    reads: list[str] = []
    real = gitcopy._content_at
    monkeypatch.setattr(gitcopy, "_content_at", lambda fd, name: reads.append(name) or real(fd, name))
    view = Mirror(tmp_path / "mirror").refresh(ws, policy, Level.INTERNAL)
    assert reads == []
    assert not (view.tree / "aaa-copy.txt").exists()
    assert_fresh_repo(view.tree, {"src/app.py", "README.md"})
    assert_not_in_store(view.tree, b"the-value-of-dot-env-")


def test_a_branch_name_that_carries_a_secret_is_not_copied(tmp_path: Path, policy: Policy) -> None:
    """`fix/<token>` or a branch named with a withheld credential would reach the copy's
    `.git/HEAD` and its refs: the fresh repository is on `main` instead (attack review)."""
    ws = history_workspace(tmp_path, packed=False)
    token = "ghp_" + "t" * 36
    git(ws, "checkout", "-q", "-b", f"fix/{token}")
    assert gitcopy.workspace_head(ws) == gitcopy.Head("main")
    cred = "Vq7mR2xK9pL4wZ8tN3"
    red = Redactor()
    red.add_file_values(f"DB_PASSWORD={cred}\n")
    git(ws, "checkout", "-q", "-b", f"try-{cred}")
    assert gitcopy.workspace_head(ws) == gitcopy.Head("main")
    del red
    git(ws, "checkout", "-q", "-b", "feature/ordinary-name")
    assert gitcopy.workspace_head(ws) == gitcopy.Head("feature/ordinary-name")


def test_a_cold_build_whose_packing_fails_says_so_and_leaves_no_pack(
    tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pack write that fails (a full disk) fails the refresh with that error and leaves no
    half-written pack in the mirror."""
    import errno

    ws = history_workspace(tmp_path, packed=False)
    real = gitcopy.ObjectStore.put
    calls: list[int] = []

    def full(self: gitcopy.ObjectStore, kind: bytes, data: bytes, oid: bytes | None = None) -> bytes:
        calls.append(1)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, kind, data, oid)

    monkeypatch.setattr(gitcopy.ObjectStore, "put", full)
    with pytest.raises(OSError, match="No space left"):
        Mirror(tmp_path / "mirror").refresh(ws, policy, Level.INTERNAL)
    assert not [p for p in (tmp_path / "mirror").rglob("tmp_pack_*")]
