"""Content detectors over bytes, fast: which withheld-content detector (redact.DETECTORS) fires on
a buffer, with a byte pre-search so a clean file costs a few passes, never a regex per detector."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from airlockd.redact import DETECTORS

# Bytes every match of a detector contains (ASCII, so they survive decoding as they are), with
# the digest of the detector's pattern they were derived from. A byte search for these decides
# whether the full regexes need to run at all; anchors are chosen to share first bytes (A, g, s,
# k, x) because each distinct first byte costs one pass over the data, and to be rare in code
# ("k-" would be one pass fewer, but kebab-case is everywhere). If redact.py changes a
# pattern, its digest no longer matches and that detector's regex runs on every file instead:
# slower, never unsound (tests/unit/test_staging.py says so when that happens).
_ANCHORS: dict[str, tuple[str, bytes]] = {
    "private-key": ("f856091f3d556f15", rb"ATE KEY"),  # in "PRIVATE KEY"
    "aws-access-key": ("727795ee3eaf9378", rb"A(?:KIA|SIA|GPA|IDA|ROA|NPA|NVA|IPA)"),
    "google-api-key": ("0427d531b30efad8", rb"AIza"),
    "github-token": ("757c4200279c3eb3", rb"gh[pousr]_|github_pat_"),
    "gitlab-token": ("ef8b678fd2828638", rb"glpat-"),
    "openai-key": ("6e1338a1e18fd390", rb"sk-"),
    "anthropic-key": ("76071ca8c52d7c1a", rb"sk-ant-"),
    "stripe-key": ("863b156ae6772cd1", rb"k_(?:live|test)_"),
    "slack-token": ("9543435bd5c8c847", rb"xox[abposr]-"),
    "jwt": ("2fc11bf80db867ff", rb"eyJ"),
    "airlock-run-token": ("29083fd9c47eddd2", rb"alrt_"),
}


def _digest(pattern: str) -> str:
    return hashlib.sha256(pattern.encode()).hexdigest()[:16]


class SecretScanner:
    """Finds one of `names` (redact.DETECTORS) whose regex matches a buffer decoded as UTF-8 with
    replacement, or None. Anchors sharing a first byte are searched as one regex, so a clean
    buffer costs five byte searches with the default detectors. Where anchors occur, the
    detectors they stand for run on the text around them (MARGIN bytes each side, more than any
    secret they find; overlapping spans merged, so never more than the whole buffer)."""

    MARGIN = 512
    overlap = 4096  # bytes carried between chunks of a streamed file (>= 2 * MARGIN)

    def __init__(self, names: Iterable[str]) -> None:
        self.names = list(dict.fromkeys(names))
        groups: dict[bytes, list[tuple[bytes, str]]] = {}
        self.unanchored: list[str] = []
        for name in self.names:
            digest, anchor = _ANCHORS.get(name, ("", b""))
            if not anchor or digest != _digest(DETECTORS[name].pattern):
                self.unanchored.append(name)
            else:
                groups.setdefault(anchor[:1], []).append((anchor, name))
        self.groups = [(re.compile(b"|".join(a for a, _ in g)), [n for _, n in g]) for g in groups.values()]

    def first_hit(self, data: bytes) -> str | None:
        for anchor, names in self.groups:
            first = anchor.search(data)
            if first is None:
                continue
            texts = [data[lo:hi].decode("utf-8", "replace") for lo, hi in self._spans(anchor, data, first)]
            for name in names:
                if any(DETECTORS[name].search(t) for t in texts):
                    return name
        if self.unanchored:
            text = data.decode("utf-8", "replace")
            return next((n for n in self.unanchored if DETECTORS[n].search(text)), None)
        return None

    def _spans(self, anchor: re.Pattern[bytes], data: bytes, first: re.Match[bytes]) -> list[tuple[int, int]]:
        m = self.MARGIN
        spans = []
        lo, hi = max(0, first.start() - m), first.start() + m
        for found in anchor.finditer(data, first.end()):
            at = found.start()
            if at - m > hi:
                spans.append((lo, hi))
                lo = at - m
            hi = at + m
        spans.append((lo, hi))
        return spans
