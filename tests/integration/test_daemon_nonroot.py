"""Both doors as a person runs them: a user who is not root, in the `docker` group. The CLI starts
its background daemon as that user, runs through it, decides through it, stops through it; the
editor's daemon (`serve --stdio`) takes the workspace over, and the CLI is then its client. Files
land owned by the user; nothing needs root."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nonroot import as_user, ensure_tester, home_for, interpreter_for

pytestmark = pytest.mark.docker

POLICY = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    [agents.bot.limits]
    wall_time_s = 60
    grace_s = 2
    """
)


class Person:
    def __init__(self, uid: int, prefix: Path, home: Path) -> None:
        self.uid, self.prefix, self.home = uid, prefix, home
        self.ws = home / "project"
        self.state = home / ".local" / "state" / "airlockd"

    def env(self) -> dict[str, str]:
        return {
            "HOME": str(self.home),
            "PATH": f"{self.prefix}/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "AIRLOCK_DAEMON": "auto",
            **({"DOCKER_HOST": os.environ["DOCKER_HOST"]} if "DOCKER_HOST" in os.environ else {}),
        }

    def cli(self, *argv: str, timeout: float = 180) -> tuple[int, Any, str]:
        proc = subprocess.run(
            as_user(self.uid, [str(self.prefix / "bin" / "airlockd"), "--workspace", str(self.ws), "--json", *argv]),
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
            cwd="/",
        )
        return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr

    def info(self) -> dict[str, Any]:
        found = list(self.state.glob("*/serve.json"))
        return json.loads(found[0].read_text()) if found else {}


@pytest.fixture
def person(_image: None) -> Iterator[Person]:
    uid = ensure_tester()
    home = home_for(uid)
    gid = pwd.getpwuid(uid).pw_gid
    try:
        with interpreter_for(uid) as prefix:
            p = Person(uid, prefix, home)
            subprocess.run(as_user(uid, ["mkdir", "-p", str(p.ws)]), check=True)
            for name, text in (("policies.toml", POLICY), ("a.txt", "a\n")):
                (p.ws / name).write_text(text)
                os.chown(p.ws / name, uid, gid)
            yield p
            pid = p.info().get("pid")
            if pid:  # its daemon ends with the test
                os.kill(int(pid), signal.SIGTERM)
                deadline = time.monotonic() + 10
                while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_user_in_the_docker_group_runs_decides_and_stops_through_the_daemon(person: Person) -> None:
    code, run, err = person.cli("run", "--agent", "bot", "--wait", "echo hi > hi.txt")
    assert code == 0 and run["state"] == "proposed", err
    daemon = person.info()
    assert daemon["mode"] == "background"
    assert Path(f"/proc/{daemon['pid']}").stat().st_uid == person.uid  # the user's own daemon
    control = person.state.glob("*/control.sock").__next__()
    assert control.stat().st_uid == person.uid and control.stat().st_mode & 0o777 == 0o600
    code, out, err = person.cli("approve", run["id"])
    assert code == 0 and out["applied"] == ["hi.txt"], err
    landed = person.ws / "hi.txt"
    assert landed.read_text() == "hi\n" and landed.stat().st_uid == person.uid
    # a run that ignores SIGTERM: stop returns once it has ended, with the final state
    code, run, err = person.cli("run", "--agent", "bot", "trap '' TERM; sleep 60")
    assert code == 0 and run["state"] == "admitted", err
    deadline = time.monotonic() + 60
    while person.cli("show", run["id"])[1]["state"] != "running" and time.monotonic() < deadline:
        time.sleep(0.2)
    t0 = time.monotonic()
    code, out, err = person.cli("stop", run["id"])
    assert code == 4 and out["state"] == "stopped", (code, out, err)
    assert time.monotonic() - t0 >= 1.5  # it waited for the grace, then the kill
    assert person.info()["pid"] == daemon["pid"]  # one daemon served all of it


def test_the_users_editor_takes_over_and_the_cli_becomes_its_client(person: Person) -> None:
    code, run, err = person.cli("run", "--agent", "bot", "--wait", "echo from-cli > c.txt")
    assert code == 0, err
    background = person.info()["pid"]
    editor = subprocess.Popen(
        as_user(person.uid, [str(person.prefix / "bin" / "airlockd"), "--workspace", str(person.ws), "serve"]),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=person.env(),
        cwd="/",
    )
    try:
        deadline = time.monotonic() + 60
        while person.info().get("mode") != "stdio" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert person.info().get("mode") == "stdio" and person.info()["pid"] != background
        code, out, err = person.cli("reject", run["id"])
        assert code == 0 and out["state"] == "rejected", err
        audit = (person.state.glob("*/audit.jsonl")).__next__().read_text().splitlines()
        rejected = [json.loads(x) for x in audit if '"review.reject"' in x]
        assert rejected and rejected[-1]["data"]["by"] == "cli"
    finally:
        editor.stdin.close()  # type: ignore[union-attr]
        editor.wait(30)
