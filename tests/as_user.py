"""Run pytest once more as a user who is not root, in the `docker` group, as people run their
editors: `make test` runs the integration suite through this after its own pass as root.

As root it makes `airlock-tester` (tests/nonroot.py), gives it a fresh home, and runs pytest as
that user on this machine's first engine (the others, which only root can start, are covered
for such a user by test_daemon_nonroot.py), staged as such a user's runs are (the engine's
overlay). Run by a user who is not root, it does nothing: the first pass already was that user's.

    python tests/as_user.py [PYTEST ARGS...]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nonroot import as_user, ensure_tester, home_for, interpreter_for

ROOT = Path(__file__).resolve().parents[1]
KEPT = ("AIRLOCK_REQUIRE_DOCKER", "AIRLOCK_RUNTIME", "CI", "LANG", "TERM")


def main(args: list[str]) -> int:
    if os.geteuid() != 0:
        print("as_user: not root: the tests already ran as this user")
        return 0
    uid = ensure_tester()
    home = home_for(uid)
    try:
        with interpreter_for(uid) as prefix:
            env = {k: os.environ[k] for k in KEPT if k in os.environ}
            env.update(
                HOME=str(home),
                PATH=f"{prefix}/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                PYTHONDONTWRITEBYTECODE="1",  # the checkout is root's
                AIRLOCK_ENGINE="local",
                # what such a user stages with (the engine's overlay, capped): the copy stager,
                # which only root can cap, is root's fallback and runs in the pass as root
                AIRLOCK_STAGER=os.environ.get("AIRLOCK_STAGER", "overlay"),
            )
            argv = [str(prefix / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider"]
            argv += ["--basetemp", str(home / "pytest"), *args]
            print(f"as_user: {' '.join(args)} as uid {uid} (home {home})", flush=True)
            return subprocess.run(as_user(uid, argv), cwd=ROOT, env=env).returncode
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
