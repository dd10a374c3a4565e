"""The runtime an agent asks for, without an engine: the policy's key and its default, the
container arguments under gVisor (the process cap by RLIMIT_NPROC, no pids cgroup), the refusal
at admission of a runtime the engine lacks or that cannot reach the gateway's socket, and the
cgroup reader reading memory alone for a gVisor sandbox. tests/integration/test_gvisor.py runs
the same under the engine."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from airlockd.errors import AdmissionRejected, PolicyError
from airlockd.policy import Limits, Policy, load_policy
from airlockd.runs.service import Service
from airlockd.sandbox import cgroups, runtimes, seccomp
from airlockd.sandbox.base import ContainerSpec
from airlockd.sandbox.cgroups import CgroupWatch
from airlockd.sandbox.dockerargs import RUNTIME_LABEL, create_kwargs, gvisor_host_tasks
from tests.unit.fakesandbox import FakeSandbox, workspace

LIMITS = Limits.model_validate({"pids": 48})


def spec(tmp_path: Path, **kw: Any) -> ContainerSpec:
    ws = tmp_path / "staging"
    ws.mkdir(exist_ok=True)
    return ContainerSpec(run_id="r1", image="img:1", argv=["agent"], workspace=ws, limits=LIMITS, **kw)


# -- the policy -------------------------------------------------------------------------------


def policy(tmp_path: Path, text: str) -> Policy:
    (tmp_path / "policies.toml").write_text(text)
    return load_policy(tmp_path).policy


def test_the_runtime_is_per_agent_with_a_default(tmp_path: Path) -> None:
    text = '[defaults]\nruntime = "runsc"\n[agents.a]\ncommand = ["x"]\n[agents.b]\ncommand = ["x"]\nruntime = "runc"\n'
    p = policy(tmp_path, text)
    assert p.runtime_for("a") == "runsc" and p.runtime_for("b") == "runc"
    assert policy(tmp_path, '[agents.a]\ncommand = ["x"]\n').runtime_for("a") == "runc"


def test_an_unknown_runtime_is_a_policy_error_naming_the_choices(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as err:
        policy(tmp_path, '[agents.a]\ncommand = ["x"]\nruntime = "kata"\n')
    assert "runtime" in str(err.value) and "runsc" in str(err.value)


# -- the container's arguments ----------------------------------------------------------------


def test_runc_keeps_the_pids_cgroup_and_names_no_runtime(tmp_path: Path) -> None:
    kw = create_kwargs(spec(tmp_path))
    assert kw["pids_limit"] == 48 and "runtime" not in kw
    assert all(u["Name"] != "nproc" for u in kw["ulimits"])  # RLIMIT_NPROC on the host is per user, host-wide
    assert kw["labels"][RUNTIME_LABEL] == "runc"


def test_runsc_caps_processes_by_nproc_inside_gvisor_not_by_the_hosts_pids_cgroup(tmp_path: Path) -> None:
    kw = create_kwargs(spec(tmp_path, runtime="runsc"))
    assert kw["runtime"] == "runsc" and kw["labels"][RUNTIME_LABEL] == "runsc"
    # the host's cap is a backstop for gVisor's own threads, well above what the agent's cap needs
    assert kw["pids_limit"] == gvisor_host_tasks(48)
    nproc = [u for u in kw["ulimits"] if u["Name"] == "nproc"]
    assert nproc and nproc[0]["Soft"] == nproc[0]["Hard"] == 48
    # every other restriction is the same as under runc, and the seccomp profile is our own
    base = create_kwargs(spec(tmp_path))
    for key in ("read_only", "cap_drop", "network_mode", "user", "mem_limit", "memswap_limit", "tmpfs"):
        assert kw[key] == base[key], key
    assert base["security_opt"] == ["no-new-privileges"]  # the engine's default profile under runc
    assert kw["security_opt"] == ["no-new-privileges", f"seccomp={seccomp.gvisor_profile()}"]
    assert seccomp.shown(kw["security_opt"]) == ["no-new-privileges", "seccomp=airlockd-gvisor"]
    assert {u["Name"] for u in base["ulimits"]} <= {u["Name"] for u in kw["ulimits"]}


def test_the_hosts_backstop_grows_with_the_process_cap_but_keeps_to_a_quarter_of_the_pid_space() -> None:
    assert gvisor_host_tasks(32, pid_max=4_194_304) == 256 + 48 * 32
    assert gvisor_host_tasks(256, pid_max=4_194_304) == 256 + 48 * 256
    assert gvisor_host_tasks(256, pid_max=32768) == 8192  # a quarter of a small pid space
    assert gvisor_host_tasks(4, pid_max=1000) == 448  # never below what a small cap needs


def test_the_gvisor_profile_refuses_every_namespace_and_lets_clone3_through_to_gvisor() -> None:
    profile = json.loads(seccomp.gvisor_profile())
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    refused = {n for r in profile["syscalls"] if "args" not in r for n in r["names"]}
    assert {"unshare", "setns", "mount", "bpf", "keyctl", "userfaultfd", "perf_event_open"} <= refused
    assert {"ptrace", "process_vm_writev"} <= refused  # a tracer could rewrite a call past the filter
    assert "clone3" not in refused  # refused it would be EPERM under this gVisor: no thread could start
    masks = {r["args"][0]["value"] for r in profile["syscalls"] if r["names"] == ["clone"]}
    assert masks == set(seccomp.NAMESPACE_FLAGS)
    user_ns = 0x10000000
    assert user_ns in masks and all(r["errnoRet"] == 1 for r in profile["syscalls"])


def test_a_sandbox_that_died_at_the_hosts_backstop_is_a_pids_violation() -> None:
    from airlockd.policy import Limits as L
    from airlockd.runs.containment import RunMonitor
    from airlockd.sandbox.base import CapCounters, ExitInfo

    counters = CapCounters(source="cgroup v1 pids.events of the container", backstop_hits=1)
    info = ExitInfo("c", 2, False, False, False, None, 1.0, 0, b"", {}, counters)
    assert info.limit_hit == "pids"
    monitor = RunMonitor(
        FakeSandbox(), "r1", L.model_validate({"pids": 32}), used_bytes=lambda: None, staged_bytes=0,
        tokens_left=None, publish=lambda sample: None,
    )  # fmt: skip
    hit = monitor.limit_hit(info)
    assert hit is not None and hit.limit == "pids" and "gVisor host backstop" in hit.source


# -- the engine's runtimes --------------------------------------------------------------------

REGISTERED = {"runc": {"path": "runc"}, "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": runtimes.GVISOR_ARGS}}


def test_a_registered_runsc_with_host_sockets_is_accepted() -> None:
    assert runtimes.refusal(REGISTERED, "runsc", host_sockets=True) is None
    assert runtimes.refusal({}, "runc", host_sockets=True) is None  # runc needs no question


def test_a_missing_runtime_says_how_to_register_it() -> None:
    why = runtimes.refusal({"runc": {"path": "runc"}}, "runsc", host_sockets=False)
    assert why is not None
    assert 'no "runsc" runtime (it has: runc)' in why
    assert "apt-get install runsc" in why and "daemon.json" in why and "kill -HUP" in why


@pytest.mark.parametrize(
    ("args", "ok"),
    [
        (["--network=none"], False),
        (["--host-uds=open"], True),
        (["--host-uds", "open"], True),
    ],
)
def test_the_gateway_needs_runsc_to_connect_to_host_sockets(args: list[str], ok: bool) -> None:
    table = {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": [*args, "--oci-seccomp"]}}
    why = runtimes.refusal(table, "runsc", host_sockets=True)
    assert (why is None) is ok, why
    if not ok:
        assert "--host-uds=open" in str(why) and "gateway" in str(why)
    assert runtimes.refusal(table, "runsc", host_sockets=False) is None  # no socket: no need


@pytest.mark.parametrize(
    "args", [["--host-uds=all"], ["-host-uds", "create"], ["--fsgofer-host-uds"], ["--host-uds=all", "--oci-seccomp"]]
)
def test_runsc_that_lets_the_agent_create_host_sockets_is_refused_with_or_without_the_gateway(args: list[str]) -> None:
    for sockets in (True, False):
        why = runtimes.refusal({"runsc": {"runtimeArgs": [*args, "--oci-seccomp"]}}, "runsc", host_sockets=sockets)
        assert why is not None and "create Unix sockets on the host" in why and "--host-uds=open" in why


@pytest.mark.parametrize("args", [["--host-uds=open"], ["--host-uds=open", "--oci-seccomp=false"]])
def test_runsc_without_the_seccomp_profile_inside_is_refused(args: list[str]) -> None:
    """Without --oci-seccomp an agent can unshare a user namespace in gVisor and fork past its cap."""
    why = runtimes.refusal({"runsc": {"runtimeArgs": args}}, "runsc", host_sockets=False)
    assert why is not None and "--oci-seccomp" in why and "user namespace" in why


def test_admission_refuses_a_runtime_the_engine_lacks_before_anything_is_spent(tmp_path: Path) -> None:
    ws = workspace(tmp_path, '[agents.hard]\ncommand = ["true"]\nruntime = "runsc"\n')
    svc = Service(ws, sandbox=FakeSandbox())
    with pytest.raises(AdmissionRejected) as err:
        svc.submit("hard", "go")
    assert 'runtime "runsc"' in str(err.value) and "register" in str(err.value)
    run = svc.store.get_run(err.value.data["run_id"])
    assert run.state.value == "rejected_at_admission" and svc.store.get_agent("hard").runs_used == 0
    assert not svc.state.run_dir(run.id).exists()  # nothing staged, nothing started
    svc2 = Service(ws, sandbox=FakeSandbox(runtimes=("runc", "runsc")))
    assert svc2.submit("hard", "go").state.value == "admitted"


# -- the cgroup reader under gVisor -----------------------------------------------------------

CID = "ef" * 32


def test_under_gvisor_the_reader_takes_memory_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's pids cgroup of a gVisor sandbox counts gVisor's threads: never read as the
    agent's processes; the memory cgroup (the OOM kill) still is."""
    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    p = tmp_path / "pids" / "docker" / CID
    p.mkdir(parents=True)
    (p / "pids.events").write_text("max 9\n")
    (p / "pids.current").write_text("217\n")
    m = tmp_path / "memory" / "docker" / CID
    m.mkdir(parents=True)
    (m / "memory.oom_control").write_text("oom_kill 0\n")
    watch = CgroupWatch(CID, pids=False).start()
    time.sleep(0.05)
    (m / "memory.oom_control").write_text("oom_kill 1\n")
    time.sleep(0.05)
    c = watch.finish()
    assert (c.pids_refused, c.pids_peak, c.oom_kills) == (0, 0, 1)
    assert "memory.oom_control" in c.source and "pids" not in c.source
