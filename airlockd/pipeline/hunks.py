"""Hunks of a text change (difflib), with stable ids, and applying a chosen subset of them. Pure.

Lines are split where an editor splits them (LSP: `\\r\\n`, `\\n` or `\\r`) and keep their endings,
so a hunk's 0-based line numbers are the editor's and joining lines gives back the exact text.
`unified_diff` follows git instead (only `\\n` ends a line).
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass

from airlockd.names import display

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\n|\r)|[^\r\n]+\Z")


@dataclass(frozen=True)
class Hunk:
    """One contiguous replacement: old[old_start:old_start+old_lines] -> new lines (0-based)."""

    id: str
    old_start: int
    old_lines: int
    new_start: int
    new_lines: int
    old: list[str]
    new: list[str]


def is_binary(data: bytes) -> bool:
    """A NUL byte in the first 8 KB, or content that is not UTF-8: listed, never diffed."""
    if b"\0" in data[:8192]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def lines(text: str) -> list[str]:
    """`text` split into lines that keep their endings (`\\r\\n`, `\\n` or `\\r`); joining them
    gives `text` back."""
    return _LINE.findall(text)


def _id(old_start: int, old: list[str], new: list[str]) -> str:
    h = hashlib.sha256(f"{old_start}\0".encode())
    h.update("".join(old).encode("utf-8", "surrogatepass"))
    h.update(b"\0\0")
    h.update("".join(new).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:12]


# Line pairs the matcher may compare (`_pairs`) past which a change is one hunk: a file of 5,000
# lines with 800 blank ones is 640,000; a 10,000-line one with 2,000, the budget (about 2 s).
MATCH_BUDGET = 4_000_000


def _pairs(a: list[str], b: list[str]) -> int:
    """How many (line of a, equal line of b) pairs there are: what each of the matcher's longest-
    match searches may walk through."""
    counts = Counter(b)
    return sum(counts[line] for line in a)


def hunks(old: str, new: str) -> list[Hunk]:
    """Minimal hunks of old -> new, no context lines merged in: one per replace, insert or delete
    run of `SequenceMatcher(autojunk=False)`. An id is the first 12 hex digits of SHA-256 over
    the hunk's old start, old lines and new lines, so computing them again gives the same ids.
    Never fails on any pair of strings (surrogates included)."""
    a, b = lines(old), lines(new)
    # Lines common at both ends are never part of a hunk; leaving them out of the matcher keeps
    # a small edit of a large file from costing a quadratic comparison of everything.
    head = 0
    while head < len(a) and head < len(b) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < len(a) - head and tail < len(b) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    mid_a, mid_b = a[head : len(a) - tail], b[head : len(b) - tail]
    if mid_a and mid_b and _pairs(mid_a, mid_b) > MATCH_BUDGET:
        # What the matcher would compare grows with lines repeated on both sides (an agent's
        # 40,000 blank lines against a file's blank lines made `show` cubic): one hunk instead.
        i2, j2 = head + len(mid_a), head + len(mid_b)
        return [Hunk(_id(head, a[head:i2], b[head:j2]), head, len(mid_a), head, len(mid_b), a[head:i2], b[head:j2])]
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, mid_a, mid_b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        i1, i2, j1, j2 = i1 + head, i2 + head, j1 + head, j2 + head
        out.append(Hunk(_id(i1, a[i1:i2], b[j1:j2]), i1, i2 - i1, j1, j2 - j1, a[i1:i2], b[j1:j2]))
    return out


def apply_hunks(old: str, new: str, chosen: Collection[str]) -> str:
    """`old` with only the chosen hunks of old -> new applied; the rest keeps old content.
    Unknown ids are ignored; never reorders or merges hunks."""
    a = lines(old)
    out: list[str] = []
    pos = 0
    for h in hunks(old, new):
        out.extend(a[pos : h.old_start])
        out.extend(h.new if h.id in chosen else h.old)
        pos = h.old_start + h.old_lines
    out.extend(a[pos:])
    return "".join(out)


def unified_diff(path: str, old: str, new: str, *, created: bool = False, deleted: bool = False) -> str:
    """A git-style unified diff (`--- a/path`, `+++ b/path`, 3 lines of context, `\\ No newline
    at end of file`), the path rendered with `display()`; `/dev/null` for a created or deleted
    file. Empty when nothing changed. Never executes or escapes anything else in the text."""
    name = display(path)
    diff = difflib.unified_diff(
        _git_lines(old),
        _git_lines(new),
        "/dev/null" if created else f"a/{name}",
        "/dev/null" if deleted else f"b/{name}",
        n=3,
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff)


def _git_lines(text: str) -> list[str]:
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out
