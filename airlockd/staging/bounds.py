"""How much of a staging copy inspection reads: a change set larger than the policy allows is a
limit violation, found before the excess is read.

The agent chooses the size and shape of what it leaves behind, and inspection runs on the host
after its container is gone, outside every cgroup cap. So the walk counts as it goes and stops at
the first entry over a bound: the number of entries (a flood of tiny files), the depth of a
chain of directories the base does not have (10,000 nested directories would hold 10,000
descriptors and build paths of megabytes), and the bytes that would be read (by allocated
blocks, never by a sparse file's claimed size). What the base already holds is never counted
against the agent: the copy stager rescans the whole copy, so its bounds are the base's own
figures plus the policy's allowance.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airlockd.policy import Limits


@dataclass(frozen=True)
class ChangeBounds:
    entries: int  # nodes the agent's side holds (created, modified, their directories)
    depth: int  # path components of a node whose parent directory the base does not have
    bytes: int  # bytes of regular files to be read (allocated, not claimed)

    @classmethod
    def of(cls, limits: Limits) -> ChangeBounds:
        return cls(limits.changed_files, limits.change_depth, limits.changed_mb * 2**20)


class ChangeSetTooLarge(Exception):
    """Inspection stopped at a bound: `limit` is the policy's key, `measured` what was counted
    when it stopped (at least that much is there), `allowed` the bound. Never crosses a door:
    the run that meets it ends `limit_exceeded`, recorded with these figures."""

    kind = "limit_exceeded"

    def __init__(self, limit: str, measured: int, allowed: int) -> None:
        what = {
            "changed_files": "entries",
            "change_depth": "path components deep",
            "changed_mb": "bytes",
        }[limit]
        super().__init__(f"the change set is over the policy's {limit}: at least {measured} {what}, {allowed} allowed")
        self.limit, self.measured, self.allowed = limit, measured, allowed
        self.hint = f"inspection stopped there; raise [agents.<name>.limits] {limit} if such a change is expected"


class Tally:
    """Counts one walk of a staging tree against `bounds`; `known(rel)` says whether the base
    holds directory `rel` (a node right under one is as deep as the workspace made it, not the
    agent: only a chain of new directories counts against the depth bound); `base_entries` and
    `base_bytes` are what the walk reads of the base itself (the copy stager's full rescan)."""

    def __init__(
        self, bounds: ChangeBounds, known: Callable[[str], bool], *, base_entries: int = 0, base_bytes: int = 0
    ) -> None:
        self.bounds = bounds
        self.known = known
        self.max_entries = base_entries + bounds.entries
        self.max_bytes = base_bytes + bounds.bytes
        self.entries = 0
        self.bytes = 0

    def count(self, rel: str, st: os.stat_result) -> None:
        """Count one node; raises ChangeSetTooLarge at the first one over a bound (so a
        directory too deep is never entered, and no byte over the allowance is read)."""
        is_file = stat.S_ISREG(st.st_mode)
        self.count_node(rel, is_file, min(st.st_size, st.st_blocks * 512) if is_file else 0)

    def count_node(self, rel: str, is_file: bool, allocated: int) -> None:
        """`count` of a node known by its path, whether it is a regular file, and the bytes of
        it that would be read (a stream's header, not a stat: upperdump)."""
        self.entries += 1
        if self.entries > self.max_entries:
            raise ChangeSetTooLarge(
                "changed_files", self.entries - (self.max_entries - self.bounds.entries), self.bounds.entries
            )
        depth = rel.count("/") + 1
        if depth > self.bounds.depth and not self.known(rel.rpartition("/")[0]):
            raise ChangeSetTooLarge("change_depth", depth, self.bounds.depth)
        if is_file:
            self.bytes += allocated
            if self.bytes > self.max_bytes:
                over = self.bytes - (self.max_bytes - self.bounds.bytes)
                raise ChangeSetTooLarge("changed_mb", over, self.bounds.bytes)
