"""Each mirror's fresh repository (staging/gitcopy.py), kept up to date by the mirror's walks and
the keeper's incremental refreshes, and the state this process keeps of it (`MIRRORS`): what a
refresh looks at, when it purges, and the cold build's packer (staging/packer.py)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

from airlockd.pipeline.manifest import Manifest
from airlockd.staging import gitcopy
from airlockd.staging.githead import DOTGIT, workspace_head
from airlockd.staging.gitobjects import small_packs
from airlockd.staging.gitstate import RepoState
from airlockd.staging.packer import Packer

MAX_PACKS = 50  # past this many small packs (one per refresh that changed something), some are joined: git's own
# gc.autoPackLimit. Walks (every few minutes, in the daemon's other process) join them first, so a
# run's refresh rarely pays a join


def cold_packer(tree: Path, workspace: Path, owner: tuple[int, int] | None) -> Packer | None:
    """A packer (staging/packer.py) for a generation built from nothing, when the workspace is a
    repository; its blobs are the repository's once the walk is done (`MirrorRepos.refresh`)."""
    if not gitcopy.ENABLED or (tree / DOTGIT).exists() or workspace_head(workspace) is None:
        return None
    tree.mkdir(mode=0o700, parents=True, exist_ok=True)
    return Packer.start(tree, owner)


class MirrorRepos:
    """Each mirror's fresh repository, as this process last wrote it (keyed by the mirror root)."""

    def __init__(self) -> None:
        self._states: dict[str, RepoState] = {}
        self._lock = threading.Lock()

    def refresh(
        self,
        mirror_root: Path,
        tree: Path,
        workspace: Path,
        owner: tuple[int, int] | None,
        base: Manifest | None = None,
        *,
        changed: Iterable[str] | None = None,
        purge: bool = False,
        packer: Packer | None = None,
        also: Iterable[str] = (),
    ) -> None:
        """Bring the repository in the mirror generation `tree` up to date with that tree.

        With a state this process wrote whose index is still the one on disk, only some paths
        are looked at: `changed` when the caller knows them (the keeper's incremental refresh,
        `base` then the manifest they are part of), else those whose entries differ between the
        `base` given last time and this one (a walk), with `also` (the nodes the walk renewed with
        the same entry). Otherwise every node is `lstat`ed.

        `purge` (a walk's, and an incremental refresh's that withheld something new or saw a
        withheld file change: keeper.py) removes the dead objects and joins the small packs.
        Between purges the store may keep earlier versions of files this mirror staged, each
        under the same policy and the same withheld files, so none can hold a value the redactor
        has learnt since (docs/staging.md, "What a mirror's store may still hold")."""
        if not gitcopy.ENABLED:
            return
        head = workspace_head(workspace)
        key = str(mirror_root)
        with self._lock:
            if head is None:
                if packer is not None:
                    packer.abandon()
                self._states.pop(key, None)
                if (tree / DOTGIT).is_dir() and not (tree / DOTGIT).is_symlink():
                    shutil.rmtree(tree / DOTGIT)
                return
            repo = gitcopy.Repo(tree, owner, split=True)
            state = self._states.pop(key, None)
            paths: list[str] | None = None
            if state is not None and packer is None and self._vouched(tree, state):
                if changed is not None:
                    paths = list(changed)
                    if base is not None:
                        for rel in paths:
                            e = base.get(rel)
                            if e is None:
                                state.manifest.pop(rel, None)
                            else:
                                state.manifest[rel] = e
                elif base is not None:  # and the nodes a walk renewed (`also`): same entry, new inode
                    paths = _differs(state.manifest, base) + list(also)
            if paths is None:
                state = None
            state = repo.build(head, state, paths, packer)
            repo.commit(state, head)
            if purge or len(small_packs(state.packs.values())) > MAX_PACKS:
                repo.purge(state, small_only=not purge)
            if paths is None or changed is None:
                state.manifest = dict(base) if base is not None else {}
            self._states[key] = state

    @staticmethod
    def _vouched(tree: Path, state: RepoState) -> bool:
        try:
            st = os.lstat(tree / DOTGIT / "index")
        except OSError:
            return False
        return (st.st_ino, st.st_size, st.st_mtime_ns) == state.index_id

    def forget(self, mirror_root: Path) -> None:
        with self._lock:
            self._states.pop(str(mirror_root), None)


def _differs(old: Manifest, new: Manifest) -> list[str]:
    """The paths whose entries differ between two manifests (same objects are not compared)."""
    out = [rel for rel, e in new.items() if old.get(rel) is not e and old.get(rel) != e]
    out.extend(rel for rel in old.keys() - new.keys())
    return out


MIRRORS = MirrorRepos()
