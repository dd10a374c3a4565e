"""Archives in the workspace: opened (by magic bytes, nested), withheld when a member would be,
withheld when they cannot be scanned whole (fail closed), staged when clean; for both the copy
and the mirror (the overlay's lower layer)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import struct
import subprocess
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from archivekinds import LZ4_FRAME, RAR, SEVEN_ZIP, ZSTD_FRAME, ar_bytes, cpio_bytes, v7_tar_bytes

from airlockd.policy import Level, Policy, load_policy
from airlockd.staging.archiveformats import UNSUPPORTED, sniff
from airlockd.staging.archives import ArchiveScanner
from airlockd.staging.copy import stage
from airlockd.staging.mirror import Mirror
from airlockd.staging.records import StageResult
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


def test_the_other_kinds_are_known_by_their_first_bytes_and_near_misses_are_not() -> None:
    assert sniff(v7_tar_bytes({"a.txt": b"x"})) == "tar"
    assert sniff(ar_bytes({"a.o": b"x"})) == "ar"
    assert sniff(ar_bytes({"a-very-long-member-name.o": b"x"}, bsd=True)) == "ar"
    assert sniff(b"!<arch>\n") == "ar"  # empty
    for fmt in ("newc", "odc", "bin-le", "bin-be"):
        assert sniff(cpio_bytes({"a": b"x"}, fmt)) == "cpio", fmt
    assert sniff(zlib.compress(b"x")) == "zlib"
    assert [sniff(d) for d in (ZSTD_FRAME, LZ4_FRAME, SEVEN_ZIP, RAR)] == list(UNSUPPORTED)
    # texts and binaries that only start like one
    assert sniff(b"!<arch>\nis how an ar archive starts; this is prose about it.\n" * 4) is None
    assert sniff(b"!<arch" + b" and more text\n" * 40) is None
    assert sniff(b"070701 is a cpio magic, and this line is text\n" * 4) is None
    assert sniff(b"\xc7\x71" + bytes(range(200))) is None  # a binary cpio's magic, no header
    broken = bytearray(v7_tar_bytes({"a.txt": b"x"}))
    broken[0] ^= 1  # the checksum no longer adds up
    assert sniff(bytes(broken)) is None
    assert sniff(b"x = 1\n" + b"y" * 600) is None  # "x " would be a zlib header with a dictionary
    assert sniff(b"\x28\xb5\x2f\xfd\x08") is None  # a zstd frame's reserved bit set


def test_the_other_kinds_withhold_what_they_hold(tmp_path: Path, policy: Policy, stage_fn: Stage) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = ENV.encode()
    (ws / "old.tar").write_bytes(v7_tar_bytes({"conf/.env": env, "a.txt": b"fine\n"}))
    (ws / "libkeys.a").write_bytes(ar_bytes({"util.o": b"\x7fELF", "a-long-member-name.pem": b"-\n"}))
    (ws / "bsd.a").write_bytes(ar_bytes({"util.o": b"\x7fELF", "id_rsa": b"k\n"}, bsd=True))
    (ws / "bsdlong.a").write_bytes(ar_bytes({"name with spaces/.npmrc": b"k\n"}, bsd=True))
    data = tar_bytes({"etc/app/.env": env, "usr/bin/app": b"\x7fELF"}, "w:xz")
    deb = ar_bytes({"debian-binary": b"2.0\n", "control.tar.gz": tar_bytes({"control": b"Package: x\n"}, "w:gz")})
    (ws / "app.deb").write_bytes(deb)
    (ws / "pkg.deb").write_bytes(ar_bytes({"debian-binary": b"2.0\n", "data.tar.xz": data}))
    (ws / "newc.cpio").write_bytes(cpio_bytes({"home/u/.ssh/config": b"Host x\n"}))
    (ws / "odc.cpio").write_bytes(cpio_bytes({"db/.pgpass": b"h:1:d:u:p\n"}, "odc"))
    (ws / "le.cpio").write_bytes(cpio_bytes({"keys/id_ed25519": b"k\n"}, "bin-le"))
    (ws / "be.cpio").write_bytes(cpio_bytes({"keys/id_ed25519": b"k\n"}, "bin-be"))
    (ws / "initrd.img").write_bytes(gzip.compress(cpio_bytes({"etc/.env": env})))
    # a member read through a decompressed stream, whose first read may come short
    (ws / "nested.cpio.gz").write_bytes(gzip.compress(cpio_bytes({"in.tar": v7_tar_bytes({"x/.env": env})})))
    (ws / "obj.z").write_bytes(zlib.compress(f"key={AWS}\n".encode()))
    (ws / "tar.z").write_bytes(zlib.compress(tar_bytes({"a/.env": env})))
    for name, frame in zip(("a.zst", "a.lz4", "a.7z", "a.rar"), (ZSTD_FRAME, LZ4_FRAME, SEVEN_ZIP, RAR), strict=True):
        (ws / name).write_bytes(frame)
    (ws / "nested.tgz").write_bytes(tar_bytes({"x.tar.zst": ZSTD_FRAME}, "w:gz"))
    # what zlib looked like but is not, with a zip after it
    (ws / "sfx.bin").write_bytes(b"x\x9c" + b"not deflate" * 10 + zip_bytes({"app/.env": env}))
    res = stage_fn(ws, tmp_path / "out", policy)
    rules = _rules(res)
    assert rules == {
        "old.tar": "archive:conf/.env:withhold:.env",
        "libkeys.a": "archive:a-long-member-name.pem:withhold:*.pem",
        "bsd.a": "archive:id_rsa:withhold:id_rsa*",
        "bsdlong.a": "archive:name with spaces/.npmrc:withhold:.npmrc",
        "pkg.deb": "archive:data.tar.xz/etc/app/.env:withhold:.env",
        "newc.cpio": "archive:home/u/.ssh/config:withhold:.ssh/",
        "odc.cpio": "archive:db/.pgpass:withhold:.pgpass",
        "le.cpio": "archive:keys/id_ed25519:withhold:id_ed25519*",
        "be.cpio": "archive:keys/id_ed25519:withhold:id_ed25519*",
        "initrd.img": "archive:etc/.env:withhold:.env",
        "nested.cpio.gz": "archive:in.tar/x/.env:withhold:.env",
        "obj.z": "archive:(compressed payload):detector:aws-access-key",
        "tar.z": "archive:a/.env:withhold:.env",
        "a.zst": "archive-unscannable:unsupported",
        "a.lz4": "archive-unscannable:unsupported",
        "a.7z": "archive-unscannable:unsupported",
        "a.rar": "archive-unscannable:unsupported",
        "nested.tgz": "archive-unscannable:unsupported",
        "sfx.bin": "archive:app/.env:withhold:.env",
    }
    for rel in rules:
        assert not _staged(tmp_path / "out", rel)
    assert _staged(tmp_path / "out", "app.deb")


def test_texts_and_binaries_that_only_look_like_the_other_kinds_are_staged(
    tmp_path: Path, policy: Policy, stage_fn: Stage
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    near = {
        "x-marks.txt": b"x^2 + y^2 = r^2 is a circle\n",  # a zlib header that does not decompress
        "window.txt": b"XG" + b"-" * 300 + b"\n",
        "ar.md": b"!<arch>\nis how an ar archive starts.\n",
        "cpio.txt": b"070701" + b"0" * 104 + b"\nnot a name\n",
        "bin.dat": b"\xc7\x71" + bytes(range(1, 256)) * 4,
        "half.tar": v7_tar_bytes({"a.txt": b"fine\n"})[:700],
    }
    for name, data in near.items():
        (ws / name).write_bytes(data)
    (ws / "plain.a").write_bytes(ar_bytes({"util.o": b"\x7fELF" + bytes(100), "very-long-object-name.o": b"x"}))
    (ws / "plain.cpio").write_bytes(cpio_bytes({"src/a.py": b"x = 1\n"}, "odc"))
    (ws / "plain.z").write_bytes(zlib.compress(b"just some text, nothing secret\n"))
    res = stage_fn(ws, tmp_path / "out", policy)
    rules = _rules(res)
    assert rules == {"half.tar": "archive-unscannable:corrupt"}  # a tar header, then cut: fail closed
    for name in [*near, "plain.a", "plain.cpio", "plain.z"]:
        if name not in rules:
            assert (tmp_path / "out" / name).read_bytes() == (ws / name).read_bytes(), name


def test_the_other_kinds_stop_within_the_bounds() -> None:
    scanner = ArchiveScanner(lambda p, d: None, SecretScanner([]), str, max_bytes=4 << 20, max_members=10)
    many = ar_bytes({f"m{i}.o": b"x" for i in range(20)})
    big = cpio_bytes({"big.bin": bytes(5 << 20)})
    bomb = zlib.compress(bytes(64 << 20), 9)
    claims = ar_bytes({"a.o": b"x"}).replace(b"1         `", b"999999999 `")  # a size past the end
    unlimited = ArchiveScanner(lambda p, d: None, SecretScanner([]), str, max_bytes=4 << 30, max_members=10)
    verdicts = [scanner.scan_bytes(d) for d in (many, big, claims)] + [unlimited.scan_bytes(bomb)]
    assert [v and v.rule for v in verdicts] == [
        "archive-unscannable:too-many-members",
        "archive-unscannable:too-big",
        "archive-unscannable:corrupt",
        "archive-unscannable:ratio",
    ]


def test_a_member_written_in_utf16_is_scanned_as_text(tmp_path: Path, policy: Policy, stage_fn: Stage) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    script = f"$env:AWS_ACCESS_KEY_ID = '{AWS}'\r\n".encode("utf-16")
    (ws / "scripts.zip").write_bytes(zip_bytes({"deploy.ps1": script}))
    (ws / "clean.zip").write_bytes(zip_bytes({"deploy.ps1": "Write-Host 'hi'\r\n".encode("utf-16")}))
    res = stage_fn(ws, tmp_path / "out", policy)
    assert _rules(res) == {"scripts.zip": "archive:deploy.ps1:detector:aws-access-key"}
    assert _staged(tmp_path / "out", "clean.zip")


def test_what_follows_an_archives_end_is_scanned_too(tmp_path: Path, policy: Policy, stage_fn: Stage) -> None:
    """`cat clean.tar env.tar`, `cat clean.tar.gz env.tar.gz` (appending to a backup) and a gzip
    whose header names `.env` (`gzip -c .env > env.bak`) are withheld; the same archives without
    the second part, or a gzip naming a clean file, are staged (found by the attack review)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    clean = tar_bytes({"a.txt": b"hello\n"})
    env = tar_bytes({".env": ENV.encode()})
    (ws / "backup.tar").write_bytes(clean + env)
    (ws / "backup.tar.gz").write_bytes(gzip.compress(clean) + gzip.compress(env))
    named = io.BytesIO()
    with gzip.GzipFile(filename=".env", mode="wb", fileobj=named) as gz:
        gz.write(b"HOST=db.local\n")
    (ws / "env.bak").write_bytes(named.getvalue())
    fine = io.BytesIO()
    with gzip.GzipFile(filename="notes.txt", mode="wb", fileobj=fine) as gz:
        gz.write(b"HOST=db.local\n")
    (ws / "notes.gz").write_bytes(fine.getvalue())
    (ws / "clean.tar").write_bytes(clean)
    (ws / "clean.tar.gz").write_bytes(gzip.compress(clean) + gzip.compress(clean))
    rules = _rules(stage_fn(ws, tmp_path / "out", policy))
    for rel in ("backup.tar", "backup.tar.gz", "env.bak"):
        assert rules.get(rel, "").startswith("archive:.env:"), (rel, rules.get(rel))
    for rel in ("notes.gz", "clean.tar", "clean.tar.gz"):
        assert rel not in rules and _staged(tmp_path / "out", rel), rel


def _local(name: bytes, data: bytes, method: int, flags: int = 0, sizes: tuple[int, int, int] | None = None) -> bytes:
    if method == zipfile.ZIP_DEFLATED:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        data = c.compress(data) + c.flush()
    crc, packed, size = sizes if sizes is not None else (zlib.crc32(data), len(data), len(data))
    head = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, flags, method, 0, 0, crc, packed, size, len(name), 0)
    return head + name + data


def _directory(name: bytes, method: int, flags: int, crc: int, packed: int, size: int, body: bytes) -> bytes:
    fields = (20, 20, flags, method, 0, 0, crc, packed, size, len(name), 0, 0, 0, 0, 0, 0)
    cd = struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", *fields) + name
    return body + cd + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(cd), len(body), 0)


def test_a_zip_entry_hidden_where_a_reader_of_local_headers_finds_it_is_withheld(
    tmp_path: Path, policy: Policy, stage_fn: Stage
) -> None:
    """The directory names `readme.txt` only, but gives it data that holds a whole local entry
    (`.env`), which Java's ZipInputStream or bsdtar then extract: stored, with a local header that
    gives the readme's real sizes; or deflated with a data descriptor, the deflate stream ending
    before the data the directory gives it does. Withheld; a zip written with data descriptors
    (to a pipe) is staged (found by the attack review)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    readme = b"just a readme\n"
    hidden = _local(b".env", ENV.encode(), zipfile.ZIP_DEFLATED)
    claimed = readme + hidden
    stored = _local(b"readme.txt", readme, zipfile.ZIP_STORED) + hidden
    (ws / "stored.zip").write_bytes(
        _directory(b"readme.txt", 0, 0, zlib.crc32(claimed), len(claimed), len(claimed), stored)
    )
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    deflated = c.compress(readme) + c.flush()
    body = _local(b"readme.txt", b"", zipfile.ZIP_DEFLATED, flags=0x08, sizes=(0, 0, 0))[:-2] + deflated + hidden
    body += struct.pack("<4sIII", b"PK\x07\x08", zlib.crc32(readme), len(deflated) + len(hidden), len(readme))
    (ws / "deflated.zip").write_bytes(
        _directory(b"readme.txt", 8, 0x08, zlib.crc32(readme), len(deflated) + len(hidden), len(readme), body)
    )

    # a local header with a data descriptor that says deflate where the directory says stored:
    # zipfile reads one stored blob, a reader of local headers inflates the readme, then `.env`
    flagged = _local(b"readme.txt", b"", zipfile.ZIP_DEFLATED, flags=0x08, sizes=(0, 0, 0))[:-2] + deflated
    flagged += struct.pack("<4sIII", b"PK\x07\x08", zlib.crc32(readme), len(deflated), len(readme)) + hidden
    blob = flagged[30 + len(b"readme.txt") :]
    (ws / "flagged.zip").write_bytes(
        _directory(b"readme.txt", 0, 0x08, zlib.crc32(blob), len(blob), len(blob), flagged)
    )

    class Pipe(io.RawIOBase):  # unseekable: zipfile writes data descriptors
        def __init__(self) -> None:
            self.buf = b""

        def writable(self) -> bool:
            return True

        def write(self, b: Any) -> int:
            self.buf += bytes(b)
            return len(b)

    pipe = Pipe()
    with zipfile.ZipFile(pipe, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a.txt", b"hello\n" * 100)
        zf.writestr("b.txt", b"world\n" * 100)
    assert zipfile.ZipFile(io.BytesIO(pipe.buf)).infolist()[0].flag_bits & 0x08
    (ws / "piped.zip").write_bytes(pipe.buf)
    rules = _rules(stage_fn(ws, tmp_path / "out", policy))
    assert rules == {
        "stored.zip": "archive-unscannable:corrupt",
        "deflated.zip": "archive-unscannable:inconsistent-entry",
        "flagged.zip": "archive-unscannable:corrupt",
    }
    assert _staged(tmp_path / "out", "piped.zip")
