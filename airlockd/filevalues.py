"""The values of a withheld file: what a Redactor is told to find (knownvalues.py finds them)."""

from __future__ import annotations

import base64
import binascii
import json
import re

_QUOTED_KEY = re.compile(r"""(?:-\s*)?(?P<q>["'])(?P<key>(?:\\.|(?!(?P=q)).)*+)(?P=q)\s*[:=]\s*(?P<value>.*)""")
_YAML_SEP = re.compile(r":(?:\s|$)")
_KEY_BREAK = re.compile(r"[\s\"']")
_BASE64_TEXT = re.compile(r"[A-Za-z0-9+/]{8,}={0,2}")
_JSON = json.JSONDecoder()


def file_values(text: str) -> list[str]:
    """The values in a withheld file's text: the value of each `KEY=value`, `key: value` or
    `"key": "value",` line (unquoted; the whole line when it has no key), every string in it when
    it is JSON, and what a value that is base64 of text decodes to (a docker `auth`, an `.npmrc`
    `_auth` or `_password`, a Kubernetes secret's data) with the password of a `user:password`."""
    values = (_json_strings(text) or []) if text.lstrip()[:1] in ("{", "[") else []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            values += _line_values(line)
    return values + [part for v in values for part in _decoded(v)]


def _line_values(line: str) -> list[str]:
    return _keyed(line)[1]


def _keyed(line: str) -> tuple[str | None, list[str]]:
    """A line's key (None when it has none) and its values."""
    m = _QUOTED_KEY.match(line)  # JSON, or YAML with a quoted key: the key ends at its quote
    if m:
        return m["key"], _unquoted(m["value"])
    body = line.removeprefix("export ").lstrip()
    key, eq, rest = body.partition("=")
    if eq and key.strip() and not _KEY_BREAK.search(key.strip()):  # KEY=value, an .npmrc //host/:_auth=
        return key.strip(), _unquoted(rest)
    m = _YAML_SEP.search(body)  # key: value (the value may hold '=' and ':')
    if m:
        return body[: m.start()], _unquoted(body[m.end() :])
    key, colon, rest = body.partition(":")
    return (key, _unquoted(rest)) if colon else (None, [line])


# What names a credential, in a key (redact.py masks a high-entropy value assigned to one).
CREDENTIAL_KEY = re.compile(
    r"(?i)secret|token|passw(?:or)?d|pwd|api[_-]?key|access[_-]?key|private[_-]?key|credential|auth"
)
# The keys whose values a file name must not carry: wider (the cost of a false hit is a withheld
# file, not a masked line): any key, pass, passphrase, pw, pin, salt, dsn, cookie, session...
NAME_KEY = re.compile(
    r"(?i)secret|token|pass|pwd|(?:^|[^a-z])(?:pw|pin|pat|psk|sig)(?:[^a-z]|$)|key|salt|dsn|auth|cred"
    r"|cookie|session|signature|bearer|cert|hmac|jwt|otp|seed|mnemonic|phrase"
)
NAMED_LEAST = 8  # a credential's value shorter than this is not sought in file names
RANDOM_LEAST = 16  # nor is a generated-looking value of another key shorter than this
# A path, not a secret: where a key or a certificate is (`SSL_CERT_FILE=/etc/ssl/cert.pem`,
# `KEY_PATH=./keys/dev.key`, `session_dir: ~/tmp`); the file it names is judged for itself.
_PATH_LIKE = re.compile(r"^(?:\.{0,2}/|~/)|^[\w.-]+(?:/[\w.-]+)+\.[A-Za-z]{1,5}$")
# What marks a credential's value as no word: a digit or a sign beside its letters (`hunter2`,
# `Winter2024.Prod`, `admin:pw`); `database`, `storefront`, `postgres`, `password`,
# `correct-horse-battery` are words (a Laravel `.env` has `SESSION_DRIVER=database`, and the
# project a `database/` folder).
_NOT_A_WORD = re.compile(r"[A-Za-z].*(?:[0-9]|[^\w\s.-])|(?:[0-9]|[^\w\s.-]).*[A-Za-z]")
_SEGMENTS = re.compile(r"[^-_/+=:,;@~]+")


def _password_of(value: str) -> list[str]:
    """The password of a `user:password` value (`CREDS=admin:hunter2`), not of a URL."""
    user, colon, password = value.partition(":")
    return [password] if colon and user and "/" not in value and "@" not in value else []


def _credential_like(value: str) -> bool:
    """Whether a value under a credential's key is sought in names: NAMED_LEAST long, and letters
    with a digit or a sign, or generated-looking; not a word (see _NOT_A_WORD)."""
    return len(value) >= NAMED_LEAST and (_NOT_A_WORD.search(value) is not None or looks_random(value))


def looks_random(value: str) -> bool:
    """Whether `value` reads as generated (a token, a key, a password made by a tool): at least
    RANDOM_LEAST characters, no blank or dot (a host name, a version or a file name has dots:
    `db01.internal`, and may name a folder), and a stretch of 12 or more between separators that
    mixes letters and digits, varied (`Xk29fQ8vLmP3zR7wT1b`, a hex digest, a UUID's last part; not
    `feature-1234-login-page` or `2024a-build-0001-linux`, made of words and numbers)."""
    if len(value) < RANDOM_LEAST or any(c.isspace() or c == "." for c in value):
        return False
    for seg in _SEGMENTS.findall(value):
        if len(seg) < 12 or not any(c.isdigit() for c in seg) or not any(c.isalpha() for c in seg):
            continue
        if len(set(seg)) * 2 >= min(len(seg), 32):  # varied: no "aaaa1111aaaa"
            return True
    return False


def name_values(text: str) -> list[str]:
    """The values of a withheld file a file name must not carry: those of its credential keys
    (NAME_KEY: `DB_PASS=`, `signing_key:`, `"token":`, in JSON at any depth), at least NAMED_LEAST
    long, with what they decode to; and any other that looks generated (looks_random: under
    another key, or a line that is a token alone). Not the others: an `.env` says
    `APP_NAME=shop`, `BRANCH=feature-12-login` and `DB_HOST=db01`, and the workspace has a `shop/`
    folder; withholding it would break the run for no secret."""
    out: list[str] = []
    if text.lstrip()[:1] in ("{", "["):
        out += _json_credentials(text)
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, values = _keyed(line)
        if key is not None and NAME_KEY.search(key):
            values = [v for v in values if not _PATH_LIKE.search(v.strip())]  # KEY_FILE=./keys/dev.key
            parts = [p for v in values for p in (v, *_decoded(v), *_password_of(v))]
            out += [p for p in parts if _credential_like(p.strip())]
        else:
            out += [v for v in values if looks_random(v.strip())]
    return out


def _json_credentials(text: str) -> list[str]:
    """The strings of a JSON document under a credential key (a service account's `private_key`,
    an OAuth client's `client_secret`)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return []
    out: list[str] = []
    todo: list[tuple[bool, object]] = [(False, doc)]
    while todo:
        keyed, item = todo.pop()
        if isinstance(item, str):
            if (keyed and _credential_like(item.strip())) or looks_random(item.strip()):
                out += [item, *_decoded(item)]
        elif isinstance(item, dict):
            todo += [(keyed or NAME_KEY.search(str(k)) is not None, v) for k, v in item.items()]
        elif isinstance(item, list):
            todo += [(keyed, v) for v in item]
    return out


def _unquoted(rest: str) -> list[str]:
    v = rest.strip()
    if v[:1] == '"':
        try:
            s, end = _JSON.raw_decode(v)  # the string ends at its closing quote; escapes read
        except ValueError:
            pass
        else:
            if isinstance(s, str):
                return [s, *_past_quote(v, s, end)]
    end = v.find(v[0], 1) if v[:1] in ("'", '"') else -1
    if end > 0:
        return [v[1:end], *_past_quote(v, v[1:end], end + 1)]
    if v[:1] in ("{", "["):  # a JSON object or list on one line: its strings, if it has any
        inner = _json_strings(v)
        if inner:
            return inner
    v = v.strip("\"'")
    return [v, v.split(" #", 1)[0].rstrip()] if " #" in v else [v]


def _past_quote(v: str, quoted: str, end: int) -> list[str]:
    """When text follows a quoted value's closing quote (`"abc"def`, which a shell reads as
    `abcdef`; a value that merely starts with a quote), the value as written and as a shell joins
    it: which of the three the file meant cannot be known, so all are withheld values."""
    rest = v[end:]
    tail = rest.strip()
    if not tail or tail in ("}", "]") or _separated(tail):
        return []
    if tail[0] == "#" and rest[:1].isspace():  # a comment; `""#x` is the shell's `#x`
        return []
    return [v, quoted + tail.strip("\"'")]


def _separated(tail: str) -> bool:
    """Whether what follows a quoted value starts another item (`"abc", "next": 1`, `'a'; b`: a
    separator, then a space or nothing), not more of the value (`"00",000` or `"00","000"`, which a
    shell reads as `00,000`)."""
    return tail[0] in ",;" and (len(tail) == 1 or tail[1] in " \t")


def _json_strings(text: str) -> list[str] | None:
    """Every string in `text` when it is a JSON document (None when it is not)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    out, todo = [], [doc]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            todo += item.values()
        elif isinstance(item, list):
            todo += item
    return out


def _decoded(value: str) -> list[str]:
    """What `value` decodes to when it is base64 of printable text, and the password of a
    `user:password` (the user alone is no secret)."""
    if len(value) % 4 or not _BASE64_TEXT.fullmatch(value):
        return []
    try:
        text = base64.b64decode(value, validate=True).decode().strip()
    except (binascii.Error, UnicodeDecodeError):
        return []
    if not text.isprintable():
        return []
    _, colon, password = text.partition(":")
    return [text, password] if colon else [text]
