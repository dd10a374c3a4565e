"""Workspace paths as strings: how a person is shown one, and whether one lies under another.

Standard library only (nothing at all, in fact): the CLI prints paths on its fast path, where
importing the manifest module (and `dataclasses`, `enum`, `hashlib` with it) cost 8 ms.
"""

from __future__ import annotations


def display(path: str) -> str:
    """A path as a person should see it: control characters and undecodable bytes escaped."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return repr(path)[1:-1]
    return path if path.isprintable() else repr(path)[1:-1]


def under(path: str, prefix: str) -> bool:
    """`path` is `prefix` or inside it (workspace-relative, '/'-separated; a trailing '/' on
    `prefix` is allowed). Compares strings only: never touches the filesystem."""
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")
