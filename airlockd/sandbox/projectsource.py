"""What a project's image is made from, read from the workspace: `image = "devcontainer"`
(`.devcontainer/devcontainer.json` with its comments and trailing commas) or `"./path/Dockerfile"`;
the keys of a devcontainer.json that would loosen the container (reported, never applied); the
images a Dockerfile names. Definition files are read as bounded regular files, never through a
link out of the workspace. sandbox/projectimage.py builds what this reads.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from airlockd.errors import PolicyError

DEVCONTAINER_FILES = (".devcontainer/devcontainer.json", ".devcontainer.json")
# An image reference as a Dockerfile's FROM takes it (name, tag, digest): nothing that could end
# the line or start another instruction in the layer's Dockerfile.
IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}")
MAX_DEFINITION_BYTES = 1 << 20  # a devcontainer.json, a Dockerfile, a .dockerignore
# devcontainer.json keys that would change how the container runs: never applied, said so.
LOOSENING = (
    "runArgs", "privileged", "capAdd", "securityOpt", "mounts", "containerUser", "remoteUser", "init",
    "containerEnv", "remoteEnv", "forwardPorts", "appPort", "workspaceMount", "workspaceFolder",
    "overrideCommand", "hostRequirements", "features", "initializeCommand", "onCreateCommand",
    "updateContentCommand", "postCreateCommand", "postStartCommand", "postAttachCommand",
)  # fmt: skip


@dataclass(frozen=True)
class ProjectSource:
    """What the agent's `image` names, read from the workspace."""

    spec: str  # the policy's value
    origin: str  # the file that says what to build (workspace-relative)
    origin_bytes: bytes
    base_image: str | None = None  # devcontainer.json `image`: a tag already on the engine
    dockerfile: str | None = None  # workspace-relative
    context: str = "."  # workspace-relative folder
    args: tuple[tuple[str, str], ...] = ()
    target: str | None = None
    ignored: tuple[str, ...] = field(default=())  # devcontainer.json keys not applied


def is_project_image(image: str | None) -> bool:
    return image == "devcontainer" or (image is not None and image.startswith("./"))


def _inside(workspace: Path, rel: str, what: str) -> str:
    """`rel` (relative to the workspace) normalized, when it stays inside the workspace without
    following a link out of it; PolicyError otherwise."""
    ws = os.path.realpath(workspace)
    full = os.path.realpath(os.path.join(ws, rel))
    if os.path.commonpath([ws, full]) != ws:
        raise PolicyError(f"{what} {rel!r} leads out of the workspace", hint="keep it inside the workspace")
    return os.path.relpath(full, ws)


def strip_jsonc(text: str) -> str:
    """JSON with comments (`//`, `/* */`) and trailing commas, as devcontainer.json is written,
    made plain JSON: comments become spaces (positions in errors stay right), a comma before `}`
    or `]` goes; strings are left as they are."""
    out: list[str] = []
    i, n = 0, len(text)
    pending_comma: int | None = None  # index in `out` of a comma that may be trailing
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            pending_comma = None
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
        else:
            if c in "}]" and pending_comma is not None:
                out[pending_comma] = " "
            if c == ",":
                pending_comma = len(out)
            elif not c.isspace():
                pending_comma = None
            out.append(c)
            i += 1
    return "".join(out)


def read_source(workspace: Path, spec: str) -> ProjectSource:
    """What `spec` ("devcontainer" or "./path/Dockerfile") asks to build; PolicyError saying what
    is missing or wrong, and where."""
    if spec != "devcontainer":
        rel = _inside(workspace, spec, "the agent's Dockerfile")
        data = read_regular(workspace / rel, f"the agent's Dockerfile {spec}")
        return ProjectSource(spec, rel, data, dockerfile=rel, context=".")
    found = next((f for f in DEVCONTAINER_FILES if (workspace / f).is_file()), None)
    if found is None:
        raise PolicyError(
            'the agent\'s image is "devcontainer", and the workspace has no .devcontainer/devcontainer.json',
            hint='add one (with `image` or `build.dockerfile`), or name a Dockerfile: image = "./Dockerfile"',
        )
    _inside(workspace, found, "devcontainer.json")
    raw = read_regular(workspace / found, found)
    try:
        doc = json.loads(strip_jsonc(raw.decode("utf-8-sig")))
    except (UnicodeDecodeError, ValueError) as exc:
        raise PolicyError(f"{found} is not valid JSON (with comments): {exc}", hint=f"fix {found}") from None
    if not isinstance(doc, dict):
        raise PolicyError(f"{found} is not a JSON object", hint=f"fix {found}")
    ignored = tuple(k for k in LOOSENING if k in doc)
    if "dockerComposeFile" in doc:
        raise PolicyError(
            f"{found} describes a Docker Compose setup, which airlockd does not build",
            hint='give the agent a Dockerfile instead: image = "./path/Dockerfile"',
        )
    build = doc.get("build") or {}
    here = os.path.dirname(found)
    dockerfile = build.get("dockerfile") if isinstance(build, dict) else None
    dockerfile = dockerfile or doc.get("dockerFile")
    if dockerfile:
        if not isinstance(dockerfile, str):
            raise PolicyError(f"{found}: build.dockerfile must be a string", hint=f"fix {found}")
        context = build.get("context", doc.get("context", ".")) if isinstance(build, dict) else "."
        args = build.get("args", {}) if isinstance(build, dict) else {}
        target = build.get("target") if isinstance(build, dict) else None
        if (
            not isinstance(context, str)
            or not isinstance(args, dict)
            or not all(isinstance(v, str) for v in args.values())
        ):
            raise PolicyError(f"{found}: build.context must be a string, build.args strings", hint=f"fix {found}")
        return ProjectSource(
            spec,
            found,
            raw,
            dockerfile=_inside(workspace, os.path.join(here, dockerfile), "build.dockerfile"),
            context=_inside(workspace, os.path.join(here, context), "build.context"),
            args=tuple(sorted((str(k), v) for k, v in args.items())),
            target=target if isinstance(target, str) else None,
            ignored=ignored,
        )
    image = doc.get("image")
    if not isinstance(image, str) or not image.strip():
        raise PolicyError(f"{found} names neither `image` nor `build.dockerfile`", hint=f"fix {found}")
    if not IMAGE_REF.fullmatch(image.strip()):
        raise PolicyError(f"{found}: `image` is not an image reference: {image.strip()[:100]!r}", hint=f"fix {found}")
    return ProjectSource(spec, found, raw, base_image=image.strip(), ignored=ignored)


def read_regular(path: Path, what: str, limit: int = MAX_DEFINITION_BYTES) -> bytes:
    """A definition file's bytes: a regular file, not followed through a link, at most `limit`
    bytes (a fifo, a device or a huge file is refused, never waited on or read whole)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise PolicyError(f"{what} cannot be read: {exc.strerror}", hint=f"check {what}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PolicyError(f"{what} is not a regular file", hint=f"make {what} a file")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise PolicyError(f"{what} is larger than {limit} bytes", hint=f"check {what}")
    return data


def image_references(dockerfile: str) -> list[str]:
    """The images a Dockerfile names in FROM and COPY --from (stages it defines, `scratch` and
    references made of build arguments left out): what the engine would otherwise pull."""
    text = re.sub(r"\\\r?\n", " ", dockerfile)
    stages: set[str] = set()
    found: list[str] = []
    for line in text.splitlines():
        words = line.strip().split()
        if not words or words[0].startswith("#"):
            continue
        op = words[0].upper()
        if op == "FROM":
            args = [w for w in words[1:] if not w.startswith("--")]
            if args:
                if args[0].lower() != "scratch" and args[0].lower() not in stages:
                    found.append(args[0])
                if len(args) >= 3 and args[1].upper() == "AS":
                    stages.add(args[2].lower())
        elif op in ("COPY", "ADD"):
            for w in words[1:]:
                if w.startswith("--from="):
                    ref = w.removeprefix("--from=")
                    if ref.lower() not in stages and not ref.isdigit():
                        found.append(ref)
    return [r for r in found if "$" not in r]
