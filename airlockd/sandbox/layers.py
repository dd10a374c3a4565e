"""A run's upper layer on a capped filesystem the engine holds: the growth cap without host root.

Root caps what an agent may write by mounting a tmpfs on the host (staging/capfs.py). A user who
is not root, in the `docker` group, asks the engine instead, and every privileged step is the
engine's:

- **the cap**: a tmpfs volume (`--opt type=tmpfs --opt o=size=S,nr_inodes=N`) of the run's own.
  The engine mounts such a volume only while a container uses it, so a *holder* container (the
  runtime image, `sleep infinity`, runc, no network, no capabilities but CAP_DAC_READ_SEARCH,
  read-only root, no-new-privileges) keeps it mounted from before the agent starts until its
  upper layer has been read. Its `Mountpoint` (a path on the engine's host) then carries the
  overlay's `upper/` and `work/`, and an agent writing past the cap gets ENOSPC;
- **the layout and the whiteouts** of paths withheld after the mirror was made: a tar put into
  the holder (`put_archive`), which the engine extracts as root (directories with their owners
  and modes, whiteouts as the 0/0 character devices overlayfs reads), so no `mknod` or `chown`
  happens on the host;
- **reading the upper layer back**: `upperdump.DUMP` run in the holder streams it out (content,
  modes, whiteouts, opaque directories), since the volume lies under the engine's data root,
  which only root may enter. The overlay is mounted with `userxattr` so that its opaque marks
  are `user.overlay.opaque`, which the holder reads with no capability beyond reading files
  (`trusted.*` would need CAP_SYS_ADMIN); an agent cannot set them itself (overlayfs refuses its
  own xattrs through the merged view);
- **cleanup**: removing the holder and the volume frees everything, the root-owned `work/work`
  the kernel leaves included.

Everything is named after the run and labelled with it, so a crashed run's holder and volume are
found again (re-attach, sweep) by its id.

**Spares.** Making a holder (the volume, the container started, the layout put) costs about
0.2 s, a third of a no-op run. A process that serves many runs (the daemon) asks `hold` with
`spare`: a holder made ahead by this process for the same workspace and the same cap (size,
inodes, owner and mode of `upper/`, image) is then taken by renaming its container after the run
(its volume keeps its own name: `find` and `release` read it from the holder's mounts, and
`holder_run` gives the run of a renamed spare for the sweep). The next spare is made when the
run's holder is released (its upper layer read back), while the proposal is reviewed; the daemon
releases it off the proposal's path too (`release(later=True)`). Only the process that makes
spares takes them, and it drops them when it closes (`drop_spares`, which first waits for what it
is still releasing and making); a daemon that starts drops those a dead one left. An unused
spare is an empty tmpfs and a `sleep`. The daemon carries each run in a process of its own: it
sets one of its spares aside for that run (`reserve_spare`: renamed `claim_name(run)`), and the
run's process takes it by the id it is told (`hold(claimed=...)`, `_take_claim`); runs/ahead.py.
"""

from __future__ import annotations

import contextlib
import io
import logging
import secrets
import tarfile
import tempfile
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import docker.errors

from airlockd.errors import EngineError
from airlockd.sandbox import enginepaths, holdservice, relay
from airlockd.sandbox.enginemirror import EngineMirror
from airlockd.sandbox.volumes import OWNER_LABEL
from airlockd.staging import upperdump

log = logging.getLogger(__name__)

ROLE_LABEL = "airlockd.role"
ROLE = "upper-holder"
WORKSPACE_LABEL = "airlockd.workspace"
HELD_LABEL = "airlockd.held-for"  # not the run label: the holder is no container of the agent's
SPARE_LABEL = "airlockd.spare-for"  # a holder made ahead: the cap it was made with (`spare_key`)
MADE_LABEL = "airlockd.made"  # a random mark each holder's volume is made with: one not made so is not ours
SPARE_PREFIX = "airlockd-spare-"
HOLDER_PREFIX = "airlockd-hold-"
CLAIM_PREFIX = "airlockd-claim-"  # a spare the daemon set aside for a run its run process carries
INODE_STEP = 1024  # inode caps are rounded up to this, so a spare made ahead fits the next run
SPARE_WAIT_S = 10.0  # a run waits this long at most for the spare being made for it
MOUNT = "/layers"
#: overlayfs options for an upper layer on an engine-held tmpfs: as `overlay.OPTIONS`, with its
#: own marks in user.* (readable by the holder without CAP_SYS_ADMIN), which requires
#: redirect_dir=nofollow (no redirect made or followed: renaming a lower directory is EXDEV).
OPTIONS = "metacopy=off,redirect_dir=nofollow,index=off,xino=off,nfs_export=off,userxattr"
OPAQUE = "user.overlay.opaque"
STDERR_KEEP = 4096


def volume_name(run_id: str) -> str:
    return f"airlockd-up-{run_id}"


def holder_name(run_id: str) -> str:
    return f"{HOLDER_PREFIX}{run_id}"


def claim_name(run_id: str) -> str:
    return f"{CLAIM_PREFIX}{run_id}"


def holder_run(name: str, labels: dict[str, str]) -> str:
    """The run whose upper layer the container `name` holds ("" for none): its label, or for a
    spare taken by (or set aside for) a run, its name."""
    if labels.get(HELD_LABEL):
        return labels[HELD_LABEL]
    name = name.lstrip("/")
    for prefix in (HOLDER_PREFIX, CLAIM_PREFIX) if labels.get(SPARE_LABEL) else ():
        if name.startswith(prefix):
            return name[len(prefix) :]
    return ""


def spare_key(size_bytes: int, inodes: int, owner: tuple[int, int], mode: int, image: str) -> str:
    return f"{size_bytes}:{inodes}:{owner[0]}:{owner[1]}:{mode:o}:{image}"


def round_inodes(inodes: int) -> int:
    return -(-max(inodes, 64) // INODE_STEP) * INODE_STEP


@dataclass(frozen=True)
class HeldLayers:
    """A run's capped filesystem as the engine holds it; paths are on the engine's host."""

    run_id: str
    mountpoint: PurePosixPath

    @property
    def upper(self) -> PurePosixPath:
        return self.mountpoint / "upper"

    @property
    def work(self) -> PurePosixPath:
        return self.mountpoint / "work"

    def options(self, lower: str) -> str:
        return f"lowerdir={lower},upperdir={self.upper},workdir={self.work},{OPTIONS}"


def _engine(what: str, exc: docker.errors.DockerException) -> EngineError:
    return EngineError(f"the engine failed {what}: {exc}", hint="check the engine (airlockd doctor)")


def hold(
    client: Any,
    run_id: str,
    *,
    image: str,
    size_bytes: int,
    inodes: int,
    owner: tuple[int, int],
    mode: int,
    labels: dict[str, str] | None = None,
    spare: bool = False,
    claimed: str | None = None,
) -> HeldLayers:
    """Create the run's capped volume, start its holder, and lay out `upper/` (owned by `owner`,
    with `mode`: what the merged root shows) and `work/`. A leftover of an earlier attempt of the
    same run is removed first; one of another workspace's (a shared engine) is never touched.
    With `spare`, a spare of the same cap is taken when there is one, and the next is made.
    `claimed`: the id of the spare another process (the daemon) set aside for this run
    (`reserve_spare`), taken when it has the same cap."""
    labels = {**(labels or {}), OWNER_LABEL: "1", ROLE_LABEL: ROLE}
    _refuse_foreign(client, run_id, labels.get(WORKSPACE_LABEL))
    inodes = round_inodes(inodes)
    key = spare_key(size_bytes, inodes, owner, mode, image)
    held = _take_claim(client, run_id, claimed, key, labels) if claimed else None
    if held is None:
        release(client, run_id, claim=False)  # (a claim taken went through it: its rename says so)
    if held is None and spare:
        held = _take_spare(client, run_id, key, labels)
    if held is None:
        name, vol = holder_name(run_id), volume_name(run_id)
        held = HeldLayers(
            run_id, _make(client, name, vol, image, size_bytes, inodes, {**labels, HELD_LABEL: run_id})[0]
        )
        try:
            _put(client, name, [("upper", "dir", owner, mode), ("work", "dir", (0, 0), 0o700)])
        except EngineError:
            release(client, run_id)
            raise
        threading.Thread(target=holdservice.open_for, args=(client, name, MOUNT), daemon=True).start()
    if spare:  # the next is made when this run lets go of its own: while it is reviewed
        with _spares.lock:
            _spares.next[(str(client.api.base_url), run_id)] = (image, size_bytes, inodes, owner, mode, labels)
    with _held_lock:
        _held_here[(str(client.api.base_url), run_id)] = held
    return held


#: (engine, run id) -> the layers `hold` gave, until `release`: where they are, without asking
_held_here: dict[tuple[str, str], HeldLayers] = {}
#: (engine, run id) whose spare set aside by another process (`reserve_spare`) `hold` took here
_claims_taken: set[tuple[str, str]] = set()
_held_lock = threading.Lock()


def _make(
    client: Any, name: str, vol: str, image: str, size_bytes: int, inodes: int, labels: dict[str, str]
) -> tuple[PurePosixPath, str]:
    """The capped volume `vol` held mounted by the holder `name`; its mount point and the
    holder's id."""
    opts = f"{size_option(client, max(size_bytes, 1 << 20))},nr_inodes={inodes},mode=0755"
    nonce = secrets.token_hex(8)  # this creation's: a volume of that name made by another is not ours
    labels = {**labels, MADE_LABEL: nonce}

    def drop() -> None:
        _remove(client, name, vol)

    def ours(found: dict[str, Any]) -> bool:
        return (found.get("Labels") or {}).get(MADE_LABEL) == nonce

    try:
        client.volumes.create(
            name=vol, driver="local", driver_opts={"type": "tmpfs", "device": "tmpfs", "o": opts}, labels=labels
        )
        if not ours(client.api.inspect_volume(vol)):
            # the engine hands back a volume of that name that exists already (Docker does, with
            # whatever it holds, and another may keep it mounted): never the agent's upper layer
            raise EngineError(
                f"the engine already has a volume named {vol}, which airlockd did not make: it is not"
                " used as the run's upper layer",
                hint=f"look at who made it (docker volume inspect {vol}); remove it if it is stale, then start"
                " the run again",
            )
        holder = client.containers.run(
            image,
            ["sleep", "infinity"],
            name=name,
            detach=True,
            user="0:0",
            network_mode="none",
            cap_drop=["ALL"],
            cap_add=["DAC_READ_SEARCH"],
            security_opt=["no-new-privileges"],
            read_only=True,
            runtime="runc",
            mem_limit="64m",
            ulimits=enginepaths.ulimits(client),
            pids_limit=64,  # the dump, statvfs, and the gateway's relay (a thread a connection)
            labels=labels,
            volumes={vol: {"bind": MOUNT, "mode": "rw"}},
        )
        made = client.api.inspect_volume(vol)
        mountpoint = PurePosixPath(made["Mountpoint"])
    except docker.errors.DockerException as exc:
        drop()
        raise _engine(f"to hold a capped upper layer ({name})", exc) from None
    if (made.get("Options") or {}).get("type") != "tmpfs" or not ours(made):
        # removed between its creation and the holder's, the engine makes the named volume
        # again for the holder: a plain directory on its disk, with no cap
        drop()
        raise EngineError(
            f"the engine gave the holder {name} a volume that is not the capped tmpfs asked for",
            hint="start the run again; if it happens again, look for what removes airlockd's volumes",
        )
    if enginepaths.kind(client) == enginepaths.PODMAN:  # the cap was said in pages of an assumed size
        size = _statvfs(client, name)[0]
        if size > max(size_bytes, 1 << 20) + PAGE:
            drop()
            raise EngineError(
                f"the engine made the capped upper layer {name} {size} bytes, not {size_bytes}: its"
                f" pages are not {PAGE} bytes",
                hint="run agents on an engine whose host has 4 KiB pages, or on Docker (docs/engines.md, Podman)",
            )
    return mountpoint, str(holder.id)


def _take_spare(client: Any, run_id: str, key: str, labels: dict[str, str]) -> HeldLayers | None:
    """A spare of `key` for this workspace, renamed after the run; None when there is none."""
    _spares.wait(client, key, labels.get(WORKSPACE_LABEL, ""))
    with _spares.lock:  # two runs of this process never take the same one
        try:
            found = client.api.containers(
                filters={"label": [f"{SPARE_LABEL}={key}", f"{WORKSPACE_LABEL}={labels.get(WORKSPACE_LABEL, '')}"]}
            )
        except docker.errors.DockerException as exc:
            log.warning("no spare holder for run %s: %s", run_id, exc)
            return None
        for c in found:
            names = [n.lstrip("/") for n in c.get("Names") or []]
            if not any(n.startswith(SPARE_PREFIX) for n in names) or c.get("State") != "running":
                continue  # taken by a run already, or ended
            if (str(client.api.base_url), c["Id"]) not in _spares.made:
                continue  # not made by this process
            _spares.made.discard((str(client.api.base_url), c["Id"]))
            try:
                client.api.rename(c["Id"], holder_name(run_id))
                holdservice.rename(client, names[0], holder_name(run_id))
                mounts = client.api.inspect_container(c["Id"]).get("Mounts") or []
            except docker.errors.DockerException as exc:
                log.warning("spare holder %s not taken: %s", names, exc)
                continue
            source = next((m.get("Source") for m in mounts if m.get("Destination") == MOUNT), None)
            if source:
                return HeldLayers(run_id, PurePosixPath(source))
            release(client, run_id)
    return None


def _take_claim(client: Any, run_id: str, cid: str, key: str, labels: dict[str, str]) -> HeldLayers | None:
    """The spare `cid` set aside for this run (`claim_name`), renamed after the run when it has
    the cap `key`; one of another cap is removed. A container of that name that is not `cid` is
    not the daemon's, and is left alone (it stands in no holder's way)."""
    name = claim_name(run_id)
    try:
        c = client.api.inspect_container(name)
    except docker.errors.NotFound:
        return None
    except docker.errors.DockerException as exc:
        log.warning("the spare holder set aside for run %s was not taken: %s", run_id, exc)
        return None
    if c.get("Id") != cid:
        log.warning("%s is not the spare holder set aside for run %s: not taken", name, run_id)
        return None
    have = c.get("Config", {}).get("Labels") or {}
    source = _mount(c, "Source")
    fits = (
        have.get(SPARE_LABEL) == key
        and have.get(WORKSPACE_LABEL) == labels.get(WORKSPACE_LABEL, "")
        and (c.get("State") or {}).get("Running")
        and source
    )
    if not fits:
        _drop_spare(client, name, _mount(c, "Name"))
        return None
    for attempt in range(2):
        try:
            client.api.rename(cid, holder_name(run_id))
            break
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and attempt == 0:  # a holder of an earlier attempt has the name
                release(client, run_id, claim=False)
                continue
            log.warning("the spare holder set aside for run %s was not taken: %s", run_id, exc)
        except docker.errors.DockerException as exc:
            log.warning("the spare holder set aside for run %s was not taken: %s", run_id, exc)
        _drop_spare(client, name, _mount(c, "Name"))
        return None
    threading.Thread(target=holdservice.open_for, args=(client, holder_name(run_id), MOUNT), daemon=True).start()
    with _held_lock:
        _claims_taken.add((str(client.api.base_url), run_id))
    return HeldLayers(run_id, PurePosixPath(str(source)))


def reserve_spare(client: Any, run_id: str, workspace: str, files: Mapping[str, bytes] | None = None) -> str | None:
    """Set one of this process's spares for `workspace` aside for a run another process carries
    (the daemon's run processes): renamed `claim_name(run_id)`, by its spare's name, so that no
    other run and no `drop_spares` takes it. Its container id (what that process is told to take:
    `hold(claimed=...)`), or None when there is none ready (one being made is not waited for:
    that run's process makes its own in the same time, while the next spare is made). `files`
    are written into it first, as `put_file` writes them (through this process's service, which
    is running already: the run's process would have to start its own and wait for it); a spare
    that cannot take them is removed, not set aside."""
    with _spares.lock:
        try:
            found = client.api.containers(filters={"label": [SPARE_LABEL, f"{WORKSPACE_LABEL}={workspace}"]})
        except docker.errors.DockerException as exc:
            log.warning("no spare holder for run %s: %s", run_id, exc)
            return None
        for c in sorted(found, key=lambda c: -int(c.get("Created") or 0)):
            name = next((n.lstrip("/") for n in c.get("Names") or [] if n.lstrip("/").startswith(SPARE_PREFIX)), None)
            mine = (str(client.api.base_url), c["Id"])
            if name is None or c.get("State") != "running" or mine not in _spares.made:
                continue
            _spares.made.discard(mine)
            try:
                for file, data in (files or {}).items():
                    what = f"{file} into the spare holder {name} set aside for run {run_id}"
                    _put_file(client, name, file, data, what)
                holdservice.drop(client, name)  # the run's process opens its own
                client.api.rename(name, claim_name(run_id))
            except (EngineError, docker.errors.DockerException) as exc:
                holdservice.drop(client, name)
                log.warning("spare holder %s not set aside (removed): %s", name, exc)
                _drop_spare(client, name, _mount(c, "Name"))  # no longer ours to give: it would stay
                continue
            return str(c["Id"])
    return None


class _Spares:
    """The spares this process is making (one at a time per engine, workspace and cap), and
    those it made and no run took yet: the only ones it takes. A container on the engine that
    only looks like one (the labels and the name prefix; on an engine others share, anyone may
    make one) is never taken: what its volume held would be shown as the agent's work."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._making: dict[tuple[str, str, str], threading.Event] = {}
        self.made: set[tuple[str, str]] = set()  # (engine, container id)
        #: (engine, run id) -> the cap of the spare to make when that run's holder goes
        self.next: dict[tuple[str, str], tuple[str, int, int, tuple[int, int], int, dict[str, str]]] = {}

    def wait(self, client: Any, key: str, workspace: str) -> None:
        with self.lock:
            done = self._making.get((client.api.base_url, workspace, key))
        if done is not None:
            done.wait(SPARE_WAIT_S)

    def settle(self, timeout: float = SPARE_WAIT_S) -> None:
        """Wait for the spares being made (a process dropping its spares must not make one after)."""
        with self.lock:
            making = list(self._making.values())
        for done in making:
            done.wait(timeout)

    def make(
        self, client: Any, image: str, size_bytes: int, inodes: int, owner: tuple[int, int], mode: int,
        labels: dict[str, str],
    ) -> None:  # fmt: skip
        """Start making the next spare of this cap in the background (none when one is being
        made); the workspace's spares of another cap go."""
        workspace = labels.get(WORKSPACE_LABEL, "")
        key = spare_key(size_bytes, inodes, owner, mode, image)
        slot = (client.api.base_url, workspace, key)
        with self.lock:
            if slot in self._making:
                return
            done = self._making[slot] = threading.Event()

        def work() -> None:
            try:
                if drop_spares(client, workspace, keep=key):
                    return  # one of this cap is waiting already
                name = f"{SPARE_PREFIX}{secrets.token_hex(6)}"
                try:
                    cid = _make(client, name, name, image, size_bytes, inodes, {**labels, SPARE_LABEL: key})[1]
                    _put(client, name, [("upper", "dir", owner, mode), ("work", "dir", (0, 0), 0o700)])
                    with self.lock:  # ready to be taken (its service, for this process's own runs, follows)
                        self.made.add((str(client.api.base_url), cid))
                    holdservice.open_for(client, name, MOUNT)
                except EngineError as exc:
                    log.warning("no spare holder made ahead: %s", exc.message)
                    _remove(client, name, name)
            finally:
                with self.lock:
                    self._making.pop(slot, None)
                done.set()

        threading.Thread(target=work, name="airlockd-spare-holder", daemon=True).start()


_spares = _Spares()


class _Later:
    """Holders let go of off the run's path (its upper layer read back: nothing of the holder is
    needed any more), each in a thread of its own; `settle` waits for them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str], threading.Thread] = {}  # (engine, run id) -> its release

    def submit(self, client: Any, run_id: str) -> None:
        slot = (str(client.api.base_url), run_id)

        def work() -> None:
            try:
                release(client, run_id)
            except Exception:
                log.exception("the holder of run %s was not let go of", run_id)
            finally:
                with self._lock:
                    self._pending.pop(slot, None)

        thread = threading.Thread(target=work, name=f"airlockd-release-{run_id}", daemon=True)
        with self._lock:
            if slot in self._pending:
                return
            self._pending[slot] = thread
        thread.start()

    def going(self, client: Any, run_id: str) -> threading.Thread | None:
        """The release of the run's holder under way, if one is."""
        with self._lock:
            return self._pending.get((str(client.api.base_url), run_id))

    def settle(self, timeout: float = 60.0) -> None:
        with self._lock:
            pending = list(self._pending.values())
        for thread in pending:
            thread.join(timeout)


_later = _Later()


def drop_spares(client: Any, workspace: str, keep: str | None = None) -> bool:
    """Remove the workspace's spares not yet taken by a run: all, or all but one running of cap
    `keep` (True when one was kept). Each goes by its spare's name, so one a run has just taken
    (renamed) is never removed. With all going (none is being made then: a volume is dangling
    for a moment while its holder is made), the volumes of spares whose holder is gone go too."""
    if keep is None:
        _later.settle()  # a release makes the next spare
        _spares.settle()
    ws = f"{WORKSPACE_LABEL}={workspace}"
    kept = False
    try:
        found = client.api.containers(all=True, filters={"label": [SPARE_LABEL, ws]})
        for c in found:
            name = next((n.lstrip("/") for n in c.get("Names") or [] if n.lstrip("/").startswith(SPARE_PREFIX)), None)
            if name is None:
                continue  # a run's now
            mine = (
                (c.get("Labels") or {}).get(SPARE_LABEL) == keep
                and c.get("State") == "running"
                and (str(client.api.base_url), c["Id"]) in _spares.made
            )
            if keep is not None and mine and not kept:
                kept = True
                continue
            _spares.made.discard((str(client.api.base_url), c["Id"]))
            _drop_spare(client, name, _mount(c, "Name") or name)  # its volume too (a spare's has its name)
        if keep is None:  # none is being made now: a volume alone was left by a spare cut short
            for name in _unmounted(client, [SPARE_LABEL, ws]):
                try:  # never forced: Podman's force removes the containers that use it first
                    client.api.remove_volume(name)
                except docker.errors.NotFound:
                    pass
                except docker.errors.APIError as exc:
                    log.info("spare volume %s not removed: %s", name, exc)
    except docker.errors.DockerException as exc:
        log.warning("cannot remove the spare holders: %s", exc)
    return kept


#: tmpfs counts `nr_blocks` in pages; those of the engine's host are taken to be 4 KiB (x86-64,
#: and arm64 as Debian and most distributions build it)
PAGE = 4096


def size_option(client: Any, size_bytes: int) -> str:
    """The tmpfs option that caps a volume at `size_bytes`. Podman reads `size=` on a volume as a
    project quota and refuses it on tmpfs ("Filesystem does not support Project Quota"); tmpfs
    takes the same cap as a count of pages, which Podman passes through."""
    if enginepaths.kind(client) == enginepaths.PODMAN:
        return f"nr_blocks={-(-size_bytes // PAGE)}"
    return f"size={size_bytes}"


def _refuse_foreign(client: Any, run_id: str, workspace: str | None) -> None:
    """An error when the run's holder name is taken by another workspace's holder on this engine
    (run ids are short: on an engine many machines share, two may meet)."""
    try:
        found = client.api.inspect_container(holder_name(run_id))
    except docker.errors.NotFound:
        return
    except docker.errors.DockerException as exc:
        raise _engine(f"to look up the holder of run {run_id}", exc) from None
    theirs = (found.get("Config") or {}).get("Labels") or {}
    if theirs.get(WORKSPACE_LABEL) != workspace:
        raise EngineError(
            f"the engine already has a container named {holder_name(run_id)} that is not this workspace's",
            hint="start the run again (it gets another id); on an engine others share, nothing of theirs is touched",
        )


def place(client: Any, held: HeldLayers, dirs: list[tuple[str, tuple[int, int], int]], whiteouts: list[str]) -> None:
    """Put into the upper layer, before the agent starts, the directories `dirs` (path under
    `upper/`, owner, mode: the lower's, for copied-up parents) and a whiteout at each of
    `whiteouts`, so those paths are absent from the merged view."""
    nodes = [(f"upper/{rel}", "dir", owner, mode) for rel, owner, mode in dirs]
    nodes += [(f"upper/{rel}", "whiteout", (0, 0), 0) for rel in whiteouts]
    _put(client, holder_name(held.run_id), nodes)


def _put(client: Any, holder: str, nodes: list[tuple[str, str, tuple[int, int], int]]) -> None:
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, (uid, gid), mode in nodes:
            ti = tarfile.TarInfo(name)
            ti.type = tarfile.DIRTYPE if kind == "dir" else tarfile.CHRTYPE
            ti.mode, ti.uid, ti.gid, ti.mtime = mode, uid, gid, now
            ti.devmajor = ti.devminor = 0
            tf.addfile(ti)
    _put_archive(client, holder, buf.getvalue(), f"the layout of the upper layer in {holder}")


def _put_archive(client: Any, holder: str, data: Any, what: str) -> None:
    """Extract the tar `data` at the holder's mount; `what` it is, for the error."""
    try:
        ok = client.api.put_archive(holder, MOUNT, data)
    except docker.errors.DockerException as exc:
        raise _engine(f"to put {what}", exc) from None
    if not ok:
        raise EngineError(f"the engine refused {what}")


def _exec(client: Any, holder: str, argv: list[str]) -> Iterator[bytes]:
    """Stream the standard output of `argv` run in the holder; an error with its standard
    error when it fails."""
    try:
        exec_id = client.api.exec_create(holder, argv, user="0:0", stdout=True, stderr=True)["Id"]
        frames = client.api.exec_start(exec_id, stream=True, demux=True)
    except docker.errors.DockerException as exc:
        raise _engine(f"to read the upper layer in {holder}", exc) from None
    err = b""
    for out, stderr in frames:
        if stderr and len(err) < STDERR_KEEP:
            err += stderr[: STDERR_KEEP - len(err)]
        if out:
            yield out
    code = client.api.exec_inspect(exec_id).get("ExitCode")
    if code != 0:
        text = err.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise EngineError(f"reading the upper layer in {holder} failed (exit {code}): {' / '.join(text)}")


def dump(client: Any, held: HeldLayers, name: str = "upper") -> Generator[bytes, None, None]:
    """The tree `name` of the capped filesystem (the upper layer, or the agent's home) as
    `upperdump.read_dump` reads it: from the holder's service (sandbox/holdservice.py), else by
    an exec. Closing the iterator early (a bound was met) leaves the program to end when the
    holder goes."""
    holder = holder_name(held.run_id)
    service = holdservice.get(client, holder)
    if service is not None:
        stream = service.dump(f"{MOUNT}/{name}", OPAQUE)
        try:
            first = next(stream, None)
        except holdservice.Broken as exc:
            log.info("%s: read by an exec", exc)
        else:
            if first is None:
                return
            yield first
            try:
                yield from stream
            except holdservice.Broken as exc:
                raise EngineError(f"reading the upper layer in {holder} failed: {exc}") from None
            return
    yield from _exec(client, holder, ["python3", "-I", "-c", upperdump.DUMP, f"{MOUNT}/{name}", OPAQUE])


WRITE_MAX = 1 << 20  # a file this small goes through the holder's service (one JSON line)
SERVICE_WAIT_S = 0.5  # a service being started is waited for this long (a tar put takes 0.03-0.1 s)


def put_file(client: Any, held: HeldLayers, name: str, data: bytes) -> None:
    """A new file `name` holding `data` on the capped filesystem, root's and read-only for all
    (what the agent reads: its standard input). Through the holder's service when it runs (a
    line on its connection), else as a tar put into the holder."""
    what = f"{name} into the capped filesystem of run {held.run_id}"
    _put_file(client, holder_name(held.run_id), name, data, what)


def _put_file(client: Any, holder: str, name: str, data: bytes, what: str) -> None:
    service = holdservice.get(client, holder, wait=SERVICE_WAIT_S) if len(data) <= WRITE_MAX else None
    if service is not None:
        try:
            service.write(name, data)
            return
        except holdservice.Broken as exc:
            log.info("%s: put as a tar", exc)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        ti = tarfile.TarInfo(name)
        ti.size, ti.mode, ti.uid, ti.gid = len(data), 0o444, 0, 0
        tf.addfile(ti, io.BytesIO(data))
    _put_archive(client, holder, buf.getvalue(), what)


def put_tree(client: Any, held: HeldLayers, name: str, src: Path, owner: tuple[int, int] | None = None) -> None:
    """Copy the local tree `src` (never following a link in it) to `name` on the capped
    filesystem, modes kept, owners too or all `owner`; ENOSPC there (a tree over the cap) is an
    error."""

    def own(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        if owner is not None:
            ti.uid, ti.gid = owner
            ti.uname = ti.gname = ""
        return ti

    with tempfile.TemporaryFile() as buf:
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            tf.add(str(src), arcname=name, recursive=True, filter=own)  # links are stored as links
        buf.seek(0)
        _put_archive(client, holder_name(held.run_id), buf, f"{src} into the capped filesystem of run {held.run_id}")


def _statvfs(client: Any, holder: str) -> tuple[int, int, int]:
    """(size, bytes in use, inodes in use) of the holder's capped filesystem, as its kernel counts
    them: `stat -f` (statvfs(2)), which starts in a few milliseconds where python3 takes tens, at
    every run's end."""
    service = holdservice.get(client, holder)
    try:
        if service is None:
            raise holdservice.Broken("no service")
        blocks, free, frsize, files, ffree = service.statvfs()
    except holdservice.Broken:
        out = b"".join(_exec(client, holder, ["stat", "-f", "-c", "%b %f %S %c %d", MOUNT]))
        try:
            blocks, free, frsize, files, ffree = (int(x) for x in out.split())
        except ValueError:
            raise EngineError(
                f"the size of the capped filesystem in {holder} could not be read: {out[:200]!r}"
            ) from None
    return blocks * frsize, (blocks - free) * frsize, files - ffree


def used(client: Any, held: HeldLayers) -> tuple[int, int]:
    """(bytes, inodes) in use on the run's capped filesystem, as its kernel counts them."""
    return _statvfs(client, holder_name(held.run_id))[1:]


def find(client: Any, run_id: str) -> HeldLayers | None:
    """The run's held layers if its holder still runs (after a crash of the process that made
    them): its volume's mount point; None when there is none to find."""
    try:
        found = client.api.inspect_container(holder_name(run_id))
    except docker.errors.NotFound:
        return None
    except docker.errors.DockerException as exc:
        raise _engine(f"to find the upper layer of run {run_id}", exc) from None
    source = _mount(found, "Source")
    if not (found.get("State") or {}).get("Running") or not source:
        return None
    return HeldLayers(run_id, PurePosixPath(source))


def _mount(container: dict[str, Any], what: str) -> str | None:
    """`what` ("Name", "Source") of the volume a holder's inspection shows at MOUNT."""
    return next((m.get(what) for m in container.get("Mounts") or [] if m.get("Destination") == MOUNT), None)


def release(client: Any, run_id: str, claim: bool = True) -> None:
    """Remove the run's holder and its volume (everything the agent wrote with them), and with
    `claim` a spare set aside for it that it never took; no-op for what is already gone. Logs
    what the engine refuses."""
    with _held_lock:
        _held_here.pop((str(client.api.base_url), run_id), None)
        _claims_taken.discard((str(client.api.base_url), run_id))
    if claim:
        drop_claim(client, run_id)
    vol = volume_name(run_id)
    with contextlib.suppress(docker.errors.DockerException):  # a spare a run took keeps its volume's name
        vol = _mount(client.api.inspect_container(holder_name(run_id)), "Name") or vol
    _remove(client, holder_name(run_id), vol)
    if vol != volume_name(run_id):
        _remove(client, None, volume_name(run_id))
    with _spares.lock:
        ahead = _spares.next.pop((str(client.api.base_url), run_id), None)
    if ahead is not None:
        _spares.make(client, *ahead)


def _unmounted(client: Any, labels: list[str]) -> list[str]:
    """The volumes with `labels` that no container (running or not) mounts. Not the engine's
    `dangling` filter: Podman's counts a volume a running container mounts as dangling."""
    found = (client.api.volumes(filters={"label": labels}) or {}).get("Volumes") or []
    mounted = {m.get("Name") for c in client.api.containers(all=True) for m in c.get("Mounts") or []}
    return [v["Name"] for v in found if v["Name"] not in mounted]


def drop_claim(client: Any, run_id: str, workspace: str | None = None) -> None:
    """Remove the spare set aside for the run that it never took (of `workspace`, when said),
    and its volume when that is a spare's (never forced: Podman's force would remove the
    containers that use it first)."""
    try:
        c = client.api.inspect_container(claim_name(run_id))
    except docker.errors.DockerException:
        return
    have = c.get("Config", {}).get("Labels") or {}
    if not have.get(SPARE_LABEL) or (workspace is not None and have.get(WORKSPACE_LABEL) != workspace):
        return
    _drop_spare(client, claim_name(run_id), _mount(c, "Name"))


def _drop_spare(client: Any, name: str, vol: str | None) -> None:
    """Remove the spare container `name`, then its volume `vol` if it is a spare's (by name)."""
    holdservice.drop(client, name)
    try:
        client.api.remove_container(name, force=True)
    except docker.errors.NotFound:
        return  # renamed meanwhile (taken by a run): its volume is that run's now
    except docker.errors.DockerException as exc:
        log.warning("cannot remove the spare holder %s: %s", name, exc)
        return
    if vol and vol.startswith(SPARE_PREFIX):
        try:
            client.api.remove_volume(vol)
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as exc:
            log.warning("cannot remove the spare volume %s: %s", vol, exc)


def _remove(client: Any, holder: str | None, vol: str) -> None:
    """Remove the container `holder`, then the volume `vol` (a volume in use cannot go); what
    is already gone is no error, and what the engine refuses is logged."""
    steps = [("capped volume", lambda: client.api.remove_volume(vol, force=True))]
    if holder is not None:
        holdservice.drop(client, holder)
        steps.insert(0, ("holder", lambda: client.api.remove_container(holder, force=True)))
    for what, remove in steps:
        try:
            remove()
        except docker.errors.NotFound:
            pass
        except docker.errors.DockerException as exc:
            log.error("cannot remove the %s %s: %s", what, holder if what == "holder" else vol, exc)


class EngineUpper:
    """`staging.base.HeldUpper` through one engine client: the capped upper layers of runs,
    each held by a holder container of `image` (the runtime image: it has the python3 `dump`
    and `used` run)."""

    options = OPTIONS

    def __init__(self, client: Any, image: str, labels: dict[str, str] | None = None, *, remote: bool = False) -> None:
        self.client, self.image, self.labels = client, image, labels or {}
        self.remote = remote  # the engine cannot see this machine's paths (docs/engines.md)

    def lower(self, tree: Path, version: str | None = None) -> str:
        if not self.remote:
            return str(tree)
        return EngineMirror(self.client, self.image, tree.parent, self.labels).sync(tree, version)

    def relay(self, run_id: str, socket: Path) -> str:
        held = self._held(run_id)
        relay.start(self.client, run_id, holder_name(run_id), f"{MOUNT}/gw/{socket.name}", socket)
        return str(held.mountpoint / "gw")

    def hold(
        self, run_id: str, size_bytes: int, inodes: int, owner: tuple[int, int], mode: int, spare: bool = False,
        claimed: str | None = None,
    ) -> tuple[str, str]:  # fmt: skip
        held = hold(
            self.client, run_id, image=self.image, size_bytes=size_bytes, inodes=inodes, owner=owner, mode=mode,
            labels=self.labels, spare=spare, claimed=claimed,
        )  # fmt: skip
        return str(held.upper), str(held.work)

    def reserve_spare(self, run_id: str, files: Mapping[str, bytes] | None = None) -> str | None:
        return reserve_spare(self.client, run_id, self.labels.get(WORKSPACE_LABEL, ""), files)

    def took_claim(self, run_id: str) -> bool:
        with _held_lock:
            return (str(self.client.api.base_url), run_id) in _claims_taken

    def drop_claim(self, run_id: str) -> None:
        drop_claim(self.client, run_id, self.labels.get(WORKSPACE_LABEL, ""))

    def make_spare(self, size_bytes: int, inodes: int, owner: tuple[int, int], mode: int) -> None:
        labels = {**self.labels, OWNER_LABEL: "1", ROLE_LABEL: ROLE}
        _spares.make(self.client, self.image, size_bytes, round_inodes(inodes), owner, mode, labels)

    def drop_spares(self) -> None:
        drop_spares(self.client, self.labels.get(WORKSPACE_LABEL, ""))

    def settle(self) -> None:
        _later.settle()

    def _held(self, run_id: str) -> HeldLayers:
        found = find(self.client, run_id)
        if found is None:
            raise EngineError(
                f"the capped upper layer of run {run_id} is gone from the engine (its holder container"
                f" {holder_name(run_id)} is not running)",
                hint="the run cannot be inspected; start it again",
            )
        return found

    def place(self, run_id: str, dirs: list[tuple[str, tuple[int, int], int]], whiteouts: list[str]) -> None:
        place(self.client, self._held(run_id), dirs, whiteouts)

    def used(self, run_id: str) -> tuple[int, int]:
        return used(self.client, self._held(run_id))

    def dump(self, run_id: str, name: str = "upper") -> Iterator[bytes]:
        return dump(self.client, self._held(run_id), name)

    def _here(self, run_id: str) -> HeldLayers:
        """The run's layers as this process's `hold` gave them, else as the engine says."""
        with _held_lock:
            known = _held_here.get((str(self.client.api.base_url), run_id))
        return known if known is not None else self._held(run_id)

    def where(self, run_id: str, name: str) -> str:
        return str(self._here(run_id).mountpoint / name)

    def put(self, run_id: str, name: str, src: Path, owner: tuple[int, int] | None = None) -> None:
        put_tree(self.client, self._held(run_id), name, src, owner)

    def put_file(self, run_id: str, name: str, data: bytes) -> None:
        put_file(self.client, self._here(run_id), name, data)

    def release(self, run_id: str, later: bool = False) -> None:
        relay.stop(run_id)
        if later:
            _later.submit(self.client, run_id)
        elif _later.going(self.client, run_id) is None:  # (once is enough: the engine refuses a second)
            release(self.client, run_id)
