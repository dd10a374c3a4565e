"""History never reaches the agent, with the real engine and either stager: an agent that hunts
for a secret its workspace's history held (`git log --all -p`, every object, `grep -r` over
/workspace) finds nothing, and `git status` / `git diff` / `git commit -am` work as its uid."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from githistory import SECRET, history_workspace

from airlockd.records import RunState
from airlockd.runs.service import Service

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

POLICY = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    [agents.bot.limits]
    wall_time_s = 60
    """
)
HEAD, TAIL = SECRET[:8], SECRET[8:]  # the prompt never quotes the whole value (it would be refused)
HUNT = textwrap.dedent(
    f"""
    cd /workspace; S="{HEAD}""{TAIL}"
    git log --all -p 2>&1 | grep -q "$S" && echo FOUND-IN-LOG
    git cat-file --batch-all-objects --batch 2>&1 | grep -q "$S" && echo FOUND-IN-OBJECTS
    grep -rqa "$S" /workspace && echo FOUND-IN-TREE
    echo "commits: $(git log --all --format=%H | wc -l) on $(git symbolic-ref --short HEAD)"
    echo "status: [$(git status --porcelain)]"
    echo "KEY = 'agent'" > src/app.py
    git diff --stat | tail -1
    git -c user.name=agent -c user.email=agent@x commit -qam agent && echo COMMIT-OK
    echo "uid $(id -u)"
    """
)


@pytest.mark.parametrize("stager", ["copy", "overlay"])
@pytest.mark.parametrize("packed", [False, True], ids=["loose", "packed"])
def test_agent_finds_no_history_and_uses_git(
    tmp_path: Path, stager: str, packed: bool, monkeypatch: pytest.MonkeyPatch, _state_dir: Path
) -> None:
    if stager == "overlay":
        from nonroot import overlay_unavailable

        if why := overlay_unavailable(_state_dir):
            pytest.skip(f"overlay staging unavailable: {why}")
    monkeypatch.setenv("AIRLOCK_STAGER", stager)
    ws = history_workspace(tmp_path, packed=packed)
    (ws / "policies.toml").write_text(POLICY)
    svc = Service(ws)
    rec = svc.execute(svc.submit("bot", HUNT).id)
    assert rec.state is RunState.PROPOSED, rec.transitions[-1]
    assert rec.stager == stager
    out = (svc.state.run_dir(rec.id) / "output.log").read_text()
    assert "FOUND" not in out, out
    assert "commits: 1 on feature/x" in out and "status: []" in out, out
    assert "1 file changed" in out and "COMMIT-OK" in out, out
    assert "uid 0" not in out, out
    files = {f.path: f for f in rec.files}
    assert files["src/app.py"].change == "modified"
    assert all(f.decision.value == "deny" for p, f in files.items() if p.startswith(".git/")), files
    assert {w["path"]: w["rule"] for w in rec.withheld}[".git"] == "git-history"
