"""Running airlockd as a person does: a user who is not root, in the `docker` group.

`airlock-tester` is created when the tests run as root (and is this user otherwise). Its
interpreter is this test run's own when it can run it; when that one sits where other users cannot
reach (a pyenv Python under /root), a virtualenv of the system's Python of the same version stands
in, seeing this run's packages and airlockd's source tree.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import airlockd

TESTER = "airlock-tester"
SYSTEM_PATH = "/usr/bin:/bin"


def ensure_tester() -> int:
    """The uid of the user tests run as: airlock-tester (in group docker when there is one),
    created when absent; this user when the tests do not run as root."""
    if os.geteuid() != 0:
        return os.geteuid()
    try:
        return pwd.getpwnam(TESTER).pw_uid
    except KeyError:
        pass
    has_docker = subprocess.run(["getent", "group", "docker"], capture_output=True).returncode == 0
    groups = ["--groups", "docker"] if has_docker else []
    subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/bin/sh", *groups, TESTER],
        check=True,
        capture_output=True,
    )
    return pwd.getpwnam(TESTER).pw_uid


def overlay_unavailable(state_root: Path) -> str | None:
    """Why runs cannot be staged with the overlay here, or None: root mounts its own, a user who
    is not root gets the engine's (docs/engines.md), given a path overlay options can carry."""
    from airlockd.staging import overlay

    return overlay.unavailable(state_root) if os.geteuid() == 0 else overlay.unsuitable_path(state_root)


def as_user(uid: int, argv: list[str]) -> list[str]:
    """`argv` run as `uid` with its groups (docker among them)."""
    if os.geteuid() == uid:
        return argv
    gid = pwd.getpwuid(uid).pw_gid
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--", *argv]


def runs_as(uid: int, python: Path) -> bool:
    # through sh, as a launcher does: setpriv's own exec may still resolve paths as root
    argv = as_user(uid, ["sh", "-c", 'exec "$0" -c "import airlockd.cli"', str(python)])
    return subprocess.run(argv, capture_output=True, env={**os.environ, "HOME": "/"}).returncode == 0


@contextlib.contextmanager
def interpreter_for(uid: int) -> Iterator[Path]:
    """The prefix of a Python environment `uid` can run airlockd from (with `bin/airlockd`)."""
    if runs_as(uid, Path(sys.prefix) / "bin" / "python"):
        yield Path(sys.prefix)
        return
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
    assert system, f"uid {uid} cannot run {sys.executable} and there is no system {version} to stand in"
    root = Path(tempfile.mkdtemp(prefix="airlock-venv-"))
    os.chmod(root, 0o755)
    try:
        subprocess.run([system, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True)
        purelib = subprocess.run(
            [str(root / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        # the package this run imports first (an editable install's source tree: its site-packages
        # hold only `airlockd/_data`, and a .pth inside a path added by a .pth is not read), then
        # this interpreter's packages
        source = Path(airlockd.__file__).resolve().parent.parent
        Path(purelib, "test-packages.pth").write_text(f"{source}\n{sysconfig.get_paths()['purelib']}\n")
        entry = root / "bin" / "airlockd"
        entry.write_text(f"#!{root}/bin/python\nimport sys\nfrom airlockd.cli import main\nsys.exit(main())\n")
        entry.chmod(0o755)
        assert runs_as(uid, root / "bin" / "python"), f"uid {uid} cannot run {root}/bin/python either"
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def home_for(uid: int) -> Path:
    """A fresh folder the user owns, outside pytest's tmp_path (closed to other users as root)."""
    home = Path(tempfile.mkdtemp(prefix="airlock-home-"))
    os.chmod(home, 0o755)
    os.chown(home, uid, pwd.getpwuid(uid).pw_gid)
    return home
