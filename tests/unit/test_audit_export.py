"""Tamper evidence of the audit log, and signed exports verified with the public key alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from airlockd.cli import main
from airlockd.evidence import signing
from airlockd.evidence.audit import AuditLog
from airlockd.redact import Redactor

N = 6


@pytest.fixture
def log(tmp_path: Path) -> AuditLog:
    log = AuditLog(tmp_path / "audit.jsonl", Redactor(), fsync=False)
    for i in range(N):
        log.append("event", run=f"r{i % 2}", agent="bot", policy="rev", n=i)
    assert log.verify() is None
    return log


def _lines(log: AuditLog) -> list[bytes]:
    return log.path.read_bytes().splitlines(keepends=True)


def _tamper(log: AuditLog, lines: list[bytes]) -> tuple[int, int | None] | None:
    log.path.write_bytes(b"".join(lines))
    brk = log.verify()
    return (brk.line, brk.seq) if brk else None


@pytest.mark.parametrize("i", range(N))
@pytest.mark.parametrize("field", ["data", "kind", "at", "run", "agent", "policy", "seq"])
def test_editing_any_field_of_any_event_is_named(log: AuditLog, i: int, field: str) -> None:
    lines = _lines(log)
    ev = json.loads(lines[i])
    ev[field] = {"n": 99} if field == "data" else (ev[field] + 1 if isinstance(ev[field], int | float) else "x")
    lines[i] = (json.dumps(ev) + "\n").encode()
    assert _tamper(log, lines) is not None
    assert _tamper(log, lines)[0] == i + 1  # type: ignore[index]


@pytest.mark.parametrize("i", range(N))
def test_an_edit_that_recomputes_its_own_hash_is_caught_by_the_next_event_or_the_head(log: AuditLog, i: int) -> None:
    from airlockd.evidence.chain import digest as chain_digest

    lines = _lines(log)
    ev = json.loads(lines[i])
    ev["data"]["n"] = 42
    ev["hash"] = chain_digest(ev)
    lines[i] = (json.dumps(ev) + "\n").encode()
    brk = _tamper(log, lines)
    assert brk is not None and brk[0] == min(i + 2, N)


@pytest.mark.parametrize("i", range(N))
def test_deleting_any_event_is_named(log: AuditLog, i: int) -> None:
    lines = _lines(log)
    brk = _tamper(log, lines[:i] + lines[i + 1 :])
    assert brk is not None
    assert brk[0] == i + 1  # the event now at the deleted one's place (or the end, for the last)


@pytest.mark.parametrize("i", range(N + 1))
def test_inserting_an_event_anywhere_is_named(log: AuditLog, i: int) -> None:
    lines = _lines(log)
    forged = json.loads(lines[max(0, i - 1)])
    forged["data"] = {"n": "forged"}
    brk = _tamper(log, [*lines[:i], (json.dumps(forged) + "\n").encode(), *lines[i:]])
    assert brk is not None and brk[0] == i + 1


@pytest.mark.parametrize("i", range(N + 1))
def test_inserting_a_copy_anywhere_is_named(log: AuditLog, i: int) -> None:
    lines = _lines(log)
    copy = lines[i - 1] if i else lines[1]  # a genuine event, out of its place
    brk = _tamper(log, [*lines[:i], copy, *lines[i:]])
    assert brk is not None and brk[0] == i + 1


@pytest.mark.parametrize("i", range(N - 1))
def test_swapping_any_two_neighbours_is_named(log: AuditLog, i: int) -> None:
    lines = _lines(log)
    lines[i], lines[i + 1] = lines[i + 1], lines[i]
    assert _tamper(log, lines) == (i + 1, i + 1)


def test_a_well_formed_event_appended_afterwards_is_caught_by_the_head(log: AuditLog) -> None:
    from airlockd.evidence.chain import digest as chain_digest

    lines = _lines(log)
    last = json.loads(lines[-1])
    ev = {**last, "seq": N, "prev": last["hash"], "data": {"n": "appended"}}
    ev["hash"] = chain_digest(ev)
    brk = _tamper(log, [*lines, (json.dumps(ev) + "\n").encode()])
    assert brk == (N + 1, N)


def test_appends_after_verification_keep_the_chain(log: AuditLog) -> None:
    log.append("more", n=1)
    assert log.verify() is None
    assert sum(1 for _ in log.events()) == N + 1


def _ws(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "policies.toml").write_text('[agents.bot]\ncommand = ["true"]\n')
    return ws


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object] | list[object]]:
    capsys.readouterr()
    code = main(["--json", *argv])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def _svc_log(ws: Path) -> AuditLog:
    from airlockd.runs.service import Service

    svc = Service(ws)
    svc.release("bot")
    svc.release("bot")
    svc.release("bot")
    return svc.audit


def test_cli_verify_names_the_first_bad_event(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = _ws(tmp_path)
    audit = _svc_log(ws)
    code, out = _cli(capsys, "--workspace", str(ws), "audit", "--verify")
    assert code == 0 and isinstance(out, dict) and out["ok"] is True
    lines = audit.path.read_bytes().splitlines(keepends=True)
    ev = json.loads(lines[1])
    ev["data"]["by"] = "someone else"
    lines[1] = (json.dumps(ev) + "\n").encode()
    audit.path.write_bytes(b"".join(lines))
    code, out = _cli(capsys, "--workspace", str(ws), "audit", "--verify")
    assert code == 1
    assert isinstance(out, dict) and out["line"] == 2 and out["seq"] == 1
    assert "line 2 (seq 1)" in str(out["message"]) and "edited" in str(out["message"])
    capsys.readouterr()
    assert main(["--workspace", str(ws), "audit", "--verify"]) == 1
    assert "line 2 (seq 1)" in capsys.readouterr().err


@pytest.fixture
def exported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path, Path]:
    ws = _ws(tmp_path)
    _svc_log(ws)
    dest = tmp_path / "out" / "audit-export.jsonl"
    dest.parent.mkdir()
    code, out = _cli(capsys, "--workspace", str(ws), "audit", "--export", str(dest))
    assert code == 0 and isinstance(out, dict) and out["events"] >= 3
    code, pk = _cli(capsys, "--workspace", str(ws), "audit", "--public-key")
    assert code == 0 and isinstance(pk, dict)
    pub = tmp_path / "out" / "audit.pub"
    pub.write_text(str(pk["public_key"]))
    return ws, dest, pub


def test_signing_key_is_private_and_stable(
    exported: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from airlockd.state import StateDir

    ws, _, pub = exported
    key = StateDir.for_workspace(ws).root / signing.KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600
    capsys.readouterr()
    assert main(["--workspace", str(ws), "audit", "--public-key"]) == 0
    assert capsys.readouterr().out == pub.read_text()


def test_export_verifies_with_the_public_key_alone(exported: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, dest, pub = exported
    # Another machine: no state directory, no workspace, only the export, its signature and the key.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for f in (dest, signing.sig_path(dest), pub):
        shutil.copy(f, elsewhere / f.name)
    empty_state = tmp_path / "no-state"
    env = {**os.environ, "AIRLOCK_STATE_DIR": str(empty_state)}
    proc = subprocess.run(
        [sys.executable, "-m", "airlockd", "audit", "--verify-export", dest.name, "--public-key-file", pub.name],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "export verified" in proc.stdout
    assert not empty_state.exists()  # it needed nothing of a state directory


def test_export_verifies_with_openssl(exported: tuple[Path, Path, Path]) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl")
    _, dest, pub = exported
    sig = str(signing.sig_path(dest))
    proc = subprocess.run(
        ["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(pub), "-rawin", "-in", str(dest), "-sigfile", sig],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "Signature Verified Successfully" in proc.stdout, proc.stdout + proc.stderr


def test_export_verifies_with_the_documented_python_one_liner(exported: tuple[Path, Path, Path]) -> None:
    _, dest, pub = exported
    one_liner = (
        "import sys;from cryptography.hazmat.primitives.serialization import load_pem_public_key as L;"
        "f=sys.argv[1];L(open(sys.argv[2],'rb').read()).verify(open(f+'.sig','rb').read(),open(f,'rb').read());"
        "print('OK')"
    )
    proc = subprocess.run([sys.executable, "-c", one_liner, str(dest), str(pub)], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stderr


@pytest.mark.parametrize("how", ["edit", "delete", "truncate", "append", "other-key"])
def test_a_modified_export_fails(
    exported: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    _, dest, pub = exported
    data = dest.read_bytes()
    lines = data.splitlines(keepends=True)
    if how == "edit":
        dest.write_bytes(data.replace(b'"by":"cli"', b'"by":"eve"', 1))
    elif how == "delete":
        dest.write_bytes(b"".join(lines[:1] + lines[2:]))
    elif how == "truncate":
        dest.write_bytes(b"".join(lines[:-1]))
    elif how == "append":
        dest.write_bytes(data + lines[-1])
    else:
        other = Ed25519PrivateKey.generate()
        pub.write_text(signing.public_pem(other))
    assert dest.read_bytes() != data or how == "other-key"
    code, out = _cli(capsys, "audit", "--verify-export", str(dest), "--public-key-file", str(pub))
    assert code == 1
    assert isinstance(out, dict) and "NOT verified" in str(out["message"])


def test_a_re_signed_but_broken_chain_still_fails(exported: tuple[Path, Path, Path]) -> None:
    """Whoever holds the key could sign anything; the chain inside is still checked."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    _, dest, _ = exported
    key = Ed25519PrivateKey.generate()
    lines = dest.read_bytes().splitlines(keepends=True)
    data = b"".join(lines[:1] + lines[2:])
    dest.write_bytes(data)
    signing.sig_path(dest).write_bytes(key.sign(data))
    check = signing.verify_export(dest, key.public_key())
    assert not check.ok and check.brk is not None and check.brk.line == 2


def test_raw_base64_public_key_is_accepted(exported: tuple[Path, Path, Path]) -> None:
    import base64

    from cryptography.hazmat.primitives import serialization

    _, dest, pub = exported
    key = signing.load_public_key(pub.read_bytes())
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert signing.verify_export(dest, signing.load_public_key(base64.b64encode(raw))).ok


def test_export_refuses_a_broken_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = _ws(tmp_path)
    audit = _svc_log(ws)
    lines = audit.path.read_bytes().splitlines(keepends=True)
    audit.path.write_bytes(b"".join(lines[:1] + lines[2:]))
    code, out = _cli(capsys, "--workspace", str(ws), "audit", "--export", str(tmp_path / "x.jsonl"))
    assert code == 1 and "not exported" in str(out["message"])  # type: ignore[call-overload]
    assert not (tmp_path / "x.jsonl").exists()
