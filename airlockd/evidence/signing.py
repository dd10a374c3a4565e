"""Signed audit exports: an Ed25519 key kept in the state directory, detached signatures.

The private key never leaves the state directory (0600, created on first use). An export is the
audit log's lines, byte for byte, plus `FILE.sig`: the raw 64-byte Ed25519 signature over the
exact bytes of FILE. Verifying needs only the public key: `verify_export` here, or
`openssl pkeyutl -verify -pubin -inkey KEY.pub -rawin -in FILE -sigfile FILE.sig`.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from airlockd.errors import AirlockError, UsageError
from airlockd.evidence.audit import AuditLog, ChainBreak, checkpoint_message, verify_lines
from airlockd.fsutil import atomic_write_bytes

KEY_FILE = "audit-signing.key"


def signing_key(state_root: Path) -> Ed25519PrivateKey:
    """The state directory's signing key; created (0600, exclusively) on first use."""
    path = state_root / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _existing_key(path)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


def _existing_key(path: Path) -> Ed25519PrivateKey:
    st = path.stat()
    if st.st_mode & 0o077:
        raise AirlockError(
            f"the audit signing key {path} is readable by others (mode {st.st_mode & 0o777:o})",
            hint=f"chmod 600 {path}",
        )
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise AirlockError(f"{path} is not an Ed25519 private key", hint="move it away; a new one is created")
    return key


def public_pem(key: Ed25519PrivateKey) -> str:
    """The public half as PEM (SubjectPublicKeyInfo), what openssl and `load_public_key` read."""
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def load_public_key(data: bytes) -> Ed25519PublicKey:
    """A public key from PEM, or from the raw 32 bytes in base64 (one line)."""
    text = data.strip()
    if text.startswith(b"-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(text)
        except ValueError as exc:
            raise UsageError(f"not a PEM public key: {exc}") from None
        if not isinstance(key, Ed25519PublicKey):
            raise UsageError("the public key is not an Ed25519 key")
        return key
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error:
        raw = b""
    if len(raw) != 32:
        raise UsageError("the public key is neither PEM nor 32 raw bytes in base64")
    return Ed25519PublicKey.from_public_bytes(raw)


@dataclass(frozen=True)
class ExportCheck:
    ok: bool
    events: int
    problem: str | None = None
    brk: ChainBreak | None = None


def export(audit: AuditLog, key: Ed25519PrivateKey, dest: Path) -> int:
    """Write the whole audit log to `dest` and its signature to `dest.sig`; refuses a broken
    chain (a signature must not vouch for a log that was edited). Returns the event count."""
    brk = audit.verify()
    if brk is not None:
        raise AirlockError(
            f"not exported: the audit chain is broken at line {brk.line} (seq {brk.seq}): {brk.problem}",
            hint="`airlockd audit --verify` shows it; keep the log as it is for investigation",
        )
    data = audit.path.read_bytes() if audit.path.exists() else b""
    brk, (count, _, _) = verify_lines(data.splitlines(keepends=True))
    if brk is not None:  # appended between the two reads: verify what is exported, not the file
        raise AirlockError(f"not exported: line {brk.line} of the log does not fit ({brk.problem}); try again")
    atomic_write_bytes(dest, data, mode=0o644)
    atomic_write_bytes(sig_path(dest), key.sign(data), mode=0o644)
    return count


def sig_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".sig")


def verify_export(path: Path, public_key: Ed25519PublicKey, sig: Path | None = None) -> ExportCheck:
    """Check an export with the public key alone: the signature over its bytes, then its chain."""
    sig = sig or sig_path(path)
    try:
        data, signature = path.read_bytes(), sig.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {exc.filename}: {exc.strerror}") from None
    try:
        public_key.verify(signature, data)
    except InvalidSignature:
        return ExportCheck(False, 0, f"the signature {sig.name} does not match {path.name} (or another key signed it)")
    brk, (count, _, _) = verify_lines(data.splitlines(keepends=True))
    if brk is not None:
        return ExportCheck(False, count, f"line {brk.line} (seq {brk.seq}): {brk.problem}", brk)
    return ExportCheck(True, count)


@dataclass(frozen=True)
class CheckpointCheck:
    """What the signed checkpoints prove about the live log, with one public key."""

    ok: bool
    checkpoints: int  # signed checkpoints that verified
    last_seq: int | None  # the seq the last of them covers
    events: int
    problem: str | None = None


def verify_checkpoints(audit: AuditLog, public_key: Ed25519PublicKey) -> CheckpointCheck:
    """Each checkpoint's signature, then the log against each: a log that ends before a
    checkpoint's seq was cut; one whose event at that seq has another hash was rewritten there
    (whatever its head file says)."""
    try:
        raw = audit.checkpoints.read_bytes() if audit.checkpoints.exists() else b""
        log = audit.path.read_bytes() if audit.path.exists() else b""
    except OSError as exc:
        raise UsageError(f"cannot read {exc.filename}: {exc.strerror}") from None
    marks: list[tuple[int, str]] = []
    for n, line in enumerate(raw.splitlines(), 1):
        try:
            cp = json.loads(line)
            seq, digest, at = int(cp["seq"]), str(cp["hash"]), float(cp["at"])
            public_key.verify(base64.b64decode(cp["sig"], validate=True), checkpoint_message(seq, digest, at))
        except InvalidSignature:
            return CheckpointCheck(
                False, len(marks), None, 0, f"checkpoint {n}: the signature is not this key's (forged)"
            )
        except (ValueError, KeyError, TypeError, binascii.Error):
            return CheckpointCheck(False, len(marks), None, 0, f"checkpoint {n}: unreadable")
        if marks and seq <= marks[-1][0]:
            return CheckpointCheck(
                False, len(marks), None, 0, f"checkpoint {n}: seq {seq} does not follow the one before"
            )
        marks.append((seq, digest))
    keep: dict[int, str] = dict.fromkeys((seq for seq, _ in marks), "")
    brk, (count, last_seq, _) = verify_lines(log.splitlines(keepends=True), keep)
    if brk is not None:
        return CheckpointCheck(False, 0, None, count, f"line {brk.line} (seq {brk.seq}): {brk.problem}")
    for seq, digest in marks:
        if last_seq is None or seq > last_seq:
            return CheckpointCheck(
                False,
                len(marks),
                marks[-1][0],
                count,
                f"the log ends at seq {last_seq}, but a signed checkpoint covers seq {seq}: events were cut",
            )
        if keep[seq] != digest:
            return CheckpointCheck(
                False,
                len(marks),
                marks[-1][0],
                count,
                f"the event at seq {seq} is not the one signed at its checkpoint: the log was rewritten",
            )
    expected = count // audit.checkpoint_every
    if len(marks) < expected:
        return CheckpointCheck(
            False,
            len(marks),
            marks[-1][0] if marks else None,
            count,
            f"{count} events should have {expected} signed checkpoints, {len(marks)} were found: some were removed",
        )
    return CheckpointCheck(True, len(marks), marks[-1][0] if marks else None, count)
