"""Shared fixtures. Docker tests run when AIRLOCK_REQUIRE_DOCKER is set (CI sets it) and then
fail loudly if the engine is missing; without it they run when an engine answers, else skip."""

from __future__ import annotations

import inspect
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemons import end_daemons

REQUIRE_DOCKER = bool(os.environ.get("AIRLOCK_REQUIRE_DOCKER"))


def _engine_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return True
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _rerun_known_stalls(items)
    if REQUIRE_DOCKER or _engine_answers():
        return
    skip = pytest.mark.skip(reason="no Docker engine (set AIRLOCK_REQUIRE_DOCKER=1 to require it)")
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)


def _rerun_known_stalls(items: list[pytest.Item]) -> None:
    """A module that names a stall of a third-party program under one runtime
    (`KNOWN_STALL = (runtime, signature, reruns)`: a message its tests fail with then, and only
    then) has those tests run again, up to `reruns` times, when they fail with exactly that
    message under that runtime (pytest-rerunfailures; the summary counts each rerun). Any other
    failure, and that one under any other runtime, fails at once."""
    for item in items:
        known = getattr(getattr(item, "module", None), "KNOWN_STALL", None)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if known is not None and params.get("runtime") == known[0]:
            item.add_marker(pytest.mark.flaky(reruns=known[2], only_rerun=[known[1]]))


@pytest.fixture(scope="session")
def _image() -> None:
    """The runtime image, built once per session when absent (a Docker test asks for it)."""
    import docker

    from airlockd.sandbox.image import ensure_image

    ensure_image(docker.from_env())


@pytest.fixture(autouse=True)
def _state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own airlockd state root, outside any workspace it creates."""
    root = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("AIRLOCK_STATE_DIR", str(root))
    yield root
    end_daemons(root)
    _unmount_below(root)


def _unmount_below(root: Path) -> None:
    """Capped staging filesystems of runs a test left proposed: unmount them, deepest first."""
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1].replace("\\040", " ") for line in fh]
    for point in sorted((p for p in points if p.startswith(str(root) + "/")), reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fixtures with a wider scope (LSP workspaces) may leave capped staging mounts: drop them."""
    base = str(session.config._tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]
    _unmount_below(Path(base))


# -- stagers: the suites that stage run once per stager (AIRLOCK_STAGER=overlay|copy runs one) --

_STAGED_MODULES = {
    "test_staging",
    "test_audit_export",
    "test_classifier",
    "test_classify",
    "test_evidence",
    "test_pipeline",
    "test_redaction",
    "test_limits",
    "test_containment",
    "test_staging_engine",
    "test_secret_deny",
    "test_secret_proposals",
    "test_secrets_random",
    "test_hostile_after",
}


#: suites whose tests that take `runtime` run once more on the second engine (a remote host,
#: tests/engines.py), under runc: containment, limits, the gateway, hostile agents, Codex, and a
#: user who is not root
_ENGINE_MODULES = {
    "test_containment",
    "test_limits",
    "test_gateway_route",
    "test_hostile_after",
    "test_codex",
    "test_daemon_nonroot",
}
#: the smaller set that runs once more through Podman's Docker API: containment, limits, the
#: gateway, a user who is not root (daemon, secrets absent, re-attach, doctor), spare holders and the holder's service
_PODMAN_MODULES = {
    "test_containment",
    "test_limits",
    "test_gateway_route",
    "test_daemon_nonroot",
    "test_spare_holders",
    "test_holder_service",
    "test_project_image",
}
ENGINES = ("local", "remote", "podman")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Staged suites run once per stager; a test that takes `runtime` runs under runc with each
    stager and under runsc (gVisor) with the overlay, the stager users get (AIRLOCK_RUNTIME=runc|
    runsc runs one); in the engine suites, and wherever a test takes `engine`, once more on the
    second engine, and in the Podman suites once more on Podman (AIRLOCK_ENGINE=local|remote|podman
    runs one)."""
    module = metafunc.module.__name__.rpartition(".")[2]
    staged = "stager" in metafunc.fixturenames and module in _STAGED_MODULES
    forced = os.environ.get("AIRLOCK_STAGER")
    names = [forced] if forced else ["overlay", "copy"]
    wanted = os.environ.get("AIRLOCK_RUNTIME")
    asks = "engine" in inspect.signature(metafunc.function).parameters
    others = []  # the engines besides the first this test runs on
    if asks or (module in _ENGINE_MODULES and "runtime" in metafunc.fixturenames):
        others.append("remote")
    if module in _PODMAN_MODULES and (asks or "runtime" in metafunc.fixturenames):
        others.append("podman")
    engines = [e for e in ENGINES if os.environ.get("AIRLOCK_ENGINE", e) == e and (e == "local" or e in others)]
    if "runtime" in metafunc.fixturenames:
        runtimes = [wanted] if wanted else ["runc", "runsc"]
        if staged:
            combos = [(s, rt) for rt in runtimes for s in (names if rt == "runc" else names[:1])]
        else:
            combos = [(None, rt) for rt in runtimes]
        cases = [(s, rt, "local") for s, rt in combos] if "local" in engines else []
        # another engine stages with the overlay (a remote one needs its volumes), under runc
        cases += [("overlay" if staged else None, "runc", e) for e in engines if e != "local"]
        ids = ["-".join(x for x in (s, rt, e if e != "local" else None) if x) for s, rt, e in cases]
        if staged:
            metafunc.parametrize(("stager", "runtime", "engine"), cases, indirect=True, ids=ids)
        else:
            metafunc.parametrize(("runtime", "engine"), [(rt, e) for _, rt, e in cases], indirect=True, ids=ids)
    elif staged and asks:
        cases = [(s, "local") for s in names if "local" in engines]
        cases += [("overlay", e) for e in engines if e != "local"]
        metafunc.parametrize(
            ("stager", "engine"), cases, indirect=True, ids=[f"{s}-{e}" if e != "local" else s for s, e in cases]
        )
    elif staged:
        metafunc.parametrize("stager", names, indirect=True)
    elif asks:
        metafunc.parametrize("engine", engines, indirect=True)


def _other_engine(kind: str) -> Iterator[str]:
    import docker
    import engines

    if os.geteuid() != 0:  # the pass as a user who is not root (tests/as_user.py) runs on the first
        pytest.skip(f"only root starts the {kind} engine: the pass as root runs this")

    from airlockd.sandbox.image import ensure_image

    image = ensure_image(docker.from_env())
    try:
        yield engines.start([image], kind)
    finally:
        engines.stop(kind)


@pytest.fixture(scope="session")
def second_engine() -> Iterator[str]:
    """The second engine's DOCKER_HOST (tests/engines.py), with the runtime image loaded."""
    yield from _other_engine("remote")


@pytest.fixture(scope="session")
def podman_engine() -> Iterator[str]:
    """Podman's DOCKER_HOST (tests/engines.py), with the runtime image loaded."""
    yield from _other_engine("podman")


@pytest.fixture(autouse=True)
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The engine a parametrised test runs on: "local" (the first), "remote" (the second, which
    sees none of this machine's paths) or "podman"; DOCKER_HOST points at it for the test, and
    every airlockd image the first engine has for this runtime is loaded into it, but the agent
    CLIs' images other than those the test's module names in `AGENT_IMAGES`."""
    name: str = getattr(request, "param", "local")
    if name != "local":
        import docker
        import engines

        from airlockd.sandbox.image import AGENT_CLIS, agent_image_tag, image_tag

        host = request.getfixturevalue("second_engine" if name == "remote" else "podman_engine")
        wanted = set(getattr(request.module, "AGENT_IMAGES", ()))
        skipped = {agent_image_tag(a) for a in AGENT_CLIS if a not in wanted}  # hundreds of MB each
        for img in docker.from_env().images.list(name="airlockd-runtime"):
            for tag in img.tags:
                if tag.startswith(image_tag()) and tag not in skipped:
                    engines.load(host, tag, name)
        monkeypatch.setenv("DOCKER_HOST", host)
    return name


@pytest.fixture
def runtime(request: pytest.FixtureRequest) -> str:
    """The container runtime a parametrised test runs its agents under. runsc must be registered
    with the engine (scripts/ensure-docker.sh does it for the engine it starts): a missing one
    fails under AIRLOCK_REQUIRE_DOCKER, and skips, saying why, otherwise."""
    name: str = getattr(request, "param", "runc")
    if name != "runc":
        import docker

        from airlockd.sandbox import runtimes

        why = runtimes.refusal(docker.from_env().info().get("Runtimes"), name, host_sockets=True)
        if why is not None:
            if REQUIRE_DOCKER:
                pytest.fail(f"the engine cannot run {name}: {why}")
            pytest.skip(f"the engine cannot run {name}: {why}")
    return name


@pytest.fixture(autouse=True)
def stager(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, _state_dir: Path) -> str | None:
    """The stager a parametrised test forces through AIRLOCK_STAGER (None where not parametrised);
    overlay is skipped, saying why, where this machine cannot do it."""
    name: str | None = getattr(request, "param", None)
    if name is None:
        return None
    if name == "overlay":
        from nonroot import overlay_unavailable

        if why := overlay_unavailable(_state_dir):
            pytest.skip(f"overlay staging unavailable: {why}")
    monkeypatch.setenv("AIRLOCK_STAGER", name)
    return name
