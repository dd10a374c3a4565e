"""One redaction engine for every channel: store, audit, logs, agent output, errors, notifications.

`DETECTORS` are also the content detectors that keep a file out of staging. A `Redactor` knows
the patterns plus the values it was told about (values of withheld files, keys, run tokens), which
it finds in the forms airlockd/knownvalues.py lists (encoded, split, disguised), not only as they are.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from airlockd.filevalues import CREDENTIAL_KEY, NAMED_LEAST, file_values, name_values
from airlockd.knownvalues import KnownScan, KnownValues, ValueForms, b64_stable

MASK = "[REDACTED]"

# Sources of the patterns (adapted, not invented, where a kept catalogue has the format; each
# catalogue's rule id is named beside its pattern):
# - gitleaks, config/gitleaks.toml (MIT licence, Copyright (c) 2019 Zachary Rice),
# - detect-secrets 1.5.0, detect_secrets/plugins/ (Apache-2.0, Yelp),
# - Nosey Parker, crates/noseyparker/data/default/builtin/rules/ (Apache-2.0, Praetorian).
# Every pattern runs in linear time: no nested quantifier that can backtrack, every lazy scan ends
# at a literal or at the end (tests/unit/test_detector_corpus.py times a 1 MB hostile input each).

_B64URL = "[A-Za-z0-9_-]"
# An unpadded base64url segment of a length a canonical encoder writes (never 4n+1 characters; the
# unused bits of the last character zero), so a JWT-shaped string with broken parts is not a JWT.
_B64URL_TAIL = f"(?:{_B64URL}[AQgw]|{_B64URL}{{2}}[AEIMQUYcgkosw048])?"
_JWT_JSON_PART = f"eyJ{_B64URL}(?:{_B64URL}{{4}}){{3,}}{_B64URL_TAIL}"  # '{"' ... : a JSON object

_B64 = "[A-Za-z0-9+/]"
# A base64 value whose bytes hold a ':' (0x3a): in a quad of characters, byte 0 gives 'O' and one
# of 'g'..'v', byte 1 one of 'DTjz' and one of 'o'..'r', byte 2 a multiple of 4 and '6'.
_B64_COLON = f"(?=(?:{_B64}{{4}})*(?:O[g-v]|{_B64}[DTjz][o-r]|{_B64}{{2}}[AEIMQUYcgkosw048]6))"
_B64_VALUE = f"(?:{_B64}{{4}}){{2,}}(?:{_B64}{{2}}==|{_B64}{{3}}=)?(?![A-Za-z0-9+/=])"


# '-----BEGIN ' and 'PRIVATE KEY' as they appear in a base64-encoded PEM, at every alignment.
PEM_BEGIN_B64 = b64_stable(b"-----BEGIN ")
PEM_PRIVATE_KEY_B64 = b64_stable(b"PRIVATE KEY")

# name -> regex over text; each pattern finds a secret, not a hint of one.
DETECTORS: dict[str, re.Pattern[str]] = {
    # gitleaks `private-key` header (any case, any key type); the block is masked to its END line
    # or, when cut short, to the end of the text.
    "private-key": re.compile(
        r"(?i)-----BEGIN[ A-Z0-9_-]{0,40}PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"(?:-----END[ A-Z0-9_-]{0,40}PRIVATE KEY(?: BLOCK)?-----|\Z)"
    ),
    # detect-secrets PrivateKeyDetector ('PuTTY-User-Key-File-2'), with format 3 (PuTTY 0.75+);
    # masked through the Private-MAC line.
    "putty-private-key": re.compile(
        r"PuTTY-User-Key-File-[0-9]+:[ \t]*[\w-]+[\s\S]*?(?:Private-MAC:[ \t]*[0-9A-Fa-f]+|\Z)"
    ),
    # Nosey Parker np.pem.2 (base64 of a PEM private key, as in a kubeconfig `client-key-data`),
    # for any key type and at all 3 base64 alignments, not only the RSA/DSA/EC headers at offset 0.
    "private-key-base64": re.compile(
        "(?:" + "|".join(PEM_BEGIN_B64) + ")[A-Za-z0-9+/]{0,60}?"
        "(?:" + "|".join(PEM_PRIVATE_KEY_B64) + ")[A-Za-z0-9+/]*={0,2}"
    ),
    # detect-secrets PrivateKeyDetector ('BEGIN SSH2 ENCRYPTED PRIVATE KEY'): an RFC 4716-style
    # ssh.com private key (PuTTYgen's "Export ssh.com key"), four dashes and spaces, which the PEM
    # header pattern above does not read; masked to its END line or to the end of the text.
    "ssh2-private-key": re.compile(
        r"(?ai)---- BEGIN SSH2 (?:ENCRYPTED )?PRIVATE KEY ----[\s\S]*?"
        r"(?:---- END SSH2 (?:ENCRYPTED )?PRIVATE KEY ----|\Z)"
    ),
    # gitleaks `age-secret-key`: an age identity (bech32, upper case as age writes it).
    "age-secret-key": re.compile(r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}"),
    "aws-access-key": re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b"),
    "github-token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b"),
    # gitleaks' GitLab rules: personal, runner, deploy, pipeline trigger, feed, SCIM, incoming
    # mail, CI build and agent tokens
    "gitlab-token": re.compile(r"\bgl(?:pat|rt|dt|ptt|ft|soat|imt|cbt|agent)-[A-Za-z0-9_\-]{20,}\b"),
    # gitleaks `slack-*-token` and `slack-app-token` (xapp-)
    "slack-token": re.compile(r"\b(?:xox[abposr]|xapp)-[A-Za-z0-9-]{10,}\b"),
    # gitleaks `slack-webhook-url`
    "slack-webhook": re.compile(r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/]{43,56}"),
    "openai-key": re.compile(r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{20,}\b"),
    "anthropic-key": re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{20,}\b"),
    "google-api-key": re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"),
    "stripe-key": re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}\b"),
    # a Stripe webhook's signing secret
    "stripe-webhook-secret": re.compile(r"\bwhsec_[A-Za-z0-9]{32,}\b"),
    # gitleaks `npm-access-token` (any case, in ASCII).
    # (npm writes the prefix in lower case, an upper-cased config in upper case; gitleaks takes
    # any case, which costs a slow scan of its own)
    "npm-token": re.compile(r"\b(?:npm|NPM)_[A-Za-z0-9]{36}\b"),
    # gitleaks `pypi-upload-token` (a macaroon: its base64 opens with '\x02\x01\x08pypi.org').
    "pypi-token": re.compile(r"pypi-AgE(?:IcHlwaS5vcmc|NdGVzdC5weXBpLm9yZw)[A-Za-z0-9_-]{50,}"),  # and TestPyPI
    # gitleaks `vault-service-token` and `vault-batch-token` (their least lengths; a longer token
    # is masked whole). The legacy `s.` + 24 form is left out: it is any word after "s.".
    "vault-token": re.compile(r"\b(?:hvs\.[A-Za-z0-9_-]{90,}|hvb\.[A-Za-z0-9_-]{138,})"),
    # gitleaks `huggingface-access-token`.
    "huggingface-token": re.compile(r"\bhf_[A-Za-z]{34}\b"),
    # Nosey Parker np.dockerhub.1 (Docker Hub personal access token).
    "dockerhub-token": re.compile(r"\bdckr_(?:pat|oat)_[A-Za-z0-9_-]{27}(?![A-Za-z0-9_-])"),  # personal, organisation
    # gitleaks `sendgrid-api-token`, held to the key's shape: `SG.` + 22 + `.` + 43 base64url.
    "sendgrid-key": re.compile(r"\bSG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])"),
    # Nosey Parker np.google.2 (Google OAuth client secret, prefixed).
    "google-oauth-secret": re.compile(r"\bGOCSPX-[A-Za-z0-9_-]{28}(?![A-Za-z0-9_-])"),
    # gitleaks `digitalocean-pat`, `digitalocean-access-token`, `digitalocean-refresh-token`.
    "digitalocean-token": re.compile(r"\bdo[opr]_v1_[a-f0-9]{64}\b"),
    # gitleaks `shopify-access-token`, `-custom-access-token`, `-private-app-access-token`,
    # `-shared-secret`.
    "shopify-token": re.compile(r"\bshp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"),
    # gitleaks `twilio-api-key`, word-bounded (no longer hex run, no `TASK...`) and holding a digit
    # and a letter, as 32 random hex digits do (not `SK` + 32 zeros, a placeholder).
    "twilio-key": re.compile(r"\bSK(?=[0-9a-fA-F]{0,31}[a-fA-F])(?=[0-9a-fA-F]{0,31}[0-9])[0-9a-fA-F]{32}\b"),
    # gitleaks `jwt` (header and payload are base64url JSON objects: 'eyJ'), with every part held
    # to a length and last character a base64url encoder can produce; the signature may be empty.
    "jwt": re.compile(
        f"(?<!{_B64URL}){_JWT_JSON_PART}\\.{_JWT_JSON_PART}\\.(?:(?:{_B64URL}{{4}})*{_B64URL_TAIL})(?!{_B64URL})"
    ),
    # Nosey Parker np.azure.1 and detect-secrets AzureStorageKeyDetector: the key of an Azure
    # storage or service-bus / event-hub connection string (`AccountKey=`, `SharedAccessKey=`).
    "azure-connection-string": re.compile(
        r"\b(?:AccountKey|SharedAccessKey)[ \t]*=[ \t]*[A-Za-z0-9+/]{20,100}={0,3}(?![A-Za-z0-9+/=])"
    ),
    # detect-secrets BasicAuthDetector: `scheme://user:password@host` (a .git/config remote URL,
    # .git-credentials); RFC 3986 delimiters are never part of the user or the password, so
    # `ssh://git@host`, `https://user@host` and `http://host:8080/` are not credentials.
    "url-credentials": re.compile(r"://[^:/?#\[\]@!$&'()*+,;=\s]+:[^:/?#\[\]@!$&'()*+,;=\s]+@"),
    # A kubeconfig user's credential (no catalogue has one: gitleaks and Nosey Parker match only
    # Secret manifests and bootstrap tokens): a `user:` mapping whose token, password, OIDC
    # tokens, client secret or client key data follow within a few indented lines.
    "kubeconfig-credential": re.compile(
        r"(?m)^[ \t]*user:[ \t]*\r?\n(?:[ \t]{1,40}\S[^\n]{0,120}\n){0,6}?[ \t]{1,40}"
        r"(?:token|password|id-token|refresh-token|access-token|client-secret|client-key-data):"
        r"[ \t]*[\"']?[^\s\"']{8,}"
    ),
    # A .pgpass line, `hostname:port:database:username:password` (PostgreSQL's libpq-pgpass
    # format; no catalogue has one): the port a number or `*`, the host a name, an address or `*`,
    # exactly five fields (an /etc/passwd line has seven).
    "pgpass": re.compile(
        r"(?m)^(?=[^\s:]*[A-Za-z.*])[^\s:#][^\s:]*:(?:[0-9]{1,5}|\*):[^\s:]+:[^\s:]+:"
        r"(?:[^\s:\\]|\\.){3,}[ \t]*\r?$"
    ),
    # Nosey Parker np.http.1 and gitleaks `curl-auth-header` (Basic): an `Authorization` (or
    # `Proxy-Authorization`) header or field with Basic credentials, any case for the header and
    # the scheme (RFC 7617); the credentials a canonical base64 of 6 bytes or more whose text holds
    # a ':' (user:password), checked on the base64 itself at each of the 3 byte positions.
    "http-basic-auth": re.compile(
        r"\b(?:[Aa]uthorization|AUTHORIZATION)[\"']?[ \t]*(?:(?:[:=,]|=>)[ \t]*)?[\"']?(?ai:basic)[ \t]+"
        + _B64_COLON
        + _B64_VALUE
    ),
    "bearer": re.compile(r"(?i)\b(?:authorization\s*[:=]\s*)?bearer\s+[A-Za-z0-9._~+/=\-]{12,}"),
    "airlock-run-token": re.compile(r"\balrt_[A-Za-z0-9_\-.]{20,}"),
}

# Detectors of raw bytes, not text (airlockd/staging/secretscan.py holds them): a private key in
# DER (PKCS#1, PKCS#8, SEC1, OpenSSH's binary form), a PEM private key written in UTF-16, and the
# base64 of a DER private key without PEM lines (a YAML, properties or JSON value). A policy names
# them like DETECTORS; the Redactor has no pattern for them (the values of a file they withhold
# are masked as a withheld file's are).
BYTE_DETECTORS = ("private-key-der", "private-key-utf16", "private-key-der-base64")


def known_detectors() -> list[str]:
    """Every built-in detector name a policy may list."""
    return [*DETECTORS, *BYTE_DETECTORS]


# key = value assignments whose value looks random enough to be a credential: a key token (tried
# only where one starts, taken whole and never given back: linear on any input, where a pattern
# that looks for the keyword inside a run of word characters is quadratic in the run's length),
# followed by `=` or `:` and a value; the key must hold one of the keywords (`_assignments`).
_ASSIGNMENT = re.compile(
    r"(?<![A-Za-z0-9_.\-])(?P<key>[A-Za-z0-9_.\-]++)(?P<sep>\s*+[:=]\s*+[\"']?)(?P<value>[^\s\"'`,;]{12,})"
)
_KEYWORD = CREDENTIAL_KEY


def _assignments(text: str) -> Iterator[re.Match[str]]:
    """Every key = value assignment in `text` whose key names a credential."""
    return (m for m in _ASSIGNMENT.finditer(text) if _KEYWORD.search(m.group("key")))


@dataclass(frozen=True)
class ExtraDetector:
    """A detector a workspace's policy adds (`[[withhold.custom]]`): a regex, and the least
    Shannon entropy (bits per character) of what it finds (its first group, if it has one, else
    the whole match) for that to count as a secret."""

    name: str
    pattern: re.Pattern[str]
    min_entropy: float = 0.0
    keywords: tuple[str, ...] = ()  # one of them, in any case, is in every match (a pre-filter)

    def finds(self, m: re.Match[str]) -> bool:
        found = m.group(1) if self.pattern.groups else m.group(0)
        return bool(found) and shannon_entropy(found) >= self.min_entropy

    def search(self, text: str) -> bool:
        return any(self.finds(m) for m in self.pattern.finditer(text))

    def found(self, text: str) -> list[str]:
        return [m.group(0) for m in self.pattern.finditer(text) if self.finds(m)]

    def mask(self, text: str) -> str:
        return self.pattern.sub(lambda m: MASK if self.finds(m) else m.group(0), text)


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
    """Masks known secret formats, high-entropy key-like assignments and registered values (in
    the forms knownvalues.py finds: base64, hex, percent-encoded, split, look-alike...).

    Thread-safe; `add` grows the set of values (withheld file contents, keys, run tokens).
    """

    MIN_VALUE = 6  # shorter values would mask ordinary words; so would a shorter folded form

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, ValueForms] = {}
        self._known = KnownValues()  # replaced whole under the lock, read without it
        self._names: dict[str, ValueForms] = {}  # the values no staged file name may carry
        self._in_names = KnownValues()
        self._extra: dict[ExtraDetector, ExtraDetector] = {}
        self.add(*values)
        _LIVE.add(self)  # so logs and error messages of this process mask what it knows

    def learn(self, text: str) -> None:
        """Register every secret the patterns find in `text` as an exact value, so a later copy
        of it without its telltale context (a bare value echoed by the agent) is masked too."""
        found = [m for _, m in find_secrets(text)]
        for extra in list(self._extra.values()):
            found.extend(extra.found(text))
        for m in _assignments(text):
            if shannon_entropy(m.group("value")) >= 3.0:
                found.append(m.group("value"))
        self.add(*found)

    def add_detectors(self, *detectors: ExtraDetector) -> None:
        """Mask what these detectors find too (a workspace's own). Never forgets one: a policy
        reload that drops a detector keeps masking with it in this process."""
        with self._lock:
            for d in detectors:
                self._extra.setdefault(d, d)

    @property
    def masks_more_than_patterns(self) -> bool:
        return bool(self._known) or bool(self._extra)

    def known_in(self, text: str) -> bool:
        """Whether `text` holds one of the registered values, as it is or in a form
        knownvalues.py finds (never says which)."""
        return self._known.found_in(text)

    def known_scan(self) -> KnownScan:
        """A search for the registered values in a stream of bytes fed to it chunk by chunk."""
        return self._known.scan()

    def add(self, *values: str, in_names: bool = True) -> None:
        """Mask `values` from here on. `in_names`: they are secrets by where they came from (a
        key, a run token, a detector's find), so no staged file name may carry them either."""
        with self._lock:
            grown = False
            for v in values:
                v = v.strip()
                if len(v) >= self.MIN_VALUE and v not in self._values:
                    self._values[v] = ValueForms.of(v, self.MIN_VALUE)
                    grown = True
            if grown:
                self._known = KnownValues(self._values.values())
        if in_names:
            self._add_names([v for v in values if len(v.strip()) >= NAMED_LEAST])

    def _add_names(self, values: Iterable[str]) -> None:
        with self._lock:
            grown = False
            for v in values:
                v = v.strip()
                if v not in self._names:
                    self._names[v] = self._values.get(v) or ValueForms.of(v, self.MIN_VALUE)
                    grown = True
            if grown:
                self._in_names = KnownValues(self._names.values())

    def in_name(self, text: str) -> bool:
        """Whether `text` (a path, or paths one per line) carries a value no file name may: a
        credential's or one that looks generated (filevalues.name_values), in any form
        knownvalues.py finds."""
        return self._in_names.found_in(text)

    @property
    def names_known(self) -> int:
        """How many values a file name may not carry (grows as staging learns them)."""
        return len(self._names)

    def export(self) -> dict[str, list[str]]:
        """What this Redactor knows, for a process this one starts (over a pipe): `restore`."""
        with self._lock:
            return {"values": sorted(self._values), "in_names": sorted(self._names)}

    def restore(self, known: dict[str, list[str]] | list[str]) -> None:
        """Learn what `export` gave (a bare list: values, none known to be a credential)."""
        if isinstance(known, list):
            self.add(*map(str, known), in_names=False)
            return
        self.add(*map(str, known.get("values", [])), in_names=False)
        self._add_names(map(str, known.get("in_names", [])))

    def add_file_values(self, text: str) -> None:
        """Register the values of a withheld file (`KEY=value`, `key: value`, `"key": "value"`
        lines, the strings of a JSON file, what a base64 value decodes to; a line with no key
        whole)."""
        self.add(*file_values(text), in_names=False)
        self._add_names(name_values(text))

    def text(self, s: str) -> str:
        if not s:
            return s
        s = self._known.mask(s, MASK)
        for pat in DETECTORS.values():
            s = pat.sub(MASK, s)
        for extra in list(self._extra.values()):
            s = extra.mask(s)

        def _assign(m: re.Match[str]) -> str:
            value = m.group("value")
            if value == MASK or shannon_entropy(value) < 3.0 or not _KEYWORD.search(m.group("key")):
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
        if red.masks_more_than_patterns:
            obj = red.value(obj)
    return obj


def secret_in_name(name: str) -> bool:
    """Whether a name (a branch, a path) holds what a detector finds, or a value no file name may
    carry that any live Redactor of this process knows (Redactor.in_name)."""
    if any(pat.search(name) for pat in DETECTORS.values()):
        return True
    return any(red.in_name(name) for red in list(_LIVE) if red.names_known)


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
