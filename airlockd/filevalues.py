"""The values of a withheld file: what a Redactor is told to find (knownvalues.py finds them)."""

from __future__ import annotations

import base64
import binascii
import json
import re

_QUOTED_KEY = re.compile(r"""(?:-\s*)?(?P<q>["'])(?:\\.|(?!(?P=q)).)*+(?P=q)\s*[:=]\s*(?P<value>.*)""")
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
    m = _QUOTED_KEY.match(line)  # JSON, or YAML with a quoted key: the key ends at its quote
    if m:
        return _unquoted(m["value"])
    body = line.removeprefix("export ").lstrip()
    key, eq, rest = body.partition("=")
    if eq and key.strip() and not _KEY_BREAK.search(key.strip()):  # KEY=value, an .npmrc //host/:_auth=
        return _unquoted(rest)
    m = _YAML_SEP.search(body)  # key: value (the value may hold '=' and ':')
    if m:
        return _unquoted(body[m.end() :])
    key, colon, rest = body.partition(":")
    return _unquoted(rest) if colon else [line]


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
    tail = v[end:].strip()
    if not tail or tail[0] in "#,;" or tail in ("}", "]"):
        return []
    return [v, quoted + tail.strip("\"'")]


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
