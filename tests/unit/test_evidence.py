"""Evidence per run, and the events each decision leaves, through the Service with a fake sandbox."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from fakesandbox import FakeSandbox, _unmount_staging, kinds, workspace  # noqa: F401
from storefiles import store_text

from airlockd.cli import main
from airlockd.evidence.document import evidence, live_tree
from airlockd.records import RunRecord, RunState
from airlockd.runs.service import Service


def _agent(ws: Path) -> bytes:
    assert not (ws / ".env").exists()  # withheld: absent from the copy
    (ws / "src" / "a.py").write_text("A = 2\n")
    (ws / "src" / "b.py").write_text(f"B = {time.time_ns()}\n")  # a change each run
    return b"done\n"


def _run(svc: Service, prompt: str = "change a") -> RunRecord:
    rec = svc.submit("bot", prompt)
    return svc.execute(rec.id)


def test_evidence_holds_what_a_reviewer_needs(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    rec = _run(svc)
    assert rec.state is RunState.PROPOSED
    ev = evidence(svc, rec.id)
    assert ev["policy"]["revision"] == rec.policy_revision
    assert Path(ev["policy"]["file"]).read_text() == svc.loaded.text
    assert ev["withheld"] == [{"path": ".env", "rule": "withhold:.env"}]
    assert {r["rule"] for r in ev["rules"]} >= {f.rule for f in rec.files}
    assert {d["path"] for d in ev["decisions"]} == {"src/a.py", "src/b.py"}
    assert ev["container"]["network_mode"] == "none" and ev["container"]["cap_drop"] == ["ALL"]
    assert ev["resources"]["effective"]["memory_bytes"] == 1 << 30
    assert ev["tokens"]["used"] == 0 and ev["tokens"]["source"]
    timeline = kinds(ev["timeline"])
    for kind in (
        "admission.admitted",
        "run.staging",
        "stage.withheld",
        "container.starting",
        "container.effective",
        "container.exited",
        "classify",
        "run.proposed",
    ):
        assert kind in timeline, kind
    for e in ev["timeline"]:
        assert e["run"] == rec.id and e["agent"] == "bot" and e["policy"] == rec.policy_revision
        assert isinstance(e["seq"], int) and isinstance(e["at"], float)
    proof = ev["workspace"]
    assert proof["before"]["sha256"] == proof["now"]["sha256"] and proof["unchanged"] is True
    assert proof["after"] is None  # nothing decided yet: measured now, not kept


def test_live_tree_digest_before_and_after(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    rec = _run(svc)
    svc.review.approve(rec.id)
    proof = evidence(svc, rec.id)["workspace"]
    assert proof["after"]["sha256"] == proof["before"]["sha256"] and proof["unchanged"] is True
    # the approval then wrote the workspace: the seal was taken before it did
    assert live_tree(ws, [".env"])["sha256"] != proof["before"]["sha256"]
    assert "workspace.sealed" in kinds(list(svc.audit.events(run=rec.id)))

    rec2 = _run(svc)
    (ws / "notes.txt").write_text("someone edited this while the run was proposed\n")
    assert evidence(svc, rec2.id)["workspace"]["unchanged"] is False
    svc.review.reject(rec2.id)
    proof = evidence(svc, rec2.id)["workspace"]
    assert proof["unchanged"] is False and proof["after"]["sha256"] != proof["before"]["sha256"]


def test_withheld_files_do_not_count_in_the_live_digest(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    before = live_tree(ws, [".env"])
    (ws / ".env").write_text("DB_PASSWORD=rotated-value-123456\n")
    assert live_tree(ws, [".env"])["sha256"] == before["sha256"]
    (ws / "src" / "a.py").chmod(0o600)
    assert live_tree(ws, [".env"])["sha256"] != before["sha256"]


def test_live_digest_is_the_merkle_digest_of_the_scan(tmp_path: Path) -> None:
    from airlockd.pipeline.manifest import scan
    from airlockd.staging.treedigest import SCHEME, TreeDigest

    ws = workspace(tmp_path)
    tree = live_tree(ws, [".env"])
    manifest = scan(ws, lambda rel, is_dir: rel == ".env")
    assert tree["scheme"] == SCHEME and tree["entries"] == len(manifest) > 0
    assert tree["sha256"] == TreeDigest.of(manifest).hexdigest()


def test_a_digest_of_an_older_scheme_is_not_compared(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    rec = _run(svc)

    def as_older_airlockd_kept_it(r: RunRecord) -> None:  # a flat digest, no "scheme" key
        r.live_tree = {"before": {"sha256": "0" * 64, "entries": 3, "at": 1.0}}

    svc.store.update_run(rec.id, as_older_airlockd_kept_it)
    proof = evidence(svc, rec.id)["workspace"]  # still proposed: measured now, another scheme
    assert proof["unchanged"] is None and "different schemes" in proof["note"]
    assert proof["now"]["scheme"] == "merkle-sha256-v1"
    svc.review.reject(rec.id)
    proof = evidence(svc, rec.id)["workspace"]
    assert proof["after"]["scheme"] == "merkle-sha256-v1" and "scheme" not in proof["before"]
    assert proof["unchanged"] is None and "different schemes" in proof["note"]
    sealed = [e for e in svc.audit.events(run=rec.id) if e["kind"] == "workspace.sealed"]
    assert len(sealed) == 1 and sealed[0]["data"]["unchanged"] is None
    assert "different schemes" in sealed[0]["data"]["note"]


def test_show_json_has_evidence_and_policy_show_has_the_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    rec = _run(svc)
    capsys.readouterr()
    assert main(["--workspace", str(ws), "--json", "show", rec.id]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["evidence"]["policy"]["revision"] == rec.policy_revision
    assert shown["policy"]["file"].endswith(f"{rec.policy_revision}.json")
    assert main(["--workspace", str(ws), "--json", "policy", "show", rec.policy_revision[:8]]) == 0
    pol = json.loads(capsys.readouterr().out)
    assert pol["revision"] == rec.policy_revision and "bot" in pol["policy"]["agents"]
    assert main(["--workspace", str(ws), "--json", "policy", "show", "nope"]) == 1


def test_policy_reload_keeps_each_revision(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    first = svc.loaded.revision
    assert not list(svc.state.policies.glob("*.json"))  # constructing it keeps nothing
    svc.recover()  # a daemon's start-up: the revision in force is kept
    (ws / "policies.toml").write_text('[agents.bot]\ncommand = ["false"]\n')
    svc.reload_policy()
    assert svc.loaded.revision != first
    assert {p.stem for p in svc.state.policies.glob("*.json")} >= {first, svc.loaded.revision}
    evs = [e for e in svc.audit.events() if e["kind"] == "policy.reloaded"]
    assert evs and evs[-1]["data"]["previous"] == first and evs[-1]["policy"] == svc.loaded.revision


def test_limit_violation_and_quarantine_and_release_are_events(tmp_path: Path) -> None:
    ws = workspace(tmp_path, "[agents.bot.admission]\nquarantine_after = 1\n")
    svc = Service(ws, sandbox=FakeSandbox(_agent, timed_out=True))
    rec = _run(svc)
    assert rec.state is RunState.LIMIT_EXCEEDED
    evs = list(svc.audit.events(run=rec.id))
    hit = next(e for e in evs if e["kind"] == "limit.exceeded")
    assert hit["data"]["limit"] == "wall_time"
    assert "agent.quarantined" in kinds(evs)
    svc.release("bot")
    rel = [e for e in svc.audit.events() if e["kind"] == "agent.released"][-1]
    assert rel["data"]["by"] == "cli" and rel["agent"] == "bot"


def test_recovery_after_a_crash_is_an_event_and_drops_the_raw_prompt(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    rec = svc.submit("bot", "work")
    raw = svc.state.run_dir(rec.id) / "prompt.raw"
    assert raw.exists()
    svc.store.update_run(rec.id, lambda r: (setattr(r, "state", RunState.RUNNING), setattr(r, "owner_pid", 2**22 + 7)))
    svc2 = Service(ws, sandbox=FakeSandbox(_agent)).recover()  # the start-up step, not construction
    assert svc2.store.get_run(rec.id).state is RunState.FAILED
    ev = next(e for e in svc2.audit.events(run=rec.id) if e["kind"] == "recovery.reconciled")
    assert ev["data"]["was"] == "running" and ev["policy"] == rec.policy_revision
    assert not raw.exists()


def test_stop_records_who_asked(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_agent), actor="lsp")
    rec = svc.submit("bot", "work")
    svc.stop(rec.id, kill=True)
    ev = next(e for e in svc.audit.events(run=rec.id) if e["kind"] == "run.kill_requested")
    assert ev["data"]["by"] == "lsp"


def test_gateway_refusal_hook_records_an_event(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    rec = svc.submit("bot", "work")
    svc.gateway_refused(rec.id, "path not allowed", method="GET", path="/v1/files")
    ev = next(e for e in svc.audit.events(run=rec.id) if e["kind"] == "gateway.refused")
    assert ev["data"]["reason"] == "path not allowed" and ev["agent"] == "bot"


def test_a_prompt_quoting_a_withheld_value_is_refused_and_never_stored(tmp_path: Path) -> None:
    from airlockd.errors import AdmissionRejected

    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    with pytest.raises(AdmissionRejected, match="withheld-value"):
        svc.submit("bot", "use Zq8-withheld-value-xK31 to connect")
    for path in svc.state.root.rglob("*"):
        if path.is_file():
            assert b"Zq8-withheld-value-xK31" not in path.read_bytes(), path


def test_a_changed_path_holding_a_secret_is_denied_and_masked(tmp_path: Path) -> None:
    ws = workspace(tmp_path)

    def agent(w: Path) -> bytes:
        (w / "AKIAIOSFODNN7EXAMPLE.txt").write_text("x\n")
        return b""

    svc = Service(ws, sandbox=FakeSandbox(agent))
    rec = _run(svc)
    assert [f.rule for f in rec.files] == ["invariant:secret-in-name"]
    assert "AKIAIOSFODNN7EXAMPLE" not in store_text(svc.state)
    assert "AKIAIOSFODNN7EXAMPLE" not in svc.state.audit.read_text()


def test_log_records_are_masked(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    ws = workspace(tmp_path)
    svc = Service(ws, sandbox=FakeSandbox(_agent))
    svc.submit("bot", "work")  # learns the withheld values
    with caplog.at_level(logging.INFO):
        logging.getLogger("airlockd.test").info(
            "value %s and key %s", "Zq8-withheld-value-xK31", "AKIAIOSFODNN7EXAMPLE"
        )
    assert "Zq8-withheld-value-xK31" not in caplog.text and "AKIAIOSFODNN7EXAMPLE" not in caplog.text
    assert "[REDACTED]" in caplog.text
    assert os.environ.get("AIRLOCK_STATE_DIR")
