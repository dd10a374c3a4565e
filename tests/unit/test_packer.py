"""The cold build's packer (staging/packer.py): the mirror's blobs packed in a process of its own
while the walk stages the tree. Nothing may rest on it: names of any bytes reach it intact, it
never follows a link out of the mirror, the walk never waits for it, a node that changed after
it read it is read again, and a packer that cannot start or dies leaves nothing and the
repository is built in the walking process, the same."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest
from githistory import git, history_workspace
from test_gitcopy import assert_fresh_repo, assert_not_in_store

from airlockd.policy import Level, Policy, load_policy
from airlockd.staging import gitcopy, packer
from airlockd.staging.gitobjects import blob_id
from airlockd.staging.mirror import Mirror
from airlockd.staging.packer import Packer


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    return load_policy(tmp_path / "no-workspace").policy


def _started(tree: Path) -> Packer:
    p = Packer.start(tree, None)
    assert p is not None
    return p


def test_names_of_any_bytes_are_packed_and_links_are_never_followed(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"outside-the-mirror-7f3a\n")
    deep = tree / "/".join(f"d{i}" for i in range(40))
    deep.mkdir(parents=True)
    files = {
        "plain.txt": b"plain\n",
        "new\nline.txt": b"a name with a newline\n",
        "tab\there": b"a tab\n",
        os.fsdecode(b"latin-\xe9.txt"): b"not utf-8 in the name\n",
        "sp ace/x.py": b"print(1)\n",
        deep.relative_to(tree).as_posix() + "/leaf.txt": b"deep\n",
        "empty": b"",
    }
    for rel, data in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
    (tree / "link").symlink_to(outside)
    (tree / "file-link").symlink_to(outside / "secret.txt")
    p = _started(tree)
    for rel in [*files, "link/secret.txt", "file-link", "gone.txt"]:
        p.add(rel)
    report = p.finish()
    assert report is not None
    assert set(report) == set(files)
    for rel, data in files.items():
        oid, size, ino, mtime = report[rel]
        st = os.lstat(tree / rel)
        assert (oid.hex(), size, ino, mtime) == (blob_id(data), len(data), st.st_ino, st.st_mtime_ns)
    packs = list((tree / ".git/objects/pack").glob("*.pack"))
    assert len(packs) == 1 and b"outside-the-mirror-7f3a" not in packs[0].read_bytes()
    git(tree, "verify-pack", str(packs[0].with_suffix(".idx")))


def test_the_walk_never_waits_for_a_packer_that_is_slow(tmp_path: Path) -> None:
    """Stopped, the child reads nothing: handing it 4 MiB of names (four times the pipe) must
    still return at once; the names wait in memory and reach it at `finish`."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "real.txt").write_bytes(b"real\n")
    p = _started(tree)
    os.kill(p.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        for i in range(100_000):
            p.add(f"some/directory/not-there-{i:08d}.txt")
        p.add("real.txt")
        assert time.monotonic() - t0 < 30
    finally:
        os.kill(p.proc.pid, signal.SIGCONT)
    report = p.finish()
    assert report is not None and set(report) == {"real.txt"}


@pytest.mark.parametrize("how", ["cannot-start", "exits", "killed"])
def test_a_packer_that_fails_leaves_nothing_and_the_build_reads_the_tree_itself(
    tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    ws = history_workspace(tmp_path, packed=False)
    reads: list[str] = []
    real_read = gitcopy._content_at
    monkeypatch.setattr(gitcopy, "_content_at", lambda fd, name: reads.append(name) or real_read(fd, name))
    if how == "cannot-start":
        monkeypatch.setattr(packer.sys, "executable", str(tmp_path / "no-python-here"))
    elif how == "exits":
        monkeypatch.setattr(packer, "MODULE", "airlockd.staging.no_such_module")
    else:
        real_add = Packer.add

        def add_then_kill(self: Packer, rel: str) -> None:
            real_add(self, rel)
            if self.proc.returncode is None:
                self.proc.kill()
                self.proc.wait()

        monkeypatch.setattr(Packer, "add", add_then_kill)
    with caplog.at_level(logging.WARNING, logger="airlockd.staging.packer"):
        view = Mirror(tmp_path / "mirror").refresh(ws, policy, Level.INTERNAL)
    assert "the cold build packs in this process" in caplog.text
    assert {"app.py", "README.md"} <= set(reads)  # read here, since the packer's report is gone
    assert_fresh_repo(view.tree, {"src/app.py", "README.md"})
    assert not list((view.tree / ".git").rglob("tmp_*"))


def test_a_node_changed_after_the_packer_read_it_is_read_again(tmp_path: Path) -> None:
    """Same size, same name, another inode (the walk replaced it): the report's blob is not
    trusted for it."""
    ws = history_workspace(tmp_path, packed=False)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.txt").write_bytes(b"first-version\n")
    (tree / "b.txt").write_bytes(b"unchanged\n")
    p = _started(tree)
    p.add("a.txt")
    p.add("b.txt")
    report = p.finish()
    assert report is not None and set(report) == {"a.txt", "b.txt"}
    (tree / "new.txt").write_bytes(b"other-version\n")
    os.replace(tree / "new.txt", tree / "a.txt")

    class Reported:
        def finish(self) -> dict[str, packer.Packed]:
            assert report is not None
            return report

    head = gitcopy.workspace_head(ws)
    assert head is not None
    repo = gitcopy.Repo(tree, None, split=True)
    state = repo.build(head, packer=Reported())  # type: ignore[arg-type]
    repo.commit(state, head)
    assert git(tree, "show", "HEAD:a.txt") == "other-version\n"
    assert git(tree, "show", "HEAD:b.txt") == "unchanged\n"
    git(tree, "fsck", "--strict", "--no-progress")


def test_a_cold_build_packs_in_the_child_and_keeps_out_what_the_walk_dropped(
    tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child packed a byte copy of `.env` before the walk knew it for one (it is staged first,
    dropped at the walk's end): the purge of the cold build leaves no object of it."""
    ws = history_workspace(tmp_path, packed=False)
    env = "TOKEN=" + "the-value-of-dot-env-" + "91be\n"
    (ws / ".env").write_text(env)
    (ws / "aaa-copy.txt").write_text(env)
    added: list[str] = []
    real_add = Packer.add
    monkeypatch.setattr(Packer, "add", lambda self, rel: added.append(rel) or real_add(self, rel))
    view = Mirror(tmp_path / "mirror").refresh(ws, policy, Level.INTERNAL)
    assert "aaa-copy.txt" in added and not (view.tree / "aaa-copy.txt").exists()
    assert_fresh_repo(view.tree, {"src/app.py", "README.md"})
    assert_not_in_store(view.tree, b"the-value-of-dot-env-")


def test_a_read_cut_at_the_kernels_cap_is_not_taken_for_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read(2) returns at most MAX_READ bytes (about 2 GiB): a file bigger than that was cut
    there, its blob and the index then wrong (attack review). Played with a small cap."""
    from airlockd.staging import fdtree

    data = os.urandom(10_000)
    (tmp_path / "big").write_bytes(data)
    real = os.read
    monkeypatch.setattr(fdtree, "MAX_READ", 4096)
    monkeypatch.setattr(fdtree.os, "read", lambda fd, n: real(fd, min(n, 4096)))
    fd = os.open(tmp_path / "big", os.O_RDONLY)
    try:
        assert fdtree.read_all(fd, len(data)) == data
    finally:
        os.close(fd)
