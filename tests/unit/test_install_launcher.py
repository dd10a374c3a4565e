"""scripts/install-launcher.sh (run by `make setup`): after set-up, `airlockd` is found through the
user's PATH. Run as a normal user (created when the tests run as root), with HOME in a temporary
folder; the installed launcher is then run through a fresh PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nonroot import SYSTEM_PATH, TESTER, ensure_tester, interpreter_for

from airlockd import __version__

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install-launcher.sh"
PROFILE_LINE = 'export PATH="$HOME/.local/bin:$PATH"'


@dataclass
class User:
    """A non-root user with its own HOME, and a way to run commands as it."""

    uid: int
    home: Path
    venv: Path

    @property
    def bin(self) -> Path:
        return self.home / ".local" / "bin"

    def run(self, argv: list[str], path: str = SYSTEM_PATH, **env: str) -> subprocess.CompletedProcess[str]:
        base = {"HOME": str(self.home), "PATH": path, "LANG": "C.UTF-8"}
        if os.environ.get("PYTHONPATH"):
            base["PYTHONPATH"] = os.environ["PYTHONPATH"]
        if os.geteuid() == 0:
            argv = ["setpriv", f"--reuid={TESTER}", f"--regid={TESTER}", "--init-groups", "--", *argv]
        return subprocess.run(argv, env={**base, **env}, capture_output=True, text=True, timeout=60)

    def install(self, *args: str, path: str = SYSTEM_PATH, **env: str) -> subprocess.CompletedProcess[str]:
        return self.run(["sh", str(SCRIPT), *args], path=path, AIRLOCK_VENV=str(self.venv), **env)


@pytest.fixture(scope="module")
def uid() -> int:
    return ensure_tester()


@pytest.fixture(scope="module")
def venv(uid: int) -> Iterator[Path]:
    """The clone's virtualenv as the launcher sees it (tests/nonroot.py)."""
    with interpreter_for(uid) as prefix:
        yield prefix


@pytest.fixture
def user(uid: int, venv: Path) -> Iterator[User]:
    # not under pytest's tmp_path: as root that folder is closed to other users
    home = Path(tempfile.mkdtemp(prefix="airlock-home-"))
    os.chmod(home, 0o755)
    os.chown(home, uid, -1)
    try:
        yield User(uid, home, venv)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_install_puts_airlockd_on_a_fresh_path(user: User) -> None:
    first = user.install()
    assert first.returncode == 0, first.stderr
    launcher = user.bin / "airlockd"
    assert f"installed {launcher}" in first.stdout
    # ~/.local/bin is not on this PATH: the exact line for the profile is printed
    assert f"    {PROFILE_LINE}\n" in first.stdout
    st = launcher.stat()
    assert st.st_uid == user.uid and st.st_mode & 0o777 == 0o755

    fresh_path = f"{user.bin}:{SYSTEM_PATH}"
    ran = user.run(["sh", "-c", "command -v airlockd && airlockd --version"], path=fresh_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [str(launcher), f"airlockd {__version__}"]

    # again, with the folder now on PATH: nothing rewritten, nothing more to add to the profile
    text = launcher.read_text()
    again = user.install(path=fresh_path)
    assert again.returncode == 0, again.stderr
    assert f"{launcher} is up to date" in again.stdout and PROFILE_LINE not in again.stdout
    after = launcher.stat()
    assert (after.st_ino, after.st_mtime_ns) == (st.st_ino, st.st_mtime_ns) and launcher.read_text() == text
    assert [p.name for p in user.bin.iterdir()] == ["airlockd"]  # no temporary file left behind

    gone = user.install("uninstall")
    assert gone.returncode == 0 and f"removed {launcher}" in gone.stdout
    assert not launcher.exists()
    assert "nothing to remove" in user.install("uninstall").stdout


def test_a_foreign_airlockd_is_left_alone_and_said_so(user: User) -> None:
    user.bin.mkdir(parents=True)
    os.chown(user.home / ".local", user.uid, -1)
    os.chown(user.bin, user.uid, -1)
    foreign = user.bin / "airlockd"
    foreign.write_text("#!/bin/sh\necho mine\n")
    foreign.chmod(0o755)

    kept = user.install()
    assert kept.returncode == 0
    assert f"left alone: {foreign} exists and is not a launcher of ours" in kept.stderr
    assert "installed" not in kept.stdout
    assert foreign.read_text() == "#!/bin/sh\necho mine\n"
    assert "not a launcher of ours" in user.install("uninstall").stderr and foreign.exists()

    forced = user.install(AIRLOCK_LAUNCHER_FORCE="1")
    assert forced.returncode == 0 and "which was not ours" in forced.stderr
    ran = user.run(["airlockd", "--version"], path=f"{user.bin}:{SYSTEM_PATH}")
    assert ran.stdout.strip() == f"airlockd {__version__}", ran.stderr


def test_where_it_goes_and_a_missing_virtualenv(user: User, tmp_path: Path) -> None:
    assert user.install("where").stdout.strip() == str(user.bin / "airlockd")
    if os.geteuid() == 0:
        as_root = subprocess.run(["sh", str(SCRIPT), "where"], capture_output=True, text=True, check=True)
        assert as_root.stdout.strip() == "/usr/local/bin/airlockd"
    chosen = user.install("where", AIRLOCK_BIN_DIR="/opt/tools/bin")
    assert chosen.stdout.strip() == "/opt/tools/bin/airlockd"
    closed = user.install(AIRLOCK_BIN_DIR="/etc")  # a folder the user may not write to
    assert closed.returncode == 1 and "cannot write to /etc" in closed.stderr, closed.stderr

    missing = user.run(["sh", str(SCRIPT)], AIRLOCK_VENV=str(tmp_path / "no-venv"))
    assert missing.returncode == 1 and "is missing: create the virtualenv first (make setup)" in missing.stderr
    assert not (user.bin / "airlockd").exists()
