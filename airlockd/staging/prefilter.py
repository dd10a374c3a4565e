"""One pass over a buffer for every detector anchor group: Hyperscan says which groups occur, and
staging/secretscan.py searches only those with `re`, as it searches every group without it. Where
Hyperscan does not import (no wheel for the platform), there is no prefilter and `re` does it all.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

_HS: Any = None  # the hyperscan module once imported (False: it does not import here)


def hyperscan_module() -> Any:
    """Hyperscan, imported on first use (it costs a process that never scans much 40 ms), or
    None on a platform without its wheel: then every group is searched by `re`."""
    global _HS
    if _HS is None:
        try:
            import hyperscan

            _HS = hyperscan
        except ImportError:
            _HS = False
    return _HS or None


class Prefilter:
    """Which groups' anchors occur in a buffer, in one pass for all of them: Hyperscan, matching
    each anchor once at most (its first match is all a group needs to know; `re` then finds where,
    as without the prefilter). A group it does not report has no match, so it is not searched: the
    20-odd passes of `re` (one per first byte, 37 MB/s together on a binary file) become one (over
    2 GB/s). A group Hyperscan cannot take (a workspace's pattern past its limits) is reported on
    every buffer: searched by `re` as before, the others still in one pass. Scans release the GIL,
    so each thread has its own scratch space."""

    def __init__(self, patterns: tuple[tuple[bytes, int], ...]) -> None:
        hyperscan = hyperscan_module()
        assert hyperscan is not None
        exprs: dict[int, bytes] = {}
        for i, (p, _) in enumerate(patterns):
            e = _hs_expression(p)
            if e is not None:
                exprs[i] = e
        ids = list(exprs)
        flags = {
            i: hyperscan.HS_FLAG_SINGLEMATCH | (hyperscan.HS_FLAG_CASELESS if f & re.IGNORECASE else 0)
            for i, (_, f) in enumerate(patterns)
        }

        def compiled(ids: list[int]) -> Any:
            db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            db.compile(expressions=[exprs[i] for i in ids], ids=ids, elements=len(ids), flags=[flags[i] for i in ids])
            return db

        self.db: Any = None
        try:
            self.db = compiled(ids) if ids else None
        except hyperscan.error:  # find the ones it refuses, and leave them to `re`
            ids = [i for i in ids if _compiles(compiled, i)]
            self.db = compiled(ids) if ids else None
        self.always = frozenset(range(len(patterns))) - frozenset(ids)
        self._local = threading.local()
        self._scratch = hyperscan.Scratch

    def fired(self, data: bytes) -> set[int]:
        fired = set(self.always)
        if self.db is None:
            return fired
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = self._scratch(self.db)
        self.db.scan(data, match_event_handler=_collect, context=fired, scratch=scratch)
        return fired


def _hs_expression(pattern: bytes) -> bytes | None:
    """`pattern` as Hyperscan reads it (its patterns are C strings: a NUL byte, which `re.escape`
    leaves as it is, would end one there), or None where that is not certain (a NUL after a
    backslash)."""
    if b"\\\x00" in pattern:
        return None
    return pattern.replace(b"\x00", rb"\x00")


def _compiles(compiled: Callable[[list[int]], Any], i: int) -> bool:
    try:
        compiled([i])
    except hyperscan_module().error:
        return False
    return True


def _collect(group: int, start: int, end: int, flags: int, fired: object) -> None:
    assert isinstance(fired, set)
    fired.add(group)


PREFILTER_MAX = 1 << 31  # bytes Hyperscan scans in one block (its length is 32 bits); beyond, `re`
# bytes a scanner is given before it compiles its prefilter (some 80 ms, once per process for a set
# of detectors: a command that checks a few files never pays it; a walk pays it in its first files)
PREFILTER_AFTER = 1 << 20
PREFILTERS: dict[tuple[tuple[bytes, int], ...], Prefilter] = {}
_LOCK = threading.Lock()


def prefilter_for(patterns: tuple[tuple[bytes, int], ...]) -> Prefilter | None:
    """The prefilter of these group regexes (compiled once per process for a set: scanners are
    made per policy and per check; the last 64 sets kept), or None without Hyperscan."""
    if hyperscan_module() is None or not patterns:
        return None
    with _LOCK:
        if patterns in PREFILTERS:
            return PREFILTERS[patterns]
        if len(PREFILTERS) >= 64:
            del PREFILTERS[next(iter(PREFILTERS))]
        made = PREFILTERS[patterns] = Prefilter(patterns)
        return made
