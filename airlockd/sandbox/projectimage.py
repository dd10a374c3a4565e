"""The project's own image as an agent's base: `image = "devcontainer"` or `image = "./path/Dockerfile"`.

An agent is only as good as what it can run: the project's toolchain lives in the image its users
already describe, `.devcontainer/devcontainer.json` (its `image`, or `build.dockerfile` with
`build.context`, `build.args`, `build.target`) or a Dockerfile. airlockd builds that image through
the engine (no registry is asked for anything: a named base must already be on the engine) and adds
its own layer on top:

- the entrypoint shim and the gateway forwarder (runtime/rootfs/usr/local/bin);
- a Python of its own for the forwarder, under /opt/airlockd/python, run by its own dynamic loader
  (so the forwarder works in an image with no Python, another Python or another libc);
- HOME on /tmp, the agent's user (1000:1000), the shim as the entrypoint.

The agent CLI's layer, when the agent has one, goes on top of that (sandbox/image.py). What is
built is read from the workspace by sandbox/projectsource.py.

What the project's files may say changes nothing in how the container runs: the user, the
capabilities, the read-only root, the limits, the network (none) and the mounts come from the
policy alone (sandbox/dockerargs.py), whatever `USER`, `runArgs`, `privileged`, `capAdd`,
`securityOpt`, `mounts` or `containerUser` ask for; `devcontainer.json`'s keys that would loosen
or change the container are reported as ignored (`ProjectSource.ignored`).

The build context is the staged copy of the workspace (staging/copy.py `stage`): secrets and
files above the agent's clearance are absent from it, as from the agent's own copy, so a
`COPY . /src` bakes nothing into the image that the agent could not see anyway; `.git` and what
`.dockerignore` names are left out. The image is cached under a tag that is a digest of its
inputs: the devcontainer.json and Dockerfile bytes, the build arguments and target, the named
base's image id, the runtime image it takes its layer from, and a listing (path, size, mode,
mtime) of the context, so changing any of them builds a new image; the previous one of the
workspace is removed once the new one is built.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pathspec
from filelock import FileLock

from airlockd.errors import EngineError, PolicyError
from airlockd.pathmatch import gitignore_spec
from airlockd.sandbox.projectsource import ProjectSource, image_references, read_regular, read_source

Progress = Callable[[str], Any]
Stage = Callable[[Path], list[str]]  # stage the workspace into this (new) directory: the paths withheld

REPO = "airlockd-project"
LAYER_VERSION = "1"  # bump when the layer below changes in a way the runtime image's tag does not show
PYTHON_HOME = "/opt/airlockd/python"
LOADER = "ld-linux-x86-64.so.2"
# What the runtime image's python3.11 needs at run time (ldd), copied next to it with its loader.
PYTHON_LIBS = ("libc.so.6", "libm.so.6", "libz.so.1", "libexpat.so.1", LOADER)
FORWARD_PYTHON = f"{PYTHON_HOME}/lib/{LOADER} --library-path {PYTHON_HOME}/lib {PYTHON_HOME}/bin/python3.11"
LAYER = "airlockd's layer"
MAX_CONTEXT_FILES = 200_000
MAX_CONTEXT_BYTES = 4 * 1024**3


def _ignore(workspace: Path, context: str) -> pathspec.PathSpec:
    path = workspace / context / ".dockerignore"
    try:
        lines = read_regular(path, ".dockerignore").decode("utf-8", "replace").splitlines()
    except PolicyError:
        if os.path.lexists(path):
            raise
        lines = []
    return gitignore_spec([".git", *lines])


def _listing(root: Path, ignore: pathspec.PathSpec) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, lstat) of what goes into the build context under `root`, sorted, links not
    followed; PolicyError past MAX_CONTEXT_FILES or MAX_CONTEXT_BYTES."""
    count = size = 0
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        try:
            with os.scandir(root / rel_dir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for de in entries:
            rel = f"{rel_dir}/{de.name}" if rel_dir else de.name
            is_dir = de.is_dir(follow_symlinks=False)
            if ignore.match_file(rel + "/" if is_dir else rel):
                continue
            st = de.stat(follow_symlinks=False)
            count += 1
            size += st.st_size if not is_dir else 0
            if count > MAX_CONTEXT_FILES or size > MAX_CONTEXT_BYTES:
                raise PolicyError(
                    f"the image's build context {root} holds more than {MAX_CONTEXT_FILES} files or"
                    f" {MAX_CONTEXT_BYTES >> 30} GiB",
                    hint="name what the image does not need in a .dockerignore, or give the build a smaller context",
                )
            yield rel, st
            if is_dir:
                stack.append(rel)


def inputs_digest(
    workspace: Path, src: ProjectSource, runtime_tag: str, base_id: str | None, scope: str, network: str = "none"
) -> str:
    """The digest of everything the project image is made from (the module's docstring). `scope`
    says what the staging rules were (the withhold rules, the labels and the agent's clearance:
    staging/mirror.py `policy_digest`): an agent cleared for less, or a policy that withholds more,
    never gets an image built from a copy that held more."""
    h = hashlib.sha256()
    key = _workspace_key(workspace)
    fields = [LAYER_VERSION, runtime_tag, src.spec, src.origin, base_id, src.args, src.target, scope, key, network]
    h.update(json.dumps(fields).encode())
    h.update(src.origin_bytes)
    if src.dockerfile is not None:
        h.update(read_regular(workspace / src.dockerfile, src.dockerfile))
        for rel, st in _listing(workspace / src.context, _ignore(workspace, src.context)):
            h.update(f"{rel}\0{st.st_size}\0{st.st_mode}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _base_id(client: Any, image: str) -> str:
    try:
        return str(client.images.get(image).id)
    except Exception:
        raise EngineError(
            f"the devcontainer's image {image!r} is not on the engine, and airlockd asks no registry for it",
            hint=f"put it on the engine first (docker pull {image}, or docker load), then retry",
        ) from None


def project_tag(
    client: Any, workspace: Path, spec: str, runtime_tag: str, scope: str, network: str = "none"
) -> tuple[str, ProjectSource]:
    src = read_source(workspace, spec)
    base_id = _base_id(client, src.base_image) if src.base_image else None
    return f"{REPO}:{inputs_digest(workspace, src, runtime_tag, base_id, scope, network)[:16]}", src


def ensure_project_image(
    client: Any,
    workspace: Path,
    spec: str,
    runtime_tag: str,
    stage: Stage,
    *,
    scope: str,
    network: str = "none",
    progress: Progress = print,
    scratch: Path | None = None,
) -> str:
    """The project image with airlockd's layer, built when the engine lacks the tag its inputs
    give; the previous project image of this workspace is removed after a build. The build's
    RUN steps have `network` ("none", or the engine's "default")."""
    tag, src = project_tag(client, workspace, spec, runtime_tag, scope, network)
    if has_image(client, tag):
        return tag
    lock = FileLock(os.path.join(tempfile.gettempdir(), f"airlockd-project-{tag.rpartition(':')[2]}.lock"))
    with lock:
        if has_image(client, tag):
            return tag
        started = time.monotonic()
        if src.ignored:
            asked = ", ".join(src.ignored)
            progress(f"project image: {src.origin} asks for {asked}: not applied (the container is airlockd's)")
        base = src.base_image
        if base is None:
            base = f"{tag}-base"
            _build_project(client, workspace, src, base, stage, progress, scratch, network)
        try:
            _refuse_onbuild(client, base)
            progress(f"project image: adding airlockd's layer -> {tag}")
            labels = {"airlockd.project": _workspace_key(workspace), "airlockd.project.source": src.spec}
            _build(client, _layer_context(base, runtime_tag, labels), tag, LAYER, network="none")
        finally:
            if base != src.base_image:
                _remove(client, base)  # its layers stay, under the new tag
        _remove_older(client, workspace, tag)
        progress(f"project image: {tag} ready in {time.monotonic() - started:.0f} s")
    return tag


def _workspace_key(workspace: Path) -> str:
    return hashlib.sha256(os.fsencode(os.path.realpath(workspace))).hexdigest()[:16]


def has_image(client: Any, tag: str) -> bool:
    try:
        client.images.get(tag)
    except Exception:
        return False
    return True


def _remove(client: Any, tag: str) -> None:
    with contextlib.suppress(Exception):  # in use, or gone: harmless
        client.images.remove(tag, noprune=True)


def _remove_older(client: Any, workspace: Path, keep: str) -> None:
    """Remove this workspace's earlier project images (and the agent layers built on them)."""
    try:
        images = client.images.list(filters={"label": f"airlockd.project={_workspace_key(workspace)}"})
    except Exception:
        return
    keep_repo, _, keep_digest = keep.partition(":")
    for img in images:
        for t in img.tags:
            repo, _, name = t.partition(":")
            if repo == keep_repo and not name.startswith(keep_digest):
                _remove(client, t)


def _refuse_onbuild(client: Any, image: str) -> None:
    """An image with ONBUILD instructions would run them in airlockd's layer build: refused."""
    try:
        config = client.images.get(image).attrs.get("Config") or {}
    except Exception:
        return  # the build that follows says what is missing
    if config.get("OnBuild"):
        raise PolicyError(
            f"the project's image {image} declares ONBUILD instructions, which would run when airlockd adds its layer",
            hint="remove the ONBUILD lines (or build from an image without them)",
        )


def _check_references(client: Any, dockerfile: str, what: str) -> None:
    """Every image the Dockerfile names is on the engine already (airlockd asks no registry), and
    none is another workspace's project image (its staged sources are in it)."""
    for ref in image_references(dockerfile):
        if ref.split(":")[0].split("@")[0] == REPO:
            raise PolicyError(f"{what} builds from {ref}, an image airlockd made of a workspace", hint=f"fix {what}")
        if not has_image(client, ref):
            raise EngineError(
                f"{what} names the image {ref!r}, which is not on the engine, and airlockd asks no registry for it",
                hint=f"put it on the engine first (docker pull {ref}, or docker load), then retry",
            )


def _build_project(
    client: Any,
    workspace: Path,
    src: ProjectSource,
    tag: str,
    stage: Stage,
    progress: Progress,
    scratch: Path | None,
    network: str,
) -> None:
    """Build the project's Dockerfile from the staged copy of its context, under `tag`."""
    assert src.dockerfile is not None
    _check_references(
        client, read_regular(workspace / src.dockerfile, src.dockerfile).decode("utf-8", "replace"), src.dockerfile
    )
    with tempfile.TemporaryDirectory(prefix="airlockd-project-", dir=scratch) as tmp:
        staged = Path(tmp) / "ws"
        progress(f"project image: staging the build context ({src.context}) with secrets absent")
        inside = "" if src.context == "." else src.context.rstrip("/") + "/"
        withheld = [w for w in stage(staged) if w.startswith(inside)]
        note = ""
        if withheld:
            shown = ", ".join(withheld[:8]) + (f" and {len(withheld) - 8} more" if len(withheld) > 8 else "")
            note = f" (withheld from its context, as from the agent's copy: {shown})"
            progress(f"project image: {len(withheld)} files withheld from the build context: {shown}")
        dockerfile = staged / src.dockerfile
        if not dockerfile.is_file() or dockerfile.is_symlink():
            raise PolicyError(
                f"{src.dockerfile} is withheld from the agent (a secret, or above its clearance):"
                " it cannot build the agent's image",
                hint="label it lower or move what it withholds elsewhere",
            )
        root = staged / src.context
        with tempfile.TemporaryFile(dir=tmp) as fh:
            with tarfile.open(fileobj=fh, mode="w") as tar:
                for rel, _st in _listing(root, _ignore(staged, src.context)):
                    tar.add(str(root / rel), arcname=rel, recursive=False)
                _add(tar, ".airlockd.Dockerfile", dockerfile.read_bytes())
            fh.seek(0)
            progress(f"project image: building {src.dockerfile} (context {src.context})")
            _build(
                client,
                fh,
                tag,
                src.dockerfile + note,
                args=dict(src.args),
                target=src.target,
                progress=progress,
                network=network,
            )


def _layer_context(base: str, runtime_tag: str, labels: dict[str, str]) -> io.BytesIO:
    copies = [
        f"COPY --from={runtime_tag} /usr/local/bin/airlock-shim /usr/local/bin/airlock-forward /usr/local/bin/",
        f"COPY --from={runtime_tag} /usr/bin/python3.11 {PYTHON_HOME}/bin/python3.11",
        f"COPY --from={runtime_tag} /usr/lib/python3.11 {PYTHON_HOME}/lib/python3.11",
        *(f"COPY --from={runtime_tag} /lib/x86_64-linux-gnu/{lib} {PYTHON_HOME}/lib/{lib}" for lib in PYTHON_LIBS),
    ]
    lines = [
        f"FROM {base}",
        "USER 0:0",
        *copies,
        f"LABEL {' '.join(f'{k}={json.dumps(v)}' for k, v in labels.items())}",
        f"ENV HOME=/tmp/home AIRLOCK_FORWARD_PYTHON={json.dumps(FORWARD_PYTHON)}",
        "USER 1000:1000",
        'ENTRYPOINT ["/usr/local/bin/airlock-shim"]',
        'CMD ["/bin/sh"]',
    ]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add(tar, "Dockerfile", ("\n".join(lines) + "\n").encode())
    buf.seek(0)
    return buf


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def _build(
    client: Any,
    fileobj: Any,
    tag: str,
    what: str,
    *,
    args: dict[str, str] | None = None,
    target: str | None = None,
    progress: Progress | None = None,
    network: str = "none",
) -> None:
    """One engine build of a tar context, its RUN steps on `network`; EngineError with the
    build's own last lines on failure."""
    tail: list[str] = []
    try:
        stream = client.api.build(
            fileobj=fileobj,
            custom_context=True,
            dockerfile="Dockerfile" if what == LAYER else ".airlockd.Dockerfile",
            tag=tag,
            buildargs=args or None,
            target=target,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
            network_mode="none" if network == "none" else None,
        )
        for chunk in stream:
            if "error" in chunk:
                detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
                shown = "".join(tail[-5:]).strip()
                raise EngineError(
                    f"building {what} failed: {detail}" + (f"\n{shown}" if shown else ""),
                    hint="fix the Dockerfile (or the devcontainer.json naming it) and retry",
                )
            line = chunk.get("stream")
            if isinstance(line, str) and line.strip():
                tail = [*tail[-19:], line]
                if progress is not None and line.startswith("Step "):
                    progress(f"project image: {line.strip()[:200]}")
    except EngineError:
        raise
    except Exception as exc:
        raise EngineError(f"building {what} failed: {exc}", hint="check that the engine answers, then retry") from None
