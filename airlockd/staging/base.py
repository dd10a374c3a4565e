"""The one interface the run lifecycle stages through: `Stager`, and the run's base tree, `Base`.

Two stagers implement it (staging/stagers.py): the overlay (the workspace's mirror as a read-only
lower layer, a per-run upper layer) and the full copy. `stagers.choose()` picks one for a new run,
`stagers.for_run()` finds the one a run was staged with; the lifecycle never asks which it is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from airlockd.pipeline.manifest import ChangeSet, Entry
from airlockd.policy import Level, Policy
from airlockd.redact import Redactor
from airlockd.staging.bounds import ChangeBounds
from airlockd.staging.records import StageResult

if TYPE_CHECKING:
    from airlockd.staging.mirror import MirrorView
    from airlockd.staging.stagers import Layout

# label screening of what was staged: (the staged tree to read, its result, how to take a path
# out of it, or None where removing the staged file is enough); it adds to `result.withheld`
Screen = Callable[[Path, StageResult, "Callable[[str], None] | None"], None]


class HeldUpper(Protocol):
    """A run's upper layer on a capped filesystem the container engine holds, for a process that
    cannot mount one on the host (not root; sandbox/layers.py). Paths it gives are on the
    engine's host; every call names the run."""

    options: str  # overlayfs options that go with such an upper layer (after lower/upper/work)
    remote: bool  # the engine cannot see this machine's paths: the lower layer and sockets travel

    def lower(self, tree: Path, version: str | None = None) -> str:
        """The path on the engine's host of the mirror generation `tree` (a remote engine's copy
        of it, brought up to date first; `tree` itself for an engine that sees it). `version`:
        what names the generation's content, when the caller can vouch for one (`view_version`):
        a copy already synced at it is taken as it is."""
        ...

    def relay(self, run_id: str, socket: Path) -> str:
        """A directory on the engine's host, to mount in the run's container, holding a socket
        whose connections reach the local `socket` (the model gateway) over the engine's own
        connection; it lasts until `release`."""
        ...

    def hold(
        self, run_id: str, size_bytes: int, inodes: int, owner: tuple[int, int], mode: int, spare: bool = False,
        claimed: str | None = None,
    ) -> tuple[str, str]:  # fmt: skip
        """Create the capped filesystem with `upper/` (owned by `owner`, with `mode`) and `work/`;
        their paths on the engine's host. With `spare` (a process that serves many runs), one
        made ahead with the same cap is taken when there is one, and the next is made ahead.
        `claimed`: the spare another process set aside for this run (`reserve_spare`), taken
        when its cap is the same."""
        ...

    def reserve_spare(self, run_id: str, files: Mapping[str, bytes] | None = None) -> str | None:
        """Set one of this process's spares aside for a run another process will carry; what to
        pass that process's `hold` as `claimed`, or None when there is none. `files` are
        written into it first, as `put_file` would (a spare that cannot take them is not set
        aside)."""
        ...

    def took_claim(self, run_id: str) -> bool:
        """Whether this process's `hold` took the spare set aside for the run (`claimed`)."""
        ...

    def drop_claim(self, run_id: str) -> None:
        """Remove the spare set aside for the run if it never took it."""
        ...

    def make_spare(self, size_bytes: int, inodes: int, owner: tuple[int, int], mode: int) -> None:
        """Start making a spare of this cap (in the background)."""
        ...

    def drop_spares(self) -> None:
        """Remove the spares made ahead for this workspace that no run took (once what is being
        released and made has settled)."""
        ...

    def settle(self) -> None:
        """Wait for the releases under way (`release(later=True)`)."""
        ...

    def place(self, run_id: str, dirs: list[tuple[str, tuple[int, int], int]], whiteouts: list[str]) -> None:
        """Put directories (path, owner, mode) and whiteouts into the upper layer."""
        ...

    def used(self, run_id: str) -> tuple[int, int]:
        """(bytes, inodes) in use on the capped filesystem."""
        ...

    def dump(self, run_id: str, name: str = "upper") -> Iterator[bytes]:
        """The tree `name` (the upper layer, or another put there) as `upperdump.read_dump`
        reads it."""
        ...

    def where(self, run_id: str, name: str) -> str:
        """The path of the tree `name` of the capped filesystem on the engine's host (a bind
        mount's source)."""
        ...

    def put(self, run_id: str, name: str, src: Path, owner: tuple[int, int] | None = None) -> None:
        """Copy the local tree `src` to `name` on the capped filesystem (modes kept; owners too,
        or every node given to `owner`)."""
        ...

    def put_file(self, run_id: str, name: str, data: bytes) -> None:
        """A new file `name` on the capped filesystem holding `data`, root's and readable by all
        (the agent's standard input)."""
        ...

    def release(self, run_id: str, later: bool = False) -> None:
        """Remove the capped filesystem and all it holds; no-op when it is gone. With `later`
        (the daemon, once the upper layer is read back) it goes off the run's path, and is gone
        when `drop_spares` returns."""
        ...


@dataclass
class StageRequest:
    """What staging one run needs from the lifecycle."""

    run_dir: Path  # the run's folder: the staging goes to `run_dir / "staging"`
    workspace: Path
    policy: Policy
    clearance: Level
    owner: tuple[int, int] | None  # who the staged nodes belong to (the agent's user, as root)
    redactor: Redactor
    growth: int  # bytes the agent may add to what was staged
    capped: bool  # whether the staging lives on a size-capped tmpfs (staging/capfs.py)
    refresh: Callable[[], MirrorView]  # the mirror refreshed and referenced for the run (overlay)
    screen: Screen
    run_id: str = ""
    held: HeldUpper | None = None  # the engine holds the capped upper layer (not root)
    spare: bool = False  # this process serves many runs: the engine's holders are made ahead
    claimed: str | None = None  # the spare the daemon set aside for this run (`HeldUpper.reserve_spare`)


@dataclass
class Staged:
    """What staging a run established."""

    result: StageResult
    staged_bytes: int  # what the staging holds before the agent starts
    live_tree: dict[str, object] | None = None  # the workspace's digest as staged, when known
    mirror: dict[str, object] = field(default_factory=dict)  # the mirror refresh's figures
    staged_entries: int = 0  # inodes the capped staging holds before the agent starts (0: not capped)


class Base(Protocol):
    """A run's base tree, looked up by relative path."""

    def get(self, rel: str) -> Entry | None:
        """The base entry of `rel`; None when the base has no such path."""
        ...

    def below(self, rel: str) -> list[str]:
        """Every base path under directory `rel` (`rel` itself excluded), sorted."""
        ...

    def twins(self, paths: Iterable[str]) -> list[str]:
        """The base paths equal, as `classify` folds them for case collisions, to any of `paths`
        or any of their parent directories, sorted."""
        ...


class Stager(Protocol):
    """How a run gets its private `/workspace`, and how what the agent did there is read back.
    Every method but `stage` takes the run's folder, where the stager recorded itself."""

    @property
    def name(self) -> str:
        """ "overlay" or "copy", as the run records it."""
        ...

    @property
    def why(self) -> str:
        """Why this stager was chosen (forced, or what ruled the overlay out)."""
        ...

    @property
    def summary(self) -> str:
        """The stager in a few words, for `airlockd doctor`."""
        ...

    @property
    def uses_mirror(self) -> bool:
        """Whether it stages from the workspace's mirror (so the mirror keeper serves it)."""
        ...

    def stage(self, req: StageRequest) -> Staged:
        """Give the run its staging, withheld files absent; records the stager in `req.run_dir`."""
        ...

    def staged_root(self, run_dir: Path) -> Path:
        """The directory that holds what the agent wrote (the upper layer, or the full copy)."""
        ...

    def layers(self, run_dir: Path) -> Layout | None:
        """The layers the engine mounts as the run's `/workspace`; None: `staged_root` is bound."""
        ...

    def base(self, run_dir: Path) -> Base:
        """The run's base, asked only about the paths that matter."""
        ...

    def inspect(self, run_dir: Path, base: Base, bounds: ChangeBounds | None = None) -> ChangeSet:
        """What the agent changed, computed from the staging itself; with `bounds`, stopped by
        `bounds.ChangeSetTooLarge` at the first entry over them."""
        ...

    def release(self, run_dir: Path, is_live: Callable[[str], bool]) -> None:
        """The run's staging is done with: drop what it holds elsewhere (idempotent)."""
        ...
