from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airlockd.pipeline.hunks import apply_hunks, hunks, is_binary, lines, unified_diff

lines_st = st.lists(st.sampled_from(["a\n", "b\n", "c\n", "d\n", "e", "\n"]), max_size=12).map("".join)
# Any text at all: CR, CRLF, form feeds, unicode line separators, no final newline, surrogates.
texts = st.lists(
    st.sampled_from(["a\n", "b\r\n", "c\r", "d", "\x0c\n", "x\u2028y\n", "\udcff\n", "", "e\n", "a\n"]), max_size=15
).map("".join)


@given(lines_st, lines_st)
def test_all_hunks_give_new_none_give_old(old: str, new: str) -> None:
    ids = [h.id for h in hunks(old, new)]
    assert apply_hunks(old, new, ids) == new
    assert apply_hunks(old, new, []) == old
    assert [h.id for h in hunks(old, new)] == ids  # stable


@given(texts, texts, st.data())
def test_any_subset_applies_each_hunk_whole_or_not_at_all(old: str, new: str, data: st.DataObject) -> None:
    hs = hunks(old, new)
    assert apply_hunks(old, new, [h.id for h in hs]) == new
    assert apply_hunks(old, new, ()) == old
    assert len({h.id for h in hs}) == len(hs)
    chosen = data.draw(st.sets(st.sampled_from([h.id for h in hs])) if hs else st.just(set()))
    merged = lines(apply_hunks(old, new, chosen))
    a, pos, expect = lines(old), 0, []
    for h in hs:
        assert a[h.old_start : h.old_start + h.old_lines] == h.old  # hunks point at old's lines
        expect += a[pos : h.old_start] + (h.new if h.id in chosen else h.old)
        pos = h.old_start + h.old_lines
    assert merged == expect + a[pos:]


@given(texts)
def test_lines_round_trip_and_split_like_an_editor(text: str) -> None:
    got = lines(text)
    assert "".join(got) == text
    assert all(line for line in got)
    for line in got[:-1]:
        assert line.endswith(("\n", "\r"))


def test_lines_split_on_lsp_line_breaks_only() -> None:
    assert lines("a\r\nb\rc\nd\x0ce\u2028f") == ["a\r\n", "b\r", "c\n", "d\x0ce\u2028f"]


def test_hunks_are_minimal_without_context() -> None:
    old = "1\n2\n3\n4\n5\n6\n7\n8\n"
    new = "1\nTWO\n3\n4\n5\n6\n8\nNINE\n"
    got = [(h.old_start, h.old_lines, h.new_start, h.new_lines, h.old, h.new) for h in hunks(old, new)]
    assert got == [
        (1, 1, 1, 1, ["2\n"], ["TWO\n"]),
        (6, 1, 6, 0, ["7\n"], []),
        (8, 0, 7, 1, [], ["NINE\n"]),
    ]


def test_ids_depend_on_position_and_text_only() -> None:
    (h1,) = hunks("a\nb\n", "a\nB\n")
    (h2,) = hunks("a\nb\nzzz\n", "a\nB\nzzz\n")
    (h3,) = hunks("q\nb\n", "q\nB\n")
    assert h1.id == h2.id == h3.id and len(h1.id) == 12 and int(h1.id, 16) >= 0
    (h4,) = hunks("b\n", "B\n")
    assert h4.id != h1.id  # another start line


def test_one_hunk_of_two() -> None:
    old = "one\ntwo\nthree\nfour\nfive\n"
    new = "ONE\ntwo\nthree\nfour\nFIVE\n"
    first, second = hunks(old, new)
    assert (first.old_start, first.old, first.new) == (0, ["one\n"], ["ONE\n"])
    assert apply_hunks(old, new, [second.id]) == "one\ntwo\nthree\nfour\nFIVE\n"
    assert apply_hunks(old, new, [first.id, "not-an-id"]) == "ONE\ntwo\nthree\nfour\nfive\n"


def test_a_small_edit_of_a_big_file_is_fast() -> None:
    old = "".join(f"line {i}\n" for i in range(200_000))
    new = old.replace("line 100000\n", "changed\n")
    (h,) = hunks(old, new)
    assert (h.old_start, h.old, h.new) == (100_000, ["line 100000\n"], ["changed\n"])


def test_binary_and_diff() -> None:
    assert is_binary(b"\x00\x01") and is_binary(b"\xff\xfe") and not is_binary("héllo".encode())
    assert not is_binary(b"") and is_binary(b"x" * 9000 + b"\xff")
    d = unified_diff("a b.txt", "x\n", "y")
    assert "--- a/a b.txt" in d and "+y" in d and "No newline" in d


def test_unified_diff_headers_and_hostile_paths() -> None:
    assert unified_diff("same", "x\n", "x\n") == ""
    created = unified_diff("new.py", "", "a\n", created=True)
    assert created.startswith("--- /dev/null\n+++ b/new.py\n")
    gone = unified_diff("old.py", "a\n", "", deleted=True)
    assert gone.splitlines()[:2] == ["--- a/old.py", "+++ /dev/null"]
    hostile = unified_diff("evil\nname\x1b.py", "a\n", "b\n")
    assert hostile.splitlines()[0] == "--- a/evil\\nname\\x1b.py"


def test_unified_diff_treats_only_newline_as_a_line_end() -> None:
    d = unified_diff("f", "a\rb\nc\n", "a\rB\nc\n")
    assert "-a\rb\n+a\rB\n" in d and "No newline" not in d


@pytest.mark.parametrize(
    ("old", "new"),
    [("a\nb\nc\n", "a\nB\nc\nd"), ("x", "y\n"), ("", "new\nfile\n"), ("1\n2\n3\n4\n5\n6\n7\n8\n9\n", "1\n9\n")],
)
def test_unified_diff_applies_with_patch(tmp_path: Path, old: str, new: str) -> None:
    if shutil.which("patch") is None:
        pytest.skip("no `patch` program")
    target = tmp_path / "f.txt"
    target.write_text(old)
    patch = unified_diff("f.txt", old, new)
    done = subprocess.run(
        ["patch", "-p1", "--quiet", "--no-backup-if-mismatch"],
        input=patch,
        text=True,
        cwd=tmp_path,
        capture_output=True,
    )
    assert done.returncode == 0, done.stderr + patch
    assert target.read_text() == new


def test_a_change_built_to_make_the_matcher_cubic_is_one_hunk_in_bounded_time() -> None:
    """40,000 blank lines against a file whose every third line is blank: the matcher would walk
    millions of equal pairs at every level (minutes); past the budget the middle is one hunk."""
    import time

    from airlockd.pipeline.hunks import apply_hunks, hunks

    base = "".join(f"x{i}\n" if i % 3 else "\n" for i in range(3000))
    new = "X\n" + "\n" * 40_000 + "Y\n"
    started = time.process_time()
    (h,) = hunks(base, new)
    assert time.process_time() - started < 5
    assert (h.old_start, h.old_lines, h.new_lines) == (0, 3000, 40_002)
    assert apply_hunks(base, new, {h.id}) == new and apply_hunks(base, new, set()) == base
    assert [x.id for x in hunks(base, new)] == [h.id]  # the same ids when computed again
