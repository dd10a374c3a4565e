"""One path matcher for the patterns that keep things out: withhold, labels, protected files.

Gitignore-style patterns, with two deliberate departures where a pattern guards a secret:

- **case-insensitive**: `.ENV`, `ID_RSA`, `cert.PEM` are what `.env`, `id_rsa*`, `*.pem` mean
  (a case-insensitive checkout makes them the same file; a person writing `.env` means both);
- **negations ignored**: a workspace's `!.env` can never carve a hole in a floor list.

And, for withhold patterns only (`anywhere=True`), **any depth**: a pattern with an inner slash,
`.docker/config.json`, matches `sub/.docker/config.json` too (gitignore would anchor it at the
root). A leading `/` still anchors: `/build/secret.txt` is the explicit "only this one".
Labels and protected files keep gitignore's anchoring: `docs/internal/` labels that folder.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

import pathspec

_ANY_DEPTH = "^(?:.+/)?"


def gitignore_spec(lines: Iterable[str]) -> pathspec.PathSpec:
    """pathspec's gitignore matcher of `lines` on its `re` backend: its default picks the "best"
    one installed, and with Hyperscan present (staging/secretscan.py) that one compiles each spec
    for tens of milliseconds, where specs here are small, many and short-lived."""
    return pathspec.PathSpec.from_lines("gitignore", lines, backend="simple")


def _regex(pattern: object, text: str, anywhere: bool) -> re.Pattern[str] | None:
    regex = getattr(pattern, "regex", None)
    if not isinstance(regex, re.Pattern) or not isinstance(regex.pattern, str):
        return None
    src = regex.pattern
    if anywhere and not text.lstrip().startswith("/") and src.startswith("^") and not src.startswith(_ANY_DEPTH):
        src = _ANY_DEPTH + src[1:]
    # pathspec names a group in every pattern; one regex cannot repeat a name.
    return re.compile(re.sub(r"\(\?P<\w+>", "(?:", src), re.IGNORECASE | re.DOTALL)


class AnyPattern:
    """Whether any of `patterns` (gitignore style) matches a relative path, case-insensitively,
    as one regex search; negations are ignored; with `anywhere`, inner-slash patterns match at
    any depth. Directories are probed with a trailing slash (`"sub/.ssh/"`)."""

    def __init__(self, patterns: Iterable[str], *, anywhere: bool = False) -> None:
        texts = [p for p in patterns if not p.lstrip().startswith("!") and p.strip()]
        self.patterns: list[tuple[str, re.Pattern[str]]] = []
        for text in texts:
            for pat in gitignore_spec([text]).patterns:
                if not getattr(pat, "include", None):
                    continue
                rx = _regex(pat, text, anywhere)
                if rx is None:  # pathspec changed its internals: refuse rather than match less
                    raise RuntimeError(f"cannot compile the pattern {text!r} (pathspec {pathspec.__version__})")
                self.patterns.append((text, rx))
        # The patterns that match at any depth share their opening `^(?:.+/)?`: one search then
        # tries each directory boundary once for all of them, not once per pattern (5x faster on
        # the default withhold list, which is searched for every path of every walk).
        deep = [rx.pattern[len(_ANY_DEPTH) :] for _, rx in self.patterns if rx.pattern.startswith(_ANY_DEPTH)]
        rest = [rx.pattern for _, rx in self.patterns if not rx.pattern.startswith(_ANY_DEPTH)]
        alts = [f"(?:{p})" for p in rest]
        if deep:
            alts.append(_ANY_DEPTH + "(?:" + "|".join(f"(?:{p})" for p in deep) + ")")
        self.regex = re.compile("|".join(alts) or "(?!)", re.IGNORECASE | re.DOTALL)

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __call__(self, path: str) -> bool:
        return self.regex.search(path) is not None

    def which(self, path: str) -> str:
        """The last pattern that matches `path` (the one gitignore would credit), or "?"."""
        hits = [text for text, rx in self.patterns if rx.search(path)]
        return hits[-1] if hits else "?"


def matcher(patterns: Iterable[str], *, anywhere: bool = False) -> AnyPattern:
    """`AnyPattern(patterns)`, made once per list of patterns in a process: the default withhold
    list alone takes 20 ms to compile, and a run's process forked by the daemon's launcher finds
    the policy's matchers made already (runs/launcher.py)."""
    return _matcher(tuple(patterns), anywhere)


@lru_cache(maxsize=256)
def _matcher(patterns: tuple[str, ...], anywhere: bool) -> AnyPattern:
    return AnyPattern(patterns, anywhere=anywhere)


def withhold_matcher(patterns: Iterable[str]) -> AnyPattern:
    """The matcher of withhold patterns: any case, any depth, no negation."""
    return matcher(patterns, anywhere=True)
