"""The agent runtime image: its tag (a digest of `runtime/`) and its build without a registry.

The build never pulls or pushes. debootstrap makes a Debian tree from the mirror this machine's apt
already uses (read from apt's sources at build time; no package host is written in the project),
the tree is trimmed, given the agent user and imported as a base image tagged by what went into it.
A local build then puts `runtime/rootfs/` and the image configuration on top, so editing a rootfs
file does not re-run debootstrap. The result is tagged `airlockd-runtime:<digest>` and `:latest`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import requests.exceptions
from filelock import FileLock
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from airlockd.errors import AirlockError, EngineError
from airlockd.interpreter import module_command
from airlockd.resources import resource
from airlockd.sandbox import compat

IMAGE_REPO = "airlockd-runtime"
BASE_REPO = "airlockd-runtime-base"
DEFINITION = "image.toml"
# Bump when the build steps below change what an image contains for the same runtime/ files.
RECIPE = "1"
_ENGINE_FIX = "start the engine with scripts/ensure-docker.sh (or `make engine`), then retry"

_ENGINE_FAILURES = (docker.errors.DockerException, requests.exceptions.RequestException)
Progress = Callable[[str], Any]  # print by default; pass a logger in `serve --stdio`
# debootstrap prints a line per package per step; the summary lines are enough.
_CHATTY = ("I: Retrieving", "I: Validating", "I: Extracting", "I: Unpacking", "I: Configuring")


class _Def(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class UserEntry(_Def):
    name: str = Field(pattern=r"^[a-z_][a-z0-9_-]*$")
    uid: int = Field(ge=1)
    gid: int = Field(ge=1)
    home: str = Field(pattern=r"^/")
    shell: str = Field(pattern=r"^/")


class ImageConfig(_Def):
    user: str
    workdir: str | None = Field(default=None, pattern=r"^/")  # made in the image when set
    entrypoint: list[str] = Field(default_factory=list)
    cmd: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class ImageDefinition(_Def):
    """`runtime/image.toml`: what debootstrap installs, what is trimmed, the user, the config."""

    suite: str = Field(pattern=r"^[a-z][a-z0-9-]*$")
    variant: str = "minbase"
    packages: list[str] = Field(default_factory=list)
    trim: list[str] = Field(default_factory=list)
    keep: list[str] = Field(default_factory=list)
    user: UserEntry
    config: ImageConfig

    @classmethod
    def load(cls, root: Path) -> ImageDefinition:
        path = root / DEFINITION
        try:
            with path.open("rb") as fh:
                raw = tomllib.load(fh)
            return cls.model_validate(raw)
        except OSError as exc:
            raise AirlockError(f"{path}: cannot read the image definition: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise AirlockError(f"{path}: not valid TOML: {exc}", hint="fix the syntax") from None
        except ValidationError as exc:
            problems = "; ".join(f"key `{'.'.join(str(p) for p in e['loc'])}`: {e['msg']}" for e in exc.errors())
            raise AirlockError(f"{path}: {problems}", hint="correct those keys") from None

    def base_key(self) -> str:
        """Digest of everything that goes into the base image (not rootfs/ or config)."""
        parts = self.model_dump(include={"suite", "variant", "packages", "trim", "keep", "user"})
        text = json.dumps({"recipe": RECIPE, **parts}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _runtime_root(root: Path | None) -> Path:
    return root if root is not None else resource("runtime")


def _files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            yield Path(dirpath) / name


def definition_digest(root: Path | None = None) -> str:
    """SHA-256 over every file under `runtime/` (path, executable bit, content) and the recipe."""
    root = _runtime_root(root)
    h = hashlib.sha256(f"airlockd-runtime recipe {RECIPE}\0".encode())
    for path in sorted(_files(root), key=lambda p: p.relative_to(root).as_posix()):
        st = path.lstat()
        rel = path.relative_to(root).as_posix()
        body = b"link:" + os.fsencode(os.readlink(path)) if path.is_symlink() else path.read_bytes()
        h.update(f"{rel}\0{'x' if st.st_mode & 0o111 else '-'}\0{len(body)}\0".encode())
        h.update(body)
    return h.hexdigest()


def image_tag(root: Path | None = None) -> str:
    """`airlockd-runtime:<12 hex>`: changes exactly when a file under `runtime/` changes."""
    return f"{IMAGE_REPO}:{definition_digest(root)[:12]}"


# ---- apt sources: where debootstrap downloads from -------------------------------------------


def _deb822_stanzas(text: str) -> Iterator[dict[str, str]]:
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if line[0] in " \t" and key:
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if fields:
            yield fields


_LIST_LINE = re.compile(r"^\s*deb\s+(?P<opts>\[[^\]]*\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)")


def apt_mirror(suite: str, etc_apt: Path = Path("/etc/apt")) -> tuple[str, str | None]:
    """(URI, keyring or None) of the apt source that carries `suite`, read from this machine.

    Never guesses a host: when no source names the suite, it says how to point at one.
    """
    candidates: list[tuple[str, str | None, list[str]]] = []
    for f in sorted((etc_apt / "sources.list.d").glob("*.sources")):
        for st in _deb822_stanzas(f.read_text(errors="replace")):
            if "deb" not in st.get("types", "").split() or st.get("enabled", "yes") == "no":
                continue
            for uri in st.get("uris", "").split():
                candidates.append((uri, st.get("signed-by") or None, st.get("suites", "").split()))
    lists = [etc_apt / "sources.list", *sorted((etc_apt / "sources.list.d").glob("*.list"))]
    for f in lists:
        if not f.is_file():
            continue
        for line in f.read_text(errors="replace").splitlines():
            m = _LIST_LINE.match(line)
            if m:
                signed = re.search(r"signed-by=(\S+?)\s*(?:\]|\s)", m["opts"] or "")
                candidates.append((m["uri"], signed[1] if signed else None, [m["suite"]]))
    for uri, keyring, suites in candidates:
        if suite in suites and uri.startswith(("http://", "https://", "file:")):
            keyring = keyring if keyring and keyring.startswith("/") else None
            return uri.rstrip("/"), keyring
    raise EngineError(
        f"no apt source on this machine carries Debian {suite!r} (looked in {etc_apt})",
        hint=f"add a Debian {suite} source to apt, or pass mirror=URI / "
        "set AIRLOCK_DEBIAN_MIRROR to a Debian mirror you can reach",
    )


# ---- the build ---------------------------------------------------------------------------------


def _has_image(client: Any, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False
    except _ENGINE_FAILURES as exc:
        raise EngineError(f"cannot query the image {tag}: {exc}", hint=_ENGINE_FIX) from None


def ensure_image(
    client: Any,
    *,
    force: bool = False,
    progress: Progress = print,
    root: Path | None = None,
    mirror: str | None = None,
    tag_latest: bool = True,
) -> str:
    """Return the runtime image's tag, building it only when the engine does not have it.

    `root` is the image definition (default: the shipped `runtime/`); `mirror` overrides the
    Debian mirror read from apt's sources; `force` rebuilds the top layer (the debootstrap base is
    reused when its inputs are the same); `tag_latest` also tags the result `:latest`.
    Never pulls from or pushes to a registry; never leaves the temporary tree behind.
    """
    root = _runtime_root(root)
    tag = image_tag(root)
    if not force and _has_image(client, tag):
        if tag_latest:
            _tag_latest(client, tag)
        return tag
    lock = FileLock(os.path.join(tempfile.gettempdir(), "airlockd-runtime-build.lock"))
    with lock:
        if not force and _has_image(client, tag):  # another process built it meanwhile
            if tag_latest:
                _tag_latest(client, tag)
            return tag
        started = time.monotonic()
        defn = ImageDefinition.load(root)
        base = f"{BASE_REPO}:{defn.base_key()}"
        if _has_image(client, base):
            progress(f"runtime image: reusing base {base}")
        else:
            _build_base(client, defn, base, progress, mirror)
        _build_top(client, defn, root, base, tag, progress)
        if tag_latest:
            _tag_latest(client, tag)
        progress(f"runtime image: {tag} ready in {time.monotonic() - started:.0f} s")
    return tag


def _tag_latest(client: Any, tag: str) -> None:
    try:
        client.images.get(tag).tag(IMAGE_REPO, "latest")
    except _ENGINE_FAILURES as exc:
        raise EngineError(f"cannot tag {tag} as latest: {exc}", hint=_ENGINE_FIX) from None


def find_debootstrap() -> str | None:
    """debootstrap on PATH or in the sbin directories (not on the PATH of a user who is not root
    on Debian)."""
    return shutil.which("debootstrap", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def _build_base(client: Any, defn: ImageDefinition, tag: str, progress: Progress, mirror: str | None) -> None:
    debootstrap = find_debootstrap()
    if debootstrap is None:
        raise EngineError(
            "debootstrap is not installed; it builds the runtime image without a registry",
            hint="apt-get install debootstrap (or run scripts/ensure-docker.sh, which installs it)",
        )
    if os.geteuid() != 0:
        raise EngineError(
            "debootstrap needs root to build the runtime image's base",
            hint="run `sudo airlockd runtime build` once; later runs reuse the image",
        )
    keyring: str | None = None
    mirror = mirror or os.environ.get("AIRLOCK_DEBIAN_MIRROR")
    if not mirror:
        mirror, keyring = apt_mirror(defn.suite)
    # /var/tmp: the tree is ~250 MB before trimming, too big for a small /tmp tmpfs.
    scratch = "/var/tmp" if os.path.isdir("/var/tmp") else None
    tree = Path(tempfile.mkdtemp(prefix="airlockd-rootfs-", dir=scratch))
    try:
        argv = [debootstrap, f"--variant={defn.variant}"]
        if defn.packages:
            argv.append("--include=" + ",".join(defn.packages))
        if keyring:
            argv.append(f"--keyring={keyring}")
        argv += [defn.suite, str(tree), mirror]
        progress(f"runtime image: debootstrap {defn.suite} ({', '.join(defn.packages)})")
        _run_streaming(argv, progress, what="debootstrap")
        _trim(tree, defn.trim, defn.keep)
        _add_user(tree, defn.user)
        progress(f"runtime image: importing base {tag}")
        _import_tree(client, tree, tag)
    finally:
        _unmount_under(tree)
        shutil.rmtree(tree, ignore_errors=True)


def _run_streaming(argv: list[str], progress: Progress, *, what: str) -> None:
    tail: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            tail = [*tail[-19:], line]
            if line.startswith(_CHATTY):
                continue
            progress(f"  {line}")
    if proc.returncode != 0:
        log = "\n    ".join(tail)
        raise EngineError(
            f"{what} failed with exit code {proc.returncode}; last lines:\n    {log}",
            hint="check that this machine reaches its apt mirror (apt-get update), then retry",
        )


def _trim(tree: Path, patterns: list[str], keep: list[str]) -> None:
    """Delete what `patterns` match inside `tree`, except paths matching `keep`."""

    def kept(p: Path) -> bool:
        rel = p.relative_to(tree).as_posix()
        return any(fnmatch.fnmatchcase(rel, k) for k in keep)

    for pattern in patterns:
        for hit in sorted(tree.glob(pattern)):
            if hit.is_symlink() or not hit.is_dir():
                if not kept(hit):
                    hit.unlink()
                continue
            for dirpath, _dirs, files in os.walk(hit, topdown=False):
                d = Path(dirpath)
                for name in files:
                    if not kept(d / name):
                        (d / name).unlink()
                with contextlib.suppress(OSError):  # not empty: something in it is kept
                    d.rmdir()


def _add_user(tree: Path, user: UserEntry) -> None:
    etc = tree / "etc"
    lines = {
        "passwd": f"{user.name}:x:{user.uid}:{user.gid}:airlockd agent:{user.home}:{user.shell}",
        "group": f"{user.name}:x:{user.gid}:",
        "shadow": f"{user.name}:!:19000::::::",
        "gshadow": f"{user.name}:!::",
    }
    for name, line in lines.items():
        path = etc / name
        if not path.exists():
            continue
        existing = path.read_text().splitlines()
        if any(e.split(":", 1)[0] == user.name for e in existing):
            continue
        with path.open("a") as fh:
            fh.write(line + "\n")


def _import_tree(client: Any, tree: Path, tag: str) -> None:
    repo, _, version = tag.partition(":")
    tar = subprocess.Popen(
        ["tar", "-C", str(tree), "--numeric-owner", "-c", "."],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert tar.stdout is not None
    out = tar.stdout
    try:
        result = client.api.import_image_from_data(iter(lambda: out.read(1 << 20), b""), repository=repo, tag=version)
    except _ENGINE_FAILURES as exc:
        raise EngineError(f"docker import of the runtime base failed: {exc}", hint=_ENGINE_FIX) from None
    finally:
        out.close()
        stderr = tar.stderr.read().decode(errors="replace") if tar.stderr else ""
        tar.wait()
    if tar.returncode != 0:
        raise EngineError(f"tar of the runtime tree failed: {stderr.strip()}")
    for line in str(result).splitlines():
        with contextlib.suppress(ValueError):
            msg = json.loads(line)
            if isinstance(msg, dict) and msg.get("error"):
                raise EngineError(f"docker import failed: {msg['error']}", hint=_ENGINE_FIX)


def _unmount_under(tree: Path) -> None:
    """Unmount what a failed debootstrap left mounted inside `tree` (proc, sys) before deleting."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    prefix = str(tree).rstrip("/") + "/"
    points = [m.split()[1] for m in mounts if len(m.split()) > 1]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def _dockerfile(defn: ImageDefinition, base: str, digest: str, has_rootfs: bool) -> str:
    c = defn.config
    lines = [f"FROM {base}"]
    if has_rootfs:
        lines.append("COPY rootfs/ /")
    if c.env:
        lines.append("ENV " + " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(c.env.items())))
    lines.append(f"LABEL airlockd.runtime={json.dumps(digest)}")
    if c.workdir:
        lines.append(f"WORKDIR {c.workdir}")
    lines.append(f"USER {c.user}")
    if c.entrypoint:
        lines.append(f"ENTRYPOINT {json.dumps(c.entrypoint)}")
    if c.cmd:
        lines.append(f"CMD {json.dumps(c.cmd)}")
    return "\n".join(lines) + "\n"


def _context(defn: ImageDefinition, root: Path, base: str) -> io.BytesIO:
    """A build context: a generated Dockerfile and `rootfs/`, everything owned by root."""
    buf = io.BytesIO()
    rootfs = root / "rootfs"
    files = sorted(_files(rootfs)) if rootfs.is_dir() else []
    library = compat.build(root)
    text = _dockerfile(defn, base, definition_digest(root), bool(files) or library is not None).encode()
    with tarfile.open(fileobj=buf, mode="w") as tar:

        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))

        add("Dockerfile", text)
        if library is not None:  # every program of the image loads it: compat.py
            add(f"rootfs/{compat.IN_IMAGE}", library, 0o755)
            add(f"rootfs/{compat.PRELOAD}", f"/{compat.IN_IMAGE}\n".encode())

        def as_root(ti: tarfile.TarInfo) -> tarfile.TarInfo:
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = "root"
            return ti

        if files:
            tar.add(rootfs, arcname="rootfs", filter=as_root)
    buf.seek(0)
    return buf


def _build_top(client: Any, defn: ImageDefinition, root: Path, base: str, tag: str, progress: Progress) -> None:
    progress(f"runtime image: adding rootfs/ and configuration -> {tag}")
    try:
        stream = client.api.build(
            fileobj=_context(defn, root, base),
            custom_context=True,
            tag=tag,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
        )
        for chunk in stream:
            if "error" in chunk:
                detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
                raise EngineError(f"building {tag} failed: {detail}", hint=_ENGINE_FIX)
    except _ENGINE_FAILURES as exc:
        raise EngineError(f"building {tag} failed: {exc}", hint=_ENGINE_FIX) from None


# ---- Agent CLIs on top (`airlockd runtime build --with codex,claude`) ---------------------------


@dataclass(frozen=True)
class AgentCli:
    """One agent CLI from npm, added to the runtime image as a layer of its own, under the image
    tag `<runtime digest>-<name>-<version>`: one binary at /usr/local/bin/<name> (no node at run
    time), or, for a CLI that needs node, its files under /opt/airlockd/<name> and a launcher
    there instead."""

    name: str  # the adapter's name in the policy
    package: str
    version: str  # pinned: the image tag names it, so a new version means a new image
    binary: str  # the binary's path in the npm prefix (with `launcher`: a file that must be there)
    size_hint: str  # what the layer adds, for `runtime build`'s progress
    extra: tuple[str, ...] = ()  # more npm packages, pinned (a node runtime)
    trees: tuple[tuple[str, str], ...] = ()  # (path in the npm prefix, path in the image), copied whole
    launcher: str | None = None  # the script at /usr/local/bin/<name>, when not the binary itself
    # "pip": a Python package installed for the image's Python (PYTHON) into `site` of the cache,
    # as wheels only (the build machine's own Python and platform do not matter)
    installer: str = "npm"

    @property
    def in_image(self) -> str:
        return f"/usr/local/bin/{self.name}"


AGENT_CLIS: dict[str, AgentCli] = {
    "codex": AgentCli(
        "codex",
        "@openai/codex",
        "0.171.0",
        "node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex",
        "about 300 MB",
    ),
    # The native (Bun-compiled, glibc-only) binary in the package's optional dependency for
    # x86_64 Linux; `bin/claude.exe` is a hard link to it (../shared/design/AGENT-CLIS.md).
    "claude": AgentCli(
        "claude",
        "@anthropic-ai/claude-code",
        "2.1.332",
        "node_modules/@anthropic-ai/claude-code-linux-x64/claude",
        "about 380 MB",
    ),
    # The native (Bun-compiled, glibc-only) binary; npm also installs a "baseline" build for CPUs
    # without AVX2, which is not taken.
    "opencode": AgentCli(
        "opencode",
        "opencode-ai",
        "1.18.33",
        "node_modules/opencode-linux-x64/bin/opencode",
        "about 180 MB",
    ),
    # A node bundle: node >= 20 (Debian 12's 18 fails on the bundle's regular expressions), from
    # npm's `node` package, and the CLI's self-contained bundle; no native module is needed headless.
    "gemini": AgentCli(
        "gemini",
        "@google/gemini-cli",
        "0.61.0",
        "node_modules/@google/gemini-cli/bundle/gemini.js",
        "about 220 MB",
        extra=("node@24.21.0",),
        trees=(
            ("node_modules/node/bin/node", "/opt/airlockd/gemini/node"),
            ("node_modules/@google/gemini-cli", "/opt/airlockd/gemini/cli"),
        ),
        launcher='#!/bin/sh\nexec /opt/airlockd/gemini/node /opt/airlockd/gemini/cli/bundle/gemini.js "$@"\n',
    ),
    # A Python application (112 packages, its own pinned dependencies): a tree of its own on
    # the image's Python, imported by the launcher alone (the agent's commands see no PYTHONPATH).
    "aider": AgentCli(
        "aider",
        "aider-chat",
        "0.86.2",
        "site/aider/__main__.py",
        "about 660 MB",
        trees=(("site", "/opt/airlockd/aider"),),
        launcher=(
            '#!/bin/sh\nexec python3 -I -c \'import sys, runpy; sys.path.insert(0, "/opt/airlockd/aider");'
            ' sys.argv[0] = "aider"; runpy.run_module("aider", run_name="__main__", alter_sys=True)\' "$@"\n'
        ),
        installer="pip",
    ),
}
PYTHON = "3.11"  # the runtime image's Python (Debian 12's), which a pip-installed CLI runs on
CODEX_VERSION = AGENT_CLIS["codex"].version
CODEX_IN_IMAGE = AGENT_CLIS["codex"].in_image


def agent_cli(name: str) -> AgentCli:
    try:
        return AGENT_CLIS[name]
    except KeyError:
        raise EngineError(
            f"no agent CLI named {name!r} can be added to the runtime image",
            hint=f"name one of: {', '.join(sorted(AGENT_CLIS))}",
        ) from None


def agent_image_tag(name: str, root: Path | None = None, version: str | None = None) -> str:
    """`airlockd-runtime:<runtime digest>-<name>-<version>`: changes with runtime/ and the version."""
    return f"{image_tag(root)}-{name}-{version or agent_cli(name).version}"


def codex_image_tag(root: Path | None = None, version: str = CODEX_VERSION) -> str:
    return agent_image_tag("codex", root, version)


def agent_cache(name: str, version: str | None = None) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "airlockd" / f"{name}-{version or agent_cli(name).version}"


def agent_binary(name: str, progress: Progress = print, version: str | None = None) -> Path:
    """The agent CLI's Linux binary from its npm package, installed into a cache dir with npm
    (the registry npm is configured with) when it is not there yet."""
    cli = agent_cli(name)
    version = version or cli.version
    cache = agent_cache(name, version)
    binary = cache / cli.binary
    if binary.is_file():
        return binary
    if cli.installer == "pip":
        return _pip_install(cli, version, cache, progress)
    npm = shutil.which("npm")
    if npm is None:
        raise EngineError(
            f"npm is not installed; it fetches the {name} CLI ({cli.package}@{version})",
            hint=f"apt-get install npm, then retry `airlockd runtime build --with {name}`",
        )
    cache.mkdir(parents=True, exist_ok=True)
    progress(f"runtime image: npm install {cli.package}@{version} ({cli.size_hint})")
    argv = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(cache), f"{cli.package}@{version}", *cli.extra]
    _run_streaming(argv, progress, what="npm install")
    if not binary.is_file():
        raise EngineError(
            f"npm installed {cli.package}@{version} but {cli.binary} is not in it",
            hint="this build supports x86_64 Linux only; check `npm ls` in " + str(cache),
        )
    return binary


def _pip_install(cli: AgentCli, version: str, cache: Path, progress: Progress) -> Path:
    """`pip install --target` of the CLI's package (from the index pip is configured with) as
    wheels for the image's Python on x86_64 Linux, into a fresh `site` that replaces any half
    made one."""
    site, part = cache / "site", cache / "site.part"
    shutil.rmtree(part, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    progress(f"runtime image: pip install {cli.package}=={version} ({cli.size_hint})")
    platforms = [
        a for p in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64") for a in ("--platform", p)
    ]
    argv = module_command(
        "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
        "--target", str(part), "--only-binary=:all:", *platforms, "--python-version", PYTHON,
        "--implementation", "cp", "--abi", "cp" + PYTHON.replace(".", ""), "--abi", "abi3",
        f"{cli.package}=={version}",
    )  # fmt: skip
    _run_streaming(argv, progress, what="pip install")
    if not (part / cli.binary.removeprefix("site/")).is_file():
        raise EngineError(
            f"pip installed {cli.package}=={version} but {cli.binary} is not in it",
            hint="check `pip download " + f"{cli.package}=={version}` against the index pip uses",
        )
    shutil.rmtree(site, ignore_errors=True)
    os.replace(part, site)
    return cache / cli.binary


def ensure_agent_image(
    client: Any,
    name: str,
    *,
    force: bool = False,
    progress: Progress = print,
    root: Path | None = None,
    version: str | None = None,
    base: str | None = None,
    tag: str | None = None,
) -> str:
    """The runtime image (or `base`, under `tag`: a project's image) plus the agent CLI `name`
    at /usr/local/bin/<name>; built when missing."""
    cli = agent_cli(name)
    version = version or cli.version
    if base is None:
        base = ensure_image(client, force=force, progress=progress, root=root)
        tag = agent_image_tag(name, root, version)
    assert tag is not None, "a base image needs the tag of what is built on it"
    if not force and _has_image(client, tag):
        return tag
    binary = agent_binary(name, progress, version)
    prefix = agent_cache(name, version)
    progress(f"runtime image: adding {name} {version} -> {tag}")
    label = f"airlockd.agent.{name}"
    steps = ["USER 0:0"] + [f"COPY tree{i} {dst}" for i, (_, dst) in enumerate(cli.trees)]
    steps += [f"COPY {name} {cli.in_image}", "USER 1000:1000"]
    dockerfile = (f"FROM {base}\n" + "\n".join(steps) + f"\nLABEL {label}={json.dumps(version)}\n").encode()
    with tempfile.TemporaryFile(dir="/var/tmp" if os.path.isdir("/var/tmp") else None) as fh:
        with tarfile.open(fileobj=fh, mode="w") as tar:
            _add_bytes(tar, "Dockerfile", dockerfile, 0o644)
            for i, (src, _) in enumerate(cli.trees):
                tar.add(str(prefix / src), arcname=f"tree{i}", filter=_as_root)
            if cli.launcher is not None:
                _add_bytes(tar, name, cli.launcher.encode(), 0o755)
            else:
                ti = _as_root(tar.gettarinfo(str(binary), arcname=name))
                ti.mode = 0o755
                ti.type, ti.linkname = tarfile.REGTYPE, ""  # the binary, not the npm tree's hard link
                with binary.open("rb") as src_file:
                    tar.addfile(ti, src_file)
        fh.seek(0)
        try:
            stream = client.api.build(
                fileobj=fh, custom_context=True, tag=tag, rm=True, forcerm=True, pull=False, decode=True
            )
            for chunk in stream:
                if "error" in chunk:
                    detail = chunk.get("errorDetail", {}).get("message") or chunk["error"]
                    raise EngineError(f"building {tag} failed: {detail}", hint=_ENGINE_FIX)
        except _ENGINE_FAILURES as exc:
            raise EngineError(f"building {tag} failed: {exc}", hint=_ENGINE_FIX) from None
    return tag


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _as_root(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    """An agent CLI's file as the image has it: root's, written by no one else."""
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = "root"
    ti.mode &= 0o755
    return ti


def ensure_codex_image(
    client: Any,
    *,
    force: bool = False,
    progress: Progress = print,
    root: Path | None = None,
    version: str = CODEX_VERSION,
) -> str:
    """The runtime image plus the Codex binary at /usr/local/bin/codex; built when missing."""
    return ensure_agent_image(client, "codex", force=force, progress=progress, root=root, version=version)


def agent_images(client: Any, root: Path | None = None) -> dict[str, str]:
    """Agent name -> the tag of its image on this engine, for each agent CLI whose image (at the
    pinned version, over this runtime) is there."""
    return {name: tag for name in AGENT_CLIS if _has_image(client, tag := agent_image_tag(name, root))}
