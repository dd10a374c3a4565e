"""Workspace growth cap, token budget mid-flight, and live resource peaks (real engine)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from airlockd.runs.service import Service
from airlockd.staging.stagers import proposed_path

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

POLICY = """
[agents.bot]
command = ["bash", "-c", "{{prompt}}"]
prompt = "argv"
runtime = "{runtime}"
[agents.bot.limits]
wall_time_s = 30
workspace_growth_mb = {growth}
[agents.bot.admission]
max_tokens = {tokens}
"""


def workspace(tmp_path: Path, growth: int = 8, tokens: int = 0, runtime: str = "runc") -> Service:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    (ws / "policies.toml").write_text(POLICY.format(growth=growth, tokens=tokens, runtime=runtime))
    return Service(ws)


def test_writing_without_end_stops_at_the_growth_cap(tmp_path: Path, runtime: str) -> None:
    svc = workspace(tmp_path, growth=8, runtime=runtime)
    disk_before = shutil.disk_usage(svc.state.root).used
    rec = svc.submit("bot", "dd if=/dev/zero of=big bs=1M count=100000; echo dd-ended $?")
    rec = svc.execute(rec.id)
    assert rec.state.value == "limit_exceeded", rec.transitions[-1]
    assert rec.limit is not None and rec.limit.limit == "workspace_growth"
    cap = 8 * 2**20
    assert cap - 2**20 <= rec.limit.measured <= cap and rec.limit.allowed == cap
    assert "No space left on device" in (svc.state.run_dir(rec.id) / "output.log").read_text()
    # the host disk grew by at most the cap (the staging copy was kept for inspection on disk)
    assert shutil.disk_usage(svc.state.root).used - disk_before < cap + 4 * 2**20
    assert svc.store.get_agent("bot").consecutive_violations == 1
    assert rec.container["runtime"] == runtime


def test_token_budget_reached_mid_flight_stops_the_run(tmp_path: Path) -> None:
    svc = workspace(tmp_path, tokens=1000)
    usage = '{"type":"turn.completed","usage":{"input_tokens":600,"output_tokens":500}}'
    rec = svc.submit("bot", f"echo '{usage}'; echo ok > done.txt; sleep 20")
    rec = svc.execute(rec.id)
    assert rec.state.value == "limit_exceeded"
    assert rec.limit is not None and rec.limit.limit == "tokens" and rec.limit.measured == 1100
    assert rec.container["duration_s"] < 15  # stopped, not left to its sleep
    assert svc.store.get_agent("bot").tokens_used == 1100
    with pytest.raises(Exception, match="token budget spent"):
        svc.submit("bot", "true")


def test_peaks_are_sampled_while_running(tmp_path: Path, runtime: str) -> None:
    svc = workspace(tmp_path, runtime=runtime)
    events: list[dict[str, object]] = []
    svc.subscribe(lambda kind, payload: events.append({"kind": kind, **payload}))
    rec = svc.submit("bot", "python3 -c 'b = bytearray(40 << 20); import time; time.sleep(4)'")
    rec = svc.execute(rec.id)
    assert rec.state.value == "applied" and rec.transitions[-1].detail == "no changes"
    assert rec.peak["mem_bytes"] >= 30 * 2**20, rec.peak
    if runtime == "runc":  # gVisor's processes are not the host kernel's to count (docs/containment.md)
        assert rec.peak["pids"] >= 1
    else:
        assert "pids" not in rec.peak, rec.peak
    running = [e for e in events if e["kind"] == "runStatus" and e["state"] == "running"]
    assert len(running) >= 2 and max(int(e["memBytes"]) for e in running) >= 30 * 2**20  # type: ignore[call-overload]


@pytest.mark.parametrize("mode", ["reject", "redact"])
def test_prompt_with_a_secret(tmp_path: Path, mode: str) -> None:
    svc = workspace(tmp_path)
    policy = svc.workspace / "policies.toml"
    policy.write_text(policy.read_text() + f'prompt_secrets = "{mode}"\n')
    svc.reload_policy()
    key = "AKIA" + "Q" * 16
    if mode == "reject":
        with pytest.raises(Exception, match="aws-access-key") as err:
            svc.submit("bot", f"deploy with {key}")
        assert getattr(err.value, "exit_code", None) == 3
        assert svc.store.get_agent("bot").runs_used == 0
        return
    rec = svc.submit("bot", f"echo 'deploy with {key}' > said.txt")
    assert rec.prompt_redactions == ["aws-access-key"] and key not in rec.prompt
    rec = svc.execute(rec.id)
    said = proposed_path(svc.state.run_dir(rec.id), "said.txt")  # the upper layer or the copy
    assert said.read_text() == "deploy with [REDACTED]\n"  # the agent never saw the key
