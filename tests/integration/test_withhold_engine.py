"""Withheld means absent, against the real engine and both stagers: a workspace with secrets at
odd spellings and depths, hard links and copies of them, archives holding them (nested), and a
secret in a file name; the agent hunts for them across `/workspace` (grep, tar, and Python
opening every archive it finds, nested, and every compressed stream) and finds none, while the
same hunt does find a harmless marker planted the same ways (so the hunt itself works)."""

from __future__ import annotations

import io
import os
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

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
import bz2, gzip, io, lzma, os, re, tarfile, zipfile
CANARY = "LEAK" + "CANARY"
SEEN = "HUNT" + "CAN-SEE"
KEYNAME = re.compile(r"AKIA[A-Z0-9]{16}")
found, seen = [], []

def look(where, name, data, depth=0):
    if KEYNAME.search(name):
        found.append(("name", where))
    if CANARY.encode() in data:
        found.append(("content", where))
    if SEEN.encode() in data:
        seen.append(where)
    if depth > 6:
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
    for opener in (gzip.decompress, bz2.decompress, lzma.decompress):
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
    # the positive controls: the same shapes, nothing withheld in them
    _write(ws, "fine.tar.gz", _tar({"inner/fine.zip": _zip({"ok.txt": SEEN.encode()})}, "w:gz"))
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
    withheld = {w["path"]: w["rule"] for w in rec.withheld}
    assert withheld["a-link.txt"] == "hardlink-of-withheld"
    assert withheld["backup/settings.txt"] == "copy-of-withheld"
    assert withheld["data.zip"] == "archive:conf/settings.cfg:copy-of-withheld"
    assert withheld["bundle.tar.gz"] == "archive:inner/deploy.zip/app/.env:withhold:.env"
    assert withheld["names/key-[REDACTED].txt"] == "detector-in-name:aws-access-key"
    assert AWS not in repr(rec.model_dump())
