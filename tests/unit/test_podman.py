"""What differs on Podman's Docker API, decided without an engine: which engine it is, the limits
every container gets there, the tmpfs cap in pages, the runtime it ran under, gVisor refused,
and its cgroup paths (docs/engines.md, Podman)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from airlockd.policy import Limits
from airlockd.sandbox import cgroups, enginepaths, layers, runtimes
from airlockd.sandbox.base import ContainerSpec
from airlockd.sandbox.dockerargs import create_kwargs

LIMITS = Limits.model_validate({"pids": 48})


class FakeClient:
    """Answers `version()` (and Podman's own container inspect) as each engine does."""

    def __init__(self, component: str, oci_runtime: str | None = "runc") -> None:
        self.component, self.asked = component, 0
        self.api = self
        self.base_url = "http+docker://localhost"
        self.oci_runtime = oci_runtime

    def version(self) -> dict[str, Any]:
        self.asked += 1
        return {"Components": [{"Name": self.component, "Version": "4.3.1"}], "Version": "4.3.1"}

    def _get(self, url: str) -> str:
        if self.oci_runtime is None:
            raise docker.errors.APIError("404 Not Found")
        assert url == f"{self.base_url}/v4.0.0/libpod/containers/c1/json"
        return json.dumps({"OCIRuntime": self.oci_runtime})

    def _result(self, response: str, json: bool = False) -> Any:
        import json as js

        return js.loads(response)


def test_the_engine_says_whether_it_is_podman_and_is_asked_once() -> None:
    podman, dockerd = FakeClient("Podman Engine"), FakeClient("Engine")
    assert enginepaths.kind(podman) == enginepaths.kind(podman) == enginepaths.PODMAN
    assert podman.asked == 1
    assert enginepaths.kind(dockerd) == enginepaths.DOCKER


def test_every_container_on_podman_gets_limits_it_would_otherwise_raise_past_the_engines() -> None:
    assert enginepaths.ulimits(FakeClient("Engine")) == []
    got = {u["Name"]: (u["Soft"], u["Hard"]) for u in enginepaths.ulimits(FakeClient("Podman Engine"))}
    assert got == {"nofile": (4096, 4096), "nproc": (4096, 4096)}


def test_a_run_on_podman_keeps_its_own_caps_and_gets_the_engines_limits_besides(tmp_path: Path) -> None:
    spec = ContainerSpec(run_id="r1", image="img:1", argv=["a"], workspace=tmp_path, limits=LIMITS)
    on_docker = {u["Name"]: (u["Soft"], u["Hard"]) for u in create_kwargs(spec)["ulimits"]}
    assert on_docker == {"core": (0, 0)}
    engine = (("nofile", 20000, 20000), ("nproc", 32768, 32768))
    kw = create_kwargs(spec, enginepaths.PODMAN, "/p/airlockd-host.json", engine)
    on_podman = {u["Name"]: (u["Soft"], u["Hard"]) for u in kw["ulimits"]}
    assert on_podman == {"core": (0, 0), "nofile": (20000, 20000), "nproc": (32768, 32768)}
    assert kw["pids_limit"] == 48  # the cap that matters stays
    assert kw["runtime"] == "runc"  # named: Podman's default may be another
    assert kw["tmpfs"]["/var/tmp"].startswith("ro,")  # Podman would make it a writable tmpfs of no size
    assert "/var/tmp" not in create_kwargs(spec)["tmpfs"]
    gvisor = ContainerSpec(run_id="r1", image="img:1", argv=["a"], workspace=tmp_path, limits=LIMITS, runtime="runsc")
    nproc = {u["Name"]: u["Soft"] for u in create_kwargs(gvisor, enginepaths.PODMAN)["ulimits"]}["nproc"]
    assert nproc == 48  # a run's own nproc cap is never replaced


def test_the_engines_limits_are_read_from_the_process_behind_its_socket(tmp_path: Path) -> None:
    import resource
    import socket

    path = tmp_path / "engine.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(path))
        srv.listen(1)
        got = dict((name, (soft, hard)) for name, soft, hard in enginepaths.engine_limits(f"unix://{path}"))
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    cap = lambda n: min(1 << 20, n if n != resource.RLIM_INFINITY else 1 << 20)  # noqa: E731
    assert got == {"nofile": (cap(nofile), cap(nofile)), "nproc": (cap(nproc), cap(nproc))}
    assert enginepaths.engine_limits(f"unix://{tmp_path}/none.sock") == enginepaths.PODMAN_ULIMITS
    assert enginepaths.engine_limits("tcp://10.0.0.1:2376") == enginepaths.PODMAN_ULIMITS


def test_runc_on_podman_gets_airlockds_profile_which_refuses_namespaces_and_answers_clone3_enosys(
    tmp_path: Path,
) -> None:
    from airlockd.errors import UsageError
    from airlockd.sandbox import seccomp

    spec = ContainerSpec(run_id="r1", image="img:1", argv=["a"], workspace=tmp_path, limits=LIMITS)
    assert create_kwargs(spec)["security_opt"] == ["no-new-privileges"]  # Docker's default profile
    kw = create_kwargs(spec, enginepaths.PODMAN, "/v/_data/airlockd-host.json")
    assert kw["security_opt"] == ["no-new-privileges", "seccomp=/v/_data/airlockd-host.json"]
    assert seccomp.shown(kw["security_opt"]) == ["no-new-privileges", "seccomp=airlockd-host"]
    with pytest.raises(UsageError, match="seccomp"):
        create_kwargs(spec, enginepaths.PODMAN, None)
    rules = json.loads(seccomp.host_profile())["syscalls"]
    by_name = {n: r for r in rules for n in r["names"] if "args" not in r}
    for name in ("unshare", "setns", "keyctl", "add_key", "mount", "bpf", "ptrace", "io_uring_setup"):
        assert by_name[name]["errnoRet"] == seccomp.EPERM, name
    assert by_name["clone3"]["errnoRet"] == seccomp.ENOSYS  # libc falls back to clone, whose flags are read
    assert sum(1 for r in rules if r["names"] == ["clone"]) == len(seccomp.NAMESPACE_FLAGS)


def test_the_growth_cap_is_said_in_pages_on_podman_which_refuses_size_on_tmpfs() -> None:
    assert layers.size_option(FakeClient("Engine"), 10 << 20) == f"size={10 << 20}"
    assert layers.size_option(FakeClient("Podman Engine"), 10 << 20) == "nr_blocks=2560"
    assert layers.size_option(FakeClient("Podman Engine"), 4097) == "nr_blocks=2"  # never below the cap


def test_the_runtime_a_container_ran_under_is_asked_of_podmans_own_api() -> None:
    assert enginepaths.podman_runtime(FakeClient("Podman Engine"), "c1") == "runc"
    assert enginepaths.podman_runtime(FakeClient("Podman Engine", oci_runtime=None), "c1") == "oci"


def test_gvisor_on_podman_is_refused_naming_the_engine_and_the_fix() -> None:
    table = {"runc": {"path": "/usr/bin/runc"}, "runsc": {"path": "/usr/bin/runsc"}}  # Podman lists what it knows
    why = runtimes.refusal(table, "runsc", host_sockets=True, podman=True)
    assert why and "Podman" in why and 'runtime = "runc"' in why and "docs/engines.md" in why
    assert runtimes.refusal(table, "runc", host_sockets=True, podman=True) is None


@pytest.mark.parametrize(
    "rel",
    ["libpod_parent/libpod-{id}", "machine.slice/libpod-{id}.scope", "docker/{id}"],
)
def test_podmans_cgroups_are_found_where_it_puts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rel: str
) -> None:
    cid = "ab" * 32
    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    for controller in ("pids", "memory"):
        (tmp_path / controller / rel.format(id=cid)).mkdir(parents=True)
    found = cgroups.locate(cid)
    assert found == {c: tmp_path / c / rel.format(id=cid) for c in ("pids", "memory")}


class RacingContainers:
    """A listing during which a container is removed: Podman answers its inspection with 500."""

    def __init__(self, races: int) -> None:
        self.races, self.asked = races, 0

    def list(self, **kwargs: Any) -> list[str]:
        self.asked += 1
        assert kwargs["ignore_removed"] is True
        if self.asked <= self.races:
            raise docker.errors.APIError(
                "500 Server Error: container 3f2a... does not exist in database: no such container"
            )
        return ["left"]


class RacingClient:
    def __init__(self, races: int) -> None:
        self.containers = RacingContainers(races)


def test_a_container_removed_while_podman_lists_them_is_simply_gone() -> None:
    from airlockd.errors import EngineError
    from airlockd.sandbox.docker import DockerSandbox

    client = RacingClient(races=2)
    assert DockerSandbox(client)._find("r1") == ["left"]  # type: ignore[arg-type]
    assert client.containers.asked == 3
    endless = RacingClient(races=100)
    with pytest.raises(EngineError, match="no such container"):
        DockerSandbox(endless).labelled_runs("/ws")  # type: ignore[arg-type]


def test_an_engine_learnt_before_a_fork_is_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's launcher asks the engine its API version and kind once (`learn`); a client its
    run processes connect is then made with that version and knows the kind (no /version twice)."""
    from airlockd.sandbox import enginepaths

    asked: list[object] = []

    class _Api:
        api_version = "1.41"

    class _Client:
        def __init__(self, version: object) -> None:
            self.api = _Api()
            asked.append(version)

        def version(self) -> dict[str, object]:
            asked.append("version()")
            return {"Components": [{"Name": "Podman Engine"}]}

        def close(self) -> None:
            pass

    monkeypatch.setenv("DOCKER_HOST", "unix:///run/learnt.sock")
    monkeypatch.setattr(enginepaths, "_engines", {})
    monkeypatch.setattr(enginepaths.docker, "from_env", lambda timeout, use_ssh_client, version=None: _Client(version))
    enginepaths.learn()  # no image: whether it sees our paths is not asked
    assert asked == [None, "version()"]  # asked: its version (auto), then its kind
    asked.clear()
    client = enginepaths.connect()
    assert asked == ["1.41"] and enginepaths.kind(client) == enginepaths.PODMAN and asked == ["1.41"]
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/another.sock")
    asked.clear()
    enginepaths.connect()
    assert asked == [None]  # another engine: asked as ever
