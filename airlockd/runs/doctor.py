"""`airlockd doctor`: each thing airlockd needs, whether it is there, and how to fix it."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airlockd.sandbox import enginepaths, layers, runtimes, seccomp, volumes
from airlockd.sandbox.base import OverlayVolume
from airlockd.sandbox.enginemirror import EngineMirror
from airlockd.staging import capfs, stagers
from airlockd.staging.upperdump import read_dump

Check = dict[str, Any]


def _check(name: str, fn: Callable[[], str], fix: str) -> Check:
    try:
        return {"name": name, "ok": True, "detail": fn()}
    except Exception as exc:  # every failure becomes a line of the report, never a traceback
        return {"name": name, "ok": False, "detail": str(exc).splitlines()[0], "fix": fix}


def run_checks(workspace: Path) -> list[Check]:
    checks: list[Check] = []
    client: Any = None

    def engine() -> str:
        nonlocal client
        client = enginepaths.connect(10)
        v = client.version()
        info = client.info()
        where = os.environ.get("DOCKER_HOST") or "the local socket"
        name = "Podman" if enginepaths.kind(client) == enginepaths.PODMAN else "Docker"
        return (
            f"{name} {v.get('Version')} ({where}), cgroup v{info.get('CgroupVersion', '?')},"
            f" storage {info.get('Driver')}"
        )

    checks.append(
        _check(
            "container engine",
            engine,
            "run scripts/ensure-docker.sh (installs docker.io and starts dockerd)",
        )
    )

    def image() -> str:
        from airlockd.sandbox.image import image_tag

        tag = image_tag()
        if client is None:
            raise RuntimeError("no engine to ask")
        img = client.images.get(tag)
        return f"{tag} ({img.attrs.get('Size', 0) // 2**20} MB)"

    checks.append(_check("runtime image", image, "airlockd runtime build"))

    wanted: list[str] = []  # the agent CLIs this workspace's agents use

    def agent_images() -> str:
        from airlockd.policy import load_policy
        from airlockd.sandbox.image import agent_images as found_images

        if client is None:
            raise RuntimeError("no engine to ask")
        wanted.extend(sorted({a.adapter for a in load_policy(workspace).policy.agents.values()} - {"command"}))
        have = found_images(client)
        missing = [name for name in wanted if name not in have]
        if missing:
            raise RuntimeError(f"no image with {', '.join(missing)} (the policy's agents use it)")
        held = ", ".join(f"{name} ({tag.rpartition('-')[2]})" for name, tag in sorted(have.items()))
        return f"images with {held}" if held else "no agent CLI image (no agent of this policy needs one)"

    check = _check("agent images", agent_images, "")
    if not check["ok"]:
        check["fix"] = "airlockd runtime build --with " + ",".join(wanted or ["codex,claude"])
    checks.append(check)

    def project_images() -> str:
        from airlockd.policy import load_policy
        from airlockd.sandbox import projectimage, projectsource
        from airlockd.sandbox.image import image_tag

        policy = load_policy(workspace).policy
        asking = {n: a.image for n, a in sorted(policy.agents.items()) if projectsource.is_project_image(a.image)}
        if not asking:
            return "no agent builds the project's own image"
        if client is None:
            raise RuntimeError("no engine to ask")
        lines = []
        from airlockd.runs.runtime import image_scope

        for name, spec in asking.items():
            network = policy.agent(name).build_network
            try:
                tag, src = projectimage.project_tag(
                    client, workspace, str(spec), image_tag(), image_scope(policy, name), network
                )
            except Exception as exc:
                raise RuntimeError(f"agent {name}: {str(exc).splitlines()[0]}") from None
            state = "built" if projectimage.has_image(client, tag) else "built at its next run (its inputs changed)"
            ignored = f"; not applied: {', '.join(src.ignored)}" if src.ignored else ""
            lines.append(f"{name}: {src.origin} -> {tag}, {state}{ignored}")
        return "; ".join(lines)

    checks.append(
        _check("project images", project_images, "fix the devcontainer.json or Dockerfile named above, or `image`")
    )

    def broker() -> str:
        from airlockd.policy import load_policy

        policy = load_policy(workspace).policy
        reach = {n: policy.broker_for(n).entries for n in sorted(policy.agents)}
        shown = [f"{n}: {', '.join(str(e) for e in entries)}" for n, entries in reach.items() if entries]
        return "agents reach " + "; ".join(shown) if shown else "no agent reaches a package registry ([broker] allow)"

    checks.append(_check("package broker", broker, "correct [broker] allow in policies.toml"))

    def builder() -> str:
        from airlockd.sandbox.image import find_debootstrap

        found = find_debootstrap()
        if not found:
            raise RuntimeError("debootstrap is not installed (needed only to build the image)")
        return found

    checks.append(_check("image builder", builder, "apt-get install debootstrap"))

    def git() -> str:
        found = shutil.which("git")
        if not found:
            raise RuntimeError('git is not installed (needed to scan history when [git] history = "scanned")')
        return found

    checks.append(_check("host git", git, "apt-get install git"))

    def policy() -> str:
        from airlockd.policy import load_policy

        lp = load_policy(workspace)
        agents = ", ".join(sorted(lp.policy.agents)) or "none"
        return f"revision {lp.revision} from {', '.join(lp.sources)}; agents: {agents}"

    checks.append(_check("policy", policy, "correct the keys named above in policies.toml"))

    def state() -> str:
        from airlockd.state import StateDir

        sd = StateDir.for_workspace(workspace).ensure()
        with tempfile.NamedTemporaryFile(dir=sd.root):
            pass
        left = list(sd.journal.glob("*.json"))
        if left:
            raise RuntimeError(f"{len(left)} unfinished commit journal(s) in {sd.journal}")
        return f"{sd.root} (writable)"

    checks.append(
        _check(
            "state directory",
            state,
            "run any airlockd command to recover the journal, or set AIRLOCK_STATE_DIR",
        )
    )

    held_probe: dict[str, str | None] = {}

    def staging() -> str:
        from airlockd.sandbox.image import image_tag
        from airlockd.state import StateDir

        root = StateDir.for_workspace(workspace).ensure().root
        held = None
        if client is not None:
            remote = not enginepaths.sees_local_paths(client, image_tag())
            if remote or capfs.available() is not None:
                held = layers.EngineUpper(client, image_tag(), remote=remote)
        stager = stagers.choose(root, held)
        if stager.name == stagers.OVERLAY and held is not None:  # the engine holds its upper layer
            held_probe["refused"] = refused = held_refuses(client, root, image_tag(), remote=held.remote)
            if refused and held.remote:  # no copy can serve an engine that cannot see it
                raise RuntimeError(f"the remote engine could not stage a run: {refused}")
            if refused:
                return f"{stagers.CopyStager.summary}: the engine could not hold a capped upper layer: {refused}"
        elif (
            stager.name == stagers.OVERLAY
            and client is not None
            and (refused := engine_refuses(client, root, image_tag()))
        ):
            return (
                f"{stagers.CopyStager.summary}: the engine refused an overlay volume: {refused}"  # it must mount them
            )
        return f"{stager.summary}: {stager.why}"

    checks.append(_check("stager", staging, "unset AIRLOCK_STAGER, or run airlockd as root on a kernel with overlayfs"))

    def runtimes_check() -> str:
        if client is None:
            raise RuntimeError("no engine to ask")
        return container_runtimes(client, workspace)

    checks.append(_check("container runtimes", runtimes_check, runtimes.REGISTER_HINT))

    def file_events() -> str:
        """Whether the daemon's mirror keeper can watch this workspace (else every run walks)."""
        from airlockd.staging.watcher import TreeWatcher

        with TreeWatcher(workspace.resolve()) as w:
            dirs = w.watching
        limit = Path("/proc/sys/fs/inotify/max_user_watches").read_text().strip()
        return (
            f"inotify: {dirs} directories watched (fs.inotify.max_user_watches = {limit}); the daemon"
            " refreshes the mirror from file events, a run without a daemon walks the workspace"
        )

    checks.append(
        _check(
            "file events",
            file_events,
            "raise fs.inotify.max_user_watches (sysctl); without it each run walks the workspace",
        )
    )

    def growth_cap() -> str:
        why = capfs.available()
        if why is None and "refused" not in held_probe:
            return "each run's writable copy is a size-capped tmpfs (workspace_growth_mb)"
        if "refused" in held_probe and held_probe["refused"] is None:
            return (
                "each run's upper layer is a size-capped tmpfs the engine holds (workspace_growth_mb);"
                " checked: a probe writing past its cap stopped at ENOSPC"
            )
        refused = held_probe.get("refused") or "the engine cannot hold one (a remote engine, or none answers)"
        raise RuntimeError(f"workspace growth is not capped: {why + ', and ' if why else ''}{refused}")

    checks.append(
        _check(
            "workspace growth cap",
            growth_cap,
            "use a local engine (the user in the docker group) so it can hold capped filesystems, or run as root",
        )
    )

    def detectors() -> str:
        from airlockd.staging import prefilter

        if prefilter.hyperscan_module() is not None:
            return "Hyperscan: one pass over each file says which of the detectors' anchors occur"
        if platform.machine() == "x86_64":  # a dependency there (pyproject.toml): a broken install
            raise RuntimeError("Hyperscan does not import: each group of detector anchors is a pass of its own")
        return f"re alone (no Hyperscan wheel for {platform.machine()}): each group of anchors is a pass of its own"

    checks.append(_check("secret detectors", detectors, "make setup (it installs hyperscan with the other packages)"))

    def user() -> str:
        return (
            "root: staging copies are given to uid 1000, the agent's user"
            if os.getuid() == 0
            else f"agent runs as uid {os.getuid()}"
        )

    checks.append(_check("agent user", user, ""))
    return checks


def container_runtimes(client: Any, workspace: Path) -> str:
    """The engine's runtimes, which agents use which, and for runsc a probe container: what
    kernel the agent sees there and whether a directory lists (the image's compat library).
    Raises when an agent's runtime could not run here."""
    from airlockd.gateway.runs import uses_socket
    from airlockd.policy import load_policy
    from airlockd.sandbox.image import image_tag

    policy = load_policy(workspace).policy
    table = client.info().get("Runtimes") or {}
    podman = enginepaths.kind(client) == enginepaths.PODMAN
    by_runtime: dict[str, list[str]] = {}
    for name in sorted(policy.agents):
        by_runtime.setdefault(policy.runtime_for(name), []).append(name)
    problems = []
    for runtime, agents in sorted(by_runtime.items()):
        sockets = any(uses_socket(policy, a) for a in agents)
        if why := runtimes.refusal(table, runtime, host_sockets=sockets, podman=podman):
            problems.append(f"agents {', '.join(agents)} ask for {runtime}, but {why.split('; fix:')[0]}")
    if problems:
        raise RuntimeError("; ".join(problems))
    parts = [f"{rt}: {', '.join(agents)}" for rt, agents in sorted(by_runtime.items())]
    detail = f"engine runtimes {', '.join(sorted(table))}; agents by runtime: {'; '.join(parts) or 'none'}"
    if podman:
        return detail + '; runsc (gVisor) is not used on Podman: needed only for runtime = "runsc", on Docker'
    if runtimes.GVISOR not in table:
        return detail + '; runsc (gVisor) not registered: needed only for runtime = "runsc"'
    out = client.containers.run(
        image_tag(),
        ["sh", "-c", GVISOR_PROBE],
        runtime=runtimes.GVISOR,
        network_mode="none",
        user="1000:1000",
        cap_drop=["ALL"],
        security_opt=["no-new-privileges", f"seccomp={seccomp.gvisor_profile()}"],  # as a run has it
        remove=True,
    )
    lines = out.decode(errors="replace").split()
    if "listed" not in lines:
        raise RuntimeError(f"under runsc the runtime image cannot list a directory: {' '.join(lines)[:200]}")
    if "threads" not in lines:
        raise RuntimeError("under runsc no thread starts (the seccomp profile inside gVisor refuses clone3 with EPERM)")
    if "clone3=38" not in lines:
        raise RuntimeError(
            "this runsc implements clone3, whose namespace flags the profile cannot read: an agent could make a"
            " user namespace there (docs/containment.md, gVisor)"
        )
    if "userns-refused" not in lines:
        raise RuntimeError("under runsc an agent can make a user namespace, where its process cap does not hold")
    if "ptrace=1" not in lines:
        raise RuntimeError("under runsc ptrace is not refused: a tracer could rewrite a call past the seccomp profile")
    args = " ".join((table[runtimes.GVISOR] or {}).get("runtimeArgs") or [])
    return detail + (
        f"; runsc probe: gVisor kernel {lines[0]} inside, directories list, threads start, no user namespace"
        f" (runtimeArgs: {args})"
    )


#: Under runsc, as a run: the kernel seen, a directory listed, a thread started, clone3's answer
#: (ENOSYS = 38: libc falls back to clone, whose flags the profile reads), no user namespace, and
#: ptrace refused (EPERM = 1).
GVISOR_PROBE = (
    "uname -r && ls / >/dev/null && echo listed;"
    " python3 -c 'import threading; t = threading.Thread(target=print, args=(\"threads\",)); t.start(); t.join()';"
    " python3 -c 'import ctypes; c = ctypes.CDLL(None, use_errno=True); c.syscall(435, 0, 0);"
    ' print("clone3=%d" % ctypes.get_errno())\';'
    " unshare -U true 2>/dev/null || echo userns-refused;"
    " python3 -c 'import ctypes; c = ctypes.CDLL(None, use_errno=True); c.ptrace(0, 0, 0, 0);"
    ' print("ptrace=%d" % ctypes.get_errno())\''
)


def held_refuses(client: Any, state_root: Path, image: str, *, remote: bool = False) -> str | None:
    """The way a run without root is staged, tried small: a capped upper layer the engine holds,
    a whiteout laid by the engine, a container on the overlay that reads, writes and fills the
    cap, and the upper layer read back. None when all of it works, else what did not."""
    probe = state_root / f".engine-probe-{uuid.uuid4().hex[:8]}"
    lower = probe / "g1"  # as a mirror's generation: a remote engine gets a copy of it
    lower.mkdir(parents=True)
    (lower / "probe").write_text("lower\n")
    (lower / "hidden").write_text("hidden\n")
    run_id = "doctor-" + probe.name[-8:]
    held = layers.EngineUpper(client, image, remote=remote)
    me = (os.getuid(), os.getgid())
    script = (
        "cat /w/hidden 2>/dev/null && echo SEEN; cat /w/probe >/dev/null && echo upper > /w/written;"
        " dd if=/dev/zero of=/w/fill bs=64k count=64 2>&1 | grep -o 'No space left' | head -n 1"
    )
    try:
        upper, work = held.hold(run_id, 1 << 20, 256, me, 0o755)
        held.place(run_id, [], ["hidden"])
        on_engine = held.lower(lower) if remote else None
        lay = stagers.Layout(lower, Path(upper), Path(work), probe, held.options, on_engine)
        volumes.create(client, run_id, OverlayVolume(lay.lower, lay.upper, lay.work, lay.options))
        try:
            out = client.containers.run(
                image,
                ["sh", "-c", script],
                volumes={volumes.volume_name(run_id): {"bind": "/w", "mode": "rw"}},
                network_mode="none",
                user=f"{me[0]}:{me[1]}",
                ulimits=enginepaths.ulimits(client),
                remove=True,
            ).decode(errors="replace")
        finally:
            volumes.remove(client, run_id)
        after, whiteouts, _ = read_dump(held.dump(run_id), None)
        if "SEEN" in out or whiteouts != ["hidden"]:
            return "a whiteout laid through the engine did not hide its path"
        if "No space left" not in out:
            return "a write past the cap did not stop at ENOSPC"
        if "written" not in after:
            return "the container's write did not reach the upper layer"
        return None
    except Exception as exc:  # the engine's words are the report
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    finally:
        held.release(run_id)
        if remote:
            EngineMirror(client, image, probe).remove()
        shutil.rmtree(probe, ignore_errors=True)


def engine_refuses(client: object, state_root: Path, image: str) -> str | None:
    """Run a container on a tiny overlay volume, as a run would; None when the engine mounts it,
    else its refusal. For `airlockd doctor` (it costs a container start)."""
    probe = state_root / f".engine-probe-{uuid.uuid4().hex[:8]}"
    lower, layers = probe / "lower", probe / "layers"
    lower.mkdir(parents=True)
    (lower / "probe").write_text("lower\n")
    run_id = "doctor-" + probe.name[-8:]
    try:
        capfs.mount(layers, 1 << 20)
        lay = stagers.layout(layers, lower)
        stagers.prepare(lay, (1000, 1000))
        volumes.create(client, run_id, OverlayVolume(lay.lower, lay.upper, lay.work, lay.options))
        try:
            client.containers.run(  # type: ignore[attr-defined]
                image,
                ["sh", "-c", "cat /w/probe >/dev/null && echo upper > /w/written"],
                volumes={volumes.volume_name(run_id): {"bind": "/w", "mode": "rw"}},
                network_mode="none",
                user="1000:1000",
                ulimits=enginepaths.ulimits(client),
                remove=True,
            )
        finally:
            volumes.remove(client, run_id)
        if not (lay.upper / "written").exists():
            return "the container's write did not reach the upper layer"
        return None
    except Exception as exc:  # the engine's words are the report
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    finally:
        capfs.unmount(layers)
        shutil.rmtree(probe, ignore_errors=True)
