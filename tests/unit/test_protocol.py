"""The wire models (airlockd/protocol.py): event lines between the run process and the daemon, the
optional-field rule, and the committed JSON Schema the VS Code extension's types come from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from airlockd import protocol
from airlockd import schema as wire_schema
from airlockd.protocol import AgentStatus, ProgressEvent, RunEvent, RunStatus
from airlockd.records import RunState

ROOT = Path(__file__).resolve().parents[2]


def _status(**extra: object) -> RunStatus:
    return RunStatus.model_validate(
        {
            "runId": "r1",
            "agent": "bot",
            "state": "running",
            "elapsedS": 1.5,
            "cpuPct": 12.5,
            "memBytes": 1 << 20,
            "outputBytes": 10,
            "tokens": 0,
            **extra,
        }
    )


AGENT = AgentStatus(agent="bot", quarantined=True, reason="3 limit violations", runsUsed=4, tokensUsed=0)


@pytest.mark.parametrize(
    "event",
    [
        RunEvent(protocol.RunStatusEvent(type="runStatus", payload=_status())),
        RunEvent(protocol.RunStatusEvent(type="runStatus", payload=_status(conflicts=["src/a.py"]))),
        RunEvent(protocol.AgentStatusEvent(type="agentStatus", payload=AGENT)),
        RunEvent(ProgressEvent(type="progress", stage=RunState.STAGING, message="copying the workspace")),
    ],
    ids=["runStatus", "runStatus-conflicts", "agentStatus", "progress"],
)
def test_event_line_round_trip(event: RunEvent) -> None:
    line = event.line()
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert RunEvent.of_line(line.encode()) == event.root
    assert json.loads(line)["type"] == event.root.type


def test_service_events_become_their_models() -> None:
    """What `Service.subscribe` listeners get (event name, payload dict) is parsed by name."""
    got = RunEvent.of_service("runStatus", _status().wire()).root
    assert isinstance(got, protocol.RunStatusEvent) and got.payload.state is RunState.RUNNING
    got = RunEvent.of_service("agentStatus", AGENT.wire()).root
    assert isinstance(got, protocol.AgentStatusEvent) and got.payload.quarantined


@pytest.mark.parametrize(
    "raw",
    [
        b"not json at all\n",
        b"\xff\xfe\x00\n",
        b'{"event": "runStatus", "payload": {}}\n',  # the key-sniffed lines of older run processes
        b'{"type": "hello", "payload": {}}\n',
        b'{"type": "progress", "stage": "staging"}\n',
        b'{"type": "progress", "stage": "dancing", "message": ""}\n',
        b'{"type": "agentStatus", "payload": {"agent": "bot"}}\n',
        b'{"type": "progress", "stage": "staging", "message": "", "extra": 1}\n',
    ],
)
def test_a_malformed_line_is_a_validation_error(raw: bytes) -> None:
    """The daemon (lsp/runs.py) logs and skips exactly this exception, so nothing else may escape."""
    with pytest.raises(ValidationError):
        RunEvent.of_line(raw)


def test_optional_fields_are_absent_and_nullable_ones_are_null() -> None:
    assert "conflicts" not in _status().wire()
    assert _status(conflicts=["a"]).wire()["conflicts"] == ["a"]
    assert AgentStatus(agent="bot", quarantined=False, reason=None, runsUsed=0, tokensUsed=0).wire()["reason"] is None
    schema = wire_schema.json_schema()["$defs"]
    assert schema["RunStatus"]["properties"]["conflicts"] == {"items": {"type": "string"}, "type": "array"}
    assert {"type": "null"} in schema["AgentStatus"]["properties"]["reason"]["anyOf"]
    assert "reason" in schema["AgentStatus"]["required"]


def test_enums_on_the_wire() -> None:
    schema = wire_schema.json_schema()["$defs"]
    assert schema["HunkState"]["enum"] == ["pending", "accepted", "rejected", "conflicted"]
    assert {"created", "modified", "deleted", "type_changed"} <= set(schema["ChangeKind"]["enum"])
    assert schema["FileChange"]["properties"]["state"] == {"$ref": "#/$defs/FileState"}
    with pytest.raises(ValidationError):
        protocol.Hunk.model_validate(
            {
                "id": "h1",
                "range": {"start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 0}},
                "state": "maybe",
                "oldLines": 1,
                "newLines": 1,
                "oldText": "a\n",
                "newText": "b\n",
            }
        )


def test_committed_schema_is_the_generated_one() -> None:
    committed = (ROOT / wire_schema.SCHEMA_FILE).read_text()
    assert committed == wire_schema.schema_text(), "the schema is stale: run `make protocol` and commit the result"


def test_check_names_the_command_that_regenerates(tmp_path: Path) -> None:
    stale = tmp_path / "airlock.schema.json"
    stale.write_text("{}\n")
    cmd = [sys.executable, "-m", "airlockd.schema", "--check", str(stale)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert out.returncode == 1 and "make protocol" in out.stderr
    stale.write_text(wire_schema.schema_text())
    assert subprocess.run(cmd, capture_output=True, text=True, check=False).returncode == 0
