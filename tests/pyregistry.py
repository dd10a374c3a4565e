"""A local Python package registry (a PEP 503 "simple" index) served over TLS on loopback, with a
throwaway test CA, for the integration tests and the benchmark that install packages through the
sandbox's egress path without touching the real PyPI.

`make_ca()` makes the CA (its `cert_pem` is what a client or an image must trust); `build_wheel()`
writes a small pure-Python wheel that pip accepts; `Registry` serves wheels under `/simple/` and
`/files/`, plus arbitrary blobs for throughput tests, and keeps every request line in `requests`.
Standard library and `cryptography` only.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import html
import ipaddress
import os
import re
import shutil
import socket
import ssl
import tempfile
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_CHUNK = 1 << 20  # big copies so TLS, not the copy loop, sets the pace of a throughput benchmark


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class TestCA:
    """A CA that exists for one test run. Only `cert_pem` leaves it; the key stays here to sign."""

    __test__ = False  # not a pytest test class, although its name starts with "Test"

    cert_pem: bytes
    _cert: x509.Certificate = field(repr=False)
    _key: ec.EllipticCurvePrivateKey = field(repr=False)

    def issue(self, names: list[str], ips: list[str]) -> tuple[bytes, bytes]:
        """A server certificate for these DNS names and IP addresses: (cert_pem, key_pem)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        ca_ski = self._cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        # Everything a strict verifier (OpenSSL's X509_STRICT, rustls, Go) asks of a leaf.
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name((names or ips or ["server"])[0]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def make_ca() -> TestCA:
    """An EC P-256 CA valid from a day ago for two days (the day back absorbs clock skew)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name("airlockd test CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return TestCA(cert_pem=cert.public_bytes(serialization.Encoding.PEM), _cert=cert, _key=key)


def normalize(name: str) -> str:
    """A project name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(dest_dir: Path, name: str, version: str, files: dict[str, str]) -> Path:
    """A valid pure-Python wheel (py3-none-any) written by hand with zipfile: the files (module path -> source),
    dist-info METADATA, WHEEL, RECORD with sha256 hashes (urlsafe b64, no padding) so that `pip install` accepts it."""
    dist = re.sub(r"[-_.]+", "_", name).lower()  # the escaped name in wheel file and dist-info names
    info = f"{dist}-{version}.dist-info"
    entries: dict[str, bytes] = {path: source.encode() for path, source in files.items()}
    entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    entries[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: airlockd-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in entries.items())
    entries[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    dest_dir.mkdir(parents=True, exist_ok=True)
    wheel = dest_dir / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in entries.items():
            zi = zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0))  # same bytes every build
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return wheel


class _TLSServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # an idle keep-alive connection must not hold up stop()

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], ctx: ssl.SSLContext) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.ctx = ctx
        super().__init__(address, handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The handshake runs here, in the connection's own thread, not in accept(): a slow or
        # distrustful client does not stall the others, and its failed handshake stays quiet.
        request.settimeout(30)
        try:
            conn = self.ctx.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        try:
            super().finish_request(conn, client_address)
        except (ssl.SSLError, OSError):  # the client went away mid-response
            pass
        finally:
            conn.close()


class Registry:
    """A PEP 503 index over TLS at `url`, serving what `add`/`add_blob` put under `root/files`."""

    def __init__(
        self,
        root: Path,
        ca: TestCA,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        names: tuple[str, ...] = ("localhost",),
        ips: tuple[str, ...] = ("127.0.0.1",),
    ) -> None:
        self.root = root
        self.files = root / "files"
        self.files.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.requests: list[str] = []
        self._want_port = port
        self._projects: dict[str, dict[str, str]] = {}  # normalized project -> {filename: sha256 hex}
        self._lock = threading.Lock()
        self._server: _TLSServer | None = None
        self._thread: threading.Thread | None = None
        cert_pem, key_pem = ca.issue(list(names), list(ips))
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # load_cert_chain reads only files: the key touches disk just long enough to load.
        with tempfile.TemporaryDirectory(prefix="pyregistry-") as tmp:
            cert_file, key_file = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert_file.write_bytes(cert_pem)
            key_file.write_bytes(key_pem)
            self._ctx.load_cert_chain(cert_file, key_file)

    # -- contents ------------------------------------------------------------------------------

    def add(self, wheel: Path) -> None:
        """Serve this wheel under /simple/<project>/ and /files/<filename>."""
        target = self.files / wheel.name
        if wheel.resolve() != target.resolve():
            shutil.copyfile(wheel, target)
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        project = normalize(wheel.name.split("-", 1)[0])
        with self._lock:
            self._projects.setdefault(project, {})[wheel.name] = digest

    def add_blob(self, name: str, size: int) -> str:
        """A file of `size` incompressible bytes at /files/<name>; returns its URL path."""
        block = os.urandom(_CHUNK)  # one random block repeated: fast to write, nothing compresses it
        with open(self.files / name, "wb") as f:
            left = size
            while left > 0:
                n = min(left, _CHUNK)
                f.write(memoryview(block)[:n])
                left -= n
        return "/files/" + quote(name)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Registry:
        self._server = _TLSServer((self.host, self._want_port), self._handler(), self._ctx)
        self._thread = threading.Thread(target=self._server.serve_forever, name="pyregistry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> Registry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("registry not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"

    @property
    def index_url(self) -> str:
        return self.url + "/simple/"

    # -- serving -------------------------------------------------------------------------------

    def _index_page(self) -> bytes:
        with self._lock:
            projects = sorted(self._projects)
        links = "".join(f'<a href="/simple/{quote(p)}/">{html.escape(p)}</a><br>\n' for p in projects)
        return _page("Simple index", links)

    def _project_page(self, project: str) -> bytes | None:
        with self._lock:
            wheels = dict(self._projects.get(normalize(project), {}))
        if not wheels:
            return None
        links = "".join(
            f'<a href="/files/{quote(fn)}#sha256={digest}">{html.escape(fn)}</a><br>\n'
            for fn, digest in sorted(wheels.items())
        )
        return _page(f"Links for {html.escape(normalize(project))}", links)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as pip and real indexes use it
            disable_nagle_algorithm = True

            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                line = f"{self.command} {self.path}" if self.command else self.requestline
                with registry._lock:
                    registry.requests.append(line)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: tests read `requests` instead

            def do_GET(self) -> None:
                self._serve(body=True)

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def _serve(self, body: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                parts = [p for p in path.split("/") if p]
                if parts == ["simple"]:
                    self._bytes(registry._index_page(), "text/html; charset=utf-8", body)
                elif len(parts) == 2 and parts[0] == "simple":
                    page = registry._project_page(parts[1])
                    if page is None:
                        self._not_found()
                    else:
                        self._bytes(page, "text/html; charset=utf-8", body)
                elif len(parts) == 2 and parts[0] == "files" and (registry.files / parts[1]).is_file():
                    self._file(registry.files / parts[1], body)
                else:
                    self._not_found()

            def _bytes(self, data: bytes, ctype: str, body: bool) -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def _file(self, path: Path, body: bool) -> None:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    if body:
                        # No zero-copy sendfile through TLS (no kTLS here), so big writes instead.
                        shutil.copyfileobj(f, self.wfile, _CHUNK)

            def _not_found(self) -> None:
                data = b"not found\n"
                self.send_response(404)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

        return Handler


def _page(title: str, links: str) -> bytes:
    return (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        '<meta name="pypi:repository-version" content="1.0">\n'
        f"<title>{title}</title>\n</head>\n<body>\n<h1>{title}</h1>\n{links}</body>\n</html>\n"
    ).encode()
