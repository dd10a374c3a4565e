"""Hunks of a text change (difflib), with stable ids, and applying a chosen subset of them."""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Collection
from dataclasses import dataclass

from airlockd.pipeline.manifest import display


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


def _id(old_start: int, old: list[str], new: list[str]) -> str:
    h = hashlib.sha256(f"{old_start}\0".encode())
    h.update("".join(old).encode("utf-8", "surrogatepass"))
    h.update(b"\0\0")
    h.update("".join(new).encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:12]


def hunks(old: str, new: str) -> list[Hunk]:
    """Minimal hunks, no context merged in; ids depend only on the hunk's position and text."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        out.append(Hunk(_id(i1, a[i1:i2], b[j1:j2]), i1, i2 - i1, j1, j2 - j1, a[i1:i2], b[j1:j2]))
    return out


def apply_hunks(old: str, new: str, chosen: Collection[str]) -> str:
    """`old` with only the chosen hunks of old -> new applied; the rest keeps old content."""
    a = old.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    for h in hunks(old, new):
        out.extend(a[pos : h.old_start])
        out.extend(h.new if h.id in chosen else h.old)
        pos = h.old_start + h.old_lines
    out.extend(a[pos:])
    return "".join(out)


def unified_diff(path: str, old: str, new: str, *, created: bool = False, deleted: bool = False) -> str:
    """A git-style unified diff with 3 lines of context."""
    name = display(path)
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        "/dev/null" if created else f"a/{name}",
        "/dev/null" if deleted else f"b/{name}",
        n=3,
    )
    text = "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
    return text
