"""The JSON Schema of the wire (airlockd/protocol.py), which the VS Code extension's types are
generated from: `python -m airlockd.schema --schema` prints it, `--check FILE` says whether the
committed one is current (`make lint`); `make protocol` regenerates both files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from airlockd.protocol import (
    AgentArgs,
    AgentInfo,
    AgentStatus,
    ApproveResult,
    DaemonHello,
    DecideArgs,
    DiffArgs,
    DiffResult,
    Evidence,
    EvidenceDocument,
    ListRunsArgs,
    NoArgs,
    Proposal,
    RunArgs,
    RunDone,
    RunEvent,
    RunOutput,
    RunProgress,
    RunResult,
    RunStatus,
    RunSummary,
    RunTaskArgs,
    StopArgs,
)


class AirlockProtocol(BaseModel):
    """Index of every shape on the wire (never sent itself): the root of the JSON Schema."""

    runEvent: RunEvent
    runStatus: RunStatus
    agentStatus: AgentStatus
    runOutput: RunOutput
    proposal: Proposal
    runResult: RunResult
    approveResult: ApproveResult
    diffResult: DiffResult
    runSummary: RunSummary
    agentInfo: AgentInfo
    evidence: Evidence
    evidenceDocument: EvidenceDocument
    runTaskArgs: RunTaskArgs
    runArgs: RunArgs
    stopArgs: StopArgs
    decideArgs: DecideArgs
    diffArgs: DiffArgs
    agentArgs: AgentArgs
    noArgs: NoArgs
    listRunsArgs: ListRunsArgs
    runProgress: RunProgress
    runDone: RunDone
    daemonHello: DaemonHello


class _Schema(GenerateJsonSchema):
    def field_title_should_be_set(self, schema: Any) -> bool:
        return False  # a titled property becomes a named TypeScript alias per field


SCHEMA_FILE = Path("editors/vscode/schema/airlock.schema.json")


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the wire (validation mode: a field with a default may be absent)."""
    schema = AirlockProtocol.model_json_schema(schema_generator=_Schema)
    for definition in schema["$defs"].values():
        for name, prop in definition.get("properties", {}).items():
            if name not in definition.get("required", ()) and prop.get("default", 0) is None:
                _absent_not_null(prop)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def _absent_not_null(prop: dict[str, Any]) -> None:
    """An optional field is left out rather than sent as null (`Wire`): no null in its schema."""
    del prop["default"]
    branches = [b for b in prop.pop("anyOf", []) if b != {"type": "null"}]
    if len(branches) == 1:
        prop.update(branches[0])
    elif branches:
        prop["anyOf"] = branches


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m airlockd.schema", description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--schema", action="store_true", help="print the JSON Schema on stdout")
    g.add_argument("--check", metavar="FILE", type=Path, help="exit 1 when FILE differs from the generated schema")
    args = p.parse_args(argv)
    text = schema_text()
    if args.schema:
        sys.stdout.write(text)
        return 0
    current = args.check.read_text() if args.check.exists() else ""
    if current != text:
        print(f"{args.check} is out of date with airlockd/protocol.py: run `make protocol`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
