"""A workspace repository whose history held a secret (tests/unit/test_gitcopy.py,
tests/integration/test_git_history.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SECRET = "hist0ry-s3cret-" + "7f3a9c1e5b"  # never in the tree as staged, only in history
ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}


def git(cwd: Path, *args: str, check: bool = True) -> str:
    env = {**os.environ, **ENV, "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(cwd.parent)}
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if check:
        assert proc.returncode == 0, (args, proc.stderr)
    return proc.stdout


def history_workspace(root: Path, *, packed: bool) -> Path:
    """A repository on branch feature/x whose history held SECRET (a committed then removed
    `.env`, a file that carried it once), a stash and reflog entries holding it; with `packed`,
    only in a packfile (git gc), otherwise only in loose objects."""
    ws = root / ("packed" if packed else "loose")
    (ws / "src").mkdir(parents=True)
    git(ws, "init", "-q", "-b", "feature/x")
    git(ws, "remote", "add", "origin", f"https://user:{SECRET}@example.invalid/r.git")
    (ws / ".env").write_text(f"TOKEN={SECRET}\n")
    (ws / "src" / "app.py").write_text(f"KEY = '{SECRET}'\n")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "with the secret")
    git(ws, "rm", "-q", "--cached", ".env")
    (ws / "src" / "app.py").write_text("KEY = None\n")
    (ws / "README.md").write_text("# project\n")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "secret removed")
    (ws / "src" / "app.py").write_text(f"KEY = '{SECRET}'  # stashed\n")
    git(ws, "stash", "-q")
    if packed:
        git(ws, "gc", "-q", "--prune=now")
        assert not [p for p in (ws / ".git/objects").glob("??/*")], "the secret must live in a pack only"
    else:
        assert not list((ws / ".git/objects/pack").glob("*.pack"))
    assert SECRET.encode() not in (ws / "src" / "app.py").read_bytes()
    return ws
