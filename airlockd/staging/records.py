"""What staging records and the rules it names: the records of a copy (`StageResult`, what it
kept out as `Withheld`, the `Ident` of each file withheld by path), the rules that rest on other
files (a hard link or byte copy of a withheld file) or on the OS (a node that vanished or raced),
how a withheld file is read for its values, and whether a symlink can resolve outside the tree.
Pure: the walk that applies them is staging/copy.py.
"""

from __future__ import annotations

import errno
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from airlockd.errors import AirlockError
from airlockd.pipeline.manifest import Entry, Kind, Manifest, kind_of
from airlockd.staging.secretscan import wide_texts

MAX_LINK_HOPS = 40  # like the kernel's ELOOP limit
IN_NAME = "detector-in-name:"  # a content detector fired on the path itself
VALUE_IN_NAME = IN_NAME + "withheld-value"  # the path carries a withheld file's credential
HARDLINK = "hardlink-of-withheld"
COPY = "copy-of-withheld"


class StagingError(AirlockError):
    """The staging copy could not be made or read; nothing partial is used."""

    kind = "staging"


@dataclass(frozen=True)
class Withheld:
    """A path kept out of the copy (or skipped) and the rule that did it, e.g. "withhold:.env",
    "detector:private-key", "label:secret>internal", "symlink-escape", "special-file:fifo"."""

    path: str
    rule: str


@dataclass(frozen=True)
class Ident:
    """What identifies one file withheld by its path (pattern, label, name): its node and,
    unless trivial, its content's SHA-256. `top` is the withheld record it falls under (itself,
    or a withheld directory), `path` the file; both as recorded (masked when a name carries a
    secret)."""

    top: str
    path: str
    node: tuple[int, int]  # st_dev, st_ino
    sha256: str | None
    # size, mtime_ns, ctime_ns of a file with other links: one outside the workspace can change
    # it with no event inside (the keeper stats these at every refresh: keeper.linked_moved)
    stamp: tuple[int, int, int] | None = None

    def row(self) -> list[object]:
        return [self.top, self.path, *self.node, self.sha256, *(self.stamp or ())]

    @classmethod
    def from_row(cls, row: list[object]) -> Ident:
        top, path, dev, ino, sha, *stamp = row
        return cls(
            str(top),
            str(path),
            (int(str(dev)), int(str(ino))),
            None if sha is None else str(sha),
            (int(str(stamp[0])), int(str(stamp[1])), int(str(stamp[2]))) if len(stamp) == 3 else None,
        )


@dataclass
class StageResult:
    """What `stage` made: the manifest of the copy (directories included), what it kept out
    (`withheld`) or could not copy (`skipped`), how many regular files and bytes it wrote, and
    the identities of the files withheld by path (`ids`), which keep their copies out too."""

    base: Manifest
    withheld: list[Withheld] = field(default_factory=list)
    skipped: list[Withheld] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    ids: list[Ident] = field(default_factory=list)


def is_identity_rule(rule: str | None) -> bool:
    """Whether a verdict rests on other files (a copy or link of a withheld one): it is judged
    again at every walk, never taken from a cache."""
    return rule is not None and (rule in (HARDLINK, COPY) or (rule.startswith("archive:") and rule.endswith(COPY)))


def identity_rule(
    entry: Entry, node: tuple[int, int] | None, members: dict[str, str] | None, ids: Iterable[Ident]
) -> str | None:
    """Why a staged file must go because of the withheld files `ids`: a hard link of one, a
    copy of one's content, or an archive holding one's content; None when none of these."""
    shas = {i.sha256 for i in ids if i.sha256}
    nodes = {i.node for i in ids}
    return identity_of(entry, node, members, shas, nodes)


def identity_of(
    entry: Entry,
    node: tuple[int, int] | None,
    members: dict[str, str] | None,
    shas: Collection[str],
    nodes: Collection[tuple[int, int]],
) -> str | None:
    """identity_rule, given the content hashes and nodes of the withheld files (sets, when a walk
    judges many files against the same ones)."""
    if entry.kind is not Kind.FILE:
        return None
    if node is not None and node in nodes:
        return HARDLINK
    if entry.sha256 in shas:
        return COPY
    for sha, member in (members or {}).items():
        if sha in shas:
            return f"archive:{member}:{COPY}"
    return None


def special_rule(mode: int) -> str:
    return f"special-file:{kind_of(mode).value}"


def os_rule(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "vanished"
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "raced"  # replaced by a link or a non-directory between listing and opening
    return f"unreadable:{errno.errorcode.get(exc.errno or 0, exc.errno)}"


def is_text(data: bytes) -> bool:
    return b"\0" not in data[:8192]


def values_text(data: bytes) -> str | None:
    """What a withheld file says, for the redactor to learn its values: UTF-8 text, or UTF-16 or
    UTF-32 text (a PowerShell script, a .reg export: read in the byte order and alignment that
    gives the most ASCII characters; the wrong ones read as CJK or garbage); None otherwise."""
    if is_text(data):
        return data.decode("utf-8", "replace")
    texts = wide_texts(data)
    if texts:
        return max(texts, key=_ascii_score)
    # text with a few NULs in it (padding, a stray byte): read without them, when what is left is
    # text (a keystore or other binary is not: its values are no lines to learn)
    rest = data.replace(b"\0", b"")
    unprintable = len(rest.translate(None, _PRINTABLE))
    return rest.decode("utf-8", "replace") if rest and unprintable * 10 <= len(rest) else None


_PRINTABLE = bytes([9, 10, 13, *range(0x20, 0x7F)])  # deleted: what is left is not printable ASCII


def _ascii_score(text: str) -> int:
    """ASCII characters other than NUL, less the NULs (UTF-32 read as UTF-16 has a NUL each)."""
    ascii_ = text.encode("ascii", "ignore")
    nuls = ascii_.count(0)
    return len(ascii_) - 2 * nuls


def link_escapes(link: str, target: str, tree: Manifest) -> bool:
    """Whether symlink `link` (a relative path in `tree`) with `target` can resolve outside the
    tree's root. Absolute targets escape. Components that are links in `tree` are followed (with
    the kernel's hop limit); missing ones are taken lexically, so a `..` that would climb above the
    root counts as escaping. Pure: reads `tree`, never the filesystem."""
    if not target or target.startswith("/"):
        return True
    cur = link.split("/")[:-1]
    todo = target.split("/")[::-1]
    hops = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not cur:
                return True
            cur.pop()
            continue
        cur.append(part)
        entry = tree.get("/".join(cur))
        if entry is not None and entry.kind is Kind.SYMLINK:
            hops += 1
            sub = entry.target or ""
            if hops > MAX_LINK_HOPS or not sub or sub.startswith("/"):
                return True
            cur.pop()
            todo.extend(sub.split("/")[::-1])
    return False
