"""Command arguments (one JSON object each, modelled in `airlockd.protocol`) validated, and the
mapping of airlockd's errors to JSON-RPC errors. A bad argument is `InvalidParams` naming the field.
Error messages may quote what the client sent (a path, a key): they pass the redactor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import ValidationError
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams

from airlockd.errors import AirlockError
from airlockd.protocol import Args
from airlockd.redact import scrub

A = TypeVar("A", bound=Args)


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
    message, field = scrub(message), scrub(field)
    return JsonRpcInvalidParams(message, data={"error": "usage", "message": message, "field": field})


def rpc_error(exc: AirlockError) -> JsonRpcException:
    """An AirlockError as a JSON-RPC error: its stable code, its message, its data (never a traceback)."""
    message = f"{exc.message} (fix: {exc.hint})" if exc.hint else exc.message
    return JsonRpcException(scrub(message), code=exc.rpc_code, data=scrub(exc.to_json()))
