"""Whether an engine can run a container under the runtime an agent asks for, judged from the
engine's own description of its runtimes (`docker info` -> Runtimes: name -> path, runtimeArgs).

Pure functions of that description, so every verdict is unit-tested without an engine; the
sandbox asks the engine and passes what it said. A runtime the engine lacks, or one that cannot
give the run what it needs, is a refusal at admission naming what is missing and how to add it:
never a silent fall back to a weaker runtime.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GVISOR = "runsc"
#: What `scripts/ensure-docker.sh` registers (scripts/dockerd.json): ptrace works on every
#: machine (no /dev/kvm needed); host-uds=open lets the agent connect to the model gateway's
#: Unix socket mounted from the host (and nothing else: it cannot create or bind one there);
#: oci-seccomp applies the container's seccomp profile (the engine's default) inside gVisor's
#: kernel. Without it an agent can unshare a user namespace there, be root in it, and fork past
#: RLIMIT_NPROC (found in review: 23,000 host tasks from a 32-process cap), so it is required.
GVISOR_ARGS = ["--network=none", "--platform=ptrace", "--host-uds=open", "--oci-seccomp"]
REGISTER_HINT = (
    "install gVisor (apt-get install runsc) and register it with the engine: add "
    '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ' + str(GVISOR_ARGS).replace("'", '"') + "}}} "
    "to its daemon.json and reload it (kill -HUP the dockerd process); scripts/ensure-docker.sh "
    "does this for the engine it starts. docs/containment.md has the details"
)


def flags(args: list[str]) -> dict[str, str]:
    """runsc's command-line flags as name -> value ("" for a bare boolean flag); accepts
    `--name=value`, `-name=value` and `--name value`."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            i += 1
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
            value = args[i + 1]
            i += 1
        out[name] = value
        i += 1
    return out


def host_uds(args: list[str]) -> str:
    """What a runsc started with `args` lets the agent do with host Unix sockets: "" (nothing),
    "open" (connect to one mounted into its container), "create" or "all" (also bind new ones
    on the host). The deprecated --fsgofer-host-uds meant "all"."""
    f = flags(args)
    if "fsgofer-host-uds" in f and f["fsgofer-host-uds"] in ("", "true"):
        return "all"
    return f.get("host-uds", "")


def host_sockets_allowed(args: list[str]) -> bool:
    """Whether a runsc started with `args` lets the agent connect to a host Unix socket that is
    mounted into its container (the model gateway's)."""
    return host_uds(args) in ("open", "all")


def seccomp_inside(args: list[str]) -> bool:
    """Whether a runsc started with `args` enforces the container's seccomp profile."""
    return flags(args).get("oci-seccomp", "x") in ("", "true")


def refusal(
    runtimes: Mapping[str, Any] | None,
    runtime: str,
    *,
    host_sockets: bool,
    engine: str = "the engine",
    podman: bool = False,
) -> str | None:
    """Why a container cannot run under `runtime` on an engine with these `runtimes`, or None.
    `host_sockets`: the run mounts the model gateway's socket and must be able to connect to it.
    `podman`: the engine is Podman, whose list names every runtime it knows of, installed or not."""
    if runtime == "runc":
        return None  # every Docker engine has it (and uses it for images and builds)
    if podman and runtime == GVISOR:
        return (
            f'{engine} is Podman, and airlockd runs "{runtime}" (gVisor) through Docker only: Podman\'s'
            " Docker API does not say how it starts runsc (airlockd must know that --oci-seccomp and"
            " --host-uds=open are set), and it takes a seccomp profile only as a file on its own host;"
            ' fix: use runtime = "runc" on Podman, or run this agent on a Docker engine with gVisor'
            " registered (docs/engines.md, Podman)"
        )
    known = dict(runtimes or {})
    if runtime not in known:
        names = ", ".join(sorted(known)) or "none listed"
        return f'{engine} has no "{runtime}" runtime (it has: {names}); fix: {REGISTER_HINT}'
    args = list((known[runtime] or {}).get("runtimeArgs") or [])
    if runtime == GVISOR and not seccomp_inside(args):
        return (
            f'{engine} runs "{runtime}" without --oci-seccomp, so the container\'s seccomp profile does not '
            "apply inside gVisor: an agent there could create a user namespace, where the process cap does "
            f'not hold (its runtimeArgs: {" ".join(args) or "none"}); fix: add "--oci-seccomp" to the '
            "runtime's runtimeArgs in the engine's daemon.json and reload it (kill -HUP the dockerd process)"
        )
    if runtime == GVISOR and host_uds(args) in ("create", "all"):
        return (
            f'{engine} runs "{runtime}" with --host-uds={host_uds(args)} (or --fsgofer-host-uds), which lets the '
            "agent create Unix sockets on the host, outside its container (its runtimeArgs: "
            f"{' '.join(args)}); fix: use \"--host-uds=open\" in the runtime's runtimeArgs in the engine's "
            "daemon.json and reload it (kill -HUP the dockerd process)"
        )
    if runtime == GVISOR and host_sockets and not host_sockets_allowed(args):
        return (
            f'{engine} runs "{runtime}" without --host-uds=open, so the agent could not reach the model '
            f'gateway\'s socket (its runtimeArgs: {" ".join(args) or "none"}); fix: add "--host-uds=open" '
            "to the runtime's runtimeArgs in the engine's daemon.json and reload it (kill -HUP the dockerd process)"
        )
    return None
