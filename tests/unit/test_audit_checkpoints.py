"""Signed checkpoints of the audit log: with the public key alone, a log cut below or rewritten at
or before its last checkpoint is caught even when its head file was rewritten to match; a missing
head is a failure; `audit --verify` says what it proved and what it could not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from airlockd.cli import main
from airlockd.evidence import signing
from airlockd.evidence.audit import GENESIS, AuditLog
from airlockd.evidence.chain import digest as chain_digest
from airlockd.redact import Redactor

EVERY = 16


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def _log(tmp_path: Path, key: Ed25519PrivateKey, n: int = 50) -> AuditLog:
    log = AuditLog(tmp_path / "audit.jsonl", Redactor(), fsync=False, signer=key.sign, checkpoint_every=EVERY)
    for i in range(n):
        log.append("event", run="r1", n=i)
    return log


def _rewrite(log: AuditLog, events: list[dict[str, object]]) -> None:
    """What an attacker with write access does: a consistent chain and a head that matches it."""
    prev, lines = GENESIS, []
    for seq, ev in enumerate(events):
        ev = {**ev, "seq": seq, "prev": prev}
        ev.pop("hash", None)
        ev["hash"] = prev = chain_digest(ev)
        lines.append(json.dumps(ev, sort_keys=True, separators=(",", ":")) + "\n")
    log.path.write_text("".join(lines))
    log.head.write_text(json.dumps({"seq": len(events) - 1, "hash": prev}))


def _events(log: AuditLog) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.path.read_text().splitlines()]


def test_checkpoints_are_signed_every_n_events_and_verify(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    log = _log(tmp_path, key)
    marks = [json.loads(line) for line in log.checkpoints.read_text().splitlines()]
    assert [m["seq"] for m in marks] == [15, 31, 47]
    check = signing.verify_checkpoints(log, key.public_key())
    assert check.ok and check.checkpoints == 3 and check.last_seq == 47 and check.events == 50


def test_a_log_cut_below_a_checkpoint_with_a_matching_head_is_caught(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    log = _log(tmp_path, key)
    _rewrite(log, _events(log)[:40])  # seq 40..49 gone, head rolled back to seq 39
    assert log.verify() is None  # chain and head agree: only the checkpoints can tell
    check = signing.verify_checkpoints(log, key.public_key())
    assert not check.ok and "covers seq 47" in (check.problem or "") and "cut" in (check.problem or "")


def test_a_rewritten_log_with_a_matching_head_is_caught(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    log = _log(tmp_path, key)
    events = _events(log)
    events[20] = {**events[20], "data": {"n": "forged"}}
    _rewrite(log, events)
    assert log.verify() is None
    check = signing.verify_checkpoints(log, key.public_key())
    assert not check.ok and "seq 31" in (check.problem or "") and "rewritten" in (check.problem or "")


def test_forged_or_removed_checkpoints_are_caught(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    log = _log(tmp_path, key)
    good = log.checkpoints.read_text()
    other = Ed25519PrivateKey.generate()
    assert not signing.verify_checkpoints(log, other.public_key()).ok  # another key's view
    log.checkpoints.write_text("".join(good.splitlines(keepends=True)[:1]))
    check = signing.verify_checkpoints(log, key.public_key())
    assert not check.ok and "some were removed" in (check.problem or "")
    log.checkpoints.unlink()
    assert not signing.verify_checkpoints(log, key.public_key()).ok


def test_a_missing_head_is_a_failure(tmp_path: Path, key: Ed25519PrivateKey) -> None:
    log = _log(tmp_path, key, n=3)
    log.head.unlink()
    brk = log.verify()
    assert brk is not None and "head file" in brk.problem and "missing" in brk.problem


def test_the_cli_says_what_it_proved_and_what_not(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "policies.toml").write_text('[agents.bot]\ncommand = ["true"]\n')
    from airlockd.runs.service import Service

    svc = Service(ws)
    svc.audit.checkpoint_every = 4
    for i in range(10 - sum(1 for _ in svc.audit.events())):
        svc.audit.append("event", n=i)
    pub = tmp_path / "audit.pub"
    assert main(["--workspace", str(ws), "audit", "--public-key"]) == 0
    pub.write_text(capsys.readouterr().out)
    assert main(["--workspace", str(ws), "audit", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "signed checkpoints: 2 verified with this state directory's own key, the last covering seq 7" in out
    assert "not proven: events after seq 7 rest on the head file alone" in out
    assert "--public-key-file" in out
    assert main(["--workspace", str(ws), "--json", "audit", "--verify", "--public-key-file", str(pub)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["checkpoints"] == 2 and doc["key"] == str(pub) and len(doc["unproven"]) == 1
    lines = svc.audit.path.read_text().splitlines(keepends=True)[:6]
    svc.audit.path.write_text("".join(lines))
    last = json.loads(lines[-1])
    svc.audit.head.write_text(json.dumps({"seq": last["seq"], "hash": last["hash"]}))
    assert main(["--workspace", str(ws), "audit", "--verify", "--public-key-file", str(pub)]) != 0
    err = capsys.readouterr().err
    assert "audit NOT verified" in err and "covers seq 7" in err


def test_an_event_of_any_size_is_bounded_and_says_what_was_cut(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl", Redactor(), fsync=False)
    nested: object = "bottom"
    for _ in range(50):
        nested = [nested]
    ev = log.append("agent.output", text="x" * 1_000_000, paths=[f"f{i}" for i in range(100_000)], deep=nested)
    line = log.path.read_bytes().splitlines()[-1]
    assert len(line) < 64 * 1024
    assert ev["data"]["text"].endswith("[995904 more characters]")
    assert ev["data"]["paths"][-1] == "… 99800 more"
    assert "nested too deep" in json.dumps(ev["data"]["deep"])
    assert log.verify() is None


def test_a_crash_between_an_event_and_its_checkpoint_is_made_good_at_the_next_append(
    tmp_path: Path, key: Ed25519PrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _log(tmp_path, key, n=EVERY - 1)

    def dies(seq: int, digest: str) -> None:
        raise KeyboardInterrupt  # killed after the event and its head, before its checkpoint

    with monkeypatch.context() as m:
        m.setattr(log, "_checkpoint", dies)
        with pytest.raises(KeyboardInterrupt):
            log.append("event", run="r1", n=EVERY - 1)
    assert not log.checkpoints.exists() and log.verify() is None
    log.append("event", run="r1", n=EVERY)  # the next append writes the missed checkpoint first
    marks = [json.loads(line)["seq"] for line in log.checkpoints.read_text().splitlines()]
    assert marks == [EVERY - 1]
    check = signing.verify_checkpoints(log, key.public_key())
    assert check.ok and check.last_seq == EVERY - 1, check
    for i in range(EVERY + 1, 2 * EVERY + 1):  # and no checkpoint is written twice after
        log.append("event", run="r1", n=i)
    marks = [json.loads(line)["seq"] for line in log.checkpoints.read_text().splitlines()]
    assert marks == [EVERY - 1, 2 * EVERY - 1]
