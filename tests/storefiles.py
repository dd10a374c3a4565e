"""What the store holds on disk, as text: every file of it (airlockd/store.py's layout)."""

from __future__ import annotations

from airlockd.state import StateDir


def store_text(state: StateDir) -> str:
    files = [state.index_file]
    for folder in (state.records, state.history):
        files += sorted(folder.glob("*.json")) if folder.is_dir() else []
    return "".join(p.read_text() for p in files if p.exists())
