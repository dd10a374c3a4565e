"""Inspection re-reads the workspace's withheld values from what the keeper knows, not by a walk.

A keeper that watches the workspace answers with the paths withheld at its last refresh and what
may have changed since (`withheld_since`); `learn_since` reads from those alone what `learn`
finds by walking the tree. Each check looks at the real effect: the values the redactor knows,
the paths read, and which folders were walked.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakesandbox import FakeSandbox, workspace

from airlockd.pipeline.manifest import Change, ChangeKind, ChangeSet, Entry, Kind
from airlockd.pipeline.manifest import walk as real_walk
from airlockd.policy import Level, Policy, load_policy
from airlockd.redact import Redactor
from airlockd.runs import inspection
from airlockd.runs.service import Service
from airlockd.staging import withheld
from airlockd.staging.keeper import MirrorKeeper
from airlockd.staging.mirror import policy_digest
from airlockd.staging.watcher import Changes
from airlockd.staging.withheld import learn, learn_since

GHP = "ghp_" + "k" * 36  # a github-token shape (assembled: no whole secret in this file)
NEW_VALUE = "Rt7-changed-while-the-agent-ran-Qp2"


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "src").mkdir(parents=True)
    (w / "src" / "a.py").write_text("A = 1\n")
    (w / "plain").mkdir()
    (w / "plain" / "conf.txt").write_text("API_TOKEN=moved-under-a-label-value\n")
    (w / ".env").write_text("DB_PASSWORD=the-value-before-the-run\n")
    return w


@pytest.fixture
def keeper(ws: Path, tmp_path: Path) -> Iterator[MirrorKeeper]:
    k = MirrorKeeper(ws, tmp_path / "state")
    assert k.start() is None
    k.refresh(_policy(ws), Level.INTERNAL)  # no redactor: every value below is learnt here or not at all
    yield k
    k.close()


@pytest.fixture
def walked(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The folders `withheld.py` walks (the workspace itself: a walk of the whole tree)."""
    roots: list[Path] = []

    def counting(root: Path, skip: Callable[[str, bool], bool] | None = None) -> Iterator[tuple[str, os.DirEntry[str]]]:
        roots.append(Path(root))
        return real_walk(root, skip)

    monkeypatch.setattr(withheld, "walk", counting)
    return roots


def _policy(ws: Path) -> Policy:
    return load_policy(ws).policy


def _since(keeper: MirrorKeeper, ws: Path, red: Redactor) -> set[str]:
    got = keeper.withheld_since(_policy(ws), Level.INTERNAL)
    assert got is not None
    return set(learn_since(ws, _policy(ws), Level.INTERNAL, red, *got))


def test_a_withheld_file_changed_after_the_refresh_is_read_again_without_a_walk(
    keeper: MirrorKeeper, ws: Path, walked: list[Path]
) -> None:
    (ws / ".env").write_text(f"DB_PASSWORD={NEW_VALUE}\n")
    red = Redactor()
    assert _since(keeper, ws, red) == {".env"}
    assert red.known_in(NEW_VALUE) and NEW_VALUE not in red.text(f"x {NEW_VALUE} y")
    assert walked == []  # one file opened, no folder listed


def test_the_changes_are_lent_not_taken(keeper: MirrorKeeper, ws: Path) -> None:
    (ws / "src" / "a.py").write_text("A = 2\n")
    first = keeper.withheld_since(_policy(ws), Level.INTERNAL)
    second = keeper.withheld_since(_policy(ws), Level.INTERNAL)
    assert first is not None and second is not None
    assert first[0] == second[0] == [".env"] and "src/a.py" in first[1].paths
    first[1].paths.clear()  # a copy: what the caller does with it is not the keeper's record
    view = keeper.refresh(_policy(ws), Level.INTERNAL)
    assert view.stats.read == 1  # the next refresh still applies the edit
    assert (view.tree / "src" / "a.py").read_text() == "A = 2\n"


def test_a_new_file_with_a_secret_in_its_name_is_found(keeper: MirrorKeeper, ws: Path, walked: list[Path]) -> None:
    (ws / "src" / f"{GHP}.txt").write_text("NAMED=a-value-in-a-named-file\n")  # an existing folder
    (ws / "new" / "deep").mkdir(parents=True)  # a new folder: walked, alone
    (ws / "new" / "deep" / "prod.env").write_text("PROD_KEY=a-value-in-a-new-folder\n")
    red = Redactor()
    assert _since(keeper, ws, red) == {".env", f"src/{GHP}.txt", "new/deep/prod.env"}
    assert red.known_in("a-value-in-a-named-file") and red.known_in("a-value-in-a-new-folder")
    assert ws not in walked and ws / "new" in walked


def test_a_folder_renamed_into_a_withheld_name_is_read_whole(
    keeper: MirrorKeeper, ws: Path, walked: list[Path]
) -> None:
    (ws / "plain").rename(ws / "secrets")  # labelled `secret`: above the agent's clearance
    (ws / "keys").mkdir()
    (ws / "keys" / "id").write_text("SSH_PASSPHRASE=a-value-in-a-renamed-folder\n")
    keeper.drain()
    (ws / "keys").rename(ws / ".ssh")  # a withhold pattern
    red = Redactor()
    assert _since(keeper, ws, red) == {".env", "secrets/conf.txt", ".ssh/id"}
    assert red.known_in("moved-under-a-label-value") and red.known_in("a-value-in-a-renamed-folder")
    assert ws not in walked


def test_a_changed_path_counts_by_its_folders_as_in_learns_walk(ws: Path) -> None:
    """Below a withheld folder every file counts but a repository's; in a folder the walk skips
    (node_modules) none."""
    (ws / "secrets" / "node_modules").mkdir(parents=True)
    (ws / "secrets" / "node_modules" / "x.txt").write_text("INNER=a-value-below-a-label\n")
    (ws / "secrets" / "repo" / ".git").mkdir(parents=True)
    (ws / "secrets" / "repo" / ".git" / "config").write_text("url = https://example.com/history-is-no-value\n")
    (ws / "node_modules" / "pkg").mkdir(parents=True)
    (ws / "node_modules" / "pkg" / ".env").write_text("SKIPPED=a-value-learn-never-walks-to\n")
    (ws / "lib" / "node_modules").mkdir(parents=True)
    (ws / "lib" / "node_modules" / ".env").write_text("SKIPPED=a-value-in-a-new-skipped-folder\n")
    changed = Changes(
        paths={"secrets/node_modules/x.txt", "secrets/repo/.git/config", "node_modules/pkg/.env"},
        trees={"lib/node_modules"},
    )
    red = Redactor()
    read = learn_since(ws, _policy(ws), Level.INTERNAL, red, [], changed)
    assert read == ["secrets/node_modules/x.txt"] and red.known_in("a-value-below-a-label")
    assert set(read) == set(learn(ws, _policy(ws), Level.INTERNAL, Redactor())) - {".env"}


def test_the_keeper_does_not_vouch_for_another_policy_or_when_not_watching(
    keeper: MirrorKeeper, ws: Path, tmp_path: Path
) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "policies.toml").write_text('[labels]\n"src/" = "secret"\n')
    other = load_policy(tmp_path / "other").policy
    assert policy_digest(other, Level.INTERNAL) != policy_digest(_policy(ws), Level.INTERNAL)
    assert keeper.withheld_since(_policy(ws), Level.INTERNAL) is not None
    assert keeper.withheld_since(other, Level.INTERNAL) is None
    assert keeper.withheld_since(_policy(ws), Level.PUBLIC) is None  # never refreshed at that clearance
    keeper.close()
    assert keeper.withheld_since(_policy(ws), Level.INTERNAL) is None
    fresh = MirrorKeeper(ws, tmp_path / "state2")
    assert fresh.withheld_since(_policy(ws), Level.INTERNAL) is None  # not started, no refresh


def test_the_keeper_does_not_vouch_once_a_withheld_file_changed_through_a_link_outside(
    ws: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    os.link(ws / ".env", outside)
    k = MirrorKeeper(ws, tmp_path / "state")
    assert k.start() is None
    try:
        k.refresh(_policy(ws), Level.INTERNAL)
        assert k.withheld_since(_policy(ws), Level.INTERNAL) is not None
        outside.write_text(f"DB_PASSWORD={NEW_VALUE}\n")  # no event inside the workspace
        assert k.withheld_since(_policy(ws), Level.INTERNAL) is None
    finally:
        k.close()


# -- through inspection -----------------------------------------------------------------------------


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    s = Service(workspace(tmp_path), sandbox=FakeSandbox(lambda w: b""))
    assert s.keep_mirrors() is None
    assert s.keeper is not None
    s.keeper.refresh(s.policy, s.policy.clearance_for("bot"))
    yield s
    s.close()


def _named(value: str) -> ChangeSet:
    """A change whose name carries `value`: carried_secrets denies it once the value is known."""
    return ChangeSet([Change(f"src/{value}", ChangeKind.CREATED, None, Entry(Kind.DIR, 0o755))])


def _learn_calls(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []

    def counting(ws: Path, *args: Any, **kwargs: Any) -> list[str]:
        calls.append(ws)
        return learn(ws, *args, **kwargs)

    monkeypatch.setattr(inspection, "learn_withheld", counting)
    return calls


def test_inspection_reads_what_the_keeper_vouches_for_without_a_walk(
    svc: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _learn_calls(monkeypatch)
    rec = svc.submit("bot", "work")
    (svc.workspace / ".env").write_text(f"DB_PASSWORD={NEW_VALUE}\n")
    assert not svc.redactor.known_in(NEW_VALUE)
    secrets = inspection.carried_secrets(svc, rec, _named(NEW_VALUE))
    assert list(secrets) == [f"src/{NEW_VALUE}"] and secrets[f"src/{NEW_VALUE}"].in_name
    assert calls == []


def test_inspection_walks_when_the_policy_changed(svc: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _learn_calls(monkeypatch)
    rec = svc.submit("bot", "work")
    with open(svc.workspace / "policies.toml", "a") as fh:
        fh.write('\n[labels]\n"docs/" = "secret"\n')
    svc.reload_policy()
    (svc.workspace / ".env").write_text(f"DB_PASSWORD={NEW_VALUE}\n")
    assert list(inspection.carried_secrets(svc, rec, _named(NEW_VALUE))) == [f"src/{NEW_VALUE}"]
    assert calls == [svc.workspace]


def test_inspection_walks_when_the_keeper_is_not_watching(svc: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _learn_calls(monkeypatch)
    rec = svc.submit("bot", "work")
    assert svc.keeper is not None
    svc.keeper.close()
    (svc.workspace / ".env").write_text(f"DB_PASSWORD={NEW_VALUE}\n")
    assert list(inspection.carried_secrets(svc, rec, _named(NEW_VALUE))) == [f"src/{NEW_VALUE}"]
    assert calls == [svc.workspace]


def test_nothing_changed_nothing_read(svc: Service, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _learn_calls(monkeypatch)
    monkeypatch.setattr(inspection, "learn_since", lambda *a, **k: pytest.fail("read for an empty change set"))
    assert inspection.carried_secrets(svc, svc.submit("bot", "work"), ChangeSet()) == {}
    assert calls == []


# -- the same files as a walk ----------------------------------------------------------------------


def _tree(ws: Path) -> None:
    files = {
        "src/app.py": "print('hi')\n",
        "src/.env": "APP_SECRET=value-in-src-env\n",
        "secrets/db.txt": "DB=value-under-a-label\n",
        "confidential/plan.md": "PLAN=value-confidential-but-cleared\n",
        ".ssh/id_ed25519": "KEY=value-in-ssh\n",
        "node_modules/pkg/.env": "NPM=value-under-node-modules\n",
        ".git/config": "[core]\n",
        "docs/aws.cfg": "aws = AKIA" + "Z" * 16 + "\n",  # withheld for its content
        f"docs/{GHP}.txt": "TOKEN_FILE=value-in-a-named-file\n",
        "a/b/c/deep.pem": "PEM=value-deep\n",
    }
    for rel, text in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)


def _mutate(ws: Path, rng: random.Random, n: int) -> None:
    dirs = [p for p in ws.rglob("*") if p.is_dir() and not p.is_symlink() and ".git" not in p.parts]
    files = [p for p in ws.rglob("*") if p.is_file() and not p.is_symlink() and ".git" not in p.parts]
    d = rng.choice([ws, *dirs])
    f = rng.choice(files) if files else None
    tag = f"value-{n}-{rng.randrange(10**6)}"
    op = rng.randrange(10)
    if op == 0:
        (d / ".env").write_text(f"X={tag}\n")
    elif op == 1 and f is not None:
        f.write_text(f"CHANGED={tag}\n")
    elif op == 2 and d != ws:
        to = ws / rng.choice(["secrets", ".ssh", ".aws", "confidential", f"moved{n}", "node_modules"])
        if not to.exists():
            d.rename(to)
    elif op == 3:
        new = d / rng.choice([f"fresh{n}", "node_modules", "secrets"]) / "in"
        new.mkdir(parents=True, exist_ok=True)
        (new / rng.choice(["k.key", "plain.txt", f"{GHP}{n}"])).write_text(f"NEW={tag}\n")
    elif op == 4 and f is not None:
        f.unlink()
    elif op == 5 and f is not None:
        f.rename(d / rng.choice([f"f{n}.pem", f"f{n}.txt", f"{GHP}.{n}", ".npmrc"]))
    elif op == 6 and d != ws and not any(p.is_dir() for p in d.iterdir()):
        shutil.rmtree(d)
    elif op == 7:
        (d / f"link{n}.env").symlink_to(os.path.relpath(f or ws / "src", d))
    elif op == 8:
        (d / f"{GHP[:8]}{n}.secret").write_text(f"LABEL={tag}\n")
    else:
        (d / f"n{n}.txt").write_text(f"plain {tag}\n")


@pytest.mark.parametrize("seed", range(8))
def test_it_reads_what_a_walk_reads(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    ws = tmp_path / "ws"
    _tree(ws)
    k = MirrorKeeper(ws, tmp_path / "state")
    assert k.start() is None
    try:
        k.refresh(_policy(ws), Level.INTERNAL)
        for n in range(rng.randrange(1, 5)):
            _mutate(ws, rng, n)
        k.refresh(_policy(ws), Level.INTERNAL)  # an incremental one: its record is the baseline
        for n in range(5, 5 + rng.randrange(1, 8)):
            _mutate(ws, rng, n)
        got = k.withheld_since(_policy(ws), Level.INTERNAL)
        assert got is not None
        recorded, changed = got
        assert changed  # there is something to judge
        since, walked = Redactor(), Redactor()
        read = set(learn_since(ws, _policy(ws), Level.INTERNAL, since, recorded, changed))
        assert read == set(learn(ws, _policy(ws), Level.INTERNAL, walked, also=recorded))
    finally:
        k.close()
