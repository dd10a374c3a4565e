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


def test_sessions_are_never_looked_for_through_a_link(tmp_path: Path) -> None:
    elsewhere = tmp_path / "host" / "2026" / "12"
    elsewhere.mkdir(parents=True)
    (elsewhere / "rollout-x-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa.jsonl").write_text("{}\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / "sessions").symlink_to(tmp_path / "host")
    assert codex.sessions(home) == {}
    (home / "sessions").unlink()
    (home / "sessions" / "2026").mkdir(parents=True)
    (home / "sessions" / "2026" / "link").symlink_to(elsewhere)
    mine = home / "sessions" / "2026" / "rollout-y-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb.jsonl"
    mine.write_text("{}\n")
    assert set(codex.sessions(home)) == {"bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb"}


def test_a_tree_deeper_than_python_recurses_is_sized_and_removed(tmp_path: Path) -> None:
    from airlockd.fsutil import remove_tree, tree_bytes

    deep = tmp_path / "run"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY)
    for _ in range(1500):  # os.makedirs recurses too
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)
    assert tree_bytes(deep) >= 1500 * 4096
    remove_tree(deep)  # else pytest's own clean-up of tmp_path would die of it
    assert not deep.exists()


def test_two_runs_ending_together_leave_one_runs_home_whole(tmp_path: Path) -> None:
    import threading

    home = tmp_path / "agents" / "codex" / "home"
    home.mkdir(parents=True)
    runs = []
    for name in ("r1", "r2"):
        copy = tmp_path / name / "staging" / "home"
        copy.mkdir(parents=True)
        for i in range(200):
            (copy / f"{name}-{i}").write_text(name)
        (tmp_path / name / "agent-home.json").write_text('{"copy": "staging"}')
        runs.append(threading.Thread(target=homes.take_back, args=(tmp_path / name, home, name, None, 1 << 24)))
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    names = {p.name.split("-")[0] for p in home.iterdir()}
    assert names in ({"r1"}, {"r2"}) and len(list(home.iterdir())) == 200
    assert [p.name for p in home.parent.iterdir() if p.name.startswith("home.")] == ["home.lock"]
