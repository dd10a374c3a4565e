"""The CLI builds only the sub-command it was given (its start-up is on the fast path to a
daemon): it must parse exactly as the whole parser does, and fall back to the whole one for help,
unknown words and option-only command lines."""

from __future__ import annotations

import argparse

import pytest

from airlockd.cli import _COMMANDS, _command_of, build_parser, main

LINES = [
    ["--workspace", "/w", "run", "--agent", "bot", "--wait", "--mode", "auto", "do it"],
    ["--json", "run", "--agent", "bot", "--follow-up", "r1", "-"],
    ["_execute", "--events", "--values-on-stdin", "r1"],
    ["runs"],
    ["runs", "--limit", "5", "--state", "proposed,applied", "--agent", "bot", "--since", "3d", "--before", "r1"],
    ["gc", "--apply", "--json"],
    ["show", "r1", "--json"],
    ["diff", "r1", "src/a.py"],
    ["approve", "r1", "--path", "src", "--hunk", "a.py:3f", "--hunk", "b.py:9a"],
    ["reject", "r1", "--path", "src"],
    ["--no-daemon", "undo", "r1"],
    ["stop", "r1", "--no-wait"],
    ["kill", "r1"],
    ["agents"],
    ["release", "bot"],
    ["audit", "--verify", "--run", "r1"],
    ["policy", "show", "abc"],
    ["runtime", "build", "--with-codex"],
    ["doctor"],
    ["demo", "--dir", "/tmp/x"],
    ["serve", "--background", "--idle", "5"],
    ["-v", "serve", "--tcp", "127.0.0.1:0"],
]


def _plain(ns: argparse.Namespace) -> dict[str, object]:
    return {k: (v.__name__ if callable(v) else v) for k, v in vars(ns).items()}


def test_every_command_is_known() -> None:
    full = build_parser()
    sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == _COMMANDS
    assert {line[0] if not line[0].startswith("-") else line[1] for line in LINES} >= _COMMANDS - {"--workspace"}


@pytest.mark.parametrize("argv", LINES, ids=lambda a: " ".join(a))
def test_the_one_sub_command_parses_as_the_whole_parser(argv: list[str]) -> None:
    command = _command_of(argv)
    assert command in _COMMANDS
    assert _plain(build_parser(command).parse_args(argv)) == _plain(build_parser().parse_args(argv))


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["--workspace", "run", "runs"], "runs"),  # a workspace folder named like a command
        (["--help"], None),
        (["run", "--help"], "run"),
        (["-h"], None),
        (["nonsense"], None),
        (["--json"], None),
        ([], None),
    ],
)
def test_which_command(argv: list[str], command: str | None) -> None:
    assert _command_of(argv) == command


def test_usage_errors_still_name_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nonsense"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nonsense'" in err and "approve" in err
