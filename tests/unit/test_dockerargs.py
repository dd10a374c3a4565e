"""The container-creation arguments, flag by flag, without an engine: what `create_kwargs` asks
for is what locks the agent in (tests/integration/test_sandbox.py checks the engine obeys)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airlockd.errors import UsageError
from airlockd.policy import Limits
from airlockd.sandbox.base import STDIN_PATH, WORKSPACE_PATH, ContainerSpec, OverlayVolume
from airlockd.sandbox.dockerargs import create_kwargs
from airlockd.sandbox.volumes import volume_name

LIMITS = Limits.model_validate({"memory_mb": 96, "cpus": 0.5, "pids": 48, "tmpfs_mb": 12, "wall_time_s": 30})


def spec(tmp_path: Path, **kw: Any) -> ContainerSpec:
    ws = tmp_path / "staging"
    ws.mkdir(exist_ok=True)
    base: dict[str, Any] = {"run_id": "r1", "image": "img:1", "argv": ["agent", "--go"], "workspace": ws}
    return ContainerSpec(**{**base, "limits": LIMITS, **kw})


def mounts(kwargs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["Target"]: dict(m) for m in kwargs["mounts"]}


def test_root_is_read_only_and_tmp_a_bounded_tmpfs(tmp_path: Path) -> None:
    kw = create_kwargs(spec(tmp_path))
    assert kw["read_only"] is True
    assert kw["tmpfs"] == {"/tmp": "size=12m,mode=1777"}  # the only writable place besides /workspace


def test_no_capabilities_no_new_privileges_not_privileged(tmp_path: Path) -> None:
    kw = create_kwargs(spec(tmp_path))
    assert kw["cap_drop"] == ["ALL"]
    assert "cap_add" not in kw and "privileged" not in kw and "devices" not in kw
    assert kw["security_opt"] == ["no-new-privileges"]


def test_the_agents_user_and_no_network(tmp_path: Path) -> None:
    kw = create_kwargs(spec(tmp_path, user="1000:1000"))
    assert kw["user"] == "1000:1000"
    assert kw["network_mode"] == "none"
    assert "ports" not in kw and "network" not in kw and "extra_hosts" not in kw


def test_a_run_with_a_holder_joins_its_namespace_on_runc_only(tmp_path: Path) -> None:
    """The holder has no network either ("none", made ahead): joining its namespace spares the
    engine a new one. gVisor keeps a namespace of its own."""
    assert create_kwargs(spec(tmp_path, network_of="airlockd-hold-r1"))["network_mode"] == "container:airlockd-hold-r1"
    gvisor = create_kwargs(spec(tmp_path, network_of="airlockd-hold-r1", runtime="runsc"))
    assert gvisor["network_mode"] == "none"


@pytest.mark.parametrize("network", ["bridge", "host", "container:x"])
def test_any_other_network_is_refused(tmp_path: Path, network: str) -> None:
    with pytest.raises(UsageError, match="network"):
        create_kwargs(spec(tmp_path, network=network))


def test_memory_without_swap_cpu_and_pids(tmp_path: Path) -> None:
    kw = create_kwargs(spec(tmp_path))
    assert kw["mem_limit"] == kw["memswap_limit"] == "96m"  # equal: no swap to spill into
    assert kw["nano_cpus"] == 500_000_000
    assert kw["pids_limit"] == 48


def test_ulimits_no_core_dumps(tmp_path: Path) -> None:
    kw = create_kwargs(spec(tmp_path))
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in kw["ulimits"]}
    assert ulimits == {"core": (0, 0)}  # a core file would land in the staged workspace


def test_init_no_tty_no_stdin_no_engine_logs_detached(tmp_path: Path) -> None:
    kw = create_kwargs(spec(tmp_path))
    assert kw["init"] is True  # docker-init as PID 1 forwards SIGTERM and reaps
    assert (kw["tty"], kw["stdin_open"], kw["detach"]) == (False, False, True)
    assert kw["log_config"]["Type"] == "none"  # output only through the bounded attach stream


def test_workspace_is_the_only_writable_bind(tmp_path: Path) -> None:
    s = spec(tmp_path)
    kw = create_kwargs(s)
    assert kw["working_dir"] == WORKSPACE_PATH
    assert mounts(kw) == {
        WORKSPACE_PATH: {"Target": WORKSPACE_PATH, "Source": str(s.workspace), "Type": "bind", "ReadOnly": False}
    }


def test_stdin_file_is_mounted_read_only_and_fed_to_the_agent(tmp_path: Path) -> None:
    prompt = tmp_path / "prompt"
    prompt.write_text("do it\n")
    kw = create_kwargs(spec(tmp_path, stdin_file=prompt))
    m = mounts(kw)[STDIN_PATH]
    assert (m["Source"], m["Type"], m["ReadOnly"]) == (str(prompt), "bind", True)
    assert kw["command"] == ["/bin/sh", "-c", f'exec "$@" < {STDIN_PATH}', "agent", "agent", "--go"]


def test_extra_mounts_keep_their_read_only_flag(tmp_path: Path) -> None:
    sock = tmp_path / "gw.sock"
    home = tmp_path / "home"
    kw = create_kwargs(spec(tmp_path, mounts=[(sock, "/run/airlock/gw.sock", True), (home, "/tmp/home", False)]))
    m = mounts(kw)
    assert m["/run/airlock/gw.sock"]["ReadOnly"] is True and m["/run/airlock/gw.sock"]["Source"] == str(sock)
    assert m["/tmp/home"]["ReadOnly"] is False


@pytest.mark.parametrize("bad", [(Path("rel/x"), "/t"), (Path("/abs"), "relative")])
def test_relative_mounts_are_refused(tmp_path: Path, bad: tuple[Path, str]) -> None:
    with pytest.raises(UsageError, match="absolute"):
        create_kwargs(spec(tmp_path, mounts=[(bad[0], bad[1], True)]))


def test_missing_workspace_empty_command_missing_stdin_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a directory"):
        create_kwargs(spec(tmp_path, workspace=tmp_path / "nowhere"))
    with pytest.raises(UsageError, match="empty command"):
        create_kwargs(spec(tmp_path, argv=[]))
    with pytest.raises(UsageError, match="stdin"):
        create_kwargs(spec(tmp_path, stdin_file=tmp_path / "no-prompt"))


def test_labels_find_the_run_and_cannot_be_forged(tmp_path: Path) -> None:
    forged = {"airlockd.workspace": "/src/app", "airlockd.run": "other", "airlockd.runtime": "runc"}
    kw = create_kwargs(spec(tmp_path, labels=forged, runtime="runsc"))
    want = {"airlockd.workspace": "/src/app", "airlockd": "1", "airlockd.run": "r1", "airlockd.runtime": "runsc"}
    assert kw["labels"] == want
    assert kw["name"] == "airlockd-r1"
    assert "name" not in create_kwargs(spec(tmp_path, run_id="bad/id"))  # not a valid name: the engine picks one


def test_overlay_workspace_is_the_runs_volume(tmp_path: Path) -> None:
    ov = OverlayVolume(tmp_path / "lower", tmp_path / "upper", tmp_path / "work", "lowerdir=x,upperdir=y,workdir=z")
    kw = create_kwargs(spec(tmp_path, workspace_overlay=ov))
    m = mounts(kw)[WORKSPACE_PATH]
    assert (m["Source"], m["Type"], m["ReadOnly"]) == (volume_name("r1"), "volume", False)
    assert m["VolumeOptions"]["NoCopy"] is True  # nothing of the image's, not even its owner
    assert len(kw["mounts"]) == 1


def test_the_command_and_environment_are_passed_as_given(tmp_path: Path) -> None:
    kw = create_kwargs(spec(tmp_path, env={"HOME": "/tmp/home"}))
    assert (kw["image"], kw["command"], kw["environment"]) == ("img:1", ["agent", "--go"], {"HOME": "/tmp/home"})


def test_the_images_volumes_are_covered_empty_and_read_only(tmp_path: Path) -> None:
    """A VOLUME in the image would be an anonymous volume: writable, uncapped, on the engine's disk
    and outliving the run. Each gets an empty read-only tmpfs instead; the run's own mounts and
    /tmp stay as they are."""
    kw = create_kwargs(spec(tmp_path), image_volumes=("/cache", "/workspace", "/tmp", "relative", "/var/lib/db/"))
    assert kw["tmpfs"]["/cache"] == kw["tmpfs"]["/var/lib/db/"] == "ro,size=64k,mode=755"
    assert "/workspace" not in kw["tmpfs"] and "relative" not in kw["tmpfs"]
    assert kw["tmpfs"]["/tmp"].startswith("size=")


class _Joined:
    """Answers `inspect_container` for the container another joined: its mode, the networks it
    was connected to, whether it runs."""

    def __init__(self, mode: str | None, networks: tuple[str, ...] = ("none",), running: bool = True) -> None:
        self.api, self.mode, self.networks, self.running = self, mode, networks, running

    def inspect_container(self, ref: str) -> dict[str, Any]:
        if self.mode is None:
            import docker.errors

            raise docker.errors.NotFound(f"No such container: {ref}")
        return {
            "Name": f"/{ref}",
            "HostConfig": {"NetworkMode": self.mode},
            "NetworkSettings": {"Networks": {n: {} for n in self.networks}},
            "State": {"Running": self.running},
        }


def _attrs(mode: str, networks: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"HostConfig": {"NetworkMode": mode}, "NetworkSettings": {"Networks": {n: {} for n in networks}}}


def test_a_joined_namespace_is_none_only_when_the_engine_says_the_holders_is() -> None:
    """The evidence says what the engine recorded: a container in its holder's namespace has no
    network only when the holder runs with "none" and was connected to no network since
    (`docker network connect` leaves its mode "none": an attack review); otherwise the mode
    stands as it is, and the sandbox refuses to start it (DockerSandbox.run)."""
    from airlockd.sandbox.docker import _network

    shared = _network(_attrs("container:airlockd-hold-r1"), _Joined("none"))
    assert shared == {"network_mode": "none", "network_shared_with": "airlockd-hold-r1"}
    assert _network(_attrs("container:x"), _Joined("bridge"))["network_mode"] == "container:x (bridge)"
    connected = _network(_attrs("container:x"), _Joined("none", ("none", "bridge")))
    assert connected == {"network_mode": "container:x (none+bridge)"}
    assert _network(_attrs("container:x"), _Joined("none", running=False))["network_mode"] == "container:x (none)"
    assert _network(_attrs("container:x"), _Joined(None)) == {"network_mode": "container:x"}  # gone
    assert _network(_attrs("none", ("none",)), None) == {"network_mode": "none"}
    assert _network(_attrs("none"), None) == {"network_mode": "none"}  # (Podman lists none)
    assert _network(_attrs("none", ("none", "bridge")), None) == {"network_mode": "none+bridge"}
