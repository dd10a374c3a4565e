"""Every content detector, old and new, against a corpus: for each, positives that staging withholds
and the Redactor masks, and near misses (public keys, certificates, URLs without a password, a
JWT with a broken part, an /etc/passwd line, ...) that are staged as they are and left unmasked.

Nothing here is a real secret: keys are generated at test time and tokens are assembled from parts,
so the repository never holds one for a scanner to flag.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airlockd.policy import CustomDetector, Level, Policy, load_policy
from airlockd.redact import BYTE_DETECTORS, DETECTORS, MASK, ExtraDetector, Redactor, known_detectors
from airlockd.staging import copy as staging
from airlockd.staging.copy import stage
from airlockd.staging.secretscan import (
    SecretScanner,
    _der_base64_private_key,
    _der_private_key,
    _utf16_private_key,
    utf16_texts,
    utf32_texts,
    wide_texts,
)

Enc = serialization.Encoding
Fmt = serialization.PrivateFormat
NoEnc = serialization.NoEncryption()


@dataclass(frozen=True)
class Sample:
    detector: str
    label: str
    data: bytes
    core: str = ""  # the part a Redactor must mask (positives of text detectors)


_B64URL_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _rand(n: int, seed: int, alphabet: str = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789") -> str:
    rnd = random.Random(seed)
    return "".join(rnd.choice(alphabet) for _ in range(n))


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _jwt(payload: dict[str, object]) -> str:
    head = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = _b64url(json.dumps(payload).encode())
    sig = _b64url(hmac.new(b"test-only", f"{head}.{body}".encode(), hashlib.sha256).digest())
    return f"{head}.{body}.{sig}"


def _keys() -> dict[str, bytes]:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    ed_key = ed25519.Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corpus.test")])
    now = __import__("datetime").datetime(2026, 1, 1)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ec_key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now.replace(year=2027))
        .sign(ec_key, hashes.SHA256())
    )
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    return {
        "rsa-pkcs1-pem": rsa_key.private_bytes(Enc.PEM, Fmt.TraditionalOpenSSL, NoEnc),
        "rsa-pkcs8-pem": rsa_key.private_bytes(Enc.PEM, Fmt.PKCS8, NoEnc),
        "rsa-encrypted-pem": rsa_key.private_bytes(
            Enc.PEM, Fmt.PKCS8, serialization.BestAvailableEncryption(b"corpus-passphrase")
        ),
        "ec-sec1-pem": ec_key.private_bytes(Enc.PEM, Fmt.TraditionalOpenSSL, NoEnc),
        "ed25519-openssh": ed_key.private_bytes(Enc.PEM, Fmt.OpenSSH, NoEnc),
        "rsa-pkcs1-der": rsa_key.private_bytes(Enc.DER, Fmt.TraditionalOpenSSL, NoEnc),
        "rsa-pkcs8-der": rsa_key.private_bytes(Enc.DER, Fmt.PKCS8, NoEnc),
        "ec-pkcs8-der": ec_key.private_bytes(Enc.DER, Fmt.PKCS8, NoEnc),
        "ec-sec1-der": ec_key.private_bytes(Enc.DER, Fmt.TraditionalOpenSSL, NoEnc),
        "ed25519-pkcs8-der": ed_key.private_bytes(Enc.DER, Fmt.PKCS8, NoEnc),
        "rsa-public-pem": rsa_key.public_key().public_bytes(Enc.PEM, pub),
        "rsa-public-der": rsa_key.public_key().public_bytes(Enc.DER, pub),
        "rsa-pkcs1-public-der": rsa_key.public_key().public_bytes(Enc.DER, serialization.PublicFormat.PKCS1),
        "cert-pem": cert.public_bytes(Enc.PEM),
        "cert-der": cert.public_bytes(Enc.DER),
    }


def _body_line(pem: bytes) -> str:
    return pem.decode().splitlines()[1]


def _corpus() -> tuple[list[Sample], list[Sample]]:
    k = _keys()
    pem = k["rsa-pkcs8-pem"]
    pem_text = pem.decode()
    aws = "AKIA" + "IOSFODNN7" + "EXAMPLE"
    gh = "ghp_" + _rand(36, 1)
    glpat = "glpat-" + _rand(24, 2)
    slack = "xoxb-" + "1234567890" + "-" + _rand(12, 3)
    openai = "sk-" + "proj-" + _rand(40, 4)
    anthropic = "sk-" + "ant-api03-" + _rand(30, 5)
    google = "AI" + "za" + _rand(35, 6)
    stripe = "sk_" + "live_" + _rand(24, 7)
    jwt = _jwt({"sub": "1234567890", "name": "corpus"})
    head, body, sig = jwt.split(".")
    storage_key = base64.b64encode(random.Random(8).randbytes(64)).decode()
    bus_key = base64.b64encode(random.Random(9).randbytes(32)).decode()
    password = "Tr0ub4dor-" + _rand(8, 10)
    k8s_token = _rand(48, 11)
    pg_password = "pg-" + _rand(14, 12)
    run_token = "alrt_" + _rand(32, 13)
    ppk_private = base64.b64encode(random.Random(14).randbytes(48)).decode()
    ppk = (
        "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: corpus\nPublic-Lines: 2\n"
        "AAAAC3NzaC1lZDI1NTE5AAAAIOqZ\nPYmFzZTY0IHB1YmxpYyBwYXJ0\nPrivate-Lines: 1\n"
        f"{ppk_private}\nPrivate-MAC: {'ab' * 32}\n"
    )
    b64_pem = [base64.b64encode(prefix + pem).decode() for prefix in (b"", b"{", b'{"')]
    hexd = "0123456789abcdef"
    age = "AGE-SECRET-KEY-1" + _rand(58, 15, "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L")
    npm = "npm_" + _rand(36, 16, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    pypi = "pypi-" + "AgEIcHlwaS5vcmc" + _rand(160, 17, _B64URL_ALPHABET)
    vault = "hvs." + _rand(95, 18, _B64URL_ALPHABET)
    vault_batch = "hvb." + _rand(150, 19, _B64URL_ALPHABET)
    hf = "hf_" + _rand(34, 20, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    docker = "dckr_" + "pat_" + _rand(27, 21, _B64URL_ALPHABET)
    sendgrid = "SG." + _rand(22, 22, _B64URL_ALPHABET) + "." + _rand(43, 23, _B64URL_ALPHABET)
    gocspx = "GOC" + "SPX-" + _rand(28, 24, _B64URL_ALPHABET)
    digitalocean = "dop_" + "v1_" + _rand(64, 25, hexd)
    shopify = "shp" + "at_" + _rand(32, 26, hexd)
    twilio = "SK" + _rand(32, 27, hexd)
    basic = base64.b64encode(("deploy:" + password).encode()).decode()
    glrt = "glrt-" + _rand(24, 31)
    xapp = "xapp-" + "1-A0123456789-" + _rand(20, 32, hexd)
    webhook = "hooks.slack.com/services/" + "T0" + _rand(8, 33) + "/B0" + _rand(8, 34) + "/" + _rand(24, 35)
    whsec = "whsec_" + _rand(32, 36)
    testpypi = "pypi-" + "AgENdGVzdC5weXBpLm9yZw" + _rand(120, 37, _B64URL_ALPHABET)
    docker_org = "dckr_" + "oat_" + _rand(27, 38, _B64URL_ALPHABET)
    ssh2_body = base64.b64encode(random.Random(28).randbytes(96)).decode()
    ssh2 = (
        "---- BEGIN " + "SSH2 ENCRYPTED PRIVATE KEY ----\n"
        'Comment: "corpus"\n'
        f"{ssh2_body[:64]}\n{ssh2_body[64:]}\n"
        "---- END " + "SSH2 ENCRYPTED PRIVATE KEY ----\n"
    )
    der_b64 = {name: base64.b64encode(k[name]).decode() for name in k if name.endswith("-der")}
    sec1_lines = k["ec-sec1-pem"].decode().splitlines()[1:-1]  # 64 columns, no PEM lines

    pos = [
        Sample("private-key", "pkcs1 upper case", k["rsa-pkcs1-pem"], _body_line(k["rsa-pkcs1-pem"])),
        Sample("private-key", "pkcs8 lower case", pem_text.lower().encode(), _body_line(pem).lower()),
        Sample(
            "private-key",
            "mixed case",
            pem_text.replace("BEGIN PRIVATE KEY", "Begin Rsa Private Key").encode(),
            _body_line(pem),
        ),
        Sample("private-key", "encrypted pkcs8", k["rsa-encrypted-pem"], _body_line(k["rsa-encrypted-pem"])),
        Sample("private-key", "sec1 ec", k["ec-sec1-pem"], _body_line(k["ec-sec1-pem"])),
        Sample("private-key", "openssh", k["ed25519-openssh"], _body_line(k["ed25519-openssh"])),
        Sample("putty-private-key", "ppk v3", ppk.encode(), ppk_private),
        Sample("putty-private-key", "ppk v2", ppk.replace("File-3", "File-2").encode(), ppk_private),
        *(
            Sample("private-key-base64", f"alignment {i}", f"key: {b}\n".encode(), b[len(b) // 2 : len(b) // 2 + 40])
            for i, b in enumerate(b64_pem)
        ),
        Sample(
            "private-key-base64",
            "json field",
            json.dumps({"privateKey": b64_pem[0]}).encode(),
            b64_pem[0][100:140],
        ),
        *(
            Sample("private-key-der", name, k[name])
            for name in k
            if name.endswith("-der") and "public" not in name and "cert" not in name
        ),
        Sample("private-key-der", "der inside a binary file", os.urandom(300) + k["ec-sec1-der"] + os.urandom(300)),
        Sample("ssh2-private-key", "ssh.com export", ssh2.encode(), ssh2_body[:64]),
        Sample("ssh2-private-key", "lower case", ssh2.lower().encode(), ssh2_body[:64].lower()),
        Sample("private-key-der-base64", "pkcs8 rsa yaml value", f"private_key: {der_b64['rsa-pkcs8-der']}\n".encode()),
        Sample(
            "private-key-der-base64", "pkcs1 rsa properties", f"jwt.signing.key={der_b64['rsa-pkcs1-der']}\n".encode()
        ),
        Sample("private-key-der-base64", "pkcs8 ec json", json.dumps({"key": der_b64["ec-pkcs8-der"]}).encode()),
        Sample("private-key-der-base64", "pkcs8 ed25519", f"ED25519_KEY={der_b64['ed25519-pkcs8-der']}\n".encode()),
        Sample("private-key-der-base64", "sec1 ec", f"{der_b64['ec-sec1-der']}\n".encode()),
        Sample(
            "private-key-der-base64",
            "sec1 wrapped in a yaml block",
            ("signing:\n  key: |\n    " + "\n    ".join(sec1_lines) + "\n").encode(),
        ),
        Sample(
            "private-key-der-base64", "sec1 wrapped in a json string", json.dumps({"k": "\n".join(sec1_lines)}).encode()
        ),
        Sample(
            "private-key-der-base64",
            "openssh body",
            b"".join(k["ed25519-openssh"].splitlines()[1:-1]) + b"\n",
        ),
        Sample("private-key-utf16", "utf-16 with bom", pem_text.encode("utf-16")),
        Sample("private-key-utf16", "utf-16-le", pem_text.encode("utf-16-le")),
        Sample("private-key-utf16", "utf-16-be", pem_text.encode("utf-16-be")),
        Sample("private-key-utf16", "utf-16-be lower case", pem_text.lower().encode("utf-16-be")),
        Sample("aws-access-key", "access key id", f"key = {aws}\n".encode(), aws),
        Sample("github-token", "classic token", f"token: {gh}\n".encode(), gh),
        Sample("gitlab-token", "personal token", f"{glpat}\n".encode(), glpat),
        Sample("gitlab-token", "runner token", f"token = {glrt!r}\n".encode(), glrt),
        Sample("slack-token", "bot token", f"{slack}\n".encode(), slack),
        Sample("slack-token", "app-level token", f"SLACK_APP_TOKEN={xapp}\n".encode(), xapp),
        Sample("slack-webhook", "webhook url", f"url: https://{webhook}\n".encode(), webhook),
        Sample("stripe-webhook-secret", "signing secret", f"STRIPE_WEBHOOK_SECRET={whsec}\n".encode(), whsec),
        Sample("pypi-token", "testpypi token", f"password = {testpypi}\n".encode(), testpypi),
        Sample("dockerhub-token", "organisation token", f"{docker_org}\n".encode(), docker_org),
        Sample(
            "http-basic-auth",
            "nginx header",
            f'proxy_set_header Authorization "Basic {basic}";\n'.encode(),
            basic,
        ),
        Sample("openai-key", "project key", f"OPENAI={openai}\n".encode(), openai),
        Sample("anthropic-key", "api key", f"k: {anthropic}\n".encode(), anthropic),
        Sample("google-api-key", "api key", f"{google}\n".encode(), google),
        Sample("google-oauth-secret", "client secret", f'"client_secret": "{gocspx}"\n'.encode(), gocspx),
        Sample("age-secret-key", "age identity", f"# created: 2026-01-01\n{age}\n".encode(), age),
        Sample("npm-token", ".npmrc auth token", f"//registry.npmjs.org/:_authToken={npm}\n".encode(), npm),
        Sample("npm-token", "upper case", f"NPM {npm.upper()}\n".encode(), npm.upper()),
        Sample("pypi-token", ".pypirc password", f"[pypi]\nusername = __token__\npassword = {pypi}\n".encode(), pypi),
        Sample("vault-token", "service token", f"VAULT_TOKEN={vault}\n".encode(), vault),
        Sample("vault-token", "batch token", f"{vault_batch}\n".encode(), vault_batch),
        Sample("huggingface-token", "access token", f"HF_TOKEN={hf}\n".encode(), hf),
        Sample("dockerhub-token", "docker login", f"docker login -u corpus -p {docker}\n".encode(), docker),
        Sample("sendgrid-key", "api key", f"SENDGRID_API_KEY='{sendgrid}'\n".encode(), sendgrid),
        Sample("digitalocean-token", "personal token", f"DIGITALOCEAN_TOKEN={digitalocean}\n".encode(), digitalocean),
        Sample("shopify-token", "admin token", f"X-Shopify-Access-Token: {shopify}\n".encode(), shopify),
        Sample("twilio-key", "api key sid", f"TWILIO_API_KEY={twilio}\n".encode(), twilio),
        Sample("stripe-key", "live key", f"{stripe}\n".encode(), stripe),
        Sample("jwt", "hs256 token", f"cookie={jwt}\n".encode(), body),
        Sample("jwt", "unsigned token", f"{head}.{body}.\n".encode(), body),
        Sample(
            "azure-connection-string",
            "storage account",
            f"DefaultEndpointsProtocol=https;AccountName=corpus;AccountKey={storage_key};"
            "EndpointSuffix=core.windows.net\n".encode(),
            storage_key,
        ),
        Sample(
            "azure-connection-string",
            "service bus",
            "Endpoint=sb://corpus.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;"
            f"SharedAccessKey={bus_key}\n".encode(),
            bus_key,
        ),
        Sample(
            "url-credentials",
            ".git/config remote",
            f'[remote "origin"]\n\turl = https://alice:{password}@git.example.com/team/repo.git\n'.encode(),
            password,
        ),
        Sample("url-credentials", ".git-credentials", f"https://bob:{password}@git.example.com\n".encode(), password),
        Sample(
            "url-credentials",
            "database url",
            f"DATABASE_URL=postgres://app:{password}@db:5432/app\n".encode(),
            password,
        ),
        Sample(
            "kubeconfig-credential",
            "kubeconfig token",
            (
                "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: https://k8s.example.com\n"
                "  name: prod\nusers:\n- name: admin\n  user:\n"
                f"    token: {k8s_token}\n"
            ).encode(),
            k8s_token,
        ),
        Sample(
            "kubeconfig-credential",
            "kubeconfig oidc",
            (
                "users:\n- name: dev\n  user:\n    auth-provider:\n      name: oidc\n      config:\n"
                f"        client-id: kubectl\n        refresh-token: {k8s_token}\n"
            ).encode(),
            k8s_token,
        ),
        Sample("pgpass", "pgpass line", f"db.example.com:5432:app:appuser:{pg_password}\n".encode(), pg_password),
        Sample("pgpass", "pgpass wildcard", f"*:*:*:postgres:{pg_password}\n".encode(), pg_password),
        Sample("http-basic-auth", "http header", f"GET / HTTP/1.1\r\nAuthorization: Basic {basic}\r\n".encode(), basic),
        Sample(
            "http-basic-auth",
            "curl header, any case",
            f"curl -H 'authorization: basic {basic}' https://api.example.com\n".encode(),
            basic,
        ),
        Sample(
            "http-basic-auth",
            "json field",
            json.dumps({"headers": {"Authorization": f"Basic {basic}"}}).encode(),
            basic,
        ),
        Sample("bearer", "authorization header", b"Authorization: Bearer abcdefghijklmnop1234\n", "abcdefghijklm"),
        Sample("airlock-run-token", "run token", f"{run_token}\n".encode(), run_token),
    ]
    bad_payload = body + "x" * ((1 - len(body)) % 4 or 4)  # 4n+1 characters: no base64 has that length
    neg = [
        Sample("private-key", "public key", k["rsa-public-pem"]),
        Sample("private-key", "certificate", k["cert-pem"]),
        Sample("private-key", "pgp public key header", b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBGV\n"),
        Sample("putty-private-key", "prose", b"A .ppk file starts with PuTTY-User-Key-File-3 and a key type.\n"),
        Sample("private-key-base64", "base64 certificate", base64.b64encode(k["cert-pem"]) + b"\n"),
        Sample("private-key-der", "der public key", k["rsa-public-der"]),
        Sample("private-key-der", "der pkcs1 public key", k["rsa-pkcs1-public-der"]),
        Sample("private-key-der", "der certificate", k["cert-der"]),
        Sample("private-key-utf16", "utf-16 certificate", k["cert-pem"].decode().encode("utf-16")),
        Sample(
            "ssh2-private-key",
            "rfc 4716 public key",
            b"---- BEGIN SSH2 PUBLIC KEY ----\nComment: corpus\nAAAAB3NzaC1yc2E\n",
        ),
        Sample("private-key-der-base64", "base64 certificate", f"cert: {der_b64['cert-der']}\n".encode()),
        Sample(
            "private-key-der-base64",
            "certificate body without pem lines",
            ("\n".join(k["cert-pem"].decode().splitlines()[1:-1]) + "\n").encode(),
        ),
        Sample("private-key-der-base64", "base64 public key", f"public_key: {der_b64['rsa-public-der']}\n".encode()),
        Sample("private-key-der-base64", "base64 pkcs1 public key", f"{der_b64['rsa-pkcs1-public-der']}\n".encode()),
        Sample("private-key-der-base64", "pkcs8 opening cut short", f"v={der_b64['rsa-pkcs8-der'][:36]}\n".encode()),
        Sample("aws-access-key", "too short", b"the id AKIA12345 is truncated\n"),
        Sample("github-token", "too short", b"ghp_" + b"abc123" + b"\n"),
        Sample("gitlab-token", "too short", b"prefix glpat- only\n"),
        Sample("slack-token", "too short", b"xoxb-123\n"),
        Sample("slack-webhook", "the docs' address", b"see https://hooks.slack.com/services/ for how\n"),
        Sample("stripe-webhook-secret", "too short", b"whsec_abc123\n"),
        Sample("openai-key", "sk- in prose", b"use a task-runner, a disk-cache and keys like sk-...\n"),
        Sample("anthropic-key", "too short", b"sk-ant-xyz\n"),
        Sample("google-api-key", "too short", b"AIza" + b"Sy12" + b"\n"),
        Sample("google-oauth-secret", "too short", b"GOCSPX-" + b"abc123" + b"\n"),
        Sample("age-secret-key", "too short", (age[:-3] + "\n").encode()),
        Sample(
            "age-secret-key",
            "public key",
            b"# public key: age1" + _rand(58, 29, "qpzry9x8gf2tvdw0s3jn54khce6mua7l").encode() + b"\n",
        ),
        Sample("npm-token", "too short", (npm[:-1] + "\n").encode()),
        Sample("npm-token", "npm_ in code", b"npm_config_registry and npm_package_version\n"),
        Sample("pypi-token", "too short", b"pypi-" + b"AgEIcHlwaS5vcmc" + b"abc\n"),
        Sample("pypi-token", "prose", b"a PyPI token starts with pypi- and a base64 macaroon\n"),
        Sample("vault-token", "too short", (vault[:60] + "\n").encode()),
        Sample("vault-token", "batch token too short", (vault_batch[:100] + "\n").encode()),
        Sample("huggingface-token", "hub call", b"from huggingface_hub import hf_hub_download\n"),
        Sample("huggingface-token", "too short", (hf[:-1] + "\n").encode()),
        Sample("dockerhub-token", "too short", (docker[:-2] + "\n").encode()),
        Sample("dockerhub-token", "too long", (docker + "Zz9\n").encode()),
        Sample("sendgrid-key", "wrong shape", b"SG.abc.def\n"),
        Sample("sendgrid-key", "second part too short", (sendgrid[:-4] + "\n").encode()),
        Sample("digitalocean-token", "too short", (digitalocean[:-1] + "\n").encode()),
        Sample("digitalocean-token", "not hex", (digitalocean[:-1] + "z\n").encode()),
        Sample("shopify-token", "too short", (shopify[:-1] + "\n").encode()),
        Sample("shopify-token", "other prefix", ("shpxx_" + shopify[6:] + "\n").encode()),
        Sample("twilio-key", "too short", (twilio[:-1] + "\n").encode()),
        Sample("twilio-key", "longer hex run", (twilio + "a\n").encode()),
        Sample("twilio-key", "inside a word", ("TASK" + twilio[2:] + "\n").encode()),
        Sample("twilio-key", "placeholder", b"SK" + b"0" * 32 + b"\n"),
        Sample("stripe-key", "too short", b"sk_live_abc\n"),
        Sample("jwt", "broken payload", f"{head}.{bad_payload}.{sig}\n".encode()),
        Sample("jwt", "too short", b"eyJhbGciOi.eyJzdWIi.abc\n"),
        Sample(
            "azure-connection-string",
            "no key",
            b"DefaultEndpointsProtocol=https;AccountName=corpus;EndpointSuffix=core.windows.net\n",
        ),
        Sample("azure-connection-string", "placeholder", b"AccountKey=<your-account-key>\n"),
        Sample("url-credentials", "ssh remote", b'[remote "origin"]\n\turl = ssh://git@github.com/x.git\n'),
        Sample("url-credentials", "user only", b"https://user@git.example.com/x\n"),
        Sample("url-credentials", "port", b"http://localhost:8080/health\n"),
        Sample("url-credentials", "variable", b"https://ci:${CI_JOB_TOKEN}@git.example.com/x.git\n"),
        Sample(
            "kubeconfig-credential",
            "exec plugin",
            b"users:\n- name: eks\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n"
            b"      command: aws\n",
        ),
        Sample("kubeconfig-credential", "ci token input", b"with:\n  token: ${{ secrets.GITHUB_TOKEN }}\n"),
        Sample("pgpass", "/etc/passwd line", b"root:x:0:0:root:/root:/bin/bash\n"),
        Sample("pgpass", "bsd passwd line", b"daemon:*:1:1:System Services:/var/root:/usr/bin/false\n"),
        Sample("http-basic-auth", "prose", b"Authorization: Basic authentication is weak\n"),
        Sample(
            "http-basic-auth",
            "no colon in the credentials",
            f"Authorization: Basic {base64.b64encode(b'deploy-only-token').decode()}\n".encode(),
        ),
        Sample("http-basic-auth", "variable", b'req.Header.Set("Authorization", "Basic "+creds)\n'),
        Sample("http-basic-auth", "not a base64 length", b"Authorization: Basic dXNlcjpwYXNzw\n"),
        Sample("bearer", "prose", b"the bearer of this letter\n"),
        Sample("airlock-run-token", "too short", b"alrt_short\n"),
    ]
    return pos, neg


POSITIVES, NEGATIVES = _corpus()
ALL = known_detectors()


def _text(s: Sample) -> str:
    return s.data.decode("utf-8", "replace")


@pytest.fixture
def every_detector_policy(tmp_path: Path) -> Policy:
    """The default policy with the two detectors it leaves off turned on as well."""
    ws = tmp_path / "policy-ws"
    ws.mkdir()
    (ws / "policies.toml").write_text('[withhold]\ndetectors = ["bearer", "airlock-run-token"]\n')
    policy = load_policy(ws).policy
    assert sorted(policy.withhold.detectors) == sorted(ALL)
    return policy


def test_the_corpus_covers_every_detector_both_ways() -> None:
    assert {s.detector for s in POSITIVES} == set(ALL)
    assert {s.detector for s in NEGATIVES} == set(ALL)
    assert set(BYTE_DETECTORS) | set(DETECTORS) == set(ALL)


def test_every_default_detector_is_anchored(tmp_path: Path) -> None:
    policy = load_policy(tmp_path / "no-workspace").policy
    assert SecretScanner(policy.withhold.detectors).unanchored == []


@pytest.mark.parametrize("sample", POSITIVES, ids=lambda s: f"{s.detector}:{s.label}")
def test_each_positive_is_found_by_its_own_detector(sample: Sample) -> None:
    assert SecretScanner([sample.detector]).first_hit(sample.data) == sample.detector
    if sample.detector in DETECTORS:
        assert DETECTORS[sample.detector].search(_text(sample))


@pytest.mark.parametrize(
    "sample", [s for s in POSITIVES if s.detector in DETECTORS], ids=lambda s: f"{s.detector}:{s.label}"
)
def test_each_positive_of_a_text_detector_is_masked(sample: Sample) -> None:
    """(Detectors of bytes have nothing for the Redactor: what it masks is text.)"""
    assert sample.core
    out = Redactor().text(_text(sample))
    assert sample.core not in out and MASK in out


@pytest.mark.parametrize("sample", NEGATIVES, ids=lambda s: f"{s.detector}:{s.label}")
def test_each_near_miss_is_left_alone(sample: Sample) -> None:
    assert SecretScanner(ALL).first_hit(sample.data) is None
    text = _text(sample)
    assert not any(p.search(text) for p in DETECTORS.values())
    if sample.detector not in BYTE_DETECTORS:
        assert Redactor().text(text) == text


def test_staging_withholds_every_positive_and_copies_every_near_miss(
    tmp_path: Path, every_detector_policy: Policy
) -> None:
    ws = tmp_path / "ws"
    for i, s in enumerate(POSITIVES):
        (ws / "pos").mkdir(parents=True, exist_ok=True)
        (ws / "pos" / f"{i}.dat").write_bytes(s.data)
    for i, s in enumerate(NEGATIVES):
        (ws / "neg").mkdir(parents=True, exist_ok=True)
        (ws / "neg" / f"{i}.dat").write_bytes(s.data)
    res = stage(ws, tmp_path / "copy", every_detector_policy, Level.INTERNAL)
    withheld = {w.path: w.rule for w in res.withheld}
    for i, s in enumerate(POSITIVES):
        assert withheld.get(f"pos/{i}.dat", "").startswith("detector:"), (s.detector, s.label)
        assert not (tmp_path / "copy" / "pos" / f"{i}.dat").exists()
    for i, s in enumerate(NEGATIVES):
        assert f"neg/{i}.dat" not in withheld, (s.detector, s.label, withheld.get(f"neg/{i}.dat"))
        assert (tmp_path / "copy" / "neg" / f"{i}.dat").read_bytes() == s.data


# -- text written in UTF-16 ----------------------------------------------------------------------

_UTF16 = {
    "utf-16 with bom": lambda t: t.encode("utf-16"),
    "utf-16-le": lambda t: t.encode("utf-16-le"),
    "utf-16-be": lambda t: t.encode("utf-16-be"),
    "utf-16-be with bom, from an odd byte": lambda t: b"\n" + b"\xfe\xff" + t.encode("utf-16-be"),
    "utf-16-le among other scripts": lambda t: f"Пароль 密码 {t} ключ 키\n".encode("utf-16-le"),
    # UTF-32: rarer, but an encoder writes it as readily
    "utf-32 with bom": lambda t: t.encode("utf-32"),
    "utf-32-le": lambda t: t.encode("utf-32-le"),
    "utf-32-be, from an odd byte": lambda t: b"\n" + t.encode("utf-32-be"),
    "utf-32-le among other scripts": lambda t: f"Пароль 密码 {t} ключ 키\n".encode("utf-32-le"),
}
_TEXT_POSITIVES = [s for s in POSITIVES if s.detector in DETECTORS]


@pytest.mark.parametrize("encoding", sorted(_UTF16))
@pytest.mark.parametrize("sample", _TEXT_POSITIVES, ids=lambda s: f"{s.detector}:{s.label}")
def test_each_positive_of_a_text_detector_is_found_in_utf16(sample: Sample, encoding: str) -> None:
    """A PowerShell script or a .reg export (UTF-16, either byte order, with or without a
    byte-order mark) carries a token as surely as a UTF-8 file."""
    data = _UTF16[encoding](_text(sample))
    assert SecretScanner([sample.detector]).first_hit(data) == sample.detector


@pytest.mark.parametrize(
    "sample", [s for s in NEGATIVES if s.detector in DETECTORS], ids=lambda s: f"{s.detector}:{s.label}"
)
def test_each_near_miss_in_utf16_is_left_alone(sample: Sample) -> None:
    for encode in _UTF16.values():
        assert SecretScanner(ALL).first_hit(encode(_text(sample))) is None


@pytest.mark.parametrize("encoding", sorted(_UTF16))
def test_a_base64_der_private_key_is_found_in_utf16(encoding: str) -> None:
    """The base64 of a DER key is text: a UTF-16 file carries it as well (and a certificate or a
    public key in UTF-16 is still no private key)."""
    for s in POSITIVES:
        if s.detector == "private-key-der-base64":
            data = _UTF16[encoding](_text(s))
            assert SecretScanner([s.detector]).first_hit(data) == s.detector, s.label
    for s in NEGATIVES:
        if s.detector == "private-key-der-base64":
            assert SecretScanner(ALL).first_hit(_UTF16[encoding](_text(s))) is None, s.label


def test_binaries_with_nul_bytes_are_not_read_as_utf16() -> None:
    """Only text pays for a second reading: executables, images and packed data do not look
    like UTF-16 (their NULs come in runs, or after any byte), and a buffer without a NUL is
    never UTF-16."""
    rnd = random.Random(7)
    noise = bytes(rnd.randrange(256) for _ in range(200_000))
    elf = b"\x7fELF\x02\x01\x01" + bytes(9) + b"".join(rnd.randbytes(12) + bytes(4) for _ in range(20_000))
    ints = b"".join(n.to_bytes(4, "little") for n in range(0, 4_000_000, 97))
    for data in (noise, elf, ints, b"plain text, no NUL at all\n" * 100):
        assert utf16_texts(data) == [] and utf32_texts(data) == []
    assert len(utf16_texts("a script\r\n".encode("utf-16-le"))) == 4
    assert utf32_texts("a script\r\n".encode("utf-16-le")) == []
    assert len(utf32_texts("a script\r\n".encode("utf-32-be"))) == 8


# -- linear time ---------------------------------------------------------------------------------


def _hostile(sample: Sample, size: int = 1 << 20) -> list[bytes]:
    """Inputs that make a backtracking pattern slow: a prefix of a positive repeated, a prefix
    followed by a long run of one character of its alphabet, and runs of its separators."""
    data = sample.data
    out = []
    for cut in {len(data) // 3, len(data) // 2, max(1, len(data) - 2)}:
        part = data[:cut]
        out.append((part * (size // len(part) + 1))[:size])
        for ch in (b"A", b"0", b" ", b"\n", b"-", b":", b".", b"\x00"):
            out.append(part + ch * (size - len(part)))
    return out


@pytest.mark.parametrize("detector", ALL)
def test_every_detector_takes_linear_time_on_a_hostile_megabyte(detector: str) -> None:
    sample = next(s for s in POSITIVES if s.detector == detector)
    scanner = SecretScanner([detector])
    slowest = 0.0
    for data in _hostile(sample):
        t0 = time.perf_counter()
        if detector in DETECTORS:
            text = data.decode("utf-8", "replace")
            DETECTORS[detector].search(text)
            DETECTORS[detector].sub(MASK, text)
        elif detector == "private-key-der":
            _der_private_key(data)
        elif detector == "private-key-der-base64":
            _der_base64_private_key(data)
        else:
            _utf16_private_key(data)
        scanner.first_hit(data)
        slowest = max(slowest, time.perf_counter() - t0)
    # a bound, not a benchmark: backtracking on a megabyte takes minutes, linear work well under
    # a second even on a loaded machine (the CI's other tests run beside it)
    assert slowest < 5, f"{detector}: {slowest:.2f} s on a hostile 1 MB input"


@pytest.mark.parametrize(
    "data",
    [
        b"\nMIIBCgIBAAK" * 100_000,  # an opening on every short line
        (b"\nMIIBCgIBAAK" + b"A" * 30) * 25_000,  # on every line long enough to be decoded
        (b"\\nMC4CAQAw" + b"Q" * 40) * 20_000,  # after every escaped line break of a JSON string
        b"MIIEogIBAAKC" + b"A" * (1 << 20),  # one run of a megabyte
    ],
    ids=["short-lines", "long-lines", "json-escapes", "one-run"],
)
def test_the_base64_der_detector_reads_each_opening_a_bounded_way(data: bytes) -> None:
    t0 = time.perf_counter()
    _der_base64_private_key(data)
    SecretScanner(["private-key-der-base64"]).first_hit(data)
    assert time.perf_counter() - t0 < 5  # a bound, not a benchmark


@pytest.mark.parametrize(
    "text",
    [
        "a" * 1_000_000,  # a long run of word characters, no newline (an agent's output)
        "token" * 200_000,  # the keyword over and over, never assigned
        ("d" * 250 + "/") * 4_000,  # long path names
        "api_key" * 100_000 + "=",
        " = " * 300_000,
        "secret=" * 100_000,
    ],
    ids=["word-run", "keyword-run", "long-paths", "keyword-run-then-sep", "separators", "assignments"],
)
def test_the_redactor_as_a_whole_takes_linear_time_on_a_hostile_megabyte(text: str) -> None:
    """Every pattern of Redactor.text and Redactor.learn together (the detectors, the key =
    value assignments, the known values): was quadratic on a run of word characters."""
    red = Redactor(["Zq8-known-value-xK31"])
    t0 = time.process_time()
    red.learn(text)
    red.text(text)
    assert time.process_time() - t0 < 5  # a bound, not a benchmark: quadratic took hours on this


# -- the scanner's anchors never change a verdict --------------------------------------------------


def _full_verdict(name: str, data: bytes) -> bool:
    if name == "private-key-der":
        return _der_private_key(data)
    if name == "private-key-utf16":
        return _utf16_private_key(data)
    if name == "private-key-der-base64":  # text: in UTF-16 or UTF-32 too
        return any(_der_base64_private_key(d) for d in [data, *(t.encode() for t in wide_texts(data))])
    texts = [data.decode("utf-8", "replace"), *wide_texts(data)]
    return any(DETECTORS[name].search(text) is not None for text in texts)


_FRAGMENTS = [s.data for s in POSITIVES + NEGATIVES]
_fragment = st.sampled_from(_FRAGMENTS).flatmap(
    lambda d: st.tuples(st.integers(0, len(d)), st.integers(0, len(d))).map(lambda ij: d[min(ij) : max(ij)])
)
_filler = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(_FRAGMENTS).map(lambda d: d.decode("utf-8", "replace").encode("utf-16-le")),
    st.text(alphabet="ab -:/=\n\t\"'.@eyJLS0t", max_size=64).map(str.encode),
    st.integers(0, 3000).map(lambda n: b"x" * n),
    st.integers(0, 3000).map(lambda n: b"\n" * n),
)
_buffer = st.lists(st.one_of(_fragment, st.sampled_from(_FRAGMENTS), _filler), max_size=8).map(b"".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_buffer)
def test_scanner_verdict_equals_the_full_regex_verdict(data: bytes) -> None:
    """With Hyperscan's one pass saying which groups to search, and with `re` searching them all."""
    full = {name for name in ALL if _full_verdict(name, data)}
    for prefilter in (True, False):
        for name in ALL:
            assert (SecretScanner([name], prefilter=prefilter).first_hit(data) == name) == (name in full), name
        assert (SecretScanner(ALL, prefilter=prefilter).first_hit(data) is not None) == bool(full)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="Hyperscan's wheel is for x86-64 (pyproject.toml)")
def test_every_anchor_is_prefiltered_in_one_pass() -> None:
    """Where the project installs Hyperscan, every group of the default detectors and of a custom
    one (a prefix, or keywords in any case) is in its one pass: none falls back to `re` alone."""
    custom = [
        CustomDetector(name="corp", regex=r"corp_[a-z0-9]{20}").detector,
        CustomDetector(name="kw", regex=r"(?i)tok(en)?=[a-z0-9]{20}", keywords=["TOKEN"]).detector,
    ]
    scanner = SecretScanner(ALL, custom, prefilter=True)
    assert scanner.prefilter is not None
    assert scanner.first_hit(b"x = corp_" + b"a1" * 10) == "corp"
    assert scanner.first_hit(b"x Token=" + b"a1" * 10) == "kw"
    assert scanner.first_hit(b"x = corp_ token" + bytes(range(256)) * 100) is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(POSITIVES), st.integers(0, 1 << 16))
def test_a_positive_across_a_streaming_chunk_boundary_is_withheld(
    tmp_path_factory: pytest.TempPathFactory, every_detector_policy: Policy, sample: Sample, shift: int
) -> None:
    """Files over READ_WHOLE stream in CHUNK-sized reads scanned with an overlap: a secret that
    straddles a boundary is found (sizes shrunk so the test stays fast; the logic is the same)."""
    tmp = tmp_path_factory.mktemp("chunks")
    mp = pytest.MonkeyPatch()
    mp.setattr(staging, "READ_WHOLE", 1000)
    mp.setattr(staging, "CHUNK", 4096)
    try:
        boundary = 4096 * (1 + shift % 3)
        start = max(0, boundary - 1 - shift % max(1, len(sample.data)))
        data = b"." * start + b"\n" + sample.data + b"\n" + b"." * 9000
        (tmp / "ws").mkdir()
        (tmp / "ws" / "big.log").write_bytes(data)
        res = stage(tmp / "ws", tmp / "copy", every_detector_policy, Level.INTERNAL)
        assert [w.path for w in res.withheld] == ["big.log"]
    finally:
        mp.undo()


def test_a_secret_across_the_real_8_mib_boundary_is_withheld(tmp_path: Path, every_detector_policy: Policy) -> None:
    sample = next(s for s in POSITIVES if s.detector == "jwt")
    at = staging.READ_WHOLE - len(sample.data) // 2
    data = bytearray(b"-" * (staging.READ_WHOLE + (1 << 20)))
    data[at : at + len(sample.data)] = sample.data
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "huge.log").write_bytes(bytes(data))
    res = stage(tmp_path / "ws", tmp_path / "copy", every_detector_policy, Level.INTERNAL)
    assert [(w.path, w.rule) for w in res.withheld] == [("huge.log", "detector:jwt")]


def test_a_name_that_hits_makes_its_directorys_batch_hit() -> None:
    """The staging walk scans a directory's paths as one text, a line each, and each alone only
    when that text hits (copy.StagingWalk._names_without_secrets): every positive, as a line
    among other names, still hits."""
    scanner = SecretScanner(ALL)
    positives, _ = _corpus()
    for sample in positives:
        if b"\x00" in sample.data or sample.detector.startswith("private-key-"):
            continue  # byte detectors: a name holds no NUL
        name = sample.data.decode("utf-8", "replace")
        joined = "\n".join(["src/a.py", f"dir/{name}", "README.md"]).encode()
        assert scanner.first_hit(name.encode()) is not None, sample.detector
        assert scanner.first_hit(joined) is not None, (sample.detector, sample.label)


def _custom(regex: str, keywords: list[str]) -> list[ExtraDetector]:
    return [CustomDetector(name="corp", regex=regex, keywords=keywords).detector]


@pytest.mark.parametrize("prefilter", [True, False])
def test_a_nul_in_a_keyword_drops_no_keyword_after_it(prefilter: bool) -> None:
    """Hyperscan reads a pattern as a C string: a NUL in a keyword (TOML writes one as \\u0000)
    would end the group's pattern there and drop the keywords after it (found by the third
    attack review); it is written as an escape."""
    extra = _custom(r"(?i)(?:token|corp)=[a-z0-9]{16}", ["x\x00", "corp"])
    scanner = SecretScanner(ALL, extra, prefilter=prefilter)
    assert scanner.first_hit(b"CORP=abcdef0123456789\n") == "corp"
    assert scanner.first_hit(b"x\x00 and nothing else\n") is None


@pytest.mark.parametrize("prefilter", [True, False])
@pytest.mark.parametrize(("keyword", "written"), [("kid", "\u212aID"), ("pass", "pa\u017fs"), ("id", "\u0130D")])
def test_a_keyword_is_found_in_every_case_re_ignores(prefilter: bool, keyword: str, written: str) -> None:
    """`re` ignoring case takes KELVIN SIGN for k, LONG S for s, and dotted and dotless I for i:
    a match may hold the keyword so, and the anchor finds it there too."""
    extra = _custom(r"(?i)(?:kid|pass|id)=[a-z0-9]{16}", [keyword])
    data = f"{written}=abcdef0123456789\n".encode()
    assert SecretScanner(ALL, extra, prefilter=prefilter).first_hit(data) == "corp"


@pytest.mark.parametrize("prefilter", [True, False])
def test_a_keyword_outside_ascii_runs_its_detector_on_every_buffer(prefilter: bool) -> None:
    """No byte search finds `é` in every case (`É`): such a detector has no anchor and runs on
    every buffer, so it finds what its own regex finds."""
    extra = _custom(r"(?i)clé=[a-z0-9]{16}", ["clé"])
    scanner = SecretScanner(ALL, extra, prefilter=prefilter)
    assert "corp" in scanner.unanchored
    assert scanner.first_hit("CLÉ=abcdef0123456789\n".encode()) == "corp"


def test_a_lone_surrogate_in_a_regex_prefix_builds_a_scanner() -> None:
    """A regex may name a lone surrogate (`\\ud800`), which no decoded text holds: the scanner is
    built all the same (it raised UnicodeEncodeError), and the detector never fires."""
    extra = _custom(r"\ud800x[0-9]{4}", [])
    assert SecretScanner(ALL, extra).first_hit(b"\xed\xa0\x80x1234") is None


@pytest.mark.skipif(platform.machine() != "x86_64", reason="Hyperscan's wheel is for x86-64 (pyproject.toml)")
def test_a_pattern_hyperscan_refuses_leaves_the_other_groups_in_its_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A workspace's group past Hyperscan's limits is searched by `re` on every buffer; the
    built-in groups stay in the one pass (a policy cannot switch the prefilter off)."""
    from airlockd.staging import prefilter

    real = prefilter._hs_expression
    monkeypatch.setattr(prefilter, "_hs_expression", lambda p: b"(" if b"corp" in p.lower() else real(p))
    monkeypatch.setattr(prefilter, "PREFILTERS", {})
    scanner = SecretScanner(ALL, _custom(r"corp_[a-z0-9]{20}", []), prefilter=True)
    assert scanner.prefilter is not None and scanner.prefilter.db is not None
    refused = [i for i, g in enumerate(scanner.groups) if b"corp" in g.regex.pattern]
    assert scanner.prefilter.always == frozenset(refused)
    assert scanner.first_hit(b"x = corp_" + b"a1" * 10) == "corp"
    assert scanner.first_hit(b"x = " + b"AKIA" + b"Z" * 16) == "aws-access-key"


def test_keywords_are_bounded() -> None:
    with pytest.raises(ValueError, match="at most 100"):
        CustomDetector(name="corp", regex=r"tok=[0-9]{8}", keywords=[f"k{i}" for i in range(101)])
    with pytest.raises(ValueError, match="longer than 200"):
        CustomDetector(name="corp", regex=r"tok=[0-9]{8}", keywords=["k" * 201])


def test_the_prefilter_is_compiled_once_a_scanner_has_read_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default a scanner compiles Hyperscan's pass (some 80 ms) only past PREFILTER_AFTER bytes
    scanned, so a command that checks a few small files never pays it; once compiled in a
    process, later scanners of the same detectors have it at once."""
    from airlockd.staging import prefilter

    monkeypatch.setattr(prefilter, "PREFILTERS", {})
    monkeypatch.setattr(prefilter, "PREFILTER_AFTER", 1000)
    scanner = SecretScanner(ALL)
    assert scanner.prefilter is None
    assert scanner.first_hit(b"x" * 600) is None and scanner.prefilter is None
    assert scanner.first_hit(b"sk-" + b"Z" * 48 + b"x" * 600) == "openai-key"  # found by re
    if prefilter.hyperscan_module() is None:
        return
    assert scanner.prefilter is not None
    assert scanner.first_hit(b"x = " + b"AKIA" + b"Z" * 16) == "aws-access-key"  # found in its pass
    assert SecretScanner(ALL).prefilter is scanner.prefilter
    assert SecretScanner(ALL, prefilter=False).prefilter is None
