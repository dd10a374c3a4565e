"""Command arguments (one JSON object each), validated with pydantic, and the mapping of airlockd's
errors to JSON-RPC errors. A bad argument is `InvalidParams` naming the field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from airlockd.errors import AirlockError


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NoArgs(_Args):
    pass


class RunTaskArgs(_Args):
    agent: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    mode: Literal["review", "auto"] | None = None
    followUp: str | None = Field(None, min_length=1)


class RunArgs(_Args):
    runId: str = Field(min_length=1)


class StopArgs(RunArgs):
    wait: bool = True  # false: answer at once with the state the run is in then


class DecideArgs(RunArgs):
    paths: list[str] | None = None
    hunks: dict[str, list[str]] | None = None


class DiffArgs(RunArgs):
    path: str | None = None


class AgentArgs(_Args):
    agent: str = Field(min_length=1)


A = TypeVar("A", bound=_Args)


def parse(model: type[A], arguments: Sequence[Any]) -> A:
    """The one JSON object of a command's arguments as `model`; InvalidParams naming the field."""
    if len(arguments) > 1:
        raise invalid(f"expects one JSON object of arguments, got {len(arguments)} values", None)
    raw = arguments[0] if arguments else {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise invalid(f"expects one JSON object of arguments, got {type(raw).__name__}", None)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        what = "unknown argument" if err["type"] == "extra_forbidden" else err["msg"]
        raise invalid(f"invalid argument `{field}`: {what}", field) from None


def invalid(message: str, field: str | None) -> JsonRpcException:
    return JsonRpcInvalidParams(message, data={"error": "usage", "message": message, "field": field})


def rpc_error(exc: AirlockError) -> JsonRpcException:
    """An AirlockError as a JSON-RPC error: its stable code, its message, its data (never a traceback)."""
    message = f"{exc.message} (fix: {exc.hint})" if exc.hint else exc.message
    return JsonRpcException(message, code=exc.rpc_code, data=exc.to_json())
