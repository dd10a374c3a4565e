"""One redaction engine for every channel: store, audit, logs, agent output, errors, notifications.

`DETECTORS` are also the content detectors that keep a file out of staging. A `Redactor` knows
the patterns plus the exact values it was told about (values of withheld files, keys, run tokens).
"""

from __future__ import annotations

import logging
import math
import re
import threading
import weakref
from collections.abc import Iterable
from typing import Any

MASK = "[REDACTED]"

# name -> regex over text; each pattern finds a secret, not a hint of one.
DETECTORS: dict[str, re.Pattern[str]] = {
    "private-key": re.compile(
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)"
    ),
    "aws-access-key": re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b"),
    "github-token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b"),
    "gitlab-token": re.compile(r"\bglpat-[A-Za-z0-9_\-]{20,}\b"),
    "slack-token": re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b"),
    "openai-key": re.compile(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}\b"),
    "anthropic-key": re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{20,}\b"),
    "google-api-key": re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"),
    "stripe-key": re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}\b"),
    "jwt": re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\b"),
    "bearer": re.compile(r"(?i)\b(?:authorization\s*[:=]\s*)?bearer\s+[A-Za-z0-9._~+/=\-]{12,}"),
    "airlock-run-token": re.compile(r"\balrt_[A-Za-z0-9_\-.]{20,}"),
}

# key = value assignments whose value looks random enough to be a credential.
_ASSIGNMENT = re.compile(
    r"(?i)(?P<key>[A-Za-z0-9_.\-]*(?:secret|token|passw(?:or)?d|api[_-]?key|access[_-]?key|"
    r"private[_-]?key|credential|auth)[A-Za-z0-9_.\-]*)(?P<sep>\s*[:=]\s*[\"']?)(?P<value>[^\s\"'`,;]{12,})"
)


def shannon_entropy(s: str) -> float:
    if not s:
        return 0.0
    counts: dict[str, int] = {}
    for ch in s:
        counts[ch] = counts.get(ch, 0) + 1
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def find_secrets(text: str, names: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """(detector, matched text) for each detector in `names` (all when None) that fires."""
    found = []
    for name in names if names is not None else DETECTORS:
        pat = DETECTORS[name]
        for m in pat.finditer(text):
            found.append((name, m.group(0)))
    return found


class Redactor:
    """Masks known secret formats, high-entropy key-like assignments and registered values.

    Thread-safe; `add` grows the set of exact values (withheld file contents, keys, run tokens).
    """

    MIN_VALUE = 6  # shorter values would mask ordinary words

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: set[str] = set()
        self._values_re: re.Pattern[str] | None = None
        self.add(*values)
        _LIVE.add(self)  # so logs and error messages of this process mask what it knows

    def learn(self, text: str) -> None:
        """Register every secret the patterns find in `text` as an exact value, so a later copy
        of it without its telltale context (a bare value echoed by the agent) is masked too."""
        found = [m for _, m in find_secrets(text)]
        for m in _ASSIGNMENT.finditer(text):
            if shannon_entropy(m.group("value")) >= 3.0:
                found.append(m.group("value"))
        self.add(*found)

    def known_in(self, text: str) -> bool:
        """Whether `text` holds one of the registered values (never says which)."""
        values_re = self._values_re
        return values_re is not None and values_re.search(text) is not None

    def add(self, *values: str) -> None:
        with self._lock:
            for v in values:
                v = v.strip()
                if len(v) >= self.MIN_VALUE:
                    self._values.add(v)
            if self._values:
                alts = sorted(self._values, key=len, reverse=True)
                self._values_re = re.compile("|".join(re.escape(a) for a in alts))

    def values(self) -> list[str]:
        """The registered exact values (to hand to a process this one starts, over a pipe)."""
        with self._lock:
            return sorted(self._values)

    def add_file_values(self, text: str) -> None:
        """Register the values of a withheld file (`KEY=value` lines, or the whole content)."""
        vals = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            _, sep, value = line.partition("=")
            if not sep:
                _, sep, value = line.partition(":")
            value = value.strip().strip("\"'") if sep else line
            if len(value) >= self.MIN_VALUE:
                vals.append(value)
        self.add(*vals)

    def text(self, s: str) -> str:
        if not s:
            return s
        values_re = self._values_re
        if values_re is not None:
            s = values_re.sub(MASK, s)
        for pat in DETECTORS.values():
            s = pat.sub(MASK, s)

        def _assign(m: re.Match[str]) -> str:
            value = m.group("value")
            if value == MASK or shannon_entropy(value) < 3.0:
                return m.group(0)
            return f"{m.group('key')}{m.group('sep')}{MASK}"

        return _ASSIGNMENT.sub(_assign, s)

    def value(self, obj: Any) -> Any:
        """Redact every string inside a JSON-like structure (keys included)."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self.text(k) if isinstance(k, str) else k: self.value(v) for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return [self.value(v) for v in obj]
        return obj


# Every Redactor of this process: logs and error messages are masked with all of them, so a value
# learnt while staging one run is masked in whatever this process prints afterwards.
_LIVE: weakref.WeakSet[Redactor] = weakref.WeakSet()
_PATTERNS_ONLY = Redactor()


def scrub(obj: Any) -> Any:
    """Redact with the patterns and with every value any live Redactor of this process knows."""
    obj = _PATTERNS_ONLY.value(obj)
    for red in list(_LIVE):
        if red._values_re is not None:
            obj = red.value(obj)
    return obj


class RedactingFilter(logging.Filter):
    """Masks a log record's message, arguments, traceback and stack before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_airlock_redacted", False):
            return True
        try:
            msg = record.getMessage()
        except Exception:  # a bad format string must not hide the record
            msg = f"{record.msg!r} {record.args!r}"
        record.msg, record.args = scrub(msg), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text)
        if record.stack_info:
            record.stack_info = scrub(record.stack_info)
        record._airlock_redacted = True
        return True


_FILTER = RedactingFilter()
_installed = False


def install_log_redaction() -> None:
    """Mask every record of airlockd's loggers at creation (whatever handler later gets it),
    and every record reaching the root handlers (third-party loggers too). Idempotent."""
    global _installed
    for handler in logging.getLogger().handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
    if _installed:
        return
    _installed = True
    factory = logging.getLogRecordFactory()

    def redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        if record.name == "airlockd" or record.name.startswith("airlockd."):
            _FILTER.filter(record)
        return record

    logging.setLogRecordFactory(redacting_factory)
