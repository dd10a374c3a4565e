"""The run's base asked only about the paths that matter: `LowerBase` answers from an overlay run's
lower layer what `ManifestBase` answers from a manifest of the same tree (entries, subtrees, case
twins), and inspecting an upper layer against either gives the same change set."""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from airlockd.pipeline.classify import classify
from airlockd.pipeline.manifest import Change, ChangeKind, ChangeSet, Entry, Kind, diff, save_manifest, scan
from airlockd.policy import Decision, load_policy
from airlockd.staging import overlay, runbase, stagers
from airlockd.staging.records import StagingError
from airlockd.staging.runbase import LowerBase, ManifestBase


def write(root: Path, rel: str, data: str = "x\n", mode: int | None = None) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(data)
    if mode is not None:
        os.chmod(p, mode)


@pytest.fixture
def lower(tmp_path: Path) -> Path:
    root = tmp_path / "lower"
    write(root, "src/app.py", "print('hi')\n")
    write(root, "src/run.sh", "echo run\n", 0o755)
    write(root, "src/pkg/mod.py", "M = 1\n")
    write(root, "src/pkg/deep/er/most.py", "D = 1\n")
    write(root, "src.txt", "a sibling that sorts between src and src/...\n")
    write(root, "docs/README.md", "# docs\n")
    write(root, "secret/keep.txt", "kept\n")
    write(root, "secret/key.txt", "hidden by the classifier\n")
    (root / "empty").mkdir()
    os.chmod(root / "empty", 0o750)
    (root / "link").symlink_to("src")  # a symlinked directory
    (root / "src/dangling").symlink_to("../nowhere")
    os.mkfifo(root / "src/pipe")
    return root


# -- get ------------------------------------------------------------------------------------------


def test_get_answers_as_a_manifest_of_the_tree_does(lower: Path) -> None:
    base, manifest = LowerBase(lower), scan(lower)
    for rel, entry in manifest.items():
        assert base.get(rel) == entry, rel
    f = base.get("src/run.sh")
    assert f is not None and (f.kind, f.mode, f.size) == (Kind.FILE, 0o755, len("echo run\n"))
    assert f.sha256 == manifest["src/run.sh"].sha256
    d = base.get("empty")
    assert d == Entry(Kind.DIR, 0o750)
    link = base.get("link")
    assert link is not None and (link.kind, link.target) == (Kind.SYMLINK, "src")
    assert base.get("src/pipe") == Entry(Kind.FIFO, manifest["src/pipe"].mode)


@pytest.mark.parametrize(
    "rel",
    [
        "missing",
        "src/missing.py",
        "missing/deeper/still.py",
        "link/app.py",  # through a symlinked parent: never followed
        "link/pkg/mod.py",
        "src/dangling/x",
        "src/app.py/under-a-file",
        "",
        "src/../src.txt",
        "./src.txt",
        "src//app.py",
    ],
)
def test_get_is_none_where_the_base_has_no_such_path(lower: Path, rel: str) -> None:
    base = LowerBase(lower)
    assert base.get(rel) is None
    assert base.get(rel) is None  # and again, from what the first answer learnt


def test_what_a_get_learns_never_hides_a_sibling(lower: Path) -> None:
    base = LowerBase(lower)
    assert base.get("src/app.py/x") is None and base.get("nope/x") is None
    assert base.get("src/app.py") is not None and base.get("src/pkg/mod.py") is not None
    assert base.get("src.txt") is not None


# -- below ----------------------------------------------------------------------------------------


def test_below_lists_the_subtree_sorted(lower: Path) -> None:
    base, mb = LowerBase(lower), ManifestBase(scan(lower))
    for rel in ["src", "src/pkg", "src/pkg/deep", "docs", "empty", "secret", ""]:
        got = base.below(rel)
        assert got == sorted(got) and got == mb.below(rel), rel
    assert "src.txt" not in base.below("src") and "src/pkg/deep/er/most.py" in base.below("src")


@pytest.mark.parametrize("rel", ["src/app.py", "missing", "link", "src/dangling", "src/pipe", "link/pkg"])
def test_below_is_empty_for_what_is_not_a_directory_of_the_base(lower: Path, rel: str) -> None:
    assert LowerBase(lower).below(rel) == [] == ManifestBase(scan(lower)).below(rel)


# -- hidden paths (the classifier's labels) -------------------------------------------------------


def test_hidden_paths_are_not_in_the_base(lower: Path) -> None:
    base = LowerBase(lower, ["secret/key.txt"])
    assert base.get("secret/key.txt") is None and base.get("secret/keep.txt") is not None
    assert base.below("secret") == ["secret/keep.txt"]
    assert base.twins(["SECRET/KEY.TXT"]) == ["secret"]
    dirs = LowerBase(lower, ["src/pkg"])
    assert dirs.get("src/pkg/mod.py") is None and dirs.below("src") == [
        p for p in ManifestBase(scan(lower)).below("src") if not p.startswith("src/pkg")
    ]


# -- twins ----------------------------------------------------------------------------------------


@pytest.fixture
def cased(tmp_path: Path) -> Path:
    root = tmp_path / "cased"
    for rel in [
        "a/b/c.txt",
        "A/b/c.txt",
        "a/B/C.TXT",
        "a/B/other.txt",
        "a/b/d/e.py",
        "a/b/D/E.PY",
        "README.md",
        "readme.md",
        "Readme.MD.bak",
        "caf\u00e9.py",  # NFC
        "dir\u00e9/x.py",
        "Stra\u00dfe/f",  # casefold: "strasse"
        "bad\udcffname",
        "BAD\udcffNAME",
        "other/deep/tree/never/listed.py",
    ]:
        write(root, rel)
    (root / "x").mkdir()
    (root / "X").symlink_to("x")  # a twin itself, never entered
    write(root, "x/y.txt")
    return root


@pytest.mark.parametrize(
    "paths",
    [
        ["a/b/c.txt"],
        ["A/B/C.txt"],
        ["a/b/d/e.py", "README.md"],
        ["a/b/new/file.py"],  # only its parents have twins
        ["cafe\u0301.py"],  # NFD asks for the NFC name
        ["DIRE\u0301/X.PY"],
        ["strasse/F", "STRASSE"],
        ["bad\udcffNaMe"],
        ["x/Y.TXT", "X/y.txt"],
        ["nothing/here"],
        [],
    ],
)
def test_twins_agree_with_the_manifests(cased: Path, paths: list[str]) -> None:
    got = LowerBase(cased).twins(paths)
    assert got == ManifestBase(scan(cased)).twins(paths) and got == sorted(got)


def test_twins_at_several_depths(cased: Path) -> None:
    got = LowerBase(cased).twins(["a/b/c.txt"])
    assert got == ["A", "A/b", "A/b/c.txt", "a", "a/B", "a/B/C.TXT", "a/b", "a/b/c.txt"]
    assert LowerBase(cased).twins(iter(["X/y.txt"])) == ["X", "x", "x/y.txt"]  # any iterable


def test_twins_list_only_the_directories_along_the_paths(cased: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(30):
        write(cased, f"wide/d{i}/f.py")
    listed: list[int] = []
    real = os.scandir

    def counting(fd: int) -> object:
        listed.append(fd)
        return real(fd)

    monkeypatch.setattr(runbase.os, "scandir", counting)
    LowerBase(cased).twins(["a/b/d/e.py"])
    # the root, a and A, their b and B (three), then d and D under a/b only
    assert len(listed) == 1 + 2 + 3 + 2
    listed.clear()
    LowerBase(cased).twins(["wide/d7/f.py"])
    assert len(listed) == 3


def test_twins_agree_on_a_random_tree(tmp_path: Path) -> None:
    rnd = random.Random(7)
    root = tmp_path / "rnd"
    names = ["a", "A", "b", "B", "\u00c9", "e\u0301", "\u00e9", "ss", "\u00df", "SS"]
    made: list[str] = []
    for _ in range(150):
        rel = "/".join(rnd.choice(names) for _ in range(rnd.randint(1, 4)))
        try:
            write(root, rel)
            made.append(rel)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            continue
    base, mb = LowerBase(root), ManifestBase(scan(root))
    for _ in range(60):
        paths = ["/".join(rnd.choice(names) for _ in range(rnd.randint(1, 5))) for _ in range(rnd.randint(1, 3))]
        assert base.twins(paths) == mb.twins(paths), paths


def test_classify_sees_the_same_collisions_as_with_every_base_path(cased: Path) -> None:
    policy = load_policy(cased / "none").policy
    changes = ChangeSet(
        [
            Change("a/b/c.txt", ChangeKind.MODIFIED, Entry(Kind.FILE, 0o644, 2, "0"), Entry(Kind.FILE, 0o644, 2, "1")),
            Change("Readme.md", ChangeKind.CREATED, None, Entry(Kind.FILE, 0o644, 2, "1")),
            Change("src/new.py", ChangeKind.CREATED, None, Entry(Kind.FILE, 0o644, 2, "1")),
        ]
    )
    everything = classify(changes, policy, (), base=scan(cased).keys())
    twins = classify(changes, policy, (), base=LowerBase(cased).twins([c.path for c in changes]))
    assert [(c.decision, c.rule) for c in twins] == [(c.decision, c.rule) for c in everything]
    assert [c.rule for c in twins][:2] == ["invariant:case-collision"] * 2 and twins[0].decision is Decision.REVIEW


# -- run_base --------------------------------------------------------------------------------------


def test_run_base_of_an_overlay_run_reads_the_lower_and_never_base_json(tmp_path: Path, lower: Path) -> None:
    run_dir = tmp_path / "run"
    lay = stagers.layout(run_dir / "staging", lower)
    lay.upper.mkdir(parents=True)
    (run_dir / "stager.json").write_text(json.dumps({"stager": "overlay", "why": "test", "lower": str(lower)}))
    (run_dir / "base.json").write_text("not json: an overlay run never reads it")
    base = stagers.for_run(run_dir).base(run_dir)
    assert isinstance(base, LowerBase) and base.get("src/app.py") is not None and not base.hidden
    (run_dir / "base.json").unlink()
    with open(lay.hidden, "w") as fh:
        fh.write(json.dumps("secret/key.txt") + "\n" + json.dumps("bad\udcffname") + "\n")
    base = stagers.for_run(run_dir).base(run_dir)
    assert isinstance(base, LowerBase) and base.hidden == {"secret/key.txt", "bad\udcffname"}
    assert base.get("secret/key.txt") is None
    lay.hidden.write_text("{broken\n")
    with pytest.raises(StagingError):
        stagers.for_run(run_dir).base(run_dir)


def test_run_base_of_a_copy_run_is_its_manifest(tmp_path: Path, lower: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stagers.write_meta(run_dir, stagers.COPY, "test")
    save_manifest(scan(lower), run_dir / "base.json")
    base = stagers.for_run(run_dir).base(run_dir)
    assert isinstance(base, ManifestBase) and base.manifest == scan(lower)


# -- inspect_upper through a kernel overlay: LowerBase == ManifestBase == diff(base, merged) -----


@pytest.fixture
def mounted(tmp_path: Path, lower: Path) -> Iterator[tuple[stagers.Layout, Path]]:
    if why := overlay.unavailable(tmp_path):
        pytest.skip(why)
    from airlockd.staging import capfs

    layers, merged = tmp_path / "layers", tmp_path / "merged"
    capfs.mount(layers, 16 << 20)
    try:
        lay = stagers.layout(layers, lower)
        stagers.prepare(lay, None)
        stagers.hide(lay, "secret/key.txt")  # as the classifier's labels do, before the agent starts
        overlay.mount(lay.lower, lay.upper, lay.work, merged)
        try:
            yield lay, merged
        finally:
            overlay.unmount(merged)
    finally:
        capfs.unmount(layers)


SCRIPTS = {
    "mixed": (
        "set -e; rm -rf src/pkg/deep; rm -rf docs; mkdir docs; echo new > docs/NEW.md;"  # whiteout, opaque
        " cat src/app.py > t; cat t > src/app.py; rm t; touch src/run.sh; chmod 700 src/run.sh;"
        " rm src/dangling; rm link; mkdir link; echo in > link/app.py;"  # a symlink becomes a directory
        " rm -rf empty; echo file > empty; mkdir -p brand/new/dir; echo n > brand/new/dir/f;"
        " mv src.txt SRC.TXT; mkfifo src/pipe2; rm src/pipe"
    ),
    "hidden-parent-deleted": "set -e; rm -rf secret; echo x > src/pkg/mod.py",
    "hidden-path-rewritten": "set -e; echo agent > secret/key.txt; rm secret/keep.txt",
    "directory-over-file": (
        "set -e; rm src/app.py; mkdir src/app.py; echo f > src/app.py/f; rm -rf src/pkg; echo f > src/pkg"
    ),
    "nothing": "true",
}


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_inspect_upper_from_the_lower_equals_from_the_manifest(
    mounted: tuple[stagers.Layout, Path], script: str
) -> None:
    lay, merged = mounted
    subprocess.run(["sh", "-c", SCRIPTS[script]], cwd=merged, check=True)
    hidden = ["secret/key.txt"]
    manifest = {p: e for p, e in scan(lay.lower).items() if p not in hidden}
    from_lower = overlay.inspect_upper(lay.upper, LowerBase(lay.lower, hidden))
    from_manifest = overlay.inspect_upper(lay.upper, ManifestBase(manifest))
    assert from_lower == from_manifest
    assert [(c.path, c.change) for c in from_lower] == [(c.path, c.change) for c in diff(manifest, scan(merged))]
    kinds = {c.path: c.change for c in from_lower}
    if script == "mixed":
        assert kinds["src/pkg/deep/er/most.py"] is ChangeKind.DELETED and kinds["docs/README.md"] is ChangeKind.DELETED
        assert kinds["docs/NEW.md"] is ChangeKind.CREATED and kinds["link"] is ChangeKind.TYPE_CHANGED
        assert kinds["src/run.sh"] is ChangeKind.MODE_CHANGED and "src/app.py" not in kinds
    if script == "hidden-parent-deleted":
        assert "secret/key.txt" not in kinds and kinds["secret/keep.txt"] is ChangeKind.DELETED
    if script == "hidden-path-rewritten":
        assert kinds["secret/key.txt"] is ChangeKind.CREATED  # not a modification of the withheld file
    if script == "nothing":
        assert kinds == {}


def test_inspect_run_of_an_overlay_run(mounted: tuple[stagers.Layout, Path], tmp_path: Path) -> None:
    """The run's way: `run_base` (the lower layer and the record `hide` left), then `inspect_run`."""
    lay, merged = mounted
    (merged / "src/app.py").write_text("changed\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "staging").symlink_to(lay.upper.parent)
    (run_dir / "stager.json").write_text(json.dumps({"stager": "overlay", "why": "test", "lower": str(lay.lower)}))
    base = stagers.for_run(run_dir).base(run_dir)
    assert isinstance(base, LowerBase) and base.hidden == {"secret/key.txt"}
    changes = stagers.for_run(run_dir).inspect(run_dir, base)
    assert [(c.path, c.change) for c in changes] == [("src/app.py", ChangeKind.MODIFIED)]
    assert base.twins([c.path for c in changes]) == ["src", "src/app.py"]
