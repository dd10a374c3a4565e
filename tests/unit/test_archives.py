"""Archives in the workspace: opened (by magic bytes, nested), withheld when a member would be,
withheld when they cannot be scanned whole (fail closed), staged when clean; for both the copy
and the mirror (the overlay's lower layer)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import subprocess
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from airlockd.policy import Level, Policy, load_policy
from airlockd.staging.archives import ArchiveScanner, sniff
from airlockd.staging.copy import StageResult, stage
from airlockd.staging.mirror import Mirror
from airlockd.staging.secretscan import SecretScanner

AWS = "AKIA" + "Z" * 16  # an AWS access key id shape (assembled: no whole secret in this file)
ENV = f"API_TOKEN=s3cr3t-{'v' * 20}\n"


def zip_bytes(members: dict[str, bytes], *, level: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", level) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def tar_bytes(members: dict[str, bytes], mode: str = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tf:  # type: ignore[call-overload]
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


Stage = Callable[[Path, Path, Policy], StageResult]


def _copy(ws: Path, out: Path, policy: Policy) -> StageResult:
    return stage(ws, out, policy, Level.INTERNAL)


def _mirror(ws: Path, out: Path, policy: Policy) -> StageResult:
    view = Mirror(out.parent / "mirror").refresh(ws, policy, Level.INTERNAL)
    out.symlink_to(view.tree)
    return view.result


@pytest.fixture(params=["copy", "mirror"])
def stage_fn(request: pytest.FixtureRequest) -> Stage:
    return {"copy": _copy, "mirror": _mirror}[request.param]


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    return load_policy(tmp_path / "none").policy


def _rules(res: StageResult) -> dict[str, str]:
    return {w.path: w.rule for w in res.withheld}


def _staged(out: Path, rel: str) -> bool:
    return os.path.lexists(out / rel)


def test_archives_are_known_by_their_first_bytes_not_their_names() -> None:
    assert sniff(zip_bytes({"a": b"x"})) == "zip"
    assert sniff(tar_bytes({"a": b"x"})) == "tar"
    assert sniff(tar_bytes({"a": b"x"}, "w:gz")) == "gzip"
    assert sniff(tar_bytes({"a": b"x"}, "w:bz2")) == "bzip2"
    assert sniff(tar_bytes({"a": b"x"}, "w:xz")) == "xz"
    assert sniff(b"BZh is how this text starts, not a bzip2 stream") is None
    assert sniff(b"print('PK')\n") is None
    assert sniff(b"junk before " + zip_bytes({"a": b"x"})) == "zip?"  # self-extracting style


def test_withheld_members_withhold_the_archive_whatever_its_name(
    tmp_path: Path, policy: Policy, stage_fn: Stage
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "backup.zip").write_bytes(zip_bytes({"app/.env": ENV.encode(), "app/main.py": b"print(1)\n"}))
    (ws / "keys.dat").write_bytes(tar_bytes({"home/.ssh/ID_RSA": b"key material here\n"}, "w:gz"))
    (ws / "state.tar.bz2").write_bytes(tar_bytes({"infra/prod/terraform.tfstate": b"{}\n"}, "w:bz2"))
    (ws / "aws.tar.xz").write_bytes(tar_bytes({"notes.txt": f"id = {AWS}\n".encode()}, "w:xz"))
    (ws / "plain.tar").write_bytes(tar_bytes({"Sub/Cert.PEM": b"-\n"}))
    (ws / "one.gz").write_bytes(gzip.compress(f"key={AWS}\n".encode()))
    (ws / "fine.zip").write_bytes(zip_bytes({"src/a.py": b"x = 1\n", "README.md": b"# hi\n"}))
    (ws / "fine.tgz").write_bytes(tar_bytes({"src/b.py": b"y = 2\n"}, "w:gz"))
    res = stage_fn(ws, tmp_path / "out", policy)
    rules = _rules(res)
    assert rules["backup.zip"] == "archive:app/.env:withhold:.env"
    assert rules["keys.dat"] == "archive:home/.ssh/ID_RSA:withhold:.ssh/"
    assert rules["state.tar.bz2"] == "archive:infra/prod/terraform.tfstate:withhold:*.tfstate"
    assert rules["aws.tar.xz"] == "archive:notes.txt:detector:aws-access-key"
    assert rules["plain.tar"] == "archive:Sub/Cert.PEM:withhold:*.pem"
    assert rules["one.gz"] == "archive:(compressed payload):detector:aws-access-key"
    out = tmp_path / "out"
    for rel in rules:
        assert not _staged(out, rel)
    assert (out / "fine.zip").read_bytes() == (ws / "fine.zip").read_bytes()
    assert (out / "fine.tgz").read_bytes() == (ws / "fine.tgz").read_bytes()


def test_nested_archives_are_opened_to_three_levels_and_no_deeper(
    tmp_path: Path, policy: Policy, stage_fn: Stage
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    inner = zip_bytes({"deploy/id_ed25519": b"-- key --\n"})
    (ws / "nested.tar.gz").write_bytes(tar_bytes({"bundle/inner.zip": inner, "x.txt": b"x\n"}, "w:gz"))
    three = tar_bytes({"l2.zip": zip_bytes({"l3.tar": tar_bytes({"ok.txt": b"fine\n"})})}, "w:gz")
    (ws / "three.tgz").write_bytes(three)
    four = zip_bytes({"l2.zip": zip_bytes({"l3.zip": zip_bytes({"l4.zip": zip_bytes({"ok.txt": b"fine\n"})})})})
    (ws / "four.zip").write_bytes(four)
    res = stage_fn(ws, tmp_path / "out", policy)
    rules = _rules(res)
    assert rules["nested.tar.gz"] == "archive:bundle/inner.zip/deploy/id_ed25519:withhold:id_ed25519*"
    assert rules["four.zip"] == "archive-unscannable:too-deep"
    assert "three.tgz" not in rules and _staged(tmp_path / "out", "three.tgz")


def test_what_cannot_be_scanned_whole_is_withheld(tmp_path: Path, stage_fn: Stage) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "policies.toml").write_text("[withhold]\narchive_scan_mb = 2\narchive_max_members = 50\n")
    policy = load_policy(ws).policy
    (ws / "big.zip").write_bytes(zip_bytes({"zeros.bin": bytes(3 << 20)}))  # declared 3 MiB > 2
    (ws / "many.zip").write_bytes(zip_bytes({f"f{i}.txt": b"x" for i in range(60)}))
    bomb = bz2.compress(bytes(64 << 20))  # 64 MiB of zeros in a few dozen bytes
    (ws / "bomb.bz2").write_bytes(bomb)
    (ws / "corrupt.zip").write_bytes(b"PK\x03\x04" + os.urandom(200))
    (ws / "truncated.tar.gz").write_bytes(tar_bytes({"a.txt": os.urandom(5000)}, "w:gz")[:-300])
    secret = tmp_path / "secret.txt"
    secret.write_text("nothing to see\n")
    subprocess.run(["zip", "-q", "-j", "-P", "pw", str(ws / "locked.zip"), str(secret)], check=True)
    res = stage_fn(ws, tmp_path / "out", policy)
    rules = _rules(res)
    assert rules["big.zip"] == "archive-unscannable:too-big"
    assert rules["many.zip"] == "archive-unscannable:too-many-members"
    assert rules["bomb.bz2"] == "archive-unscannable:ratio"
    assert rules["corrupt.zip"] == "archive-unscannable:corrupt"
    assert rules["truncated.tar.gz"] == "archive-unscannable:corrupt"
    assert rules["locked.zip"] == "archive-unscannable:encrypted"
    for rel in rules:
        assert not _staged(tmp_path / "out", rel)


def test_a_bomb_is_stopped_early(tmp_path: Path) -> None:
    """A ratio bomb stops past RATIO_FLOOR, long before the scan budget is spent."""
    import time

    scanner = ArchiveScanner(lambda p, d: None, SecretScanner([]), str, max_bytes=4 << 30, max_members=10)
    bomb = lzma.compress(bytes(512 << 20))
    t0 = time.monotonic()
    scan = scanner.scan_bytes(bomb)
    assert scan is not None and scan.rule == "archive-unscannable:ratio"
    assert time.monotonic() - t0 < 5


def test_a_big_archive_is_judged_on_the_copy_written(tmp_path: Path, policy: Policy, stage_fn: Stage) -> None:
    """Files over 8 MiB are streamed: the archive is read back from what was written."""
    ws = tmp_path / "ws"
    ws.mkdir()
    noise = os.urandom(9 << 20)
    (ws / "big.zip").write_bytes(zip_bytes({"data.bin": noise, "cfg/.npmrc": b"//r/:_authToken=x\n"}, level=0))
    (ws / "big-ok.zip").write_bytes(zip_bytes({"data.bin": noise}, level=0))
    (ws / "big.bin").write_bytes(noise + b"PK\x05\x06")  # an end record, but not a zip
    res = stage_fn(ws, tmp_path / "out", policy)
    rules = _rules(res)
    assert rules == {"big.zip": "archive:cfg/.npmrc:withhold:.npmrc"}
    assert not _staged(tmp_path / "out", "big.zip")
    assert (tmp_path / "out" / "big-ok.zip").stat().st_size == (ws / "big-ok.zip").stat().st_size
    assert _staged(tmp_path / "out", "big.bin")


def test_a_secret_in_a_member_name_is_masked_in_the_rule(tmp_path: Path, policy: Policy, stage_fn: Stage) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    # compressed, so that the name is not in the file's own bytes (a zip's would be: a detector
    # on the archive itself withholds it first)
    (ws / "names.tgz").write_bytes(tar_bytes({f"keys/{AWS}.txt": b"nothing\n"}, "w:gz"))
    (ws / "escape.tgz").write_bytes(tar_bytes({"\x1b[31mdir/.env": b"A=1\n"}, "w:gz"))
    res = stage_fn(ws, tmp_path / "out", policy)
    rules = _rules(res)
    assert rules["names.tgz"] == "archive:keys/[REDACTED].txt:detector-in-name:aws-access-key"
    assert rules["escape.tgz"] == "archive:?[31mdir/.env:withhold:.env"
    assert AWS not in repr(res.withheld)


def test_a_member_that_is_a_withheld_files_content_withholds_the_archive_in_either_order(
    tmp_path: Path, policy: Policy, stage_fn: Stage
) -> None:
    ws = tmp_path / "ws"
    (ws / "zzz").mkdir(parents=True)
    (ws / "zzz" / ".env").write_text(ENV)  # met after the archive at the root
    (ws / "a.tar.xz").write_bytes(tar_bytes({"copy-of-settings.txt": ENV.encode()}, "w:xz"))
    (ws / "zzz" / "later.zip").write_bytes(zip_bytes({"x/y.cfg": ENV.encode()}))
    (ws / "empty.zip").write_bytes(zip_bytes({"__init__.py": b""}))
    (ws / "zzz" / "empty.env").write_text("")
    res = stage_fn(ws, tmp_path / "out", policy)
    rules = _rules(res)
    assert rules["a.tar.xz"] == "archive:copy-of-settings.txt:copy-of-withheld"
    assert rules["zzz/later.zip"] == "archive:x/y.cfg:copy-of-withheld"
    assert "empty.zip" not in rules
    assert not _staged(tmp_path / "out", "a.tar.xz") and not _staged(tmp_path / "out", "zzz/later.zip")
