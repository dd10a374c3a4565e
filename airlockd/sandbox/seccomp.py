"""The seccomp profiles airlockd gives containers itself: a gVisor (`runsc`) container's, applied
inside gVisor's kernel, and on Podman a runc container's (its default profile lets an agent make a
user namespace and use the keyrings, which Docker's refuses; docs/engines.md, Podman).

Under runsc the engine's default profile does not work: it answers `clone3` with ENOSYS (so that
libc falls back to `clone`, whose flags a filter can read), but gVisor's `--oci-seccomp` of the
release Debian ships ignores a rule's errno and answers EPERM, on which glibc does not fall back:
no thread could start (Python's `threading`, airlockd's own gateway forwarder, Codex). Without a
profile at all, an agent could make a user namespace there, be root in it, and fork past its
process cap (RLIMIT_NPROC holds only for its own user).

So a runsc container gets this profile instead. It allows what it does not name, and refuses, with
EPERM:
- `clone` with any namespace flag, `unshare` and `setns`: no namespace of the agent's own, so
  the process cap and the container's view hold;
- mounting and the new mount API, keyrings, BPF, perf events, userfaultfd, module and kexec
  loading, the kernel log, swap, reboot, accounting and quotas: what the agent has no use for
  and a kernel (gVisor's here) has the most surface in;
- `ptrace` and cross-process memory access: this gVisor checks the filter before a tracer may
  rewrite a call at its entry stop, not after, so a traced child's harmless call could become
  `unshare` (found by the second attack review). No debugger or `strace` under runsc.
`clone3` is allowed: gVisor's kernel of that release does not implement it and answers ENOSYS
itself, so libc falls back to `clone`, which the profile reads. A runsc whose kernel implements
`clone3` would let a namespace flag through it; `airlockd doctor`'s probe under runsc checks that
`clone3` still answers ENOSYS, and docs/containment.md says what to do if not.
"""

from __future__ import annotations

import functools
import json

#: Namespace flags of clone(2): NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET (NEWTIME,
#: 0x80, is clone3's and unshare's only: in clone's flags the low byte is the exit signal).
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
REFUSED = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "syslog",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    # this gVisor checks the filter before a ptrace syscall-entry stop and not after the tracer
    # rewrote the call: a traced child's getppid() became unshare(CLONE_NEWUSER) (attack review)
    "ptrace",
    "process_vm_writev",
    "process_vm_readv",
)
EPERM = 1
ENOSYS = 38
NAME = "airlockd-gvisor"  # how the evidence names it
HOST_NAME = "airlockd-host"
#: on the host's kernel (Podman's runc) besides: io_uring, whose calls run in kernel threads a
#: filter never sees (Docker's default refuses it too)
HOST_REFUSED = ("io_uring_setup", "io_uring_enter", "io_uring_register")


@functools.cache
def gvisor_profile() -> str:
    """The profile as the engine takes it (`--security-opt seccomp=<json>`)."""
    return json.dumps(_profile(), separators=(",", ":"))


@functools.cache
def host_profile() -> str:
    """The profile of a container on the host's kernel where the engine's default is not Docker's
    (Podman): gVisor's refusals, io_uring, and `clone3` answered ENOSYS, as Docker's default does,
    so that libc falls back to `clone`, whose namespace flags the filter reads (clone3 passes them
    in memory a filter cannot see)."""
    profile = _profile()
    rules = profile["syscalls"]
    assert isinstance(rules, list)
    rules.append({"names": list(HOST_REFUSED), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM})
    rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    return json.dumps(profile, separators=(",", ":"), indent=None)


def _profile() -> dict[str, object]:
    rules: list[dict[str, object]] = [{"names": list(REFUSED), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM}]
    for flag in NAMESPACE_FLAGS:  # one rule a flag: refused when that bit is set, whatever else is
        rules.append(
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": EPERM,
                "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
            }
        )
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"], "syscalls": rules}


def shown(security_opt: list[str] | None) -> list[str] | None:
    """The engine's security options with this profile's JSON (or its file on the engine's host)
    named rather than spelled out."""
    if security_opt is None:
        return None
    out = []
    for o in security_opt:
        if o == f"seccomp={gvisor_profile()}":
            o = f"seccomp={NAME}"
        elif o.startswith("seccomp=") and o.endswith(f"/{HOST_NAME}.json"):
            o = f"seccomp={HOST_NAME}"
        out.append(o)
    return out
