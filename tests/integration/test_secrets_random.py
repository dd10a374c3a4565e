"""Secrets in random formats, places, names, depths, cases and archive nestings never reach the
agent's copy, and appear in nothing airlockd prints or stores (hypothesis, the real engine, the
stager under test).

Each example plants 1 to 4 secrets in a fresh git workspace, each drawn as: a format (cloud and
forge tokens, a JWT, a PEM or PuTTY private key, URL credentials, an Azure connection string, a
.pgpass line; the random core is what must never appear), and a place: a file with a withheld name
(in any case, in a random folder), an ordinary-looking file whose content carries it (in UTF-8 or
UTF-16), a member of an archive (zip, tar, tar.gz, tar.bz2, tar.xz, a v7 tar, ar, cpio, cpio.gz, a
zlib stream) nested 1 to 3 deep under an innocent name, a file whose name is the secret, or a file
committed once and deleted since (history). The agent in the container then hunts: it prints every
file's bytes, every archive's listing, the whole history (`git log --all -p`, every object), and
exits. Every secret's core is then searched in the agent's output, the run's withheld list (masked),
every CLI output, and every file under the state directory (gzip files decompressed).
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import os
import string
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import zipfile
import zlib
from pathlib import Path

import pytest
from archivekinds import ar_bytes, cpio_bytes, v7_tar_bytes
from daemons import end_daemons
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airlockd.redact import shannon_entropy

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

POLICY = textwrap.dedent(
    """
    [agents.hunter]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    [agents.hunter.limits]
    wall_time_s = 60
    output_bytes = 50_000_000
    """
)
HUNT = (
    "cd /workspace; find . -type f -print; find . -type f -exec cat {} + 2>/dev/null; "
    "for f in $(find . -type f); do tar -tvf $f 2>/dev/null; python3 -m zipfile -l $f 2>/dev/null; done; "
    "git log --all -p 2>/dev/null; "
    "find .git/objects -type f -exec python3 -c "
    '\'import sys,zlib; [print(zlib.decompress(open(p,"rb").read())) for p in sys.argv[1:] if "/pack/" not in p]\''
    " {} + 2>/dev/null; "
    "for p in .git/objects/pack/*.pack; do git verify-pack -v $p 2>/dev/null; done; true"
)
ALNUM = string.ascii_letters + string.digits
CORE = st.text(ALNUM, min_size=36, max_size=36).filter(lambda s: shannon_entropy(s[:16]) >= 3.5)  # never a hash's zeros

# format name -> (the secret's text around its core, whether it may be a file name)
FORMATS = {
    "aws": (lambda c: "AKIA" + c[:16].upper(), True),
    "github": (lambda c: "ghp_" + c, True),
    "gitlab": (lambda c: "glpat-" + c[:24], True),
    "slack": (lambda c: "xoxb-1234567890-" + c[:20], True),
    "openai": (lambda c: "sk-proj-" + c, True),
    "anthropic": (lambda c: "sk-ant-api03-" + c, True),
    "stripe": (lambda c: "sk_live_" + c[:28], True),
    "pem": (lambda c: f"-----BEGIN RSA PRIVATE KEY-----\nMIIE{c}\n-----END RSA PRIVATE KEY-----\n", False),
    "pem-lower": (lambda c: f"-----begin private key-----\nMIIE{c}\n-----end private key-----\n", False),
    "ppk": (
        lambda c: (
            "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: x\nPublic-Lines: 1\nAAAA\n"
            f"Private-Lines: 1\n{c}\nPrivate-MAC: {'ab' * 32}\n"
        ),
        False,
    ),
    "url": (lambda c: f"https://deploy:{c}@git.example.com/team/repo.git\n", False),
    "azure": (lambda c: f"DefaultEndpointsProtocol=https;AccountName=x;AccountKey={c}==;\n", False),
    "pgpass": (lambda c: f"db.example.com:5432:app:admin:{c}\n", False),
}
CORES = {  # the part of each format that must never appear (what a format keeps of the core)
    "aws": lambda c: c[:16].upper(),
    "gitlab": lambda c: c[:24],
    "slack": lambda c: c[:20],
    "stripe": lambda c: c[:28],
}
WITHHELD_NAMES = [".env", ".ENV", "prod.env", "id_rsa", "ID_RSA", "cert.PEM", "key.Pem", ".npmrc", "_netrc", ".Pgpass"]
INNOCENT = ["notes.txt", "README.md", "data.json", "config.yaml", "main.py"]
FOLDERS = ["", "src", "Deep/er/still/deeper", "sub/.docker", "A/b/C"]
ARCHIVES = ["zip", "tar", "tar.gz", "tar.bz2", "tar.xz", "tar-v7", "ar", "cpio", "cpio.gz", "zlib"]


@st.composite
def plantings(draw: st.DrawFn) -> list[dict[str, object]]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        fmt = draw(st.sampled_from(sorted(FORMATS)))
        make, nameable = FORMATS[fmt]
        places = ["withheld-name", "content", "utf16", "archive", "history"] + (["name"] if nameable else [])
        core = draw(CORE)
        out.append(
            {
                "i": i,
                "format": fmt,
                "text": make(core),
                "core": CORES.get(fmt, lambda c: c)(core),
                "place": draw(st.sampled_from(places)),
                "folder": draw(st.sampled_from(FOLDERS)),
                "name": draw(st.sampled_from(WITHHELD_NAMES)),
                "innocent": draw(st.sampled_from(INNOCENT)),
                "nesting": draw(st.lists(st.sampled_from(ARCHIVES), min_size=1, max_size=3)),
            }
        )
    return out


def _archive(kind: str, name: str, data: bytes) -> bytes:
    """An archive of `kind` holding `name` with `data` (a zlib stream: `data` alone)."""
    other = {
        "tar-v7": lambda: v7_tar_bytes({name: data}),
        "ar": lambda: ar_bytes({name: data}),
        "cpio": lambda: cpio_bytes({name: data}),
        "cpio.gz": lambda: gzip.compress(cpio_bytes({name: data})),
        "zlib": lambda: zlib.compress(data),
    }
    if kind in other:
        return other[kind]()
    buf = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(name, data)
        return buf.getvalue()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    return {"tar": raw, "tar.gz": gzip.compress(raw), "tar.bz2": bz2.compress(raw), "tar.xz": lzma.compress(raw)}[kind]


def _git(ws: Path, *argv: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    subprocess.run(["git", "-C", str(ws), *argv], check=True, capture_output=True, env=env)


def _plant(ws: Path, secrets: list[dict[str, object]]) -> dict[str, str]:
    """Writes the workspace; returns path -> place of every planted file that must be absent."""
    absent: dict[str, str] = {}
    later: list[tuple[Path, str]] = []
    for s in secrets:
        folder = Path(str(s["folder"]))
        text = str(s["text"]).encode()
        place = s["place"]
        if place == "withheld-name":
            rel = folder / f"w{s['i']}" / str(s["name"])
        elif place == "content":
            rel = folder / f"c{s['i']}" / str(s["innocent"])
        elif place == "utf16":  # a PowerShell script, a .reg export
            rel = folder / f"u{s['i']}" / str(s["innocent"])
            text = text.decode().encode("utf-16")
        elif place == "name":
            rel = folder / f"n{s['i']}" / f"{s['text']}.txt"
            text = b"nothing secret in here\n"
        elif place == "archive":
            data, member = text, str(s["innocent"])
            for depth, kind in enumerate(s["nesting"]):  # type: ignore[arg-type]
                data = _archive(str(kind), member, data)
                member = f"inner{depth}.{kind}"
            rel = folder / f"a{s['i']}" / f"bundle.{s['nesting'][-1]}"  # type: ignore[index]
        else:  # history: committed once, deleted since
            rel = folder / f"h{s['i']}" / "settings.txt"
            later.append((ws / rel, rel.as_posix()))
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_bytes(text)
        if place != "history":
            absent[rel.as_posix()] = str(place)
    (ws / "policies.toml").write_text(POLICY)
    (ws / "app.py").write_text("print('hi')\n")
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "add", "-A")
    _git(ws, "commit", "-q", "-m", "first")
    for path, _ in later:
        path.unlink()
    _git(ws, "add", "-A")
    _git(ws, "commit", "-q", "--allow-empty", "-m", "remove the settings")
    _git(ws, "gc", "-q")  # the history in a packfile too
    return absent


def _cli(ws: Path, state: Path, out: list[str], *argv: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "airlockd", "--workspace", str(ws), *argv],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "AIRLOCK_STATE_DIR": str(state)},
    )
    out += [proc.stdout, proc.stderr]
    return proc


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(secrets=plantings())
def test_random_secrets_never_reach_the_agent_nor_anything_airlockd_wrote(
    _state_dir: Path, stager: str | None, secrets: list[dict[str, object]]
) -> None:
    root = Path(tempfile.mkdtemp(prefix="planted-", dir=_state_dir))
    state = root / "state"
    try:
        ws = root / "project"
        ws.mkdir()
        absent = _plant(ws, secrets)
        out: list[str] = []
        proc = _cli(ws, state, out, "--json", "run", "--agent", "hunter", "--wait", HUNT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        run = json.loads(proc.stdout)
        assert run["state"] in ("proposed", "applied"), run
        log = next(state.glob(f"*/runs/{run['id']}/output.log")).read_text(errors="replace")
        listed = {line[2:] for line in log.splitlines() if line.startswith("./")}
        for path in absent:
            assert path not in listed, (path, absent[path])
        assert "app.py" in listed  # the hunt really ran over the copy
        for argv in (["show", run["id"]], ["runs"], ["audit"], ["diff", run["id"]]):
            assert _cli(ws, state, out, *argv).returncode == 0
            assert _cli(ws, state, out, "--json", *argv).returncode == 0
        for s in secrets:
            core = str(s["core"])
            assert core not in log, s
            for i, text in enumerate(out):
                assert core not in text, (s, i, text[:2000])
            for p in state.rglob("*"):
                assert core not in str(p), (s, p)
                if p.is_file() and not p.is_symlink():
                    data = p.read_bytes()
                    if data[:2] == b"\x1f\x8b":
                        data = gzip.decompress(data)
                    assert core.encode() not in data, (s, p)
    finally:
        end_daemons(state)
