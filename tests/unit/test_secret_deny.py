"""A proposal that carries a secret is denied by an invariant, and no output shows the secret.

The agent (a fake sandbox playing it on the staging copy) writes a value of a withheld file into a
staged file, creates a file holding a private key, and creates a file whose NAME is a token. Each
is `deny` by `secret-in-content` / `secret-in-name` whatever the policy says, with a reason that
names the detector or "a value of a withheld file"; none can be approved; the staging copy, the
state dir, and every CLI command a person runs (plain and `--json`) never show the raw values."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakesandbox import FakeSandbox, workspace
from storefiles import store_text

from airlockd.errors import AdmissionRejected, StateError
from airlockd.lsp import proposal
from airlockd.pipeline.classify import WITHHELD_VALUE, Secret, classify
from airlockd.pipeline.manifest import Change, ChangeKind, ChangeSet, Entry, Kind
from airlockd.policy import Decision, load_policy
from airlockd.records import FileState, RunRecord
from airlockd.runs.service import Service
from airlockd.staging import stagers

WITHHELD = "Zq8-withheld-value-xK31"  # the value of DB_PASSWORD in the workspace's .env
# Built in pieces so that this file itself holds no detector-format secret.
KEY_BODY = base64.b64encode(bytes(range(48)) * 4).decode()
PEM = "-----BEGIN " + "PRIVATE KEY-----\n" + KEY_BODY + "\n-----END " + "PRIVATE KEY-----\n"
TOKEN = "ghp" + "_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"  # github-token format
RAW = (WITHHELD, KEY_BODY, TOKEN)

PERMISSIVE = """
[[rules]]
match = ["*", "**/*"]
action = "auto"
reason = "this workspace trusts its agent"
"""


def _agent(ws: Path) -> bytes:
    (ws / "src" / "a.py").write_text(f'A = 1\nPASSWORD = "{WITHHELD}"\n')  # modified: a withheld value
    (ws / "src" / "notes.txt").write_text("keep this\n" + PEM)  # created: a detector hit
    (ws / "src" / f"{TOKEN}.txt").write_text("nothing here\n")  # created: a token in the name
    (ws / "src" / "ok.py").write_text("OK = True\n")  # clean
    return b"done\n"


def _run(svc: Service) -> RunRecord:
    return svc.execute(svc.submit("bot", "work").id)


# -- the invariant, pure ----------------------------------------------------------------------


def _file(size: int = 10) -> Entry:
    return Entry(Kind.FILE, 0o644, size, "ab")


@pytest.mark.parametrize(
    ("secret", "rule", "words"),
    [
        (Secret("private-key"), "invariant:secret-in-content", "private-key"),
        (Secret(WITHHELD_VALUE), "invariant:secret-in-content", "a value of a withheld file"),
        (Secret("github-token", in_name=True), "invariant:secret-in-name", "the path carries a github-token"),
    ],
)
def test_a_secret_is_denied_above_any_policy_rule(tmp_path: Path, secret: Secret, rule: str, words: str) -> None:
    (tmp_path / "policies.toml").write_text(PERMISSIVE)
    policy = load_policy(tmp_path).policy
    changes = ChangeSet(
        [Change("src/x.py", ChangeKind.CREATED, None, _file()), Change("src/y.py", ChangeKind.CREATED, None, _file())]
    )
    got = classify(changes, policy, (), secrets={"src/x.py": secret})
    assert (got[0].decision, got[0].rule) == (Decision.DENY, rule)
    assert words in got[0].reason
    assert (got[1].decision, got[1].rule) == (Decision.AUTO, "rules[0]")  # the policy still decides the rest


def test_a_modified_file_is_denied_even_when_its_base_held_the_value(tmp_path: Path) -> None:
    (tmp_path / "policies.toml").write_text(PERMISSIVE)
    policy = load_policy(tmp_path).policy
    change = Change("config.py", ChangeKind.MODIFIED, _file(5), _file(6))
    got = classify(ChangeSet([change]), policy, (), secrets={"config.py": Secret(WITHHELD_VALUE)})
    assert got[0].decision is Decision.DENY and got[0].rule == "invariant:secret-in-content"


def test_a_directory_named_with_a_secret_is_denied_not_followed(tmp_path: Path) -> None:
    (tmp_path / "policies.toml").write_text(PERMISSIVE)
    policy = load_policy(tmp_path).policy
    d = Change("keys", ChangeKind.CREATED, None, Entry(Kind.DIR, 0o755))
    f = Change("keys/a.txt", ChangeKind.CREATED, None, _file())
    got = classify(ChangeSet([d, f]), policy, (), secrets={"keys": Secret("aws-access-key", in_name=True)})
    assert [(c.decision, c.rule) for c in got] == [
        (Decision.DENY, "invariant:secret-in-name"),
        (Decision.AUTO, "rules[0]"),
    ]


# -- through the service ----------------------------------------------------------------------


def test_secrets_in_a_proposal_are_denied_and_never_kept(tmp_path: Path, stager: str) -> None:
    ws = workspace(tmp_path, PERMISSIVE)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    rec = _run(svc)
    by_path = {f.path: f for f in rec.files}
    a, notes, ok = by_path["src/a.py"], by_path["src/notes.txt"], by_path["src/ok.py"]
    assert (a.decision, a.rule, a.state) == (Decision.DENY, "invariant:secret-in-content", FileState.DENIED)
    assert "a value of a withheld file" in a.reason
    assert (notes.decision, notes.rule) == (Decision.DENY, "invariant:secret-in-content")
    assert "private-key" in notes.reason
    named = [f for f in rec.files if f.rule == "invariant:secret-in-name"]
    assert len(named) == 1 and TOKEN not in named[0].path and "github-token" in named[0].reason
    assert (ok.decision, ok.state) == (Decision.AUTO, FileState.PENDING)
    # what carries a secret is gone from the staging copy; the rest is still there to land
    run_dir = svc.state.run_dir(rec.id)
    assert not stagers.proposed_path(run_dir, "src/notes.txt").exists()
    assert not stagers.proposed_path(run_dir, f"src/{TOKEN}.txt").exists()
    assert stagers.proposed_path(run_dir, "src/ok.py").exists()
    # a deny can never be accepted, by path or with everything pending
    for path in ("src/a.py", "src/notes.txt"):
        with pytest.raises(StateError, match="denied by invariant:secret-in-content"):
            svc.review.approve(rec.id, [path])
    done = svc.review.approve(rec.id)
    assert done.applied == ["src/ok.py"]
    assert (ws / "src" / "a.py").read_text() == "A = 1\n" and not (ws / "src" / "notes.txt").exists()
    assert not any(TOKEN in p.name for p in ws.rglob("*"))
    _assert_nowhere(svc.state.root)


def test_a_hit_of_the_workspaces_own_detector_in_a_proposal_is_denied(tmp_path: Path) -> None:
    """The invariant asks every detector the policy uses, `[[withhold.custom]]` included (the
    proposal's checks once asked only the built-in ones), in content and in names; and approving
    hunks that would bring one in is refused too."""
    acme = "acme_" + "Q7x" * 10 + "Zp"
    custom = '[[withhold.custom]]\nname = "acme-token"\nregex = "acme_[A-Za-z0-9]{32}"\nmin_entropy = 2.0\n'
    ws = workspace(tmp_path, PERMISSIVE + custom)

    def agent(root: Path) -> bytes:
        (root / "src" / "notes.txt").write_text(f"the key is {acme}\n")
        (root / "src" / f"{acme}.txt").write_text("nothing here\n")
        (root / "src" / "ok.py").write_text("OK = True\n")
        return b"done\n"

    svc = Service(ws, sandbox=FakeSandbox(agent))
    rec = _run(svc)
    by_path = {f.path: f for f in rec.files}
    notes = by_path["src/notes.txt"]
    assert (notes.decision, notes.rule) == (Decision.DENY, "invariant:secret-in-content")
    assert "acme-token" in notes.reason and acme not in notes.reason
    named = [f for f in rec.files if f.rule == "invariant:secret-in-name"]
    assert len(named) == 1 and acme not in named[0].path
    assert by_path["src/ok.py"].decision is Decision.AUTO
    with pytest.raises(StateError, match="denied by invariant:secret-in-content"):
        svc.review.approve(rec.id, ["src/notes.txt"])
    assert svc.review.approve(rec.id).applied == ["src/ok.py"]
    assert not (ws / "src" / "notes.txt").exists()
    assert acme.encode() not in b"".join(p.read_bytes() for p in svc.state.root.rglob("*") if p.is_file())


def test_a_symlink_whose_target_is_a_secret_is_denied_and_masked(tmp_path: Path) -> None:
    ws = workspace(tmp_path, PERMISSIVE)

    def agent(staged: Path) -> bytes:
        os.symlink(f"../{TOKEN}", staged / "src" / "link")
        return b""

    svc = Service(ws, sandbox=FakeSandbox(agent))
    (link,) = _run(svc).files
    assert (link.decision, link.rule) == (Decision.DENY, "invariant:secret-in-content")
    assert "github-token" in link.reason
    _assert_nowhere(svc.state.root)


def test_the_cli_shows_the_deny_and_its_reason_never_the_value(tmp_path: Path) -> None:
    ws = workspace(tmp_path, PERMISSIVE)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    rec = _run(svc)
    (tmp_path / "exports").mkdir()
    export = tmp_path / "exports" / "audit.jsonl"
    shown = ""
    for argv in (
        ["runs"],
        ["show", rec.id],
        ["diff", rec.id],
        ["diff", rec.id, "src/a.py"],
        ["audit"],
        ["audit", "--run", rec.id],
        ["approve", rec.id, "--path", "src/notes.txt"],
        ["audit", "--export", str(export)],
    ):
        for as_json in (False, True):
            out = _cli(ws, argv, as_json)
            shown += out
            for raw in RAW:
                assert raw not in out, (argv, as_json)
    assert "invariant:secret-in-content" in shown and "a value of a withheld file" in shown
    assert "denied by invariant:secret-in-content" in shown  # the refused approval says why
    _assert_nowhere(export.parent)
    assert not (ws / "src" / "notes.txt").exists()


def test_values_are_learnt_again_at_inspection(tmp_path: Path) -> None:
    """A process handed no values (a daemon that restarted and knew none), and a withheld file
    that changed while the agent ran: inspection reads the live workspace's values again."""
    ws = workspace(tmp_path, PERMISSIVE)
    fresh = "Nw7-changed-during-the-run-Pq2"

    def agent(staged: Path) -> bytes:
        (ws / ".env").write_text(f"DB_PASSWORD={fresh}\n")  # the person edits the live .env
        (staged / "src" / "b.py").write_text(f"B = '{fresh}'\n")
        return b""

    svc = Service(ws, sandbox=FakeSandbox(agent), known_values=[])
    assert not svc.redactor.known_in(fresh)
    rec = _run(svc)
    (b,) = rec.files
    assert (b.decision, b.rule) == (Decision.DENY, "invariant:secret-in-content")
    assert fresh not in store_text(svc.state)


def test_values_staging_found_by_content_or_deep_are_known_to_every_later_process(tmp_path: Path) -> None:
    """Another process (a CLI command, a restarted daemon) learns the withheld values with a walk
    of path rules only; what staging withheld for its content (the other lines of a config that
    holds an AWS key) or in a folder that walk skips (`node_modules/pkg/.env`) is read too, from
    the paths the runs recorded: a diff or a prompt quoting them is masked or refused."""
    ws = workspace(tmp_path, PERMISSIVE)
    deep, beside = "Rt6-deep-in-node-modules-Vb1", "Hq3-beside-an-aws-key-Lm8"
    aws = "AKIA" + "Q" * 16
    (ws / "node_modules" / "pkg").mkdir(parents=True)
    (ws / "node_modules" / "pkg" / ".env").write_text(f"DB_PASSWORD={deep}\n")
    (ws / "config").mkdir()
    (ws / "config" / "app.yaml").write_text(f"aws_key: {aws}\ndb_password: {beside}\n")
    # a folder named with a value of the .env: the record of what is under it is masked
    masked = "Kw4-under-a-masked-folder-Tz6"
    (ws / ".env").write_text("DB_PASSWORD=Zq8-withheld-value-xK31\nAPP_NAME=billingsvc\n")
    (ws / "billingsvc" / "deploy").mkdir(parents=True)
    (ws / "billingsvc" / "deploy" / "prod.yaml").write_text(f"aws_key: {aws}\nprod: {masked}\n")
    subprocess.run(["git", "init", "-q", str(ws)], check=True)  # history: withheld, never read for values
    svc = Service(ws, sandbox=FakeSandbox(lambda staged: b""))
    rec = _run(svc)
    recorded = {w["path"] for w in rec.withheld}
    assert ".git" in recorded
    assert {"node_modules/pkg/.env", "config/app.yaml", "[REDACTED]/deploy/prod.yaml"} <= recorded
    for _ in range(12):  # runs that stage nothing (queued, refused) do not push the staged ones out
        with contextlib.suppress(AdmissionRejected):
            svc.submit("bot", "later")
    later = Service(ws, actor="cli")
    for value in (deep, beside, masked):
        assert later.redactor.known_in(f"x {value} y"), value
    assert deep not in later.redactor.text(f"echo {deep}")
    # git's hook samples are no values: "delete" from them masked every "deleted" (CI found it)
    assert later.redactor.text("the file was deleted") == "the file was deleted"


def test_the_editors_proposal_passes_the_redactor(tmp_path: Path) -> None:
    """A change the detectors of the policy let through (a bearer token: its detector masks output
    but is not in the default `withhold.detectors`) still reaches the editor masked, in hunks and
    in the edit."""
    ws = workspace(tmp_path, PERMISSIVE)
    (ws / "src" / "a.py").write_text("".join(f"line {i}\n" for i in range(10)))
    jwt = "Bearer " + "q8ZrT5vLx2Wm" + "9KpN3aHdY7cB"

    def agent(staged: Path) -> bytes:
        (staged / "src" / "a.py").write_text("".join(f"line {i}\n" for i in range(10)) + f"T = '{jwt}'\n")
        (staged / "src" / "new.py").write_text(f"T = '{jwt}'\n")
        return b""

    svc = Service(ws, sandbox=FakeSandbox(agent))
    rec = _run(svc)
    assert {f.path: f.decision for f in rec.files} == {"src/a.py": Decision.AUTO, "src/new.py": Decision.AUTO}
    support = proposal.EditSupport(True, frozenset({"create", "delete"}), True)
    wire = json.dumps(proposal.build(svc.content, rec, ws, support))
    assert jwt[7:] not in wire and "[REDACTED]" in wire
    assert jwt[7:] not in svc.content.diff(rec.id)


def _encoding_agent(ws: Path) -> bytes:
    """Writes and says the withheld value as an exact search misses it: base64 (inside a longer
    stream, as of a whole .env line), split across lines, with zero-width spaces, in hex."""
    b64 = base64.b64encode(f"DB_PASSWORD={WITHHELD}\n".encode()).decode()
    split = WITHHELD[:9] + "\n" + WITHHELD[9:]
    (ws / "src" / "blob.txt").write_text(f"blob: {b64}\n")  # created
    (ws / "src" / "a.py").write_text(f'A = 1\nP = """{split}"""\n')  # modified
    (ws / "src" / "zw.py").write_text("P = '" + "\u200b".join(WITHHELD) + "'\n")
    (ws / "src" / "ok.py").write_text("OK = True\n")
    return f"said: {b64}\n{split}\n{WITHHELD.encode().hex()}\n".encode()


def test_a_value_encoded_or_split_is_denied_and_never_shown(tmp_path: Path) -> None:
    ws = workspace(tmp_path, PERMISSIVE)
    svc = Service(ws, sandbox=FakeSandbox(_encoding_agent))
    rec = _run(svc)
    by_path = {f.path: f for f in rec.files}
    for path in ("src/blob.txt", "src/a.py", "src/zw.py"):
        f = by_path[path]
        assert (f.decision, f.rule) == (Decision.DENY, "invariant:secret-in-content"), path
        assert "a value of a withheld file" in f.reason
    assert by_path["src/ok.py"].decision is Decision.AUTO
    log = (svc.state.run_dir(rec.id) / "output.log").read_text()
    assert log.startswith("said: ") and log.count("[REDACTED]") == 3
    shown = [_cli(ws, argv, as_json) for argv in (["show", rec.id], ["diff", rec.id]) for as_json in (False, True)]
    assert all("a value of a withheld file" in out for out in shown)
    for text in [*shown, log]:
        assert not svc.redactor.known_in(text), text
    _assert_no_form_kept(svc)


def _powershell_agent(ws: Path) -> bytes:
    """Writes and says the withheld value as PowerShell takes a script to run: base64 of its
    UTF-16LE bytes (`-EncodedCommand`), which no exact search or fold of the text finds."""
    encoded = base64.b64encode(f"$p = '{WITHHELD}'; Connect-Db $p".encode("utf-16-le")).decode()
    (ws / "src" / "run.ps1").write_text(f"powershell -NoProfile -EncodedCommand {encoded}\n")  # created
    (ws / "src" / "ok.py").write_text("OK = True\n")
    return f"run: powershell -EncodedCommand {encoded}\n".encode()


def test_a_value_in_base64_of_utf16_is_denied_and_never_shown(tmp_path: Path) -> None:
    ws = workspace(tmp_path, PERMISSIVE)
    svc = Service(ws, sandbox=FakeSandbox(_powershell_agent))
    rec = _run(svc)
    by_path = {f.path: f for f in rec.files}
    ps1 = by_path["src/run.ps1"]
    assert (ps1.decision, ps1.rule) == (Decision.DENY, "invariant:secret-in-content")
    assert "a value of a withheld file" in ps1.reason
    assert by_path["src/ok.py"].decision is Decision.AUTO
    log = (svc.state.run_dir(rec.id) / "output.log").read_text()
    assert log.startswith("run: powershell -EncodedCommand [REDACTED]")
    shown = [
        _cli(ws, argv, as_json)
        for argv in (["show", rec.id], ["diff", rec.id], ["audit", "--run", rec.id])
        for as_json in (False, True)
    ]
    for text in [*shown, log]:
        assert not svc.redactor.known_in(text), text
    _assert_no_form_kept(svc)


# -- helpers ----------------------------------------------------------------------------------


def _cli(ws: Path, argv: list[str], as_json: bool) -> str:
    head = [sys.executable, "-m", "airlockd", "--workspace", str(ws), "--no-daemon"] + ["--json"] * as_json
    proc = subprocess.run([*head, *argv], capture_output=True, text=True, timeout=120, env=os.environ.copy())
    return proc.stdout + proc.stderr


def _assert_no_form_kept(svc: Service) -> None:
    """No form of a value the service's redactor knows in any file of its state directory (gzip
    members decompressed)."""
    for path in svc.state.root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            text = (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode("utf-8", "replace")
            assert not svc.redactor.known_in(text), path


def _assert_nowhere(root: Path) -> None:
    """None of the raw secrets in any file under `root` (gzip members decompressed)."""
    for path in root.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        for raw in RAW:
            assert raw.encode() not in data, path
        assert TOKEN not in str(path), path


def test_plain_output_of_a_process_acting_alone_is_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last net under plain text, as `--json` has one: once a command has built the service
    (and learnt the withheld values), whatever it prints passes the redactor."""
    from airlockd.cli.decide import MaskedText, mask_output

    monkeypatch.setattr(sys, "stdout", sys.stdout)  # restored after the test, wrapper and all
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    svc = Service(workspace(tmp_path))
    assert svc.redactor.known_in(WITHHELD)
    mask_output()
    mask_output()  # once
    assert isinstance(sys.stdout, MaskedText) and not isinstance(sys.stdout.raw, MaskedText)
    print(f"a line with {WITHHELD} and {TOKEN}")
    print(f"and on stderr {WITHHELD}", file=sys.stderr)
    got = capsys.readouterr()
    assert WITHHELD not in got.out + got.err and TOKEN not in got.out
    assert got.out.count("[REDACTED]") == 2 and "[REDACTED]" in got.err
