"""Both stagers behind the one `Stager` interface, as the lifecycle drives them: stage a real
workspace (withheld files absent), find the stager again from the run's folder, change what the
agent sees, and inspect it back; the same change set either way."""

from __future__ import annotations

from pathlib import Path

import pytest

from airlockd.pipeline.manifest import ChangeKind
from airlockd.policy import Level, load_policy
from airlockd.redact import Redactor
from airlockd.staging import stagers
from airlockd.staging.base import Stager, StageRequest
from airlockd.staging.mirror import MirrorView, mirror_for
from airlockd.staging.records import StageResult
from airlockd.staging.runbase import LowerBase, ManifestBase


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    w = tmp_path / "ws"
    (w / "src").mkdir(parents=True)
    (w / "src" / "app.py").write_text("print('hi')\n")
    (w / "src" / "gone.py").write_text("G = 1\n")
    (w / "README.md").write_text("# readme\n")
    (w / ".env").write_text("API_TOKEN=not-for-the-agent\n")
    return w


def _stage(stager: Stager, ws: Path, tmp_path: Path, screened: list[Path]) -> tuple[Path, StageResult]:
    policy = load_policy(ws).policy
    run_dir = tmp_path / "state" / "runs" / "r1"
    run_dir.mkdir(parents=True)

    def refresh() -> MirrorView:
        if stager.uses_mirror:
            return mirror_for(tmp_path / "state", Level.INTERNAL).refresh(ws, policy, Level.INTERNAL, run_id="r1")
        raise AssertionError("a stager without a mirror never asks for one")

    def screen(tree: Path, result: StageResult, hide: object) -> None:
        screened.append(tree)

    staged = stager.stage(
        StageRequest(
            run_dir=run_dir,
            workspace=ws,
            policy=policy,
            clearance=Level.INTERNAL,
            owner=None,
            redactor=Redactor(),
            growth=1 << 20,
            capped=False,
            refresh=refresh,
            screen=screen,
        )
    )
    assert [w.path for w in staged.result.withheld] == [".env"]
    return run_dir, staged.result


@pytest.mark.parametrize("chosen", [stagers.OverlayStager("test"), stagers.CopyStager("test")], ids=lambda s: s.name)
def test_a_stager_is_found_again_and_inspects_what_the_agent_did(chosen: Stager, ws: Path, tmp_path: Path) -> None:
    screened: list[Path] = []
    run_dir, result = _stage(chosen, ws, tmp_path, screened)
    assert set(result.base) >= {"src/app.py", "README.md"} and ".env" not in result.base
    stager = stagers.for_run(run_dir)  # what the lifecycle does for every later step
    assert (stager.name, stager.why, type(stager)) == (chosen.name, "test", type(chosen))
    root = stager.staged_root(run_dir)
    base = stager.base(run_dir)
    assert isinstance(base, LowerBase if stager.uses_mirror else ManifestBase)
    assert base.get(".env") is None and base.get("src/app.py") is not None
    layers = stager.layers(run_dir)
    if stager.uses_mirror:  # the agent writes to the upper layer; the lower layer is the mirror
        assert layers is not None and layers.upper == root and screened == [layers.lower]
        assert not (layers.lower / ".env").exists() and (layers.lower / "src" / "app.py").is_file()
        (root / "src").mkdir()
        (root / "src" / "app.py").write_text("print('changed')\n")  # a copied-up file
    else:  # the agent writes to the copy itself
        assert layers is None and screened == [root] and not (root / ".env").exists()
        (root / "src" / "app.py").write_text("print('changed')\n")
    (root / "NEW.md").write_text("new\n")
    changes = {c.path: c.change for c in stager.inspect(run_dir, base)}
    assert changes == {"src/app.py": ChangeKind.MODIFIED, "NEW.md": ChangeKind.CREATED}
    assert stagers.proposed_path(run_dir, "NEW.md").read_text() == "new\n"
    refs = list((tmp_path / "state").rglob("refs/g*/r1"))
    assert bool(refs) == stager.uses_mirror  # an overlay run holds its mirror generation
    stager.release(run_dir, lambda run_id: False)
    stager.release(run_dir, lambda run_id: False)  # idempotent
    assert not [r for r in refs if r.exists()]


def test_choose_honours_the_forced_stager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(stagers.ENV, "copy")
    chosen = stagers.choose(tmp_path)
    assert isinstance(chosen, stagers.CopyStager) and not chosen.uses_mirror and "forced" in chosen.why
    monkeypatch.setenv(stagers.ENV, "nonsense")
    with pytest.raises(Exception, match="is not a stager"):
        stagers.choose(tmp_path)
