from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from airlockd.pipeline.hunks import apply_hunks, hunks, is_binary, unified_diff

lines = st.lists(st.sampled_from(["a\n", "b\n", "c\n", "d\n", "e", "\n"]), max_size=12).map("".join)


@given(lines, lines)
def test_all_hunks_give_new_none_give_old(old: str, new: str) -> None:
    ids = [h.id for h in hunks(old, new)]
    assert apply_hunks(old, new, ids) == new
    assert apply_hunks(old, new, []) == old
    assert [h.id for h in hunks(old, new)] == ids  # stable


def test_one_hunk_of_two() -> None:
    old = "one\ntwo\nthree\nfour\nfive\n"
    new = "ONE\ntwo\nthree\nfour\nFIVE\n"
    first, second = hunks(old, new)
    assert (first.old_start, first.old, first.new) == (0, ["one\n"], ["ONE\n"])
    assert apply_hunks(old, new, [second.id]) == "one\ntwo\nthree\nfour\nFIVE\n"


def test_binary_and_diff() -> None:
    assert is_binary(b"\x00\x01") and is_binary(b"\xff\xfe") and not is_binary("héllo".encode())
    d = unified_diff("a b.txt", "x\n", "y")
    assert "--- a/a b.txt" in d and "+y" in d and "No newline" in d
