"""What the daemon makes ready for the runs its run processes carry (runs/ahead.py): a spare set
aside for a run is written into the run's folder for its process to read once; the next spare is
made with the cap the run's holder had (a claim it never took dropped first), and that cap is kept
so a daemon that starts makes one before its first run; nothing is made without the daemon's
keeper or an engine-held upper layer."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airlockd.runs import ahead, execution
from airlockd.staging import stagers


class _Held:
    def __init__(self, spare: str | None = "c0ffee", remote: bool = False) -> None:
        self.spare, self.calls, self.remote = spare, [], remote
        self.files: dict[str, bytes] = {}

    def reserve_spare(self, run_id: str, files: dict[str, bytes] | None = None) -> str | None:
        self.calls.append(("reserve", run_id))
        self.files = dict(files or {})
        return self.spare

    def drop_claim(self, run_id: str) -> None:
        self.calls.append(("drop_claim", run_id))

    def make_spare(self, size: int, inodes: int, owner: tuple[int, int], mode: int) -> None:
        self.calls.append(("make", (size, inodes, owner, mode)))


def _svc(tmp_path: Path, keeper: bool = True, agents: tuple[str, ...] = ("bot",), cfg: Any = None) -> Any:
    root = tmp_path / "state"
    (root / "runs" / "r1").mkdir(parents=True)
    return SimpleNamespace(
        keeper=object() if keeper else None,
        state=SimpleNamespace(root=root, run_dir=lambda run_id: root / "runs" / run_id),
        store=SimpleNamespace(get_run=lambda run_id: SimpleNamespace(id=run_id, agent="bot")),
        policy=SimpleNamespace(agents={a: cfg for a in agents}),
    )


def test_a_spare_set_aside_is_read_once_by_the_runs_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc, held = _svc(tmp_path), _Held()
    monkeypatch.setattr(ahead, "held_upper", lambda svc, agent=None: held)
    assert ahead.reserve(svc, "r1") is True
    assert held.calls == [("reserve", "r1")]
    assert execution.claimed_spare(svc, "r1") == "c0ffee"
    assert execution.claimed_spare(svc, "r1") is None  # once
    held.spare = None
    assert ahead.reserve(svc, "r1") is False and execution.claimed_spare(svc, "r1") is None


def test_nothing_is_set_aside_or_made_without_the_keeper_or_a_held_layer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = _Held()
    monkeypatch.setattr(ahead, "held_upper", lambda svc, agent=None: held)
    svc = _svc(tmp_path, keeper=False)
    assert ahead.reserve(svc, "r1") is False
    ahead.after(svc, "r1")
    assert held.calls == []
    monkeypatch.setattr(ahead, "held_upper", lambda svc, agent=None: None)  # root, local engine
    svc = _svc(tmp_path / "b")
    assert ahead.reserve(svc, "r1") is False
    ahead.after(svc, "r1")
    ahead.at_start(svc)


def test_the_next_spare_has_the_cap_the_run_had_and_a_daemon_that_starts_makes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    svc, held = _svc(tmp_path), _Held()
    monkeypatch.setattr(ahead, "held_upper", lambda svc, agent=None: held)
    ahead.after(svc, "r1")  # no cap recorded (it failed before its holder): only its claim goes
    assert held.calls == [("drop_claim", "r1")]
    run_dir = svc.state.run_dir("r1")
    lay = stagers.Layout(Path("/lower"), Path("/e/upper"), Path("/e/work"), run_dir / "staging", "opts", None)
    stagers.write_meta(run_dir, "overlay", "why", held=lay, cap=(64 << 20, 4096, (1000, 1000), 0o755))
    held.calls.clear()
    ahead.after(svc, "r1")
    assert held.calls == [("drop_claim", "r1"), ("make", (64 << 20, 4096, (1000, 1000), 0o755))]
    assert json.loads((svc.state.root / ahead.LAST_CAP).read_text())["agent"] == "bot"

    fresh, again = _svc(tmp_path / "x"), _Held()
    fresh.state.root = svc.state.root  # the same state directory, a new daemon
    monkeypatch.setattr(ahead, "held_upper", lambda svc, agent=None: again)
    ahead.at_start(fresh)
    assert again.calls == [("make", (64 << 20, 4096, (1000, 1000), 0o755))]
    gone = _svc(tmp_path / "y", agents=("other",))  # the agent is no longer in the policy
    gone.state.root = svc.state.root
    again.calls.clear()
    ahead.at_start(gone)
    assert again.calls == []
    (svc.state.root / ahead.LAST_CAP).write_text("{not json")
    ahead.at_start(fresh)  # a damaged record: nothing made, nothing raised
    assert again.calls == []


def test_on_a_remote_engine_the_prompt_on_standard_input_goes_into_the_spare_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's service runs in its spare already: it writes what a `command` agent will read
    on its standard input, and tells the run's process the digest (which compares it with what
    it would write before it trusts it). Not for an engine that reads the local file, an agent
    that takes the prompt in its argv, nor an agent CLI."""
    from airlockd.policy import AgentConfig

    prompt = "fix the bug — in ünïcode\n"
    for cfg, remote, wanted in [
        (AgentConfig.model_validate({"command": ["cat"]}), True, prompt.encode()),
        (AgentConfig.model_validate({"command": ["cat"]}), False, None),
        (AgentConfig.model_validate({"command": ["echo", "{prompt}"], "prompt": "argv"}), True, None),
        (AgentConfig.model_validate({"adapter": "codex"}), True, None),
    ]:
        svc, held = _svc(tmp_path / f"{remote}-{cfg.prompt}-{cfg.adapter}", cfg=cfg), _Held(remote=remote)
        monkeypatch.setattr(ahead, "held_upper", lambda svc, agent=None, h=held: h)
        (svc.state.run_dir("r1") / "prompt.raw").write_text(prompt)
        assert ahead.reserve(svc, "r1") is True
        assert held.files == ({"stdin": wanted} if wanted is not None else {})
        digests = json.loads((svc.state.run_dir("r1") / execution.AHEAD).read_text())
        assert digests == ({"stdin": hashlib.sha256(wanted).hexdigest()} if wanted is not None else {})
        assert execution._written_ahead(svc.state.run_dir("r1"), "stdin") == digests.get("stdin")
