"""Holders made ahead (sandbox/layers.py, "Spares"): a process that serves many runs takes a
spare holder of the same cap instead of making one (a rename, not a container start), the cap
still holds on it, the sweep still finds the run it now holds for, releasing the run frees the
spare's volume, a spare of another cap is never taken, and none is left when the process closes.
On every engine: the local one, one that sees none of this machine's paths, and Podman."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from airlockd.sandbox import enginepaths, layers
from airlockd.sandbox.docker import DockerSandbox
from airlockd.sandbox.image import image_tag

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

MiB = 1 << 20


def _spares(client: Any, ws: str) -> list[dict[str, Any]]:
    return [
        c
        for c in client.api.containers(
            all=True, filters={"label": [layers.SPARE_LABEL, f"{layers.WORKSPACE_LABEL}={ws}"]}
        )
        if any(n.lstrip("/").startswith(layers.SPARE_PREFIX) for n in c["Names"])
    ]


def _left(client: Any, ws: str) -> tuple[list[str], list[str]]:
    label = f"{layers.WORKSPACE_LABEL}={ws}"
    return (
        [c.name for c in client.containers.list(all=True, filters={"label": label})],
        [v.name for v in client.volumes.list(filters={"label": label})],
    )


def _hold(
    client: Any, run_id: str, ws: str, size: int = 8 * MiB, spare: bool = True, claimed: str | None = None
) -> layers.HeldLayers:
    me = (os.getuid(), os.getgid())
    return layers.hold(
        client, run_id, image=image_tag(), size_bytes=size, inodes=1000, owner=me, mode=0o755,
        labels={layers.WORKSPACE_LABEL: ws}, spare=spare, claimed=claimed,
    )  # fmt: skip


def _laid_out(client: Any, cid: str) -> bool:
    """Whether the holder `cid` has its `upper/` and `work/` put in."""
    try:
        res = client.containers.get(cid).exec_run(["test", "-d", "/layers/work"], user="0:0")
    except docker.errors.DockerException:
        return False
    return bool(res.exit_code == 0)


def _fill(client: Any, run_id: str) -> str:
    """Write 16 MiB into the holder's capped filesystem: what the kernel says."""
    prog = "dd if=/dev/zero of=/layers/work/fill bs=1M count=16 2>&1; rm -f /layers/work/fill"
    return b"".join(layers._exec(client, layers.holder_name(run_id), ["sh", "-c", prog])).decode(errors="replace")


def test_the_next_run_takes_the_spare_and_the_cap_the_sweep_and_the_release_hold(engine: str, tmp_path: Path) -> None:
    client = docker.from_env()
    ws = str(tmp_path / "ws")
    ids = [f"sp{os.getpid() % 10000}{i}" for i in range(2)]
    try:
        first = _hold(client, ids[0], ws)
        assert first.mountpoint.name == "_data" and layers.volume_name(ids[0]) in str(first.mountpoint)
        layers._spares.settle()
        assert _spares(client, ws) == []  # made when the run lets go of its holder: while it is reviewed
        layers.release(client, ids[0])
        layers._spares.settle()
        (made,) = _spares(client, ws)
        spare_name = made["Names"][0].lstrip("/")
        assert made["State"] == "running"

        t0 = time.perf_counter()
        second = _hold(client, ids[1], ws)
        taken_s = time.perf_counter() - t0
        # the run holds the spare: its volume, under the run's holder name
        info = client.api.inspect_container(layers.holder_name(ids[1]))
        assert info["Id"] == made["Id"]
        assert layers._mount(info, "Name") == spare_name
        assert str(second.mountpoint) == layers._mount(info, "Source")
        assert layers.find(client, ids[1]) == second
        print(f"\nspare taken in {taken_s:.3f} s")

        # the cap it was made with holds, and the layout is the run's
        assert "No space left on device" in _fill(client, ids[1])
        listing = b"".join(layers._exec(client, layers.holder_name(ids[1]), ["ls", "-ln", "/layers"])).decode()
        assert f" {os.getuid()} {os.getgid()} " in next(
            line for line in listing.splitlines() if line.endswith(" upper")
        )

        # the sweep finds the run it holds for (by its name: its labels were the spare's)
        assert ids[1] in DockerSandbox(client).labelled_runs(ws)
        assert ids[1] not in DockerSandbox(client).labelled_runs(ws, holders=False)

        # letting go of it frees the spare's volume, and the next spare is made
        layers.release(client, ids[1])
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_volume(spare_name)
        layers._spares.settle()
        (again,) = _spares(client, ws)
        assert again["Id"] != made["Id"]
    finally:
        for run_id in ids:
            layers.release(client, run_id)
        layers.drop_spares(client, ws)
    assert _left(client, ws) == ([], [])


def test_a_spare_of_another_cap_is_never_taken_and_goes(engine: str, tmp_path: Path) -> None:
    client = docker.from_env()
    ws = str(tmp_path / "ws")
    ids = [f"sq{os.getpid() % 10000}{i}" for i in range(2)]
    try:
        _hold(client, ids[0], ws, size=8 * MiB)
        layers.release(client, ids[0])
        layers._spares.settle()
        (small,) = _spares(client, ws)
        big = _hold(client, ids[1], ws, size=32 * MiB)  # another agent's cap: a holder of its own
        assert layers.volume_name(ids[1]) in str(big.mountpoint)
        assert "No space left" not in _fill(client, ids[1])
        layers.release(client, ids[1])
        layers._spares.settle()
        (now,) = _spares(client, ws)  # the small spare went; one of the new cap waits
        assert now["Id"] != small["Id"] and now["Labels"][layers.SPARE_LABEL].startswith(f"{32 * MiB}:")
    finally:
        for run_id in ids:
            layers.release(client, run_id)
        layers.drop_spares(client, ws)
    assert _left(client, ws) == ([], [])


def test_only_a_process_that_makes_spares_takes_them(engine: str, tmp_path: Path) -> None:
    client = docker.from_env()
    ws = str(tmp_path / "ws")
    ids = [f"sr{os.getpid() % 10000}{i}" for i in range(2)]
    try:
        _hold(client, ids[0], ws)
        layers.release(client, ids[0])
        layers._spares.settle()
        (made,) = _spares(client, ws)
        plain = _hold(client, ids[1], ws, spare=False)  # a CLI run: it never races the daemon for one
        assert layers.volume_name(ids[1]) in str(plain.mountpoint)
        assert [c["Id"] for c in _spares(client, ws)] == [made["Id"]]
    finally:
        for run_id in ids:
            layers.release(client, run_id)
        layers.drop_spares(client, ws)
    assert _left(client, ws) == ([], [])


def test_the_daemons_runs_take_spares_and_leave_none_when_it_closes(engine: str, tmp_path: Path) -> None:
    """Through the service as the daemon keeps it (its keeper watching): runs on engine-held
    layers (a remote engine; a user who is not root on the local one) propose what the agent
    wrote, a spare waits between runs, and closing the service leaves nothing on the engine."""
    from airlockd.runs import execution
    from airlockd.runs.service import Service

    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    (ws / "policies.toml").write_text('[agents.w]\ncommand = ["sh", "-c", "echo $RANDOM > out.txt"]\n')
    subprocess.run(["chmod", "-R", "a+rX", str(tmp_path)], check=True)
    svc = Service(ws)
    if execution.held_upper(svc) is None:
        svc.close()
        pytest.skip("root on the local engine mounts its own capped upper layers: no holder to make ahead")
    client = docker.from_env()
    try:
        assert svc.keep_mirrors() is None
        recs = [svc.execute(svc.submit("w", "").id) for _ in range(3)]
        assert [r.state.value for r in recs] == ["proposed"] * 3, [r.error for r in recs]
        assert all([f.path for f in r.files] == ["out.txt"] for r in recs)
        layers._later.settle()  # each holder was let go of off the proposal's path
        for r in recs:
            with pytest.raises(docker.errors.NotFound):
                client.api.inspect_container(layers.holder_name(r.id))
        layers._spares.settle()
        assert len(_spares(client, str(ws))) == 1
    finally:
        svc.close()
    left = _left(client, str(ws))
    assert not [n for n in left[0] if n.startswith((layers.SPARE_PREFIX, layers.HOLDER_PREFIX))], left
    assert not [n for n in left[1] if n.startswith(layers.SPARE_PREFIX)], left


def test_a_spare_set_aside_for_a_run_is_taken_by_that_run_alone(engine: str, tmp_path: Path) -> None:
    """The daemon sets one of its spares aside for a run its run process carries (renamed after
    the run, out of every other run's and every spare sweep's way); that process takes it by the
    id it was told, when its cap is the one it needs. One of another cap is removed; a container
    of that name that is not the one set aside is never taken; one never taken goes with the
    run's release, and the sweep finds its run."""
    client = docker.from_env()
    ws = str(tmp_path / "ws")
    ids = [f"sc{os.getpid() % 10000}{i}" for i in range(4)]

    def spare() -> dict[str, Any]:
        _hold(client, f"{ids[0]}x", ws)
        layers.release(client, f"{ids[0]}x")
        layers._spares.settle()
        (made,) = _spares(client, ws)
        return made

    try:
        made = spare()
        cid = layers.reserve_spare(client, ids[0], ws)
        assert cid == made["Id"]
        assert client.api.inspect_container(layers.claim_name(ids[0]))["Id"] == cid
        assert _spares(client, ws) == []  # no other run, and no sweep of spares, sees it
        layers.drop_spares(client, ws)
        assert ids[0] in DockerSandbox(client).labelled_runs(ws)
        assert layers.reserve_spare(client, ids[1], ws) is None  # it was the only one

        held = _hold(client, ids[0], ws, spare=False, claimed=cid)
        info = client.api.inspect_container(layers.holder_name(ids[0]))
        assert info["Id"] == cid and str(held.mountpoint) == layers._mount(info, "Source")
        assert "No space left on device" in _fill(client, ids[0])  # its cap holds
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_container(layers.claim_name(ids[0]))

        # another cap: the one set aside goes, with its volume, and the run makes its own
        other = spare()
        cid = layers.reserve_spare(client, ids[1], ws)
        big = _hold(client, ids[1], ws, size=32 * MiB, spare=False, claimed=cid)
        assert layers.volume_name(ids[1]) in str(big.mountpoint)
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_container(other["Id"])
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_volume(layers._mount(other, "Name") or other["Names"][0].lstrip("/"))

        # told another id: the container of that name is not taken (nor removed)
        spare()
        cid = layers.reserve_spare(client, ids[2], ws)
        mine = _hold(client, ids[2], ws, spare=False, claimed="0" * 64)
        assert layers.volume_name(ids[2]) in str(mine.mountpoint)
        assert client.api.inspect_container(layers.claim_name(ids[2]))["Id"] == cid

        # never taken: it goes with the run's release
        layers.release(client, ids[2])
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_container(cid)
    finally:
        for run_id in [*ids, f"{ids[0]}x"]:
            layers.release(client, run_id)
        layers.drop_spares(client, ws)
    assert _left(client, ws) == ([], [])


def test_the_daemons_run_processes_take_the_spares_it_sets_aside(engine: str, tmp_path: Path) -> None:
    """Through the daemon a run starts (`airlockd run`: each run carried by a process of its own):
    the daemon makes a spare when a run's process has ended, sets it aside for the next run, whose
    process takes it (the agent reads its prompt and writes as ever), and a daemon that leaves
    takes its spares with it."""
    import json
    import sys

    from airlockd.lsp.client import Daemon
    from airlockd.staging import stagers
    from airlockd.state import StateDir

    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    (ws / "policies.toml").write_text('[agents.w]\ncommand = ["sh", "-c", "cat > got.txt"]\n')
    client = docker.from_env()
    root = StateDir.for_workspace(ws).root

    def run(prompt: str) -> dict[str, Any]:
        argv = [sys.executable, "-m", "airlockd", "--workspace", str(ws), "--json", "run", "--agent", "w", "--wait"]
        proc = subprocess.run([*argv, prompt], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "AIRLOCK_DAEMON": "auto"})  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        doc: dict[str, Any] = json.loads(proc.stdout)
        assert doc["state"] == "proposed" and [f["path"] for f in doc["files"]] == ["got.txt"], doc
        return doc

    def spare_made(other_than: str = "") -> dict[str, Any]:
        """A spare the daemon made, once it is laid out (then it may be set aside for a run)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            made = [c for c in _spares(client, str(ws)) if c["Id"] != other_than and c["State"] == "running"]
            if made and _laid_out(client, made[0]["Id"]):
                time.sleep(0.5)
                return made[0]
            time.sleep(0.1)
        raise AssertionError("the daemon made no spare holder")

    def held_in(run_id: str) -> str | None:
        held = stagers.meta(StateDir.for_workspace(ws).run_dir(run_id)).get("held")
        return str(held["upper"]) if isinstance(held, dict) else None

    try:
        first = run("one")
        layers_of_first = held_in(first["id"])
        if layers_of_first is None:
            pytest.skip("root on the local engine mounts its own capped upper layers")
        assert layers.volume_name(first["id"]) in layers_of_first  # none made ahead yet: its own
        made = spare_made()
        second = run("two")
        name = next(n.lstrip("/") for n in made["Names"])
        assert f"/{name}/" in str(held_in(second["id"]))  # it took the one the daemon made
        upper = StateDir.for_workspace(ws).run_dir(second["id"]) / "staging" / "upper"
        assert (upper / "got.txt").read_text() == "two"
        spare_made(other_than=made["Id"])  # and the next is made
    finally:
        daemon = Daemon.connect(root)
        if daemon is not None:
            with contextlib.suppress(Exception):
                daemon.request("airlock/handover")
            daemon.close()
            deadline = time.monotonic() + 30
            while (root / "serve.json").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
    left = _left(client, str(ws))
    assert not [n for n in left[0] if n.startswith((layers.SPARE_PREFIX, layers.HOLDER_PREFIX, layers.CLAIM_PREFIX))]
    assert not [n for n in left[1] if n.startswith(layers.SPARE_PREFIX)], left


def test_a_volume_of_the_runs_name_another_made_is_never_its_upper_layer(engine: str, tmp_path: Path) -> None:
    """On an engine others share, another may make the volume a run's holder would be named
    (`airlockd-up-<run>`), tmpfs and labelled as ours, with files in it, and keep it mounted:
    the engine hands it back on creation. It is refused as the run's upper layer, and neither it
    nor its container is touched; a claim of another workspace is never dropped either."""
    from airlockd.errors import EngineError
    from airlockd.sandbox.volumes import OWNER_LABEL

    client = docker.from_env()
    ws = str(tmp_path / "ws")
    run_id = f"sv{os.getpid() % 10000}0"
    vol = layers.volume_name(run_id)
    labels = {layers.WORKSPACE_LABEL: ws, layers.ROLE_LABEL: layers.ROLE, OWNER_LABEL: "1"}
    opts = {"type": "tmpfs", "device": "tmpfs", "o": layers.size_option(client, 8 * MiB)}  # as Podman says it
    client.volumes.create(name=vol, driver="local", driver_opts=opts, labels=labels)
    theirs = client.containers.run(
        image_tag(), ["sh", "-c", "mkdir -p /v/upper && echo planted > /v/upper/evil.py && sleep infinity"],
        name=f"atk-{run_id}", detach=True, network_mode="none", volumes={vol: {"bind": "/v"}},
        ulimits=enginepaths.ulimits(client),
    )  # fmt: skip
    squat = client.containers.run(
        image_tag(), ["sleep", "infinity"], name=layers.claim_name(run_id), detach=True, network_mode="none",
        labels={**labels, layers.SPARE_LABEL: "x", layers.WORKSPACE_LABEL: ws + "-other"},
        ulimits=enginepaths.ulimits(client),
    )  # fmt: skip
    try:
        with pytest.raises(EngineError, match="did not make"):
            _hold(client, run_id, ws, spare=False)
        theirs.reload()
        assert theirs.status == "running"
        assert client.api.inspect_volume(vol)["Name"] == vol
        layers.drop_claim(client, run_id, ws)  # not this workspace's claim: left alone
        squat.reload()
        assert squat.status == "running"
    finally:
        theirs.remove(force=True)
        squat.remove(force=True)
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_volume(vol)
        layers.release(client, run_id, claim=False)
    assert _left(client, ws) == ([], [])


def test_a_look_alike_another_made_is_never_taken(engine: str, tmp_path: Path) -> None:
    """On an engine others share, anyone may make a container with a spare's labels and name:
    what its volume held would be shown as the agent's work. Only spares this process made are
    taken."""
    from airlockd.sandbox.volumes import OWNER_LABEL

    client = docker.from_env()
    ws = str(tmp_path / "ws")
    run_id = f"st{os.getpid() % 10000}0"
    key = layers.spare_key(8 * MiB, layers.round_inodes(1000), (os.getuid(), os.getgid()), 0o755, image_tag())
    labels = {layers.SPARE_LABEL: key, layers.WORKSPACE_LABEL: ws, layers.ROLE_LABEL: layers.ROLE, OWNER_LABEL: "1"}
    fake = client.containers.run(
        image_tag(), ["sleep", "infinity"], name=f"{layers.SPARE_PREFIX}fake{os.getpid()}", detach=True,
        labels=labels, network_mode="none", ulimits=enginepaths.ulimits(client),
    )  # fmt: skip
    try:
        held = _hold(client, run_id, ws)
        assert layers.volume_name(run_id) in str(held.mountpoint)  # a holder of its own
        fake.reload()
        assert fake.name == f"{layers.SPARE_PREFIX}fake{os.getpid()}" and fake.status == "running"
    finally:
        fake.remove(force=True)
        layers.release(client, run_id)
        layers.drop_spares(client, ws)
    assert _left(client, ws) == ([], [])


def test_a_volume_the_engine_made_again_without_its_cap_is_refused(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capped volume removed between its creation and its holder's (a cleanup racing it: the
    attack review found one) is made again by the engine for the holder as a plain directory on
    its disk, with no cap: the holder is refused, and nothing of it stays."""
    from docker.models.volumes import VolumeCollection

    from airlockd.errors import EngineError

    client = docker.from_env()
    ws = str(tmp_path / "ws")
    run_id = f"su{os.getpid() % 10000}0"
    create = VolumeCollection.create

    def racing(self: VolumeCollection, name: str | None = None, **kw: Any) -> Any:
        made = create(self, name=name, **kw)
        self.client.api.remove_volume(name, force=True)
        return made

    monkeypatch.setattr(VolumeCollection, "create", racing)
    try:
        with pytest.raises(EngineError, match=r"not the capped tmpfs|to hold a capped upper layer"):
            _hold(client, run_id, ws, spare=False)
    finally:
        monkeypatch.undo()
        layers.release(client, run_id)
    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_volume(layers.volume_name(run_id))
    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_container(layers.holder_name(run_id))
