"""Every error a user can see, with its CLI exit code and JSON-RPC code in one place."""

from __future__ import annotations

from typing import Any, ClassVar

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_ADMISSION = 3
EXIT_LIMIT = 4
EXIT_CONFLICT = 5


class AirlockError(Exception):
    """Root of airlockd's errors: a message a person can act on, plus machine-readable data."""

    exit_code: ClassVar[int] = EXIT_ERROR
    rpc_code: ClassVar[int] = -32001
    kind: ClassVar[str] = "error"

    def __init__(self, message: str, *, hint: str | None = None, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.data = data

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.hint}" if self.hint else self.message

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.kind, "message": self.message}
        if self.hint:
            out["hint"] = self.hint
        out.update(self.data)
        return out


class UsageError(AirlockError):
    exit_code = EXIT_USAGE
    rpc_code = -32602
    kind = "usage"


class PolicyError(AirlockError):
    """A policy file that does not validate: names the file, the key and the fix."""

    rpc_code = -32010
    kind = "policy"


class NotFoundError(AirlockError):
    rpc_code = -32011
    kind = "not_found"


class StateError(AirlockError):
    """An operation that does not fit the run's current state (approving a rejected run...)."""

    rpc_code = -32012
    kind = "state"


class StillEnding(StateError):
    """A stop or kill was delivered but the run had not ended within its grace and a margin."""

    rpc_code = -32014
    kind = "still_ending"


class EngineError(AirlockError):
    """The container engine is missing, not running, or refused a request."""

    rpc_code = -32013
    kind = "engine"


class AdmissionRejected(AirlockError):
    exit_code = EXIT_ADMISSION
    rpc_code = -32020
    kind = "admission_rejected"


class LimitExceeded(AirlockError):
    exit_code = EXIT_LIMIT
    rpc_code = -32021
    kind = "limit_exceeded"


class ConflictError(AirlockError):
    """The live workspace moved under a proposal: nothing was written."""

    exit_code = EXIT_CONFLICT
    rpc_code = -32030
    kind = "conflict"

    def __init__(self, message: str, *, paths: list[str], hint: str | None = None) -> None:
        super().__init__(message, hint=hint, paths=paths)
        self.paths = paths


class CommitError(AirlockError):
    """A commit failed part-way and was rolled back (the workspace is as it was)."""

    rpc_code = -32031
    kind = "commit_failed"


def from_json(message: str, data: Any) -> AirlockError:
    """An error answered by the daemon (its `data` is `to_json()`) as the AirlockError it was."""
    data = dict(data) if isinstance(data, dict) else {}
    kind = data.pop("error", "error")
    msg = data.pop("message", message)
    hint = data.pop("hint", None)
    cls = next((c for c in _subclasses(AirlockError) if c.kind == kind), AirlockError)
    if cls is ConflictError:
        return ConflictError(msg, paths=list(data.get("paths") or []), hint=hint)
    err = AirlockError.__new__(cls)
    AirlockError.__init__(err, msg, hint=hint, **data)
    return err


def _subclasses(cls: type[AirlockError]) -> list[type[AirlockError]]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out
