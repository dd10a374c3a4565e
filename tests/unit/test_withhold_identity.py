"""Withheld means absent whatever the spelling: patterns in any case and at any depth, a secret in
a file's name, and a file's identity (a hard link of a withheld file, a copy of its bytes), in
whichever order the walk meets them; for the copy, the mirror (walks), and the keeper
(incremental refreshes, which must end where a walk would)."""

from __future__ import annotations

import json
import os
import shutil
import string
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airlockd.pipeline.classify import classify
from airlockd.pipeline.manifest import Change, ChangeKind, Entry, Kind
from airlockd.policy import Decision, Level, Policy, load_policy
from airlockd.redact import Redactor
from airlockd.staging.copy import stage
from airlockd.staging.keeper import MirrorKeeper
from airlockd.staging.mirror import Mirror
from airlockd.staging.records import StageResult
from airlockd.staging.withheld import learn

AWS = "AKIA" + "X" * 16  # an AWS access key id shape (assembled: no whole secret in this file)
GHP = "ghp_" + "k" * 36
ENV = "DB_PASSWORD=correct-horse-battery-staple\n"

Stage = Callable[[Path, Path, Policy], StageResult]


def _copy(ws: Path, out: Path, policy: Policy) -> StageResult:
    return stage(ws, out, policy, Level.INTERNAL)


def _mirror(ws: Path, out: Path, policy: Policy) -> StageResult:
    view = Mirror(out.parent / "mirror").refresh(ws, policy, Level.INTERNAL)
    out.symlink_to(view.tree)
    return view.result


@pytest.fixture(params=["copy", "mirror"])
def stage_fn(request: pytest.FixtureRequest) -> Stage:
    return {"copy": _copy, "mirror": _mirror}[request.param]


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    return load_policy(tmp_path / "none").policy


def write(root: Path, rel: str, data: str | bytes = "x\n") -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    return p


def rules(res: StageResult) -> dict[str, str]:
    return {w.path: w.rule for w in res.withheld}


def present(out: Path) -> set[str]:
    root = out.resolve()
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# -- patterns: any case, any depth -------------------------------------------------------------------


def test_patterns_match_in_any_case_and_at_any_depth(tmp_path: Path, policy: Policy, stage_fn: Stage) -> None:
    ws = tmp_path / "ws"
    for rel in [
        ".ENV",
        "ID_RSA",
        "cert.PEM",
        "sub/_netrc",
        "sub/.docker/config.json",
        "a/b/.Kube/Config",
        "deploy/prod.env",
        "infra/terraform.tfstate",
        "infra/terraform.tfstate.backup",
        "keys/putty.PPK",
        "keys/store.p12",
        "keys/store.pfx",
        "keys/app.jks",
        "keys/app.keystore",
        "web/.htpasswd",
        "home/.git-credentials",
        "home/.pgpass",
        "ops/kubeconfig",
    ]:
        write(ws, rel, f"value of {rel} {len(rel) * 'q'}\n")
    write(ws, "src/app.py", "print(1)\n")
    write(ws, "sub/.docker/daemon.json", "{}\n")
    res = stage_fn(ws, tmp_path / "out", policy)
    got = present(tmp_path / "out")
    assert "src/app.py" in got and "sub/.docker/daemon.json" in got
    assert {
        "sub/.docker/config.json": "withhold:.docker/config.json",
        "a/b/.Kube/Config": "withhold:.kube/config",
        "sub/_netrc": "withhold:_netrc",
    }.items() <= rules(res).items()
    for rel in rules(res):
        assert rel not in got
    assert len(rules(res)) == 18


def test_a_leading_slash_still_anchors_and_labels_match_in_any_case(tmp_path: Path, stage_fn: Stage) -> None:
    ws = tmp_path / "ws"
    write(ws, "policies.toml", '[withhold]\npatterns = ["/only-here.txt"]\n[labels]\n"Vault/" = "secret"\n')
    write(ws, "only-here.txt")
    write(ws, "sub/only-here.txt")
    write(ws, "VAULT/plans.md")
    write(ws, "docs/vault/plans.md")  # labels keep gitignore's anchoring: "Vault/" is any depth already
    res = stage_fn(ws, tmp_path / "out", load_policy(ws).policy)
    assert rules(res) == {
        "only-here.txt": "withhold:/only-here.txt",
        "VAULT": "label:secret>internal",
        "docs/vault": "label:secret>internal",
    }
    assert "sub/only-here.txt" in present(tmp_path / "out")


def test_a_proposal_creating_a_withheld_path_in_any_case_or_depth_is_denied(policy: Policy) -> None:
    def created(path: str) -> Change:
        return Change(path, ChangeKind.CREATED, None, Entry(Kind.FILE, 0o644, 3, "0" * 64))

    paths = ["sub/.ENV", "deep/x/.docker/config.json", "a/ID_RSA", "sub/_netrc", "prod.env"]
    out = classify([created(p) for p in paths], policy, [])
    assert [(c.change.path, c.decision, c.rule) for c in out] == [
        (p, Decision.DENY, "invariant:withheld") for p in paths
    ]


def test_learn_reads_withheld_values_in_any_case_and_depth(tmp_path: Path, policy: Policy) -> None:
    ws = tmp_path / "ws"
    write(ws, "sub/.ENV", "TOKEN=deep-upper-case-value\n")
    write(ws, "x/.docker/config.json", '{"auth": "docker-auth-value-123"}\n')
    write(ws, f"notes-{AWS}.txt", "NAME_SECRET=named-file-value\n")
    red = Redactor()
    read = learn(ws, policy, Level.INTERNAL, red)
    assert set(read) == {"sub/.ENV", "x/.docker/config.json", f"notes-{AWS}.txt"}
    assert red.known_in("deep-upper-case-value") and red.known_in("named-file-value")


# -- a secret in a name --------------------------------------------------------------------------------


def test_a_secret_in_a_name_keeps_the_file_out_and_the_name_out_of_every_record(
    tmp_path: Path, policy: Policy, stage_fn: Stage
) -> None:
    ws = tmp_path / "ws"
    write(ws, f"backup-{AWS}.txt", "harmless content\n")
    write(ws, f"tokens/{GHP}/readme.md", "also harmless\n")
    write(ws, "ok.txt", "fine\n")
    res = stage_fn(ws, tmp_path / "out", policy)
    assert rules(res) == {
        "backup-[REDACTED].txt": "detector-in-name:aws-access-key",
        "tokens/[REDACTED]": "detector-in-name:github-token",
    }
    assert present(tmp_path / "out") == {"ok.txt", "tokens"}
    stored = repr(res) + "".join(
        p.read_text(errors="replace") for p in (tmp_path / "mirror").glob("cache.*") if p.is_file()
    )
    assert AWS not in stored and GHP not in stored


CRED = "Qm7vR2xK9pL4wZ8t"  # a generated-looking password, no detector's format


def _staged(tmp_path: Path, stage_fn: Stage, ws: Path, policy: Policy) -> tuple[set[str], dict[str, str], str]:
    red = Redactor()
    learn(ws, policy, Level.INTERNAL, red)  # what every run's redactor knows before staging
    out = tmp_path / "out"
    if stage_fn is _mirror:
        view = Mirror(tmp_path / "mirror").refresh(ws, policy, Level.INTERNAL, redactor=red)
        out.symlink_to(view.tree)
        res = view.result
    else:
        res = stage(ws, out, policy, Level.INTERNAL, redactor=red)
    stored = repr(res) + "".join(
        p.read_text(errors="replace") for p in (tmp_path / "mirror").glob("cache.*") if p.is_file()
    )
    return present(out), rules(res), stored


def test_a_name_carrying_a_withheld_credential_keeps_it_out_but_not_a_plain_setting(
    tmp_path: Path, policy: Policy, stage_fn: Stage
) -> None:
    """A file or folder whose name holds a withheld file's credential (in no detector's format) is
    withheld, its path masked in every record; a name holding a setting that is no credential
    (`APP_NAME=shop`, and the app lives in `shop/`) is staged."""
    ws = tmp_path / "ws"
    write(ws, ".env", f"APP_NAME=shop\nDB_PASSWORD={CRED}\n")
    write(ws, f"cache/login-{CRED}.json", "{}\n")
    write(ws, f"dumps/{CRED.lower()}/data.sql", "select 1;\n")  # another case, and a folder
    write(ws, "shop/app.py", "print('shop')\n")
    have, why, stored = _staged(tmp_path, stage_fn, ws, policy)
    assert "shop/app.py" in have and "cache" in have and "dumps" in have
    assert not any(CRED.lower() in p.lower() for p in have)
    assert why == {
        ".env": "withhold:.env",
        "cache/login-[REDACTED].json": "detector-in-name:withheld-value",
        "dumps/[REDACTED]": "detector-in-name:withheld-value",
    }
    assert CRED.lower() not in stored.lower()


def test_a_link_whose_target_carries_a_secret_is_withheld(tmp_path: Path, policy: Policy, stage_fn: Stage) -> None:
    """The agent reads a link's target with readlink, and every record of the copy holds it:
    a target a detector fires on, or one carrying a withheld credential, keeps the link out."""
    ws = tmp_path / "ws"
    write(ws, ".env", f"DB_PASSWORD={CRED}\n")
    write(ws, "src/app.py", "print(1)\n")
    (ws / "tok").symlink_to(GHP)
    (ws / "src/cred").symlink_to(f"../cache/{CRED}")
    (ws / "src/ok").symlink_to("app.py")
    have, why, stored = _staged(tmp_path, stage_fn, ws, policy)
    assert "src/ok" in have and "tok" not in have and "src/cred" not in have
    assert why["tok"] == "detector-in-name:github-token" and why["src/cred"] == "detector-in-name:withheld-value"
    assert GHP not in stored and CRED not in stored


def test_a_credential_learnt_late_in_the_walk_takes_out_a_name_staged_before(
    tmp_path: Path, policy: Policy, stage_fn: Stage
) -> None:
    """The walk meets `aaa/` before `zzz/settings.py`, a file withheld for its content (an AWS
    key), whose secret key is in `aaa/`'s name: the name goes once the value is known."""
    ws = tmp_path / "ws"
    secret = "wJalrXUtnFEMI" + "K7MDENGbPxRfiCY" + "EXAMPLEKEY"
    write(ws, f"aaa/{secret}/notes.md", "notes\n")
    write(ws, "aaa/keep.md", "kept\n")
    write(ws, "zzz/settings.py", f'AWS_ACCESS_KEY_ID = "{AWS}"\nAWS_SECRET_ACCESS_KEY = "{secret}"\n')
    have, why, stored = _staged(tmp_path, stage_fn, ws, policy)
    assert have == {"aaa", "aaa/keep.md", "zzz"}
    assert why["aaa/[REDACTED]"] == "detector-in-name:withheld-value"
    assert secret not in stored


def test_the_keeper_takes_out_a_name_once_a_credential_it_carries_is_learnt(
    keeper: tuple[Path, MirrorKeeper], policy: Policy, tmp_path: Path
) -> None:
    ws, k = keeper
    write(ws, f"build/out-{CRED}.log", "log\n")
    red = Redactor()
    view = k.refresh(policy, Level.INTERNAL, redactor=red)
    assert (view.tree / f"build/out-{CRED}.log").exists()  # no credential of that value yet
    write(ws, "config/app.yaml", f"api_key: {AWS}\nclient_secret: {CRED}\n")  # withheld for its content
    view = k.refresh(policy, Level.INTERNAL, redactor=red)
    assert not (view.tree / f"build/out-{CRED}.log").exists()
    assert rules(view.result)["build/out-[REDACTED].log"] == "detector-in-name:withheld-value"
    view = k.refresh(policy, Level.INTERNAL, redactor=red)  # and it stays out, refreshed incrementally
    assert not (view.tree / f"build/out-{CRED}.log").exists()
    write(ws, f"build/again-{CRED}.log", "log\n")  # a new name carrying it, on a known value
    view = k.refresh(policy, Level.INTERNAL, redactor=red)
    assert not (view.tree / f"build/again-{CRED}.log").exists()
    assert rules(view.result)["build/again-[REDACTED].log"] == "detector-in-name:withheld-value"
    cache = [p for p in (tmp_path / "state").rglob("cache*") if p.is_file()]
    assert cache and not any(CRED.encode() in p.read_bytes() for p in cache)


# -- identity: hard links and copies ------------------------------------------------------------------


@pytest.mark.parametrize("link_first", [True, False])
def test_a_hard_link_of_a_withheld_file_is_withheld_in_either_order(
    tmp_path: Path, policy: Policy, stage_fn: Stage, link_first: bool
) -> None:
    ws = tmp_path / "ws"
    # the walk fills a directory's files before entering its subdirectories
    env, link = ("zzz/.env", "notes.txt") if link_first else (".env", "zzz/notes.txt")
    write(ws, env, "pw=1\n")  # too short to match by content: only the inode gives it away
    (ws / link).parent.mkdir(parents=True, exist_ok=True)
    os.link(ws / env, ws / link)
    res = stage_fn(ws, tmp_path / "out", policy)
    assert rules(res) == {env: "withhold:.env", link: "hardlink-of-withheld"}
    assert link not in present(tmp_path / "out")
    assert link not in res.base and res.files == 0


@pytest.mark.parametrize("copy_first", [True, False])
def test_a_copy_of_a_withheld_files_bytes_is_withheld_in_either_order(
    tmp_path: Path, policy: Policy, stage_fn: Stage, copy_first: bool
) -> None:
    ws = tmp_path / "ws"
    env, copy = ("zzz/.ssh/id_ed25519", "backup.txt") if copy_first else (".env", "zzz/backup.txt")
    write(ws, env, ENV)
    write(ws, copy, ENV)
    write(ws, "other.txt", ENV + "\n")  # one byte more: not a copy
    res = stage_fn(ws, tmp_path / "out", policy)
    assert rules(res)[copy] == "copy-of-withheld"
    got = present(tmp_path / "out")
    assert copy not in got and "other.txt" in got


def test_trivial_contents_are_never_matched_by_identity(tmp_path: Path, policy: Policy, stage_fn: Stage) -> None:
    ws = tmp_path / "ws"
    write(ws, ".env", "")
    write(ws, ".env.local", "   \n\n\t\n\n  \n")
    write(ws, "pkg/__init__.py", "")
    write(ws, "pkg/blank.txt", "   \n\n\t\n\n  \n")
    write(ws, ".env.short", "a=1\n")
    write(ws, "short.txt", "a=1\n")
    res = stage_fn(ws, tmp_path / "out", policy)
    assert set(rules(res)) == {".env", ".env.local", ".env.short"}
    assert {"pkg/__init__.py", "pkg/blank.txt", "short.txt"} <= present(tmp_path / "out")


def test_a_read_only_directory_still_loses_the_copy(tmp_path: Path, policy: Policy, stage_fn: Stage) -> None:
    ws = tmp_path / "ws"
    write(ws, ".env", ENV)
    write(ws, "ro/copy.txt", ENV)
    write(ws, "ro/keep.txt", "keep\n")
    os.chmod(ws / "ro", 0o555)
    try:
        res = stage_fn(ws, tmp_path / "out", policy)
    finally:
        os.chmod(ws / "ro", 0o755)
    out = tmp_path / "out"
    assert rules(res)["ro/copy.txt"] == "copy-of-withheld"
    assert not (out / "ro" / "copy.txt").exists() and (out / "ro" / "keep.txt").exists()
    assert (out / "ro").resolve().stat().st_mode & 0o777 == 0o555


def test_mirror_walks_follow_withheld_files_as_they_come_and_go(tmp_path: Path, policy: Policy) -> None:
    """A cached verdict never vouches for identity: a file that becomes a copy of a newly withheld
    file leaves the mirror at the next walk and comes back when that stops being true."""
    ws = tmp_path / "ws"
    write(ws, "config/settings.txt", ENV)
    mirror = Mirror(tmp_path / "mirror")

    def walk() -> tuple[set[str], dict[str, str]]:
        view = mirror.refresh(ws, policy, Level.INTERNAL)
        return {str(p.relative_to(view.tree)) for p in view.tree.rglob("*")}, rules(view.result)

    assert "config/settings.txt" in walk()[0]
    write(ws, ".env", ENV)
    got, why = walk()
    assert "config/settings.txt" not in got and why["config/settings.txt"] == "copy-of-withheld"
    got, why = walk()  # and again, from the cache
    assert "config/settings.txt" not in got and why["config/settings.txt"] == "copy-of-withheld"
    (ws / ".env").write_text("DB_PASSWORD=rotated-value-now\n")
    got, why = walk()
    assert "config/settings.txt" in got and "config/settings.txt" not in why
    assert (mirror.tree(mirror.current() or 0) / "config/settings.txt").read_text() == ENV


# -- the keeper: incremental refreshes end where a walk would ------------------------------------------


@pytest.fixture
def keeper(tmp_path: Path) -> Iterator[tuple[Path, MirrorKeeper]]:
    ws = tmp_path / "ws"
    write(ws, "src/app.py", "print(1)\n")
    write(ws, "config/settings.txt", ENV)
    k = MirrorKeeper(ws, tmp_path / "state")
    if k.start() is not None:
        pytest.skip(f"inotify unavailable: {k.why}")
    yield ws, k
    k.close()


def _refresh(ws: Path, k: MirrorKeeper, policy: Policy, tmp_path: Path) -> tuple[set[str], dict[str, str]]:
    view = k.refresh(policy, Level.INTERNAL)
    tree = {str(p.relative_to(view.tree)) for p in view.tree.rglob("*")}
    ref_root = tmp_path / f"ref-{os.urandom(4).hex()}"
    ref = Mirror(ref_root).refresh(ws, policy, Level.INTERNAL)
    assert tree == {str(p.relative_to(ref.tree)) for p in ref.tree.rglob("*")}
    assert rules(view.result) == rules(ref.result)
    assert view.result.base == ref.result.base
    shutil.rmtree(ref_root)
    return tree, rules(view.result)


def test_the_keeper_follows_copies_of_withheld_files_incrementally(
    keeper: tuple[Path, MirrorKeeper], policy: Policy, tmp_path: Path
) -> None:
    ws, k = keeper
    tree, _ = _refresh(ws, k, policy, tmp_path)
    assert "config/settings.txt" in tree
    write(ws, "deploy/.env.prod", ENV)  # a new withheld file whose bytes are settings.txt's
    tree, why = _refresh(ws, k, policy, tmp_path)
    assert "config/settings.txt" not in tree and why["config/settings.txt"] == "copy-of-withheld"
    write(ws, "src/notes.txt", ENV)  # a new copy, beside nothing withheld
    tree, why = _refresh(ws, k, policy, tmp_path)
    assert "src/notes.txt" not in tree and why["src/notes.txt"] == "copy-of-withheld"
    os.link(ws / "deploy/.env.prod", ws / "src/link.txt")
    tree, why = _refresh(ws, k, policy, tmp_path)
    assert why["src/link.txt"] == "hardlink-of-withheld"
    (ws / "deploy/.env.prod").unlink()
    (ws / "src/link.txt").unlink()
    tree, why = _refresh(ws, k, policy, tmp_path)
    assert {"config/settings.txt", "src/notes.txt"} <= tree and not why


def test_the_keeper_follows_a_withheld_directorys_files(
    keeper: tuple[Path, MirrorKeeper], policy: Policy, tmp_path: Path
) -> None:
    ws, k = keeper
    write(ws, ".ssh/known", "nothing like it\n")
    _refresh(ws, k, policy, tmp_path)
    (ws / ".ssh/known").write_text(ENV)  # inside a withheld directory, now settings.txt's bytes
    tree, why = _refresh(ws, k, policy, tmp_path)
    assert "config/settings.txt" not in tree and why["config/settings.txt"] == "copy-of-withheld"


# -- random trees --------------------------------------------------------------------------------------

_WITHHELD_NAMES = [".env", ".ENV", "id_rsa", "ID_RSA", "cert.PEM", "_netrc", ".Pgpass", "prod.env", "x.TFSTATE"]
_DIRS = ["", "a", "a/b", "deep/er/still", ".docker", ".ssh", "Sub/.AWS"]
_VALUE = st.text(string.ascii_letters + string.digits, min_size=12, max_size=24)


@st.composite
def trees(draw: st.DrawFn) -> list[tuple[str, str, str]]:
    """(kind, path, value): "secret" files at withheld paths, and "copy"/"link" files elsewhere
    whose bytes (or inode) are a secret file's."""
    n = draw(st.integers(1, 4))
    out: list[tuple[str, str, str]] = []
    for i in range(n):
        d = draw(st.sampled_from(_DIRS))
        name = draw(st.sampled_from(_WITHHELD_NAMES))
        path = f"{d}/s{i}/{name}" if d else f"s{i}/{name}"
        if d in (".docker",):
            path = f"{d}/config.json" if i == 0 else path
        out.append(("secret", path, f"SECRET_{i}=" + draw(_VALUE)))
    for j in range(draw(st.integers(0, 4))):
        of = draw(st.integers(0, n - 1))
        kind = draw(st.sampled_from(["copy", "link"]))
        d = draw(st.sampled_from(["", "src", "z/y", "AAA"]))
        out.append((kind, f"{d}/f{j}.txt" if d else f"f{j}.txt", out[of][1]))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees(), use_mirror=st.booleans())
def test_random_trees_never_stage_a_withheld_value(
    tmp_path: Path, policy: Policy, tree: list[tuple[str, str, str]], use_mirror: bool
) -> None:
    root = tmp_path / os.urandom(6).hex()
    ws = root / "ws"
    values = []
    for kind, path, value in tree:
        if kind == "secret":
            write(ws, path, value + "\n")
            values.append(value)
    for kind, path, of in tree:
        if kind == "copy":
            write(ws, path, (ws / of).read_bytes())
        elif kind == "link":
            (ws / path).parent.mkdir(parents=True, exist_ok=True)
            os.link(ws / of, ws / path)
    write(ws, "src/main.py", "print('hello')\n")
    res = (_mirror if use_mirror else _copy)(ws, root / "out", policy)
    out = (root / "out").resolve()
    for p in out.rglob("*"):
        if p.is_file() and not p.is_symlink():
            data = p.read_text(errors="replace")
            assert not any(v in data for v in values), p
    assert (out / "src/main.py").exists()
    assert json.dumps([w.path for w in res.withheld])  # records are plain strings
    shutil.rmtree(root)


def test_a_newline_in_a_folder_name_does_not_unwithhold_what_is_below_it(tmp_path: Path) -> None:
    from airlockd.policy import Level, load_policy
    from airlockd.staging.copy import stage

    ws = tmp_path / "ws"
    (ws / "a\nb").mkdir(parents=True)
    (ws / "a\nb" / ".env").write_text("DB_PASSWORD=hunter2-newline-zz\n")
    result = stage(ws, tmp_path / "out", load_policy(ws).policy, Level.INTERNAL)
    assert "a\nb/.env" in {w.path for w in result.withheld}
    assert not (tmp_path / "out" / "a\nb" / ".env").exists()


# -- history under other names -------------------------------------------------------------------


def test_a_repository_bundle_or_pack_under_another_name_is_withheld(
    tmp_path: Path, policy: Policy, stage_fn: Stage
) -> None:
    """A bare clone (`backup.git`), a jj store's git directory, a bundle and a loose packfile hold
    the whole history, the secret once committed included: withheld as `.git` is (found by the
    attack review: only entries named `.git` were)."""
    import subprocess

    ws = tmp_path / "ws"
    value = "Zq8-history-elsewhere-xK31"
    write(ws, "app.py", "print(1)\n")
    write(ws, "settings.txt", f"DB_PASSWORD={value}\n")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    env |= {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}

    def git(*argv: str, cwd: Path = ws) -> None:
        subprocess.run(["git", *argv], cwd=cwd, check=True, capture_output=True, env=env)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "with the secret")
    (ws / "settings.txt").unlink()
    git("commit", "-qam", "without it")
    git("gc", "-q")
    git("clone", "-q", "--bare", ".", "backup.git")
    git("bundle", "create", "-q", "repo.bundle", "--all")
    (ws / ".jj" / "repo" / "store").mkdir(parents=True)
    git("clone", "-q", "--bare", ".", str(ws / ".jj" / "repo" / "store" / "git"))
    pack = next((ws / ".git" / "objects" / "pack").glob("*.pack"))
    write(ws, "assets/blob.dat", pack.read_bytes())
    res = stage_fn(ws, tmp_path / "out", policy)
    why = rules(res)
    assert why["backup.git"] == "git-history" and why[".jj/repo/store/git"] == "git-history"
    assert why["repo.bundle"] == "git-history:bundle" and why["assets/blob.dat"] == "git-history:packfile"
    out = (tmp_path / "out").resolve()
    for p in out.rglob("*"):
        if p.is_file() and not p.is_symlink() and ".git" not in p.relative_to(out).parts:
            assert p.read_bytes()[:4] != b"PACK", p
    assert (out / "app.py").exists()


# -- values of withheld files in UTF-16 --------------------------------------------------------------


def test_values_of_a_withheld_file_with_a_stray_nul_are_learnt(tmp_path: Path, policy: Policy) -> None:
    ws = tmp_path / "ws"
    write(ws, ".env", b"\0DB_PASSWORD=Nx4-after-a-stray-nul-Qe7\n")
    red = Redactor()
    stage(ws, tmp_path / "out", policy, Level.INTERNAL, redactor=red)
    assert red.known_in("the agent said Nx4-after-a-stray-nul-Qe7")


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"])
def test_values_of_a_withheld_utf16_file_are_learnt(tmp_path: Path, policy: Policy, codec: str) -> None:
    """A `.env` written in UTF-16 (an editor on Windows, a PowerShell export): its value is
    masked afterwards, by every stager's redactor and by the daemon's walk (`learn`)."""
    ws = tmp_path / "ws"
    write(ws, "sub/.env", ENV.encode(codec))
    write(ws, "a.txt")
    value = ENV.split("=", 1)[1].strip()
    red = Redactor()
    res = stage(ws, tmp_path / "out", policy, Level.INTERNAL, redactor=red)
    assert "sub/.env" in rules(res)
    assert value not in red.text(f"the agent said {value}")
    walked = Redactor()
    learn(ws, policy, Level.INTERNAL, walked)
    assert value not in walked.text(f"the agent said {value}")
