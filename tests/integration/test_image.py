"""The runtime image: its tag follows runtime/, its build is offline, cached and reused.

The tag and definition tests need no engine; the build tests run against the real one.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from airlockd.errors import AirlockError, EngineError
from airlockd.resources import resource
from airlockd.sandbox.image import (
    IMAGE_REPO,
    ImageDefinition,
    _trim,
    apt_mirror,
    definition_digest,
    ensure_image,
    image_tag,
)

RUNTIME = resource("runtime")
SHIM = Path("rootfs/usr/local/bin/airlock-shim")


@pytest.fixture
def runtime_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "runtime"
    shutil.copytree(RUNTIME, copy, symlinks=True)
    return copy


def test_tag_is_stable_and_follows_every_runtime_file(runtime_copy: Path) -> None:
    tag = image_tag(runtime_copy)
    assert re.fullmatch(rf"{IMAGE_REPO}:[0-9a-f]{{12}}", tag)
    assert tag == image_tag(RUNTIME) == image_tag(runtime_copy)

    shim = runtime_copy / SHIM
    original = shim.read_bytes()
    shim.write_bytes(original + b"# edited\n")
    edited = image_tag(runtime_copy)
    assert edited != tag
    shim.write_bytes(original)
    assert image_tag(runtime_copy) == tag

    shim.chmod(0o644)  # losing the executable bit changes the image too
    assert image_tag(runtime_copy) != tag
    shim.chmod(0o755)

    (runtime_copy / "rootfs" / "etc").mkdir()
    (runtime_copy / "rootfs" / "etc" / "motd").write_text("hi\n")
    assert image_tag(runtime_copy) not in (tag, edited)


def test_package_list_changes_the_tag_and_the_base(runtime_copy: Path) -> None:
    before = ImageDefinition.load(runtime_copy)
    tag = image_tag(runtime_copy)
    toml = runtime_copy / "image.toml"
    toml.write_text(toml.read_text().replace('"ca-certificates",', '"ca-certificates", "less",'))
    after = ImageDefinition.load(runtime_copy)
    assert sorted(after.packages) == sorted([*before.packages, "less"])
    assert image_tag(runtime_copy) != tag
    assert after.base_key() != before.base_key()


def test_rootfs_edit_keeps_the_base(runtime_copy: Path) -> None:
    before = ImageDefinition.load(runtime_copy).base_key()
    (runtime_copy / SHIM).write_text((runtime_copy / SHIM).read_text() + "# edited\n")
    assert ImageDefinition.load(runtime_copy).base_key() == before
    assert definition_digest(runtime_copy) != definition_digest(RUNTIME)


def test_definition_is_lean_and_matches_the_registry_dockerfile() -> None:
    defn = ImageDefinition.load(RUNTIME)
    assert defn.variant == "minbase"
    assert "python3-minimal" in defn.packages
    assert (defn.user.uid, defn.user.gid, defn.user.home) == (1000, 1000, "/tmp/home")
    assert defn.config.env["HOME"] == "/tmp/home"
    dockerfile = (RUNTIME / "Dockerfile").read_text()
    for pkg in defn.packages:
        assert pkg in dockerfile, f"runtime/Dockerfile does not install {pkg}"
    assert f"USER {defn.config.user}" in dockerfile
    assert defn.config.workdir is None and "WORKDIR" not in dockerfile.replace("no WORKDIR", "")


def test_bad_definition_names_the_key(runtime_copy: Path) -> None:
    toml = runtime_copy / "image.toml"
    toml.write_text(toml.read_text().replace("uid = 1000", 'uid = "root"'))
    with pytest.raises(AirlockError, match=r"image.toml: key `user.uid`"):
        ImageDefinition.load(runtime_copy)


def test_no_package_host_is_written_in_runtime() -> None:
    for path in RUNTIME.rglob("*"):
        if path.is_file():
            assert not re.search(r"https?://", path.read_text(errors="replace")), path


def test_mirror_comes_from_apt_sources(tmp_path: Path) -> None:
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://security.invalid/debian-security\nSuites: bookworm-security\n"
        "Components: main\n\n"
        "Types: deb\nURIs: http://mirror.invalid/debian/\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    assert apt_mirror("bookworm", etc) == (
        "http://mirror.invalid/debian",
        "/usr/share/keyrings/debian-archive-keyring.gpg",
    )
    (etc / "sources.list.d" / "debian.sources").unlink()
    (etc / "sources.list").write_text(
        "# comment\ndeb-src http://src.invalid/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://list.invalid/debian bookworm main\n"
    )
    assert apt_mirror("bookworm", etc) == ("http://list.invalid/debian", "/k.gpg")
    with pytest.raises(EngineError, match="AIRLOCK_DEBIAN_MIRROR"):
        apt_mirror("trixie", etc)


def test_trim_keeps_copyright_notices(tmp_path: Path) -> None:
    doc = tmp_path / "usr/share/doc/bash"
    doc.mkdir(parents=True)
    (doc / "copyright").write_text("GPL\n")
    (doc / "README.gz").write_text("x")
    (tmp_path / "usr/share/doc/empty").mkdir()
    (tmp_path / "usr/share/man/man1").mkdir(parents=True)
    (tmp_path / "usr/share/man/man1/ls.1.gz").write_text("x")
    _trim(tmp_path, ["usr/share/doc", "usr/share/man"], ["usr/share/doc/*/copyright"])
    left = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert left == ["usr", "usr/share", "usr/share/doc", "usr/share/doc/bash", "usr/share/doc/bash/copyright"]


# ---- against the engine ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def client() -> Any:
    import docker

    return docker.from_env()


@pytest.fixture(scope="module")
def built(client: Any) -> str:
    return ensure_image(client)


@pytest.mark.docker
def test_ensure_image_is_a_no_op_when_the_tag_exists(client: Any, built: str) -> None:
    assert built == image_tag()
    said: list[str] = []
    t0 = time.monotonic()
    assert ensure_image(client, progress=said.append) == built
    assert time.monotonic() - t0 < 2
    assert said == []
    assert client.images.get(f"{IMAGE_REPO}:latest").id == client.images.get(built).id


@pytest.mark.docker
def test_image_configuration(client: Any, built: str) -> None:
    img = client.images.get(built)
    cfg = img.attrs["Config"]
    assert cfg["User"] == "1000:1000"
    assert not cfg["WorkingDir"]  # no /workspace in the image: Podman would give its owner to a run's volume
    assert "HOME=/tmp/home" in cfg["Env"]
    assert cfg["Entrypoint"] == ["/usr/local/bin/airlock-shim"]
    assert cfg["Labels"]["airlockd.runtime"] == definition_digest()
    assert img.attrs["Size"] < 200 * 1024 * 1024
    out = client.containers.run(
        built,
        [
            "sh",
            "-c",
            "getent passwd agent; stat -c '%U %a' /usr/local/bin/airlock-shim; python3 -V;"
            " test -e /workspace || echo no-workspace",
        ],
        remove=True,
        network_mode="none",
    )
    assert (
        out.decode().splitlines()[:2]
        == [
            "agent:x:1000:1000:airlockd agent:/tmp/home:/bin/bash",
            "root 755",
        ][:2]
    )
    assert out.decode().splitlines()[2].startswith("Python 3.11")
    assert out.decode().splitlines()[3] == "no-workspace"


@pytest.mark.docker
def test_rootfs_edit_rebuilds_only_the_top_layer(client: Any, built: str, runtime_copy: Path) -> None:
    (runtime_copy / SHIM).write_text((runtime_copy / SHIM).read_text() + "# edited\n")
    said: list[str] = []
    t0 = time.monotonic()
    tag = ensure_image(client, progress=said.append, root=runtime_copy, tag_latest=False)
    took = time.monotonic() - t0
    try:
        assert tag == image_tag(runtime_copy) != built
        assert any("reusing base" in s for s in said), said
        assert took < 20, took
        base_layers = client.images.get(built).history()[-1]["Id"]
        assert client.images.get(tag).history()[-1]["Id"] == base_layers
        assert client.images.get(f"{IMAGE_REPO}:latest").id == client.images.get(built).id
    finally:
        client.images.remove(tag)
