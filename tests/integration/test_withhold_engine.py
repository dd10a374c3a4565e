"""Withheld means absent, against the real engine and both stagers: a workspace with secrets at
odd spellings and depths, hard links and copies of them, archives holding them (nested), and a
secret in a file name; the agent hunts for them across `/workspace` (grep, tar, and Python
opening every archive it finds, nested, and every compressed stream) and finds none, while the
same hunt does find a harmless marker planted the same ways (so the hunt itself works). The
archives are of every kind the scanner knows (zip, tar and v7 tar, ar and .deb, cpio, gzip / xz /
zlib streams) or withholds unopened (zstd), and one secret is written in UTF-16."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import textwrap
import zipfile
import zlib
from pathlib import Path

import pytest
from archivekinds import ZSTD_FRAME, ar_bytes, cpio_bytes, v7_tar_bytes

from airlockd.records import RunState
from airlockd.runs.service import Service
from airlockd.staging.stagers import proposed_path

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

POLICY = textwrap.dedent(
    """
    [agents.hunter]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    [agents.hunter.limits]
    wall_time_s = 120
    """
)
CANARY = "LEAK" + "CANARY"  # in every planted secret value; never in a staged file
SEEN = "HUNT" + "CAN-SEE"  # planted the same ways in files that may be staged
AWS = "AKIA" + "C" * 16

HUNT = r"""
set -u
cd /workspace
python3 - > hunt.txt 2>&1 <<'EOF'
import bz2, gzip, io, lzma, os, re, tarfile, zipfile, zlib
CANARY = "LEAK" + "CANARY"
SEEN = "HUNT" + "CAN-SEE"
KEYNAME = re.compile(r"AKIA[A-Z0-9]{16}")
found, seen = [], []

def ar_members(data):
    at = 8
    while at + 60 <= len(data):
        size = int(data[at + 48 : at + 58])
        yield data[at : at + 16].decode().strip().rstrip("/"), data[at + 60 : at + 60 + size]
        at += 60 + size + size % 2

def look(where, name, data, depth=0):
    if KEYNAME.search(name):
        found.append(("name", where))
    if any(CANARY.encode(c) in data for c in ("utf-8", "utf-16-le", "utf-16-be")):
        found.append(("content", where))
    if SEEN.encode() in data:
        seen.append(where)
    if depth > 6:
        return
    if data.startswith(b"!<arch>\n"):
        for n, member in ar_members(data):
            look(where + "!" + n, n, member, depth + 1)
        return
    bio = io.BytesIO(data)
    try:
        if zipfile.is_zipfile(bio):
            with zipfile.ZipFile(bio) as zf:
                for info in zf.infolist():
                    look(where + "!" + info.filename, info.filename, zf.read(info), depth + 1)
            return
    except Exception:
        pass
    for opener in (gzip.decompress, bz2.decompress, lzma.decompress, zlib.decompress):
        try:
            look(where + "!~", "", opener(data), depth + 1)
            return
        except Exception:
            pass
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            for m in tf.getmembers():
                f = tf.extractfile(m) if m.isreg() else None
                look(where + "!" + m.name, m.name, f.read() if f else b"", depth + 1)
    except Exception:
        pass

for top, dirs, files in os.walk("/workspace"):
    for n in dirs + files:
        path = os.path.join(top, n)
        if KEYNAME.search(n):
            found.append(("name", path))
        if n in files and not os.path.islink(path) and n != "hunt.txt":
            with open(path, "rb") as fh:
                look(path, n, fh.read())
for kind, where in found:
    print("LEAK-FOUND", kind, where)
for where in seen:
    print("SEEN", where)
print("HUNT-DONE")
EOF
grep -rl "$(printf 'LEAK%s' CANARY)" /workspace --exclude=hunt.txt >/dev/null && echo LEAK-FOUND grep >> hunt.txt
for f in $(find /workspace -type f ! -name hunt.txt); do
  tar -xOf "$f" 2>/dev/null | grep -q "$(printf 'LEAK%s' CANARY)" && echo "LEAK-FOUND tar $f" >> hunt.txt
done
true
"""


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _tar(members: dict[str, bytes], mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:  # type: ignore[call-overload]
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _write(ws: Path, rel: str, data: str | bytes) -> None:
    p = ws / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "project"
    _write(ws, "policies.toml", POLICY)
    _write(ws, "src/app.py", "print('hi')\n")
    env = f"TOKEN={CANARY}-env-0123456789\n"
    _write(ws, "zz/.env", env)
    _write(ws, "sub/.ENV", f"KEY={CANARY}-upper-9876543210\n")
    _write(ws, "deep/a/b/.docker/config.json", f'{{"auth": "{CANARY}-docker-5555"}}\n')
    _write(ws, "keys/ID_RSA", f"PRIV={CANARY}-idrsa-4444\n")
    _write(ws, "ops/prod.env", f"PASS={CANARY}-prodenv-3333\n")
    _write(ws, "infra/terraform.tfstate", f'{{"password": "{CANARY}-tf-2222"}}\n')
    os.link(ws / "zz/.env", ws / "a-link.txt")  # met before zz/.env
    _write(ws, "backup/settings.txt", (ws / "sub/.ENV").read_bytes())
    _write(ws, f"names/key-{AWS}.txt", "harmless content\n")
    inner = _zip({"app/.env": f"T={CANARY}-inzip-1111\n".encode(), "ok.txt": SEEN.encode()})
    _write(ws, "bundle.tar.gz", _tar({"inner/deploy.zip": inner}, "w:gz"))
    _write(ws, "data.zip", _zip({"conf/settings.cfg": env.encode()}))  # a withheld file's bytes
    _write(ws, "stuff.tar.xz", _tar({"notes.txt": f"id = {AWS}\n".encode()}, "w:xz"))
    # the kinds the standard library does not open, and a token written in UTF-16
    _write(ws, "old.tar", v7_tar_bytes({"conf/.env": f"K={CANARY}-v7tar-1212\n".encode()}))
    _write(ws, "libx.a", ar_bytes({"x.o": b"\x7fELF", "a-long-member-name.env": f"{CANARY}-ar\n".encode()}))
    data = _tar({"etc/app/.env": f"P={CANARY}-deb-3434\n".encode()}, "w:xz")
    _write(ws, "pkg.deb", ar_bytes({"debian-binary": b"2.0\n", "data.tar.xz": data}))
    _write(ws, "initrd.img", gzip.compress(cpio_bytes({"etc/.env": f"Q={CANARY}-cpio-5656\n".encode()})))
    _write(ws, "keys.cpio", cpio_bytes({"home/u/.ssh/id_rsa": f"{CANARY}-odc\n".encode()}, "odc"))
    _write(ws, "object.bin", zlib.compress(f"key = {AWS} {CANARY}-zlib\n".encode()))
    _write(ws, "cache.zst", ZSTD_FRAME)
    _write(ws, "setup.ps1", f"$env:AWS_ACCESS_KEY_ID = '{AWS}' # {CANARY}-utf16\r\n".encode("utf-16"))
    # the positive controls: the same shapes, nothing withheld in them
    _write(ws, "fine.tar.gz", _tar({"inner/fine.zip": _zip({"ok.txt": SEEN.encode()})}, "w:gz"))
    control = _tar({"ok.txt": SEEN.encode()}, "w:gz")
    _write(ws, "fine.deb", ar_bytes({"debian-binary": b"2.0\n", "data.tar.gz": control}))
    _write(ws, "fine.z", zlib.compress(f"{SEEN}\n".encode()))
    _write(ws, "notes.txt", "x^2 is not a zlib stream\n")
    _write(ws, "plain.txt", f"{SEEN}\n")
    return ws


@pytest.mark.parametrize("stager", ["overlay", "copy"], indirect=True)
def test_the_agent_finds_no_withheld_value_anywhere(ws: Path, stager: str) -> None:
    svc = Service(ws)
    rec = svc.execute(svc.submit("hunter", HUNT).id)
    assert rec.state is RunState.PROPOSED, rec.transitions[-1]
    assert rec.stager == stager
    report = proposed_path(svc.state.run_dir(rec.id), "hunt.txt").read_text()
    assert "HUNT-DONE" in report, report
    assert "LEAK-FOUND" not in report, report
    seen = [line for line in report.splitlines() if line.startswith("SEEN")]
    assert any("fine.tar.gz!" in s and s.endswith("ok.txt") for s in seen), report
    assert any(s.endswith("plain.txt") for s in seen), report
    assert any("fine.deb!data.tar.gz!~!ok.txt" in s for s in seen), report
    assert any(s.endswith("fine.z!~") for s in seen), report
    withheld = {w["path"]: w["rule"] for w in rec.withheld}
    assert withheld["a-link.txt"] == "hardlink-of-withheld"
    assert withheld["backup/settings.txt"] == "copy-of-withheld"
    assert withheld["data.zip"] == "archive:conf/settings.cfg:copy-of-withheld"
    assert withheld["bundle.tar.gz"] == "archive:inner/deploy.zip/app/.env:withhold:.env"
    assert withheld["names/key-[REDACTED].txt"] == "detector-in-name:aws-access-key"
    assert withheld["old.tar"] == "archive:conf/.env:withhold:.env"
    assert withheld["libx.a"] == "archive:a-long-member-name.env:withhold:*.env"
    assert withheld["pkg.deb"] == "archive:data.tar.xz/etc/app/.env:withhold:.env"
    assert withheld["initrd.img"] == "archive:etc/.env:withhold:.env"
    assert withheld["keys.cpio"] == "archive:home/u/.ssh/id_rsa:withhold:.ssh/"
    assert withheld["object.bin"] == "archive:(compressed payload):detector:aws-access-key"
    assert withheld["cache.zst"] == "archive-unscannable:unsupported"
    assert withheld["setup.ps1"] == "detector:aws-access-key"
    assert not {"fine.deb", "fine.z", "notes.txt"} & set(withheld)
    assert AWS not in repr(rec.model_dump())
