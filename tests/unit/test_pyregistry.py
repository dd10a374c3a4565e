"""The test registry (tests/pyregistry.py) works for real: pip installs from it over TLS with the test CA,
a client that does not trust that CA is refused, and blobs download whole."""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyregistry import Registry, TestCA, build_wheel, make_ca  # tests/ is on sys.path (conftest)


@pytest.fixture(scope="module")
def ca() -> TestCA:
    return make_ca()


@pytest.fixture
def registry(tmp_path: Path, ca: TestCA) -> Iterator[Registry]:
    with Registry(tmp_path / "registry", ca) as reg:
        yield reg


def _offline_pip_env() -> dict[str, str]:
    """The environment without proxies or pip configuration, so pip talks to the registry and nothing else."""
    drop = {"http_proxy", "https_proxy", "all_proxy", "no_proxy", "ftp_proxy"}
    # requests lets these win over pip's --cert (psf/requests#3829): the registry's CA would go unused.
    drop |= {"requests_ca_bundle", "curl_ca_bundle"}
    env = {k: v for k, v in os.environ.items() if k.lower() not in drop and not k.startswith("PIP_")}
    env.update(
        NO_PROXY="*",
        no_proxy="*",
        PIP_NO_CACHE_DIR="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_CONFIG_FILE=os.devnull,  # a user's pip.conf could add an extra index on the internet
        PIP_NO_INPUT="1",
        PIP_RETRIES="0",  # loopback does not flake; a refusal should fail now, not after five backoffs
    )
    return env


def test_pip_installs_a_built_wheel_through_the_registry(tmp_path: Path, ca: TestCA, registry: Registry) -> None:
    # A name with mixed separators and case: pip asks for it normalized, the registry must match.
    wheel = build_wheel(tmp_path / "dist", "Regtest.Pkg_X", "1.2", {"regtest_mod.py": "VALUE = 'from the registry'\n"})
    assert wheel.name == "regtest_pkg_x-1.2-py3-none-any.whl"
    registry.add(wheel)
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.cert_pem)
    target = tmp_path / "target"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target)]
    cmd += ["--index-url", registry.index_url, "--cert", str(ca_file), "Regtest.Pkg-X==1.2"]
    done = subprocess.run(cmd, env=_offline_pip_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr

    code = f"import sys; sys.path.insert(0, {str(target)!r}); import regtest_mod; print(regtest_mod.VALUE)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.strip() == "from the registry"
    assert (target / "regtest_pkg_x-1.2.dist-info" / "RECORD").is_file()
    assert "GET /simple/regtest-pkg-x/" in registry.requests
    assert "GET /files/regtest_pkg_x-1.2-py3-none-any.whl" in registry.requests


@pytest.mark.parametrize("trust", ["system store", "another test CA"])
def test_a_client_not_trusting_the_ca_is_refused(registry: Registry, trust: str) -> None:
    if trust == "system store":
        ctx = ssl.create_default_context()
    else:
        ctx = ssl.create_default_context(cadata=make_ca().cert_pem.decode())
    with (
        socket.create_connection(("127.0.0.1", registry.port), timeout=10) as sock,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        ctx.wrap_socket(sock, server_hostname="localhost")
    assert registry.requests == []  # refused at the handshake, before any HTTP


def test_a_blob_downloads_whole(ca: TestCA, registry: Registry) -> None:
    size = 5 * 1024 * 1024
    path = registry.add_blob("blob.bin", size)
    assert path == "/files/blob.bin"
    ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    # An empty ProxyHandler: urllib would otherwise follow HTTPS_PROXY from the environment.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
    with opener.open(registry.url + path, timeout=30) as resp:
        assert resp.headers["Content-Length"] == str(size)
        data = resp.read()
    assert len(data) == size
    on_disk = (registry.root / "files" / "blob.bin").read_bytes()
    assert hashlib.sha256(data).digest() == hashlib.sha256(on_disk).digest()
    assert registry.requests == ["GET /files/blob.bin"]

    with pytest.raises(urllib.error.HTTPError) as missing:
        opener.open(registry.url + "/files/absent.bin", timeout=30)
    assert missing.value.code == 404
    missing.value.close()
