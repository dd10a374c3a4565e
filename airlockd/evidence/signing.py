"""Signed audit exports: an Ed25519 key kept in the state directory, detached signatures.

The private key never leaves the state directory (0600, created on first use). An export is the
audit log's lines, byte for byte (every kept segment's, then the active one's), plus `FILE.sig`:
the raw 64-byte Ed25519 signature over the exact bytes of FILE. Verifying needs only the public
key: `verify_export` here, or `openssl pkeyutl -verify -pubin -inkey KEY.pub -rawin -in FILE -sigfile FILE.sig`.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from airlockd.errors import AirlockError, UsageError
from airlockd.evidence.audit import GENESIS, AuditLog, ChainBreak, checkpoint_message, verify_lines
from airlockd.evidence.segments import Anchor
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
    first_seq: int = 0  # the first event's seq: above 0, the events before were dropped from the log


def export(audit: AuditLog, key: Ed25519PrivateKey, dest: Path) -> int:
    """Write the whole audit log (every kept segment, then the active one) to `dest` and its
    signature to `dest.sig`; refuses a broken chain (a signature must not vouch for a log that
    was edited). Returns the event count."""
    brk = audit.verify()
    if brk is not None:
        raise AirlockError(
            f"not exported: the audit chain is broken at {_where(brk)}: {brk.problem}",
            hint="`airlockd audit --verify` shows it; keep the log as it is for investigation",
        )
    try:
        data, start = audit.snapshot()
    except OSError as exc:
        raise AirlockError(f"not exported: cannot read {exc.filename}: {exc.strerror}; try again") from None
    brk, (count, _, _) = verify_lines(data.splitlines(keepends=True), start=start)
    if brk is not None:  # changed between the two reads: verify what is exported, not the files
        raise AirlockError(f"not exported: line {brk.line} of the log does not fit ({brk.problem}); try again")
    atomic_write_bytes(dest, data, mode=0o644)
    atomic_write_bytes(sig_path(dest), key.sign(data), mode=0o644)
    return count


def _where(brk: ChainBreak) -> str:
    return f"{brk.file + ' ' if brk.file else ''}line {brk.line} (seq {brk.seq})"


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
    lines = data.splitlines(keepends=True)
    start = _export_start(lines[0]) if lines else (GENESIS, 0)
    brk, (count, _, _) = verify_lines(lines, start=start)
    if brk is not None:
        return ExportCheck(False, count, f"line {brk.line} (seq {brk.seq}): {brk.problem}", brk, start[1])
    return ExportCheck(True, count, first_seq=start[1])


def _export_start(first: bytes) -> tuple[str, int]:
    """Where an export's chain starts: the genesis, or, for a log whose oldest segments were
    dropped, after them (the first event's own `prev` and `seq`: the signature over the whole
    file is what says nothing was cut from its start)."""
    try:
        ev = json.loads(first)
        seq, prev = ev["seq"], ev["prev"]
    except (ValueError, KeyError, TypeError):
        return GENESIS, 0  # the chain check names it
    if isinstance(seq, int) and seq > 0 and isinstance(prev, str):
        return prev, seq
    return GENESIS, 0


@dataclass(frozen=True)
class CheckpointCheck:
    """What the signed checkpoints prove about the live log, with one public key."""

    ok: bool
    checkpoints: int  # signed checkpoints that verified
    last_seq: int | None  # the seq the last of them covers
    events: int  # events checked (those kept)
    problem: str | None = None
    dropped: int = 0  # events before them, dropped under signed anchors


def verify_checkpoints(audit: AuditLog, public_key: Ed25519PublicKey) -> CheckpointCheck:
    """Each checkpoint's signature, then the log against each: a log that ends before a
    checkpoint's seq was cut; one whose event at that seq has another hash was rewritten there
    (whatever its head file says). A checkpoint in a dropped range is covered by the anchors,
    which must be signed by the same key: dropping is the only way events may leave the log."""
    try:
        raw = audit.checkpoints.read_bytes() if audit.checkpoints.exists() else b""
    except OSError as exc:
        raise UsageError(f"cannot read {exc.filename}: {exc.strerror}") from None
    marks, problem = _marks(raw, public_key)
    if problem is not None:
        return CheckpointCheck(False, len(marks), None, 0, problem)
    keep: dict[int, str] = dict.fromkeys((seq for seq, _ in marks), "")
    brk, end = audit.verify_chain(keep)
    if brk is not None:
        return CheckpointCheck(False, 0, None, end.events, f"{_where(brk)}: {brk.problem}", end.dropped)
    anchors = audit.segments.anchor_list()  # after the chain: a drop meanwhile only covers more
    last_mark = marks[-1][0] if marks else None

    def failed(problem: str) -> CheckpointCheck:
        return CheckpointCheck(False, len(marks), last_mark, end.events, problem, end.dropped)

    for n, anchor in enumerate(anchors, 1):
        if not _signed(anchor, public_key):
            return failed(
                f"anchor {n} (seq {anchor.first_seq}-{anchor.last_seq}) is not signed by this key: "
                "those events were removed, not dropped"
            )
    dropped_to = anchors[-1].last_seq if anchors else -1
    for seq, digest in marks:
        if seq <= dropped_to:
            anchor = anchors[bisect.bisect_left([a.last_seq for a in anchors], seq)]
            if seq == anchor.last_seq and anchor.hash != digest:
                return failed(f"the event at seq {seq} was not the one signed at its checkpoint when it was dropped")
            continue
        if end.last_seq is None or seq > end.last_seq:
            return failed(
                f"the log ends at seq {end.last_seq}, but a signed checkpoint covers seq {seq}: events were cut"
            )
        if keep[seq] != digest:
            return failed(f"the event at seq {seq} is not the one signed at its checkpoint: the log was rewritten")
    total = end.dropped + end.events
    expected = total // audit.checkpoint_every
    if len(marks) < expected:
        return failed(
            f"{total} events should have {expected} signed checkpoints, {len(marks)} were found: some were removed"
        )
    return CheckpointCheck(True, len(marks), last_mark, end.events, dropped=end.dropped)


def _marks(raw: bytes, public_key: Ed25519PublicKey) -> tuple[list[tuple[int, str]], str | None]:
    """The checkpoints (seq, hash), each signature checked, seqs rising; or the first problem."""
    marks: list[tuple[int, str]] = []
    for n, line in enumerate(raw.splitlines(), 1):
        try:
            cp = json.loads(line)
            seq, digest, at = int(cp["seq"]), str(cp["hash"]), float(cp["at"])
            public_key.verify(base64.b64decode(cp["sig"], validate=True), checkpoint_message(seq, digest, at))
        except InvalidSignature:
            return marks, f"checkpoint {n}: the signature is not this key's (forged)"
        except (ValueError, KeyError, TypeError, binascii.Error):
            return marks, f"checkpoint {n}: unreadable"
        if marks and seq <= marks[-1][0]:
            return marks, f"checkpoint {n}: seq {seq} does not follow the one before"
        marks.append((seq, digest))
    return marks, None


def _signed(anchor: Anchor, public_key: Ed25519PublicKey) -> bool:
    if not anchor.sig:
        return False
    try:
        public_key.verify(base64.b64decode(anchor.sig, validate=True), anchor.message())
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True
