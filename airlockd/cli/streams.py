"""The CLI's human-readable output: every character a terminal would act on is written as an
escape (`names.escape`), so a file name, a diff line or an agent's reason cannot hide a line,
move the cursor or write the reviewer's clipboard. `--json` output needs none of it: `json.dumps`
writes every control and non-ASCII character as a `\\u` escape."""

from __future__ import annotations

import io
import sys
from typing import TextIO


class FilteredText(io.TextIOBase):
    """A text stream whose every write passes `filter` first (`EscapedText`, and the
    redactor's `decide.MaskedText`)."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def filter(self, s: str) -> str:
        raise NotImplementedError

    def write(self, s: str) -> int:
        self.raw.write(self.filter(s))
        return len(s)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.raw.encoding


class EscapedText(FilteredText):
    """Every write `names.escape`d (newlines and tabs kept)."""

    def filter(self, s: str) -> str:
        from airlockd.names import escape

        return escape(s)


def escape_output() -> None:
    """Escape what this process prints on stdout and stderr from now on (once)."""
    if not isinstance(sys.stdout, EscapedText):
        sys.stdout = EscapedText(sys.stdout)
    if not isinstance(sys.stderr, EscapedText):
        sys.stderr = EscapedText(sys.stderr)
