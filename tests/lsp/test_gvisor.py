"""gVisor as the agent's runtime, through both doors on one workspace: an agent with
`runtime = "runsc"` runs from the editor (pytest-lsp) and from the CLI; it sees gVisor's kernel,
not the host's (`uname -r`, `dmesg`), while a runc agent of the same workspace sees the host's;
its ordinary tools work (`ls`, `stat`: the image's compat library); the evidence in the editor and
in `airlockd show` names the runtime and the process cap; and the cap holds, counted from inside.
The hostile-agent suites run under runsc as well (tests/integration: test_containment, test_limits,
test_sandbox, the re-attach in test_pipeline, Codex in test_codex)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from pytest_lsp import LanguageClient

from airlockd.sandbox.dockerargs import gvisor_host_tasks

from .conftest import POLICY, command, make_workspace, notes, start_client, wait_until

pytestmark = [
    pytest.mark.docker,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.filterwarnings("error::pytest_lsp.LspSpecificationWarning"),
]

HARD = '\n[agents.hard]\ncommand = ["bash", "-c", "{prompt}"]\nprompt = "argv"\nruntime = "runsc"\n'
HARD += "[agents.hard.limits]\nwall_time_s = 60\npids = 40\n"
KERNEL = (
    "uname -r > kernel.txt; cat /proc/version > version.txt; dmesg > dmesg.txt 2>&1; "
    "ls -la src > listing.txt; stat -c %s src/lib.py >> listing.txt"
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def editor(tmp_path_factory: pytest.TempPathFactory, _image: None) -> AsyncIterator[Any]:
    import docker

    from airlockd.sandbox import runtimes

    why = runtimes.refusal(docker.from_env().info().get("Runtimes"), "runsc", host_sockets=True)
    if why is not None:
        if os.environ.get("AIRLOCK_REQUIRE_DOCKER"):
            pytest.fail(f"the engine cannot run runsc: {why}")
        pytest.skip(f"the engine cannot run runsc: {why}")
    root = tmp_path_factory.mktemp("gvisor")
    ws = make_workspace(root)
    (ws / "policies.toml").write_text(POLICY + HARD)
    state = root / "state"
    c = await start_client(ws, state, "visual-studio-code")
    c.ws, c.state = ws, state  # type: ignore[attr-defined]
    yield c
    await c.shutdown_session()
    await c.stop()


async def cli(c: Any, *argv: str) -> tuple[int, Any, str]:
    env = {**os.environ, "AIRLOCK_STATE_DIR": str(c.state)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "airlockd", "--workspace", str(c.ws), "--json", *argv, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode is not None
    return proc.returncode, json.loads(out) if out.strip() else None, err.decode()


async def proposed_from_editor(c: Any, agent: str, prompt: str) -> str:
    started = await command(c, "airlock.runTask", {"agent": agent, "prompt": prompt})
    run_id: str = started["runId"]
    await wait_until(
        lambda: any(p["runId"] == run_id for p in notes(c, "airlock/proposal")), timeout=120, what="the proposal"
    )
    return run_id


async def proposed_text(c: Any, run_id: str, path: str) -> str:
    """What the agent wrote to the new file `path`, as the editor's diff shows it."""
    diff = await command(c, "airlock.diff", {"runId": run_id, "path": path})
    added = [line[1:] for line in str(diff["diff"]).splitlines() if line.startswith("+") and not line.startswith("+++")]
    return "\n".join(added) + "\n"


async def test_the_agent_sees_gvisors_kernel_and_its_tools_work(editor: LanguageClient) -> None:
    c: Any = editor
    host = os.uname().release
    hard = await proposed_from_editor(c, "hard", KERNEL)
    kernel = (await proposed_text(c, hard, "kernel.txt")).strip()
    assert kernel and kernel != host, (kernel, host)
    version = await proposed_text(c, hard, "version.txt")  # gVisor's own, fixed kernel banner
    assert "#1 SMP Sun Jan 10 15:06:54 PST 2016" in version and version != Path("/proc/version").read_text()
    # the kernel's log is gVisor's ("Starting gVisor..."), but reading it is refused by the seccomp
    # profile that runs inside gVisor too (--oci-seccomp), as under runc
    assert "Operation not permitted" in await proposed_text(c, hard, "dmesg.txt")
    listing = await proposed_text(c, hard, "listing.txt")
    assert "lib.py" in listing and "mod.py" in listing and "Invalid argument" not in listing, listing
    assert listing.rstrip().endswith("\n6"), listing  # `stat` works too: "X = 1\n" is 6 bytes

    # the same prompt from the CLI, for the runc agent of this workspace: the host's kernel
    code, run, err = await cli(c, "run", "--agent", "bot", "--wait", "uname -r > kernel.txt")
    assert code == 0, err
    shown = await proposed_text(c, run["id"], "kernel.txt")
    assert shown.strip() == host
    for run_id in (hard, run["id"]):
        code, _, err = await cli(c, "reject", run_id)
        assert code == 0, err


async def test_both_doors_show_the_runtime_and_the_process_cap(editor: LanguageClient) -> None:
    c: Any = editor
    code, run, err = await cli(c, "run", "--agent", "hard", "--wait", "echo made > src/made.py")
    assert code == 0, err
    assert run["container"]["runtime"] == "runsc" and run["container"]["effective"]["runtime"] == "runsc"
    ev = await command(c, "airlock.getEvidence", {"runId": run["id"]})
    assert ev["container"]["runtime"] == "runsc"
    assert ev["resources"]["effective"]["nproc"] == 40
    assert ev["resources"]["effective"]["pids_limit"] == gvisor_host_tasks(40)  # the host's backstop
    code, shown, err = await cli(c, "show", run["id"])
    assert code == 0 and shown["container"]["runtime"] == "runsc", err
    code, events, err = await cli(c, "audit", "--run", run["id"])
    starting = [e["data"] for e in events if e["kind"] == "container.starting"]
    effective = [e["data"] for e in events if e["kind"] == "container.effective"]
    assert starting[0]["runtime"] == "runsc" and effective[0]["runtime"] == "runsc", (starting, effective)
    # a run from the editor, approved from the CLI: the decision works as under runc
    run_id = await proposed_from_editor(c, "hard", "echo from-editor > src/gv.py")
    code, out, err = await cli(c, "approve", run_id)
    assert code == 0 and out["run"]["state"] == "applied", (out, err)
    assert (Path(c.ws) / "src/gv.py").read_text() == "from-editor\n"
    code, _, err = await cli(c, "reject", run["id"])
    assert code == 0, err


async def test_the_process_cap_holds_inside_gvisor(editor: LanguageClient) -> None:
    """RLIMIT_NPROC in gVisor's kernel: forks are refused at the cap (40, with docker-init, bash
    and python), and gVisor's own /proc never counts more of the agent's processes than that."""
    c: Any = editor
    bomb = (
        "python3 -c 'import os, subprocess\nps = []\ntry:\n"
        '    while True: ps.append(subprocess.Popen(["sleep", "20"]))'
        '\nexcept OSError as e: print("refused after", len(ps), e)'
        '\nprint("procs", sum(n.isdigit() for n in os.listdir("/proc")))\''
    )
    _, run, err = await cli(c, "run", "--agent", "hard", "--wait", bomb)
    assert run is not None, err
    out = (next(Path(c.state).glob(f"*/runs/{run['id']}/output.log"))).read_text()
    refused = re.search(r"refused after (\d+) \[Errno 11\]", out)
    procs = re.search(r"procs (\d+)", out)
    assert refused and procs, out
    assert 30 <= int(refused.group(1)) < 40 and int(procs.group(1)) <= 40, out


async def test_no_user_namespace_lets_the_agent_past_its_cap_and_threads_still_start(editor: LanguageClient) -> None:
    """Root in a user namespace of its own is not held by RLIMIT_NPROC: airlockd's seccomp profile,
    applied inside gVisor (--oci-seccomp, required at admission), refuses to make one, by clone's
    flags; clone3 reaches gVisor's kernel, which answers ENOSYS, so libc's threads fall back to
    clone and start (the engine's default profile answered EPERM there: no thread started)."""
    c: Any = editor
    probe = (
        "unshare -Ur id 2>&1; unshare -U true 2>&1; "
        "python3 -c 'import threading; t = threading.Thread(target=print, args=(\"thread-ran\",)); t.start(); t.join()'"
        " 2>&1; python3 -c 'import ctypes; c = ctypes.CDLL(None, use_errno=True); c.ptrace(0, 0, 0, 0);"
        ' print("ptrace-errno", ctypes.get_errno())\'; echo done'
    )
    _, run, err = await cli(c, "run", "--agent", "hard", "--wait", probe)
    assert run is not None, err
    out = (next(Path(c.state).glob(f"*/runs/{run['id']}/output.log"))).read_text()
    assert out.count("Operation not permitted") == 2 and "uid=0" not in out, out
    assert "thread-ran" in out and "done" in out, out
    assert "ptrace-errno 1" in out, out  # a tracer could otherwise rewrite a call past the filter
