"""Ending what the CLI started in the background for a test (shared by conftest and tests that
make state roots of their own)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def end_daemons(root: Path) -> None:
    """The background daemons the CLI started for workspaces of this state root: ended (SIGTERM,
    then SIGKILL), so no test leaves a process behind."""
    import json
    import signal
    import time

    pids = []
    for info in root.glob("*/serve.json"):
        try:
            doc = json.loads(info.read_text())
        except (OSError, ValueError):
            continue
        if doc.get("mode") == "background" and isinstance(doc.get("pid"), int):
            pids.append(doc["pid"])
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    for pid in pids:
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
