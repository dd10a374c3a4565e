"""A remote engine's mirror (sandbox/enginemirror.py), against the second engine (a host where
none of this machine's paths exist): the engine itself says it cannot see them, the first sync
sends the tree, the next only what changed, a generation a live run may have mounted never
changes under it, generations gone here go there, and a sync cut short is made again whole."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import docker
import pytest

from airlockd.runs.service import Service
from airlockd.sandbox.enginemirror import EngineMirror
from airlockd.sandbox.enginepaths import sees_local_paths
from airlockd.sandbox.image import image_tag

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

ODD = "odd name\nwith a newline \udcff"  # a name that is not UTF-8 and has a newline in it


def _tree(root: Path, n: int = 300) -> Path:
    for i in range(n):
        d = root / f"pkg{i % 10}" / f"sub{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"m{i}.py").write_text(f"V = {i}\n" * (i % 7 + 1))
    (root / "link").symlink_to("pkg0/sub0/m0.py")
    (root / os.fsdecode(os.fsencode(ODD))).write_bytes(b"odd\n")
    os.chmod(root / "pkg1", 0o750)
    return root


def _sums(tree: Path) -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(tree):
        for f in files:
            p = Path(dirpath) / f
            rel = os.fsencode(p.relative_to(tree)).hex()
            out[rel] = "link:" + os.readlink(p) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


SUMS = r"""
import hashlib, json, os, sys
out = {}
for dirpath, _, files in os.walk(sys.argv[1].encode()):
    for f in files:
        p = os.path.join(dirpath, f)
        rel = os.path.relpath(p, sys.argv[1].encode()).hex()
        link = os.path.islink(p)
        out[rel] = "link:" + os.readlink(p).decode() if link else hashlib.sha256(open(p, "rb").read()).hexdigest()
print(json.dumps(out))
"""


def _there(client: docker.DockerClient, mirror: EngineMirror, gen: str) -> dict[str, str]:
    import json

    out = client.containers.run(
        image_tag(), ["python3", "-I", "-c", SUMS, f"/m/{gen}"], volumes={mirror.name: {"bind": "/m", "mode": "ro"}},
        network_mode="none", remove=True, user="0:0",
    )  # fmt: skip
    return dict(json.loads(out))


def test_the_engine_itself_says_whether_it_sees_this_machines_paths(
    second_engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked of the engine: the local one through a socket path of its own (this machine's usual
    socket is taken as local without asking), and the second."""
    (tmp_path / "docker.sock").symlink_to("/var/run/docker.sock")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/docker.sock")
    assert sees_local_paths(docker.DockerClient(base_url=f"unix://{tmp_path}/docker.sock"), image_tag()) is True
    monkeypatch.setenv("DOCKER_HOST", second_engine)
    assert sees_local_paths(docker.DockerClient(base_url=second_engine), image_tag()) is False


def test_the_mirror_travels_once_then_only_what_changed(second_engine: str, tmp_path: Path) -> None:
    client = docker.DockerClient(base_url=second_engine)
    root = tmp_path / "mirror"
    g1 = _tree(root / "g1")
    mirror = EngineMirror(client, image_tag(), root)
    try:
        lower = mirror.sync(g1)
        assert lower.endswith(f"/{mirror.name}/_data/g1")  # a path on the engine's host
        nodes = sum(len(d) + len(f) for _, d, f in os.walk(g1))
        assert mirror.last == (0, nodes)
        assert _there(client, mirror, "g1") == _sums(g1)
        mirror.sync(g1)
        assert mirror.last == (0, 0)  # nothing changed: nothing travels

        # the next generation, as the local mirror makes one under a live run: a hard-link clone
        subprocess.run(["cp", "-al", str(g1), str(root / "g2")], check=True)
        g2 = root / "g2"
        for i in range(10):
            p = g2 / f"pkg{i % 10}" / f"sub{i % 3}" / f"m{i}.py"
            tmp = p.with_name(".tmp")
            tmp.write_text(f"CHANGED = {i}\n")
            os.replace(tmp, p)  # never in place: a new inode
        shutil.rmtree(g2 / "pkg9" / "sub2")
        mirror.sync(g2)
        removed, sent = mirror.last
        assert removed == 1 and sent == 10  # the directory that went; the changed files replaced
        assert _there(client, mirror, "g2") == _sums(g2)
        assert _there(client, mirror, "g1") == _sums(g1)  # what a live run mounted did not change

        shutil.rmtree(g1)  # the local mirror collected it: so does the engine's
        mirror.sync(g2)
        assert mirror.last == (0, 0)
        assert "g1" not in {bytes.fromhex(k).split(b"/")[0] for k in _there(client, mirror, "")}

        # a sync cut short (the process died mid-stream): the next makes the generation again
        import json

        state = json.loads((root / "engine-mirror.json").read_text())
        state["gens"]["g2"]["partial"] = True
        (root / "engine-mirror.json").write_text(json.dumps(state))
        client.containers.get(mirror.name).exec_run(["sh", "-c", "rm -rf /mirror/g2/pkg0"])
        mirror.sync(g2)
        assert mirror.last[1] == sum(len(d) + len(f) for _, d, f in os.walk(g2))
        assert _there(client, mirror, "g2") == _sums(g2)
        assert not (root / "engine-mirror.partial").exists()

        # cut short as a sync marks it (the record itself untouched): made again, too
        nonce = json.loads((root / "engine-mirror.json").read_text())["nonce"]
        (root / "engine-mirror.partial").write_text(json.dumps({"nonce": nonce, "gens": ["g2"]}))
        client.containers.get(mirror.name).exec_run(["sh", "-c", "rm -rf /mirror/g2/pkg1"])
        mirror.sync(g2)
        assert mirror.last[1] == sum(len(d) + len(f) for _, d, f in os.walk(g2))
        assert _there(client, mirror, "g2") == _sums(g2)
        mirror.sync(g2)
        assert mirror.last == (0, 0)  # whole again, and remembered so
    finally:
        mirror.remove()


def test_a_prompt_on_standard_input_reaches_an_agent_on_the_remote_engine(
    second_engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default prompt mode: the prompt file, which the engine's host cannot see, is put into
    the run's holder and read by the agent from there (as root here: given to the agent's user)."""
    from airlockd.records import RunState
    from airlockd.runs.service import Service

    monkeypatch.setenv("DOCKER_HOST", second_engine)
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "policies.toml").write_text('[agents.bot]\ncommand = ["sh", "-c", "cat > got.txt; id -u >> got.txt"]\n')
    svc = Service(ws)
    rec = svc.execute(svc.submit("bot", "the prompt, on stdin").id)
    assert rec.state in (RunState.PROPOSED, RunState.APPLIED), rec.error
    assert {f.path for f in rec.files} == {"got.txt"}
    got = next(svc.state.run_dir(rec.id).glob("staging/upper/got.txt")).read_text()
    assert got == "the prompt, on stdin1000\n"


def test_through_the_daemon_the_prompt_on_standard_input_is_written_ahead_into_the_spare(
    second_engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the CLI and the editor have it: the daemon sets a spare holder aside for the run and
    writes the prompt into it (runs/ahead.py) before the run's process starts; that process finds
    it there (the audit says so) and the agent reads every byte of it from its standard input."""
    import time

    from airlockd.lsp.client import start_background
    from airlockd.sandbox import layers
    from airlockd.state import StateDir
    from airlockd.store import Store

    monkeypatch.setenv("DOCKER_HOST", second_engine)
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "README.md").write_text("# project\n")
    (ws / "policies.toml").write_text('[agents.bot]\ncommand = ["sh", "-c", "cat > got.txt"]\n')
    state = StateDir.for_workspace(ws).ensure()
    daemon = start_background(ws, state.root)
    daemon.subscribe("airlock/runDone")
    client = docker.DockerClient(base_url=second_engine)

    def run(prompt: str) -> str:
        run_id = str(daemon.command("airlock.runTask", {"agent": "bot", "prompt": prompt})["runId"])
        daemon.wait_for(lambda n: n["method"] == "airlock/runDone" and n["params"]["runId"] == run_id, timeout=120)
        return run_id

    try:
        run("the first run: the daemon has no spare yet")
        deadline = time.monotonic() + 60  # the next run's spare, made once the first let go of its holder
        spare = {"label": [layers.SPARE_LABEL, f"{layers.WORKSPACE_LABEL}={ws}"], "name": layers.SPARE_PREFIX}
        while not client.containers.list(filters=spare) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.containers.list(filters=spare), "no spare was made for the next run"
        prompt = "the second run's prompt: écrit d'avance\n$HOME `x`\n"
        second = run(prompt)
        rec = Store(state).get_run(second)
        assert rec.state.value in ("proposed", "applied"), rec.error
        started = [e for e in Service(ws).audit.events(second) if e["kind"] == "container.starting"]
        assert started and started[0]["data"].get("stdin") == "written ahead into the spare holder", started
        got = next(state.run_dir(second).glob("staging/upper/got.txt"), None)
        changed = {f.path: f for f in rec.files}
        assert "got.txt" in changed, changed
        if got is not None:
            assert got.read_text() == prompt
        else:  # applied (auto): it is in the workspace
            assert (ws / "got.txt").read_text() == prompt
    finally:
        import contextlib

        with contextlib.suppress(Exception):
            daemon.request("airlock/handover")
        daemon.close()
