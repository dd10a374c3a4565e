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

import docker
import pytest
from nonroot import as_user, ensure_tester, home_for, interpreter_for

pytestmark = pytest.mark.docker
AGENT_IMAGES = ("codex",)  # loaded into the other engines (tests/conftest.py): its Codex test

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

    def cli(
        self, *argv: str, timeout: float = 180, daemon: str = "auto", env: dict[str, str] | None = None
    ) -> tuple[int, Any, str]:
        proc = subprocess.run(
            as_user(self.uid, [str(self.prefix / "bin" / "airlockd"), "--workspace", str(self.ws), "--json", *argv]),
            capture_output=True,
            text=True,
            env={**self.env(), "AIRLOCK_DAEMON": daemon, **(env or {})},
            timeout=timeout,
            cwd="/",
        )
        return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr

    def logs(self, lines: int = 40) -> str:
        """The tail of every daemon log under the user's state (what a failed assertion shows)."""
        out = []
        for log in sorted(self.state.rglob("daemon.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.relative_to(self.state)}\n" + "\n".join(tail))
        return "\n".join(out)

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


def test_a_user_in_the_docker_group_runs_decides_and_stops_through_the_daemon(person: Person, engine: str) -> None:
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
    while (shown := person.cli("show", run["id"])[1])["state"] != "running" and time.monotonic() < deadline:
        assert shown["state"] in ("admitted", "staging", "running"), (
            f"{shown['state']}: {shown.get('error')}\n{person.logs()}"
        )
        time.sleep(0.2)
    t0 = time.monotonic()
    code, out, err = person.cli("stop", run["id"])
    assert code == 4 and out["state"] == "stopped", f"{code} {out['state']}: {out.get('error')} {err}\n{person.logs()}"
    assert time.monotonic() - t0 >= 1.5  # it waited for the grace, then the kill
    assert person.info()["pid"] == daemon["pid"]  # one daemon served all of it


def test_a_user_follows_the_agents_output_live_through_the_daemon_with_its_token_masked(person: Person) -> None:
    policy = person.ws / "policies.toml"
    policy.write_text(
        policy.read_text()
        + '[agents.talker]\ncommand = ["bash", "-c", "{prompt}"]\nprompt = "argv"\nnetwork = "gateway"\n'
        + '[gateway]\nupstream = "http://127.0.0.1:9"\nkey_env = "AIRLOCK_TEST_FOLLOW_KEY"\n'
    )
    key = "sk-follow-" + "7" * 30
    script = 'echo start; echo "token=$OPENAI_API_KEY"; printf "\\033[2J"; echo wiped; sleep 1; echo end'
    code, run, err = person.cli("run", "--agent", "talker", "--follow", script, env={"AIRLOCK_TEST_FOLLOW_KEY": key})
    assert code == 0 and run["state"] in ("proposed", "applied"), err
    assert person.info()["mode"] == "background"  # through the daemon
    lines = [line for line in err.splitlines() if not line.startswith("[")]  # --json: the account on stderr
    assert lines == ["start", "token=[REDACTED]", "\\x1b[2Jwiped", "end"], err
    assert "alrt_" not in err and key not in err


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


def _holders(client: Any, run_id: str, running: bool = False) -> list[Any]:
    """The holders of the run's upper layer: by label, or by name (a spare the daemon made ahead
    keeps the spare's labels when a run takes it)."""
    found = {}
    for filters in ({"label": f"airlockd.held-for={run_id}"}, {"name": f"^airlockd-hold-{run_id}$"}):
        for c in client.containers.list(all=not running, filters=filters):
            found[c.id] = c
    return list(found.values())


def _kept(client: Any, run_id: str) -> list[Any]:
    """The run's holders and its capped volume, while they are still there."""
    return _holders(client, run_id) + client.volumes.list(filters={"name": f"airlockd-up-{run_id}"})


def _unheld_volumes(client: Any, ws: Path) -> list[str]:
    """The workspace's capped volumes no holder mounts, a few seconds after a run (one being
    made ahead is unheld for a moment). Not the engine's `dangling` filter: Podman's counts a
    volume a running container mounts as dangling."""
    filters = {"label": [f"airlockd.workspace={ws}", "airlockd.role=upper-holder"]}
    deadline = time.monotonic() + 10

    def unheld() -> list[str]:
        mounted = {m.get("Name") for c in client.api.containers(all=True) for m in c.get("Mounts") or []}
        return [
            v.name
            for v in client.volumes.list(filters=filters)
            if v.name.startswith(("airlockd-up-", "airlockd-spare-")) and v.name not in mounted
        ]

    while (left := unheld()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _own(person: Person, path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    pw = pwd.getpwuid(person.uid)
    for p in [path, *path.parents]:
        if p == person.ws.parent:
            break
        os.chown(p, pw.pw_uid, pw.pw_gid)


def test_a_user_gets_secrets_absent_and_the_reviewers_protections_too(person: Person, engine: str) -> None:
    """The withholding (by name in any case, by identity, inside an archive, in the history) and
    the protections after the container (bounds, marks, escapes) as the user runs them."""
    import io
    import zipfile

    value = "Zq8-nonroot-withheld-xK31"
    _own(person, person.ws / "sub" / ".ENV", f"DB_PASSWORD={value}\n".encode())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("deploy/.env", f"TOKEN={value}\n")
    _own(person, person.ws / "bundle.zip", buf.getvalue())
    os.link(person.ws / "sub" / ".ENV", person.ws / "notes.txt")  # a hard link under an innocent name
    subprocess.run(as_user(person.uid, ["git", "-C", str(person.ws), "init", "-q"]), check=True, env=person.env())
    hunt = (
        "cat sub/.ENV notes.txt 2>&1; ls; git log --all -p 2>/dev/null | head -50; "
        r"printf 'x\033[8mhidden\033[0m\n' > shown.py; printf 'print(1)\n' > s$(printf '\320\265')tup.py"
    )
    code, run, err = person.cli("run", "--agent", "bot", "--wait", hunt)
    assert code == 0 and run["state"] == "proposed", (run, err)
    withheld = {w["path"] for w in run["withheld"]}
    assert {"sub/.ENV", "bundle.zip", "notes.txt"} <= withheld, withheld
    log = next(person.state.glob(f"*/runs/{run['id']}/output.log")).read_text()
    assert value not in log and "bundle.zip" not in log.split("notes.txt")[-1]
    by = {f["path"]: f for f in run["files"]}
    assert by["shown.py"]["rule"] == "invariant:hidden-characters" and by["shown.py"]["marks"]
    assert by["s\u0435tup.py"]["rule"] == "invariant:confusable-name"
    diff = subprocess.run(
        as_user(
            person.uid, [str(person.prefix / "bin" / "airlockd"), "--workspace", str(person.ws), "diff", run["id"]]
        ),
        capture_output=True,
        text=True,
        env=person.env(),
        cwd="/",
    )
    assert diff.returncode == 0 and "\x1b" not in diff.stdout and "\\x1b[8m" in diff.stdout
    # a flood past the bound ends the run at inspection, as for root
    with (person.ws / "policies.toml").open("a") as fh:
        fh.write("changed_files = 100\n")
    code, run, err = person.cli("run", "--agent", "bot", "--wait", "for i in $(seq 1 300); do : > f$i; done")
    assert code == 4 and run["state"] == "limit_exceeded" and run["limit"]["limit"] == "changed_files", (run, err)
    for p in person.state.rglob("*"):
        if p.is_file() and not p.is_symlink():
            assert value.encode() not in p.read_bytes(), p


HOSTILE = {  # prompt, the limit it must end at (as for root: test_containment.py, test_limits.py)
    "fork bomb": ("bomb() { bomb | bomb & }; bomb; sleep 30", {"pids", "wall_time"}),
    "memory hog": ("python3 -c 'a = bytearray(900 << 20); import time; time.sleep(30)'", {"memory"}),
    "output flood": ("yes flood", {"output"}),
    "disk filler": ("dd if=/dev/zero of=fill bs=1M count=200", {"workspace_growth"}),
    "SIGTERM ignorer": ("trap '' TERM; while :; do sleep 1; done", {"wall_time"}),
}


def test_hostile_agents_meet_their_limits_for_a_user_who_is_not_root(person: Person, runtime: str) -> None:
    """The containment a run gets as root, as the user gets it (overlay through the engine, its
    capped upper layer held by the engine), under runc and under gVisor: each hostile agent ends
    at its limit, counted, and leaves no container, holder or volume behind."""
    with (person.ws / "policies.toml").open("a") as fh:
        fh.write(
            f'\n[agents.hostile]\ncommand = ["bash", "-c", "{{prompt}}"]\nprompt = "argv"\nruntime = "{runtime}"\n'
            "[agents.hostile.limits]\nwall_time_s = 12\ngrace_s = 1\npids = 32\nmemory_mb = 128\n"
            "output_bytes = 100000\nworkspace_growth_mb = 16\n"
            "[agents.hostile.admission]\nquarantine_after = 100\n"
        )
    client = docker.from_env()
    for name, (prompt, limits) in HOSTILE.items():
        code, run, err = person.cli("run", "--agent", "hostile", "--wait", prompt, timeout=120)
        assert run is not None and run["state"] == "limit_exceeded", (name, code, run, err)
        assert run["limit"]["limit"] in limits, (name, run["limit"])
        assert run["stager"] == "overlay" and run["container"]["runtime"] == runtime, (name, run.get("stager"))
        left = client.containers.list(all=True, filters={"label": f"airlockd.run={run['id']}"})
        assert not left, (name, left)
        # the daemon says the run is done once its process said all; the holder (then its
        # volume) goes meanwhile
        deadline = time.monotonic() + 10

        while (held := _kept(client, run["id"])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not held, (name, held)
        assert _unheld_volumes(client, person.ws) == [], name  # a spare's volume went with the run


def test_a_run_whose_process_dies_is_reattached_for_a_user_who_is_not_root(person: Person, runtime: str) -> None:
    """The process carrying the user's run dies while the agent runs: the next command hands the
    container to a new process, and the upper layer the engine still holds is read back and
    proposed as if nothing had happened. Under runc and under runsc."""
    with (person.ws / "policies.toml").open("a") as fh:
        fh.write(f'\n[agents.slow]\ncommand = ["bash", "-c", "{{prompt}}"]\nprompt = "argv"\nruntime = "{runtime}"\n')
    code, run, err = person.cli("run", "--agent", "slow", "sleep 4; echo done > done.txt", daemon="off")
    assert code == 0 and run is not None, err
    client = docker.from_env()
    deadline = time.monotonic() + 60
    while not client.containers.list(filters={"label": f"airlockd.run={run['id']}", "status": "running"}):
        assert time.monotonic() < deadline, "the run's container never started"
        time.sleep(0.1)
    owner = person.cli("show", run["id"], daemon="off")[1]["owner_pid"]
    os.kill(owner, signal.SIGKILL)  # dies without cleaning up: the container and the holder stay
    assert _holders(client, run["id"], running=True)
    time.sleep(0.5)
    assert person.cli("undo", "rnosuchrun", daemon="off")[0] == 1  # a writing command recovers first
    deadline = time.monotonic() + 90
    while (final := person.cli("show", run["id"], daemon="off")[1])["state"] not in ("proposed", "failed"):
        assert time.monotonic() < deadline, final["state"]
        time.sleep(0.3)
    assert final["state"] == "proposed", final.get("error")
    assert [f["path"] for f in final["files"]] == ["done.txt"] and final["owner_pid"] != owner
    assert "recovery.reattached" in [e["kind"] for e in final["timeline"]]
    assert not _holders(client, run["id"])


def test_codex_as_a_user_who_is_not_root_gets_a_capped_copy_of_its_home(person: Person, engine: str) -> None:
    """The real Codex through the gateway, as the user: its home is a copy on the capped
    filesystem the engine holds, so writing 100 MB there stops at the cap and the run is over its
    growth limit, nothing of it reaches the home; a run within the cap keeps what it wrote there."""
    import secrets

    from engines import codex_image
    from scripted_model import Reply, ScriptedModel, exec_call, message, usage

    codex_image()
    key_env, key = "AIRLOCK_TEST_NONROOT_UPSTREAM_KEY", "sk-proj-" + secrets.token_hex(20)
    with ScriptedModel(fallback=lambda seen: Reply([message("nothing more")], usage(5, 1))) as model:
        with (person.ws / "policies.toml").open("a") as fh:
            fh.write(
                '\n[agents.codex]\nadapter = "codex"\nnetwork = "gateway"\n'
                "[agents.codex.limits]\nwall_time_s = 120\nmemory_mb = 1024\nworkspace_growth_mb = 16\n"
                f'[gateway]\nupstream = "{model.url}"\nkey_env = "{key_env}"\nkey_file = ""\n'
                'allowed = ["POST /v1/responses"]\n'
            )
        fill = "dd if=/dev/zero of=$CODEX_HOME/fill bs=1M count=100 2>&1 | head -n 1"
        model.replies = [Reply([exec_call(fill)], usage(5, 1)), Reply([message("filled")], usage(5, 1))]
        code, run, err = person.cli("run", "--agent", "codex", "--wait", "fill", daemon="off", env={key_env: key})
        assert run is not None and run["state"] == "limit_exceeded", (code, run, err)
        assert run["limit"]["limit"] == "workspace_growth" and run["stager"] == "overlay", run["limit"]
        assert "No space left on device" in model.tool_outputs()[0]
        home = next(person.state.glob("*/agents/codex/home"))
        assert not (home / "fill").exists()
        model.replies = [
            Reply([exec_call("echo kept > $CODEX_HOME/note.txt; echo x > x.txt")], usage(5, 1)),
            Reply([message("noted")], usage(5, 1)),
        ]
        code, run, err = person.cli("run", "--agent", "codex", "--wait", "note", daemon="off", env={key_env: key})
        assert run is not None and run["state"] == "proposed", (code, run, err)
        assert (home / "note.txt").read_text() == "kept\n" and (home / "note.txt").stat().st_uid == person.uid
        for p in person.state.rglob("*"):
            if p.is_file() and not p.is_symlink():
                assert key.encode() not in p.read_bytes(), p
        client = docker.from_env()
        assert not _holders(client, run["id"])


def test_doctor_is_green_for_the_user_on_either_engine(person: Person, engine: str) -> None:
    """The user's `airlockd doctor` on the local engine and on the second (a remote host): the
    overlay stager and a growth cap the engine holds, each tried with a probe run there."""
    code, report, err = person.cli("doctor", daemon="off")
    assert code == 0 and report["ok"], ([c for c in report["checks"] if not c["ok"]], err)
    by = {c["name"]: c["detail"] for c in report["checks"]}
    assert by["stager"].startswith("overlay"), by["stager"]
    assert "remote engine" in by["stager"] if engine == "remote" else "not root" in by["stager"]
    assert "the engine holds" in by["workspace growth cap"] and "ENOSPC" in by["workspace growth cap"]
    if engine == "remote":
        assert os.environ["DOCKER_HOST"] in by["container engine"]
