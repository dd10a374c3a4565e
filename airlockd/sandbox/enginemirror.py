"""A workspace's mirror on an engine that cannot see this machine's paths (a remote host).

The overlay's lower layer must be a directory on the engine's host. For a remote engine that is
a volume of the engine's own (`airlockd-mirror-<key>`, the local driver: a plain directory under
its data root), holding one directory per mirror generation (`g<N>`), kept equal to the local
generation of the same number (staging/mirror.py) by tar streams of what changed since the last
sync:

- what the engine holds is recorded here, per generation, as each node's stat key (kind, mode,
  owner, size, mtime, inode, link target): the local mirror never writes a file in place (a
  change is a new inode), so an unchanged key is unchanged content;
- a generation the engine lacks starts as a hard-link clone (`cp -al`) of the newest one it has,
  as the local mirror's generations do. A path that went, or became another kind of node, is
  removed there first; a changed file or link is replaced by the extraction itself, which unlinks
  an existing non-directory before it creates the new one (the engine's archive code: "if path
  exists we almost always just want to remove and replace it"), so a clone's sibling (which a
  live run may have mounted) never changes (tests/integration/test_remote_engine.py checks it);
- the changed and new nodes travel as one `tar` stream (GNU tar, read from the local generation,
  owners and modes kept) through `put_archive`; generations no longer here are removed there;
- a sync cut short leaves the generation marked (a small file beside the record, so the
  record of 20,000 nodes is written once a sync, not twice): the next one removes it and starts
  again. A process that syncs again keeps the record it wrote in memory, and reads it again only
  when the file is not the one it wrote.

A *keeper* container (`airlockd-mirror-<key>`: the runtime image, `sleep infinity`, runc, no
network, read-only root, only CAP_CHOWN, CAP_DAC_OVERRIDE and CAP_FOWNER) holds the volume for
`put_archive` and the `rm`/`cp -al` it needs; it stays for the next run.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import secrets
import stat
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import docker.errors
from filelock import FileLock

from airlockd.errors import EngineError
from airlockd.fsutil import atomic_write_bytes
from airlockd.sandbox import enginepaths
from airlockd.sandbox.volumes import OWNER_LABEL

log = logging.getLogger(__name__)

ROLE_LABEL = "airlockd.role"
ROLE = "mirror-keeper"
NONCE_LABEL = "airlockd.mirror-nonce"
MOUNT = "/mirror"
STDERR_KEEP = 4096

Key = list[Any]  # [kind, mode, uid, gid, size, mtime_ns, ino, target]

#: run in the keeper: remove the paths listed (NUL-separated, relative to the generation) in the
#: file argv[2] from the generation argv[1], never following a link; a directory goes whole.
REMOVE = r"""
import os, shutil, sys
root = sys.argv[1]
data = open(sys.argv[2], 'rb').read()
os.unlink(sys.argv[2])
for rel in data.split(b'\0'):
    if not rel:
        continue
    p = os.path.join(root.encode(), rel)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        continue
    if os.path.isdir(p) and not os.path.islink(p):
        shutil.rmtree(p)
    else:
        os.unlink(p)
"""


#: state file -> ((inode, size, mtime) of the file as written, the record written): this
#: process's last sync of each mirror
_memo: dict[Path, tuple[tuple[int, int, int] | None, dict[str, Any] | None]] = {}


def volume_name(key: str) -> str:
    return f"airlockd-mirror-{key}"


ID_FILE = "engine-mirror.id"


def mirror_key(mirror_root: Path) -> str:
    """The engine-side name of the local mirror at `mirror_root` (a workspace at a clearance):
    random, made once and kept beside it. Never derived from the path: two machines (or users)
    with the same paths on one shared engine would otherwise share a volume, and one's runs could
    see the other's files."""
    path = mirror_root / ID_FILE
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        key = ""
    if len(key) == 32 and all(c in "0123456789abcdef" for c in key):
        return key
    mirror_root.mkdir(parents=True, exist_ok=True, mode=0o700)
    fresh = secrets.token_hex(16)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another process made it first: theirs (or one not ours: replaced)
        key = path.read_text().strip()
        if len(key) == 32 and all(c in "0123456789abcdef" for c in key):
            return key
        atomic_write_bytes(path, fresh.encode())
        return fresh
    with os.fdopen(fd, "w") as fh:
        fh.write(fresh)
    return fresh


#: a directory changed this recently (ns) is read again at the next scan: a change made within
#: the same clock tick as the scan would leave its ctime as the scan saw it
RACY_NS = 2_000_000_000
DirMemo = tuple[tuple[int, int], dict[str, Key], list[str]]  # (inode, ctime), its non-directories, its directories
SCANS_KEPT = 2
#: generation path -> what its last scan in this process found, per directory
_scans: dict[str, dict[str, DirMemo]] = {}


def scan(tree: Path) -> dict[str, Key]:
    """Every node under `tree` (not the root) with its stat key; links never followed.

    The local mirror never changes a file or link in place (a change is a new node renamed in),
    so a directory whose inode and ctime are as the last scan in this process saw them still has
    the same files and links: they are taken from that scan, and only its directories are
    `lstat`ed (a tenth of the nodes in a source tree). A directory changed within RACY_NS of a
    scan is listed again by the next one."""
    memo = _scans.get(str(tree), {})
    fresh: dict[str, DirMemo] = {}
    now = time.time_ns()
    out: dict[str, Key] = {}
    stack: list[tuple[str, str, os.stat_result]] = [(str(tree), "", os.lstat(tree))]
    while stack:
        path, rel, dst = stack.pop()
        dkey = (dst.st_ino, dst.st_ctime_ns)
        known = memo.get(rel)
        if known is not None and known[0] == dkey:
            files, subdirs = known[1], known[2]
        else:
            files, subdirs = {}, []
            with os.scandir(path) as it:
                for de in it:
                    st = de.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        subdirs.append(de.name)
                    elif stat.S_ISLNK(st.st_mode):
                        files[de.name] = ["l", st.st_mode, st.st_uid, st.st_gid, os.readlink(de.path)]
                    else:
                        files[de.name] = ["f", st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ino]
        for name, key in files.items():
            out[f"{rel}{name}"] = key
        for name in subdirs:
            sub = os.path.join(path, name)
            st = os.lstat(sub)
            out[f"{rel}{name}"] = ["d", st.st_mode, st.st_uid, st.st_gid]
            stack.append((sub, f"{rel}{name}/", st))
        if now - dst.st_ctime_ns > RACY_NS:
            fresh[rel] = (dkey, files, subdirs)
    _scans.pop(str(tree), None)
    _scans[str(tree)] = fresh
    for old in list(_scans)[:-SCANS_KEPT]:  # generations come and go: the newest are synced next
        del _scans[old]
    return out


def plan(have: dict[str, Key], want: dict[str, Key]) -> tuple[list[str], list[str]]:
    """(paths to remove there first, paths to send) to turn `have` into `want`. A path that went,
    or whose kind changed, is removed; a node of the same kind that differs is sent (the extraction
    replaces a file or link, and gives a directory its mode and owner)."""
    remove = [r for r, k in have.items() if r not in want or want[r][0] != k[0]]
    removed = set(remove)
    # under a removed directory nothing needs removing on its own; a parent goes before its children
    remove = sorted(r for r in remove if not any(p in removed for p in _parents(r)))
    if removed:
        send = [
            r for r, k in want.items() if have.get(r) != k or r in removed or any(p in removed for p in _parents(r))
        ]
    else:  # nothing went: what differs is all (a path a time, not its every parent)
        send = [r for r, k in want.items() if have.get(r) != k]
    send.sort()
    return remove, send


def _parents(rel: str) -> Iterator[str]:
    parts = rel.split("/")
    for i in range(1, len(parts)):
        yield "/".join(parts[:i])


class EngineMirror:
    """The generations of one local mirror (`mirror_root`) on the engine of `client`."""

    def __init__(self, client: Any, image: str, mirror_root: Path, labels: dict[str, str] | None = None) -> None:
        self.client, self.image, self.root = client, image, mirror_root
        self.key = mirror_key(mirror_root)
        self.name = volume_name(self.key)
        self.labels = {**(labels or {}), OWNER_LABEL: "1", ROLE_LABEL: ROLE}
        self._state_file = mirror_root / "engine-mirror.json"
        self._partial_file = mirror_root / "engine-mirror.partial"
        self._synced_file = mirror_root / "engine-mirror.synced"
        self.last = (0, 0)  # the last sync: (paths removed there, paths sent)

    # -- what the engine holds, as recorded here ---------------------------------------------

    def _load(self, nonce: str) -> dict[str, Any]:
        """The record, with the generations a sync cut short marked partial. Taken out of the
        memo: a sync that fails half way must not leave its changes there."""
        state = _memo.pop(self._state_file, (None, None))[1] if self._memo_valid() else None
        if state is None:
            try:
                state = json.loads(self._state_file.read_bytes())
            except (OSError, ValueError):
                state = None
        if not isinstance(state, dict) or state.get("nonce") != nonce or not isinstance(state.get("gens"), dict):
            state = {"nonce": nonce, "gens": {}}  # another volume (made again): nothing of it is known
        try:
            cut = json.loads(self._partial_file.read_bytes())
        except (OSError, ValueError):
            cut = None
        if isinstance(cut, dict) and cut.get("nonce") == nonce and isinstance(cut.get("gens"), list):
            for gen in cut["gens"]:
                if isinstance(gen, str) and gen in state["gens"]:
                    state["gens"][gen]["partial"] = True
        return state

    def _memo_valid(self) -> bool:
        try:
            st = os.stat(self._state_file)
        except OSError:
            return False
        return _memo.get(self._state_file, (None, None))[0] == (st.st_ino, st.st_size, st.st_mtime_ns)

    def _mark(self, nonce: str, gen: str) -> None:
        """Record that `gen` there is about to change, with those a sync cut short left marked
        (the record says them whole until it is written again)."""
        try:
            cut = json.loads(self._partial_file.read_bytes())
        except (OSError, ValueError):
            cut = None
        gens = [gen]
        if isinstance(cut, dict) and cut.get("nonce") == nonce and isinstance(cut.get("gens"), list):
            gens += [g for g in cut["gens"] if isinstance(g, str) and g != gen]
        atomic_write_bytes(self._partial_file, json.dumps({"nonce": nonce, "gens": gens}).encode())
        self._stamp(nonce, gen, None)

    def _synced(self) -> dict[str, Any]:
        try:
            doc = json.loads(self._synced_file.read_bytes())
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) and isinstance(doc.get("gens"), dict) else {}

    def _stamp(self, nonce: str, gen: str, version: str | None, keep: set[str] | None = None) -> None:
        """Record that the engine's `gen` is the local generation at `version` (None: no longer
        known to be), for the next sync of it to take at its word (`sync`)."""
        doc = self._synced()
        gens = doc.get("gens", {}) if doc.get("nonce") == nonce else {}
        if keep is not None:
            gens = {g: v for g, v in gens.items() if g in keep}
        if version is None and gen not in gens:
            return
        if version is None:
            gens.pop(gen, None)
        else:
            gens[gen] = version
        atomic_write_bytes(self._synced_file, json.dumps({"nonce": nonce, "gens": gens}).encode())

    def _save(self, state: dict[str, Any]) -> None:
        atomic_write_bytes(self._state_file, json.dumps(state, separators=(",", ":")).encode())
        self._partial_file.unlink(missing_ok=True)  # left by a crash here: one more full resend
        st = os.stat(self._state_file)
        _memo[self._state_file] = ((st.st_ino, st.st_size, st.st_mtime_ns), state)

    # -- the engine's side ---------------------------------------------------------------------

    def _keeper(self, retried: bool = False) -> tuple[str, PurePosixPath]:
        """The volume's nonce and mount point, with its keeper running (made when missing)."""
        try:
            try:
                vol = self.client.api.inspect_volume(self.name)
            except docker.errors.NotFound:
                nonce = secrets.token_hex(8)
                self.client.volumes.create(name=self.name, driver="local", labels={**self.labels, NONCE_LABEL: nonce})
                vol = self.client.api.inspect_volume(self.name)
            try:
                c = self.client.containers.get(self.name)
                if c.status != "running":
                    c.remove(force=True)
                    raise docker.errors.NotFound("stopped")
            except docker.errors.NotFound:
                self.client.containers.run(
                    self.image,
                    ["sleep", "infinity"],
                    name=self.name,
                    detach=True,
                    user="0:0",
                    network_mode="none",
                    cap_drop=["ALL"],
                    cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER"],
                    security_opt=["no-new-privileges"],
                    read_only=True,
                    runtime="runc",
                    mem_limit="256m",
                    ulimits=enginepaths.ulimits(self.client),
                    pids_limit=64,
                    labels=self.labels,
                    volumes={self.name: {"bind": MOUNT, "mode": "rw"}},
                )
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and not retried:  # another process made it at the same moment
                return self._keeper(retried=True)
            raise _engine("to keep the workspace's mirror", exc) from None
        except docker.errors.DockerException as exc:
            raise _engine("to keep the workspace's mirror", exc) from None
        return str((vol.get("Labels") or {}).get(NONCE_LABEL, "")), PurePosixPath(vol["Mountpoint"])

    def _exec(self, argv: list[str]) -> None:
        try:
            res = self.client.containers.get(self.name).exec_run(argv, user="0:0", demux=True)
        except docker.errors.DockerException as exc:
            raise _engine("to update the workspace's mirror", exc) from None
        if res.exit_code != 0:
            err = (res.output[1] or b"")[-STDERR_KEEP:].decode("utf-8", "replace").strip().splitlines()[-3:]
            raise EngineError(
                f"updating the workspace's mirror on the engine failed (exit {res.exit_code}): {' / '.join(err)}",
                hint="remove the mirror's volume (docker volume rm -f " + self.name + "); the next run makes it again",
            )

    def _put(self, dest: str, data: Any) -> None:
        try:
            ok = self.client.api.put_archive(self.name, dest, data)
        except docker.errors.DockerException as exc:
            raise _engine("to send the workspace's mirror", exc) from None
        if not ok:
            raise EngineError(f"the engine refused the workspace's mirror ({dest})")

    def _remove(self, gen: str, paths: list[str]) -> None:
        """Remove `paths` from the generation `gen` there: the list put beside it, then one exec."""
        name = f".remove-{secrets.token_hex(6)}"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            data = b"".join(r.encode("utf-8", "surrogateescape") + b"\0" for r in paths)
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
        self._put(MOUNT, buf.getvalue())
        self._exec(["python3", "-I", "-c", REMOVE, f"{MOUNT}/{gen}", f"{MOUNT}/{name}"])

    def _send(self, tree: Path, dest: str, paths: list[str]) -> None:
        """The nodes `paths` of the local `tree` as one tar stream into `dest` on the engine."""
        listing = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
        proc = subprocess.Popen(
            ["tar", "-c", "-C", str(tree), "--no-recursion", "--null", "-T", "-", "--numeric-owner", "-f", "-"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        feeder = threading.Thread(target=_feed, args=(proc.stdin, listing), daemon=True)
        feeder.start()
        try:
            self._put(dest, _chunks(proc.stdout))
        finally:
            feeder.join()
            err = proc.stderr.read()
            code = proc.wait()
        if code != 0:
            raise EngineError(
                f"tar of the workspace's mirror failed (exit {code}): {err.decode(errors='replace')[-400:]}"
            )

    # -- the one entry point ----------------------------------------------------------------

    def sync(self, tree: Path, version: str | None = None) -> str:
        """Bring the engine's copy of the local generation `tree` (`<mirror>/g<N>`) up to date;
        its path on the engine's host (the overlay's lower layer).

        `version`, when the caller can vouch for one, names the generation's content (the local
        mirror's serial as the caller's refresh left it, under which the generation is
        referenced by the run and cannot change: staging/mirror.py): a generation last synced at
        that version, by any process, is taken as it is there, at the cost of asking the engine
        for the volume (still the one synced to: its nonce). The daemon syncs before a run's
        process stages, so that process reads no record and scans no tree."""
        gen = tree.name
        with FileLock(str(self.root / "engine-mirror.lock")):
            if version is not None:
                done = self._synced()
                if done.get("gens", {}).get(gen) == version:
                    try:
                        vol = self.client.api.inspect_volume(self.name)
                    except docker.errors.NotFound:
                        vol = {}
                    except docker.errors.DockerException as exc:
                        raise _engine("to find the workspace's mirror", exc) from None
                    if vol and (vol.get("Labels") or {}).get(NONCE_LABEL) == done.get("nonce"):
                        self.last = (0, 0)
                        return str(PurePosixPath(vol["Mountpoint"]) / gen)
            # under the lock: a list taken before it could miss a generation another sync just sent
            local_gens = {p.name for p in self.root.iterdir() if p.name[:1] == "g" and p.name[1:].isdigit()}
            nonce, mountpoint = self._keeper()
            state = self._load(nonce)
            gens: dict[str, Any] = state["gens"]
            want = scan(tree)
            entry = gens.get(gen)
            if entry is None or entry.get("partial"):
                base = max(
                    (g for g, e in gens.items() if not e.get("partial") and g != gen),
                    key=lambda g: int(g[1:]),
                    default=None,
                )
                gens[gen] = {"partial": True, "nodes": {}}
                self._mark(nonce, gen)
                script = f"rm -rf {MOUNT}/{gen} && " + (
                    f"cp -al {MOUNT}/{base} {MOUNT}/{gen}" if base else f"mkdir -m 0755 {MOUNT}/{gen}"
                )
                self._exec(["sh", "-c", script])
                have = dict(gens[base]["nodes"]) if base else {}
            else:
                have = entry["nodes"]
                gens[gen] = {"partial": True, "nodes": {}}
                self._mark(nonce, gen)
            remove, send = plan(have, want)
            if remove:
                self._remove(gen, remove)
            if send:
                self._send(tree, f"{MOUNT}/{gen}", send)
            gens[gen] = {"nodes": want}
            gone = [g for g in gens if g not in local_gens and g != gen]
            if gone:
                with contextlib.suppress(EngineError):  # the next sync tries again
                    self._exec(["rm", "-rf", *(f"{MOUNT}/{g}" for g in gone)])
                    for g in gone:
                        gens.pop(g)
            self._save(state)
            if version is not None:
                self._stamp(nonce, gen, version, keep=set(gens))
            self.last = (len(remove), len(send))
            log.info("mirror %s on the engine: %s removed, %s sent", gen, len(remove), len(send))
            return str(mountpoint / gen)

    def remove(self) -> None:
        """The keeper and the volume (`airlockd gc`, tests); the record here goes with them."""
        for what, call in (
            ("keeper", lambda: self.client.api.remove_container(self.name, force=True)),
            ("volume", lambda: self.client.api.remove_volume(self.name, force=True)),
        ):
            try:
                call()
            except docker.errors.NotFound:
                pass
            except docker.errors.DockerException as exc:
                log.error("cannot remove the mirror's %s %s: %s", what, self.name, exc)
        self._state_file.unlink(missing_ok=True)
        self._synced_file.unlink(missing_ok=True)


def _feed(pipe: Any, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError):
        pipe.write(data)
    with contextlib.suppress(BrokenPipeError):
        pipe.close()


def _chunks(pipe: Any) -> Iterator[bytes]:
    while chunk := pipe.read(1 << 20):
        yield chunk


def _engine(what: str, exc: docker.errors.DockerException) -> EngineError:
    return EngineError(f"the engine failed {what}: {exc}", hint="check the engine (airlockd doctor)")
