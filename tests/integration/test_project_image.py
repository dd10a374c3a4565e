"""Agents that build and test the project: the project's own image (a Dockerfile, a
devcontainer.json) as the agent's base, and packages from a registry through the broker.

A scripted agent in a project image `pip install`s a package from a local PEP 503 registry over
TLS on loopback (its test CA trusted by the image), through the run's broker, runs the project's
tests, fixes the bug and proposes the fix; the same agent reaches neither a second loopback
server the policy does not allow, nor a name that resolves to this machine, nor the host's other
address, and every refusal is in the audit trail. A devcontainer.json image is built, cached and
rebuilt when it changes; what it asks for (root, capabilities, privileged, the host's network)
loosens nothing; secrets are absent from its build context; and an image without Python still
reaches the broker through airlockd's own forwarder.
"""

from __future__ import annotations

import contextlib
import ensurepip
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from pyregistry import Registry, build_wheel, make_ca
from tcpservers import TcpServer

from airlockd.errors import PolicyError
from airlockd.records import RunState
from airlockd.runs.service import Service
from airlockd.sandbox.image import image_tag

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

CALC = "def total(xs):\n    out = 0\n    for x in xs:\n        out = out - x  # the bug\n    return out\n"
TESTS = (
    "import unittest\n\nimport calc\nimport fixlib\n\n\n"
    "class T(unittest.TestCase):\n"
    "    def test_total(self):\n"
    "        self.assertEqual(calc.total([1, 2, 3]), fixlib.six())\n\n\n"
    'if __name__ == "__main__":\n    unittest.main()\n'
)
# What the agent tries besides its job: hosts the broker must refuse (printed as RESULT for the test).
PROBE = r"""
import json, sys, urllib.request, urllib.error
out = {}
for name, url in (("other", sys.argv[1]), ("localhost", sys.argv[2]), ("host", sys.argv[3])):
    try:
        urllib.request.urlopen(url, timeout=10)
        out[name] = "reached"
    except urllib.error.URLError as exc:
        out[name] = str(exc.reason)[:200]
    except OSError as exc:
        out[name] = repr(exc)[:200]
print("RESULT " + json.dumps(out), flush=True)
"""


def pip_wheel() -> Path:
    """A pip wheel from this interpreter's own ensurepip (or Debian's copy): the project image
    has pip from it, offline, as a project's image would have it from its base image."""
    found = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("pip-*.whl"))
    found += sorted(Path("/usr/share/python-wheels").glob("pip-*.whl"))
    assert found, "no pip wheel on this machine (ensurepip's bundled one, or python3-pip-whl)"
    return found[-1]


def host_address() -> str:
    """This machine's address on its default route (not loopback), or the Docker bridge's."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent
            addr = str(s.getsockname()[0])
        except OSError:
            addr = "172.17.0.1"
    return addr if not addr.startswith("127.") else "172.17.0.1"


@pytest.fixture(autouse=True)
def _no_project_image_left(engine: str) -> Iterator[None]:
    """The project images a test built go with it (each test's workspace is new, so nothing else
    would remove them), with the agent layers on them and the bases under them."""
    from airlockd.sandbox import enginepaths

    client = enginepaths.connect()
    mine = {"label": "airlockd.project"}
    before = {img.id for img in client.images.list(filters=mine)}
    yield
    for img in client.images.list(filters=mine):
        if img.id not in before:
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(img.id, force=True)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[tuple[Registry, bytes]]:
    ca = make_ca()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with Registry(tmp_path / "registry", ca) as reg:
        reg.add(build_wheel(wheels, "fixlib", "1.0", {"fixlib/__init__.py": "def six():\n    return 6\n"}))
        yield reg, ca.cert_pem


@pytest.fixture
def python_base(engine: str) -> str:
    """A Python base image with pip on the engine under test, as a project's `FROM python:...`
    would be (no registry here: made from the runtime image and this machine's pip wheel)."""
    from airlockd.sandbox import enginepaths

    client = enginepaths.connect()
    wheel = pip_wheel()
    tag = f"airlockd-test-python:{image_tag().rpartition(':')[2]}-{wheel.stem.split('-')[1]}-1"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    dockerfile = (
        f"FROM {image_tag()}\nUSER root\nCOPY pip /opt/pip\n"
        "ENV PYTHONPATH=/opt/pip PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_BREAK_SYSTEM_PACKAGES=1\n"
        "USER 1000:1000\n"
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar, zipfile.ZipFile(wheel) as whl:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile.encode()))
        for name in whl.namelist():
            data = whl.read(name)
            info = tarfile.TarInfo(f"pip/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    client.images.build(fileobj=buf, custom_context=True, tag=tag, rm=True, pull=False)
    return tag


def project_dockerfile(base: str) -> str:
    """The project's Dockerfile: its base and the CA its registry's certificate is signed by."""
    return (
        f"FROM {base}\n"
        "USER root\n"
        "COPY ci/test-ca.crt /usr/local/share/ca-certificates/airlock-test-ca.crt\n"
        "RUN update-ca-certificates\n"
        "ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt\n"
    )


def make_project(tmp_path: Path, ca_pem: bytes, policy: str, base: str | None = None) -> Path:
    ws = tmp_path / "project"
    (ws / "ci").mkdir(parents=True)
    (ws / "ci" / "test-ca.crt").write_bytes(ca_pem)
    (ws / "ci" / "Dockerfile").write_text(project_dockerfile(base or image_tag()))
    (ws / "calc.py").write_text(CALC)
    (ws / "test_calc.py").write_text(TESTS)
    (ws / "probe.py").write_text(PROBE)
    (ws / ".env").write_text("DATABASE_PASSWORD=hunter2-not-for-agents\n")
    (ws / "policies.toml").write_text(policy)
    return ws


def audit(svc: Service) -> list[dict[str, Any]]:
    return list(svc.audit.events())


def kind(e: dict[str, Any]) -> str:
    return str(e.get("kind") or e.get("event"))


def output(svc: Service, run_id: str) -> str:
    return (svc.state.run_dir(run_id) / "output.log").read_text(errors="replace")


def test_an_agent_installs_from_a_registry_through_the_broker_tests_and_proposes_a_fix(
    tmp_path: Path, registry: tuple[Registry, bytes], python_base: str, engine: str
) -> None:
    """On the second engine too: there the broker's bytes go through the relay of the engine's
    own connection, as the model's do."""
    reg, ca_pem = registry
    other, near = TcpServer(mode="close"), TcpServer(mode="close")
    host = host_address()
    far = TcpServer(host, mode="close")
    try:
        policy = (
            '[agents.fixer]\ncommand = ["bash", "-c", "{prompt}"]\nprompt = "argv"\nimage = "./ci/Dockerfile"\n'
            f'[agents.fixer.broker]\nallow = ["127.0.0.1:{reg.port}", "localhost:{near.port}"]\n'
        )
        ws = make_project(tmp_path, ca_pem, policy, python_base)
        script = (
            f"python3 -m pip install --user --index-url {reg.index_url} fixlib==1.0 && echo INSTALLED;"
            " python3 -m unittest test_calc >/dev/null 2>&1 && echo BEFORE=pass || echo BEFORE=fail;"
            " sed -i 's/out = out - x  # the bug/out = out + x/' calc.py;"
            " python3 -m unittest test_calc && echo AFTER=pass;"
            f" python3 probe.py https://127.0.0.1:{other.port}/ https://localhost:{near.port}/ https://{host}:{far.port}/"
        )
        svc = Service(ws)
        rec = svc.execute(svc.submit("fixer", script).id)
        out = output(svc, rec.id)
        assert rec.state is RunState.PROPOSED, (rec.error, out[-3000:])
        assert "INSTALLED" in out and "BEFORE=fail" in out and "AFTER=pass" in out, out[-3000:]
        assert [f.path for f in rec.files] == ["calc.py"]  # pip's files stayed in the container
        assert any(r.startswith("GET /simple/fixlib/") for r in reg.requests), reg.requests
        assert any(r.startswith("GET /files/fixlib-1.0") for r in reg.requests), reg.requests
        result = json.loads(next(line[7:] for line in out.splitlines() if line.startswith("RESULT ")))
        assert "403" in result["other"] and "403" in result["localhost"] and "403" in result["host"], result
        assert other.accepted == near.accepted == far.accepted == 0
        events = audit(svc)
        opened = [e["data"] for e in events if kind(e) == "broker.opened"]
        assert opened and all(e["port"] == reg.port and e["address"] == "127.0.0.1" for e in opened)
        closed = [e["data"] for e in events if kind(e) == "broker.closed"]
        assert len(closed) == len(opened) and sum(e["down"] for e in closed) > 0
        refusals = [e["data"] for e in events if kind(e) == "broker.refused"]
        refused = {(d["host"], d["port"]): d["reason"] for d in refusals}
        assert "allow-list" in refused[("127.0.0.1", other.port)]
        assert "not a public address" in refused[("localhost", near.port)]
        assert "allow-list" in refused[(host, far.port)]
        assert "hunter2" not in svc.state.audit.read_text()
        # both doors show what the broker let through and refused: the CLI and the editor's evidence
        shown = subprocess.run(
            [sys.executable, "-m", "airlockd", "show", rec.id], cwd=ws, capture_output=True, text=True, timeout=60
        ).stdout
        assert f"package broker: {len(opened)} tunnels to 127.0.0.1:{reg.port} (" in shown, shown
        assert f"refused 127.0.0.1:{other.port}: 403" in shown and f"refused localhost:{near.port}: 403" in shown
        from airlockd.lsp.commands import evidence

        egress = evidence(Service(ws), rec.id)["egress"]
        assert egress["tunnels"] == len(opened) and egress["refused"] == 3
        assert egress["allowed"] == [f"127.0.0.1:{reg.port}", f"localhost:{near.port}"]
        assert egress["hosts"][0]["host"] == f"127.0.0.1:{reg.port}"
    finally:
        for lst in (other, near, far):
            lst.close()


DEVCONTAINER = """// the project's development container, as its users describe it
{
  "name": "calc",  /* built from a Dockerfile, with the project as the context */
  "build": {"dockerfile": "Dockerfile", "context": "..", "args": {"FLAVOUR": "plain",},},
  "runArgs": ["--privileged", "--network=host", "--cap-add=SYS_ADMIN"],
  "privileged": true,
  "capAdd": ["SYS_ADMIN", "NET_ADMIN"],
  "containerUser": "root",
  "mounts": ["source=/,target=/host,type=bind"],
}
"""
# In the devcontainer's image: no Python (airlockd's forwarder brings its own); root asked for.
DEVCONTAINER_DOCKERFILE = """FROM {runtime}
ARG FLAVOUR
USER root
COPY . /src/
RUN python3 -c "import socket; socket.create_connection(('{host}', {port}), 3)" && echo yes > /net || echo no > /net
RUN rm -f /usr/bin/python3 /usr/bin/python3.11 && echo "$FLAVOUR" > /flavour
VOLUME /cache
{extra}USER root
"""
REPORT = r"""
echo "UID=$(id -u)"
echo "CAPEFF=$(grep CapEff /proc/self/status | tr -d '[:space:]')"
echo "NETS=$(ls /sys/class/net | tr '\n' ' ')"
echo "PYTHON=$(command -v python3 || echo none)"
echo "FLAVOUR=$(cat /flavour)"
echo "ENVFILE=$(test -e /src/.env && echo present || echo absent)"
echo "CALC=$(test -e /src/calc.py && echo present || echo absent)"
echo "BUILDNET=$(cat /net)"
touch /cache/x 2>/dev/null && echo VOLUME=writable || echo VOLUME=read-only
touch /usr/airlock-root-write 2>/dev/null && echo ROOTFS=writable || echo ROOTFS=read-only
exec 3<>/dev/tcp/127.0.0.1/8181 && printf 'CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: x\r\n\r\n' >&3 \
  && head -c 12 <&3 | sed 's/^/BROKER=/'
echo
"""


def test_a_devcontainer_image_is_built_cached_rebuilt_and_loosens_nothing(
    tmp_path: Path, registry: tuple[Registry, bytes]
) -> None:
    reg, ca_pem = registry
    policy = (
        '[agents.dev]\ncommand = ["bash", "report.sh"]\nimage = "devcontainer"\n'
        f'[agents.dev.broker]\nallow = ["127.0.0.1:{reg.port}"]\n'
    )
    ws = make_project(tmp_path, ca_pem, policy)
    (ws / ".devcontainer").mkdir()
    (ws / ".devcontainer" / "devcontainer.json").write_text(DEVCONTAINER)
    dockerfile = ws / ".devcontainer" / "Dockerfile"
    listener = TcpServer(host_address(), mode="close")  # what a build's RUN step must not reach
    fill = {"runtime": image_tag(), "host": host_address(), "port": listener.port}
    dockerfile.write_text(DEVCONTAINER_DOCKERFILE.format(**fill, extra=""))
    (ws / "report.sh").write_text(REPORT)
    client = docker.from_env()

    def run() -> tuple[str, str]:
        svc = Service(ws)
        rec = svc.execute(svc.submit("dev", "report").id)
        out = output(svc, rec.id)
        assert rec.state in (RunState.PROPOSED, RunState.APPLIED), (rec.error, out[-2000:])
        started = next(e for e in audit(svc) if kind(e) == "container.starting" and e["run"] == rec.id)
        return str(started["data"]["image"]), out

    def doctor() -> str:
        found = subprocess.run(
            [sys.executable, "-m", "airlockd", "doctor"], cwd=ws, capture_output=True, text=True, timeout=120
        )
        return next(line for line in found.stdout.splitlines() if "project images" in line)

    before = doctor()
    assert "dev: .devcontainer/devcontainer.json -> airlockd-project:" in before, before
    assert "built at its next run" in before and "not applied: runArgs, privileged, capAdd, mounts" in before
    first, out = run()
    assert first.startswith("airlockd-project:")
    assert f"{first}, built;" in doctor()
    uid = os.getuid() or 1000  # the agent's user: root's runs get 1000, a user's their own uid, never 0
    for line in (f"UID={uid}", "CAPEFF=CapEff:0000000000000000", "NETS=lo ", "PYTHON=none", "FLAVOUR=plain"):
        assert line in out, (line, out)
    assert "ENVFILE=absent" in out and "CALC=present" in out  # the build context was the staged copy
    assert "ROOTFS=read-only" in out
    assert "BUILDNET=no" in out and listener.accepted == 0  # the build's RUN steps had no network
    assert "VOLUME=read-only" in out  # the image's VOLUME is no writable, uncapped volume
    assert "BROKER=HTTP/1.1 407" in out  # the forwarder runs without the image's Python
    built = client.images.get(first).id
    again, _ = run()
    assert again == first and client.images.get(again).id == built  # cached: nothing rebuilt
    dockerfile.write_text(DEVCONTAINER_DOCKERFILE.format(**fill, extra="ENV CHANGED=1\n"))
    changed, out = run()
    assert changed != first and f"UID={uid}" in out
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(first)  # the workspace's previous image is gone
    client.images.remove(changed, force=True)
    listener.close()


def test_a_base_image_with_onbuild_steps_is_refused(tmp_path: Path) -> None:
    """ONBUILD steps would run in airlockd's own layer build: a devcontainer image that has them
    is refused, with why, and the run fails before any container starts."""
    client = docker.from_env()
    base = f"airlockd-test-onbuild:{image_tag().rpartition(':')[2]}"
    dockerfile = f"FROM {image_tag()}\nONBUILD RUN echo ran-in-airlockd-layer > /onbuild\n".encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    buf.seek(0)
    client.images.build(fileobj=buf, custom_context=True, tag=base, rm=True, pull=False)
    ws = tmp_path / "project"
    (ws / ".devcontainer").mkdir(parents=True)
    (ws / ".devcontainer" / "devcontainer.json").write_text(json.dumps({"image": base}))
    (ws / "policies.toml").write_text('[agents.dev]\ncommand = ["true"]\nimage = "devcontainer"\n')
    svc = Service(ws)
    run_id = svc.submit("dev", "x").id
    with pytest.raises(PolicyError, match="ONBUILD"):  # the run's error, raised to whoever ran it
        svc.execute(run_id)
    rec = svc.store.get_run(run_id)
    assert rec.state is RunState.FAILED and "ONBUILD" in str(rec.error), rec.error
    assert not [e for e in audit(svc) if kind(e) == "container.starting"]
