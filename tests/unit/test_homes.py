"""The agent's home during a run (agents/homes.py, agents/codex.py): what a run leaves in its copy
is counted before it is taken back, refused whole past a bound, and never trusted to write."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airlockd.agents import codex, homes
from airlockd.staging.bounds import ChangeBounds, ChangeSetTooLarge

BOUNDS = ChangeBounds(entries=1000, depth=homes.HOME_DEPTH, bytes=1 << 20)


def test_a_tree_is_counted_without_recursion_and_hard_links_once(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(os.urandom(300_000))
    for i in range(20):
        os.link(tmp_path / "f", tmp_path / f"l{i}")
    homes.check_tree(tmp_path, BOUNDS)  # 300 KB once, not 6 MB
    deep = tmp_path / "d"
    for _ in range(homes.HOME_DEPTH + 5):
        deep = deep / "d"
    deep.mkdir(parents=True)
    with pytest.raises(ChangeSetTooLarge) as err:
        homes.check_tree(tmp_path, BOUNDS)
    assert err.value.limit == "change_depth"


def test_a_home_over_its_cap_is_not_taken_back(tmp_path: Path) -> None:
    run_dir, home = tmp_path / "run", tmp_path / "home"
    home.mkdir()
    (home / "kept.txt").write_text("before\n")
    copy = run_dir / "staging" / "home"
    copy.mkdir(parents=True)
    (copy / "fill").write_bytes(os.urandom(2 << 20))
    (run_dir / "agent-home.json").write_text('{"copy": "staging"}')
    with pytest.raises(homes.HomeRefused, match="over its bounds"):
        homes.take_back(run_dir, home, "r1", None, 1 << 20)
    assert (home / "kept.txt").read_text() == "before\n" and not (home / "fill").exists()
    assert not copy.exists() and not home.with_name("home.new").exists()


def test_the_agents_config_is_never_kept_and_a_link_in_its_place_is_never_followed(tmp_path: Path) -> None:
    run_dir, home = tmp_path / "run", tmp_path / "home"
    home.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("host file\n")
    copy = run_dir / "staging" / "home"
    copy.mkdir(parents=True)
    (copy / "config.toml").symlink_to(victim)
    (copy / "note").write_text("turns\n")
    (run_dir / "agent-home.json").write_text('{"copy": "staging"}')
    homes.take_back(run_dir, home, "r1", None, 1 << 20)
    assert (home / "note").read_text() == "turns\n" and not (home / "config.toml").is_symlink()
    (home / "config.toml").symlink_to(victim)  # left there some other way: still not followed
    codex.write_config(home, "model_provider = 'x'\n")
    assert victim.read_text() == "host file\n"
    assert not (home / "config.toml").is_symlink() and "model_provider" in (home / "config.toml").read_text()
