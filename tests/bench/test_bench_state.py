"""Benchmark (prints, never fails on speed): does a run cost the same on the thousandth day?

Two workspaces, one with an empty state, one whose store holds AIRLOCK_BENCH_RUNS (10,000) past
runs of 20 changed files each, spread over 120 days, with their audit events (8 a run) and run
folders, written in the first layout (one store.json) and converted by the code under test on
first use, as a user's upgrade would. In interleaved rounds, through the CLI with the real engine
(`--no-daemon`: the command alone, the way the issue measured it): a no-op `run --wait`, an
`approve` of a fresh proposal, a `show --json` of it, and `runs --limit 50`; printed as the big
store's median ÷ the empty store's. Then, against a daemon (`airlockd serve`, a real LSP
client) on the big store with 4 runs live: `airlock.listRuns` p50/p99, and the store's bytes
written per live-run second (every store file of the live runs, the index and the days' lines,
polled every 25 ms; a file replaced counts its whole size). Targets (issue 13): ratios <= 1.1,
`runs --limit 50` < 100 ms, listRuns p99 < 20 ms, <= 4 KiB per live-run second.

    .venv/bin/pytest tests/bench/test_bench_state.py -s -q
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pygls.uris import from_fs_path
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from airlockd.evidence.audit import AuditLog
from airlockd.records import FileReview, FileState, RunRecord, RunState, Transition
from airlockd.redact import Redactor
from airlockd.state import StateDir
from airlockd.store import Store

pytestmark = [pytest.mark.docker, pytest.mark.slow]

RUNS = int(os.environ.get("AIRLOCK_BENCH_RUNS", "10000"))
FILES = 20
ROUNDS = int(os.environ.get("AIRLOCK_BENCH_ROUNDS", "9"))
LIVE = 4
POLICY = textwrap.dedent(
    """
    [agents.bot]
    command = ["bash", "-c", "{prompt}"]
    prompt = "argv"
    mode = "review"
    [agents.bot.admission]
    max_concurrent = 8
    """
)
EVENTS = ("admission.admitted", "stage.done", "container.starting", "container.exited")
ENDS = ("run.proposed", "classify", "review.approve", "run.applied")


def _entry(n: int) -> dict[str, Any]:
    return {"kind": "file", "mode": 0o644, "size": 100 + n, "sha256": hashlib.sha256(str(n).encode()).hexdigest()}


def _past_run(i: int, at: float) -> RunRecord:
    run_id = "r" + time.strftime("%y%m%d", time.localtime(at)) + f"{i:06x}"
    state = (RunState.APPLIED, RunState.REJECTED, RunState.UNDONE, RunState.EXPIRED)[i % 4]
    files = [
        FileReview(
            path=f"src/pkg{j % 4}/module_{j}.py",
            change="modified",
            decision="auto" if j % 3 else "review",
            rule="rules[3]",
            reason="ordinary source code",
            state=FileState.ACCEPTED if state is RunState.APPLIED else FileState.REJECTED,
            before=_entry(i * FILES + j),
            after=_entry(i * FILES + j + 1),
        )
        for j in range(FILES)
    ]
    steps = ("admitted", "staging", "running", "inspecting", "proposed", state.value)
    return RunRecord(
        id=run_id,
        agent="bot",
        mode="review",
        state=state,
        prompt=f"past task {i}: refactor the parser and update its tests",
        prompt_sha256=hashlib.sha256(str(i).encode()).hexdigest(),
        policy_revision="0" * 16,
        created_at=at,
        proposed_at=at + 30,
        transitions=[Transition(state=RunState(s), at=at + k, detail="") for k, s in enumerate(steps)],
        withheld=[{"path": ".env", "rule": "withhold:.env"}],
        files=files,
        container={"id": f"{i:012x}", "image": "airlockd-runtime", "exit_code": 0, "duration_s": 12.5},
        tokens=1000 + i,
        staged_bytes=184_000_000,
    )


def write_history(ws: Path, n: int) -> tuple[StateDir, float]:
    """`n` past runs in the first layout, their audit events and folders; converted by the store
    (the seconds the conversion took)."""
    state = StateDir.for_workspace(ws).ensure()
    now = time.time()
    span = 120 * 86400
    runs = {str(i + 1): _past_run(i, now - span + i * span / n).model_dump(mode="json") for i in range(n)}
    agents = {"1": {"name": "bot", "runs_used": n, "tokens_used": 0}}
    state.store.write_text(json.dumps({"runs": runs, "agents": agents}))
    audit = AuditLog(state.audit, Redactor(), fsync=False)
    for doc in runs.values():
        for kind in EVENTS + ENDS:
            audit.append(kind, run=doc["id"], agent="bot", policy="0" * 16, paths=[f["path"] for f in doc["files"][:5]])
        folder = state.run_dir(doc["id"])
        folder.mkdir(mode=0o700)
        (folder / "output.log").write_text("done\n" * 20)
    t0 = time.perf_counter()
    Store(state).lines(limit=1)
    return state, time.perf_counter() - t0


def _cli(ws: Path, env: dict[str, str], *argv: str, as_json: bool = True) -> tuple[float, Any]:
    cmd = [sys.executable, "-P", "-m", "airlockd", "--workspace", str(ws), "--no-daemon", *argv]
    cmd += ["--json"] if as_json else []
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t0
    assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-2000:])
    return took, (json.loads(proc.stdout) if proc.stdout.strip() else None) if as_json else proc.stdout


def _round(ws: Path, env: dict[str, str], i: int) -> dict[str, float]:
    out = {}
    out["noop run"], rec = _cli(ws, env, "run", "--agent", "bot", "--wait", "true")
    assert rec["state"] in ("proposed", "applied"), rec
    _, rec = _cli(ws, env, "run", "--agent", "bot", "--wait", f"echo {i} > bench{i}.txt")
    assert rec["state"] == "proposed", rec
    out["approve"], _ = _cli(ws, env, "approve", rec["id"])
    out["show --json"], shown = _cli(ws, env, "show", rec["id"])
    assert shown["state"] == "applied"
    out["runs --limit 50"], text = _cli(ws, env, "runs", "--limit", "50", as_json=False)
    assert text.strip()
    out["runs --limit 50 --json"], listed = _cli(ws, env, "runs", "--limit", "50")  # its output scrubbed once more
    assert 0 < len(listed) <= 50
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class StoreWrites:
    """Bytes the store writes while runs are live: the index, the days' lines and the live runs'
    own files, polled; a file replaced since the last look counts its whole size."""

    def __init__(self, state: StateDir, runs: list[str]) -> None:
        self.state, self.runs = state, runs
        self.bytes = 0
        self._seen: dict[str, tuple[int, int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _files(self) -> list[Path]:
        files = [self.state.index_file, *self.state.history.glob("*.json")]
        for run_id in self.runs:
            files += [self.state.record(run_id), self.state.live_sample(run_id)]
        return files

    def _look(self, count: bool) -> None:
        for path in self._files():
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._seen.get(str(path)) != key:
                self._seen[str(path)] = key
                self.bytes += st.st_size if count else 0

    def _loop(self) -> None:
        while not self._stop.wait(0.025):
            self._look(True)

    def __enter__(self) -> StoreWrites:
        self._look(False)
        self.t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.seconds = time.perf_counter() - self.t0


async def _live(ws: Path, state: StateDir, env: dict[str, str]) -> dict[str, Any]:
    states: dict[str, str] = {}

    def factory() -> LanguageClient:
        from pytest_lsp.client import make_test_lsp_client

        c = make_test_lsp_client()

        @c.feature("airlock/runStatus")
        def on_status(ls: LanguageClient, params: Any) -> None:
            states[params.runId] = params.state

        for m in ("airlock/agentStatus", "airlock/proposal", "airlock/runProgress", "airlock/runDone"):
            c.feature(m)(lambda ls, params: None)
        return c

    serve = [sys.executable, "-P", "-m", "airlockd", "--workspace", str(ws), "serve"]
    config = ClientServerConfig(serve, client_factory=factory, server_env=env)
    client = await config.start()
    assert isinstance(client, LanguageClient)
    await client.initialize_session(
        types.InitializeParams(capabilities=client_capabilities("visual-studio-code"), root_uri=from_fs_path(str(ws)))
    )

    async def command(name: str, args: dict[str, Any]) -> Any:
        return await client.workspace_execute_command_async(types.ExecuteCommandParams(command=name, arguments=[args]))

    try:
        ids = []
        for _ in range(LIVE):
            got = await command("airlock.runTask", {"agent": "bot", "prompt": "sleep 60"})
            ids.append(got["runId"])
        deadline = time.monotonic() + 120
        while sum(1 for r in ids if states.get(r) == "running") < LIVE:
            assert time.monotonic() < deadline, states
            await asyncio.sleep(0.05)
        await asyncio.sleep(2)  # the first samples are out
        lat = []
        with StoreWrites(state, ids) as writes:
            t_end = time.monotonic() + 12
            while time.monotonic() < t_end:
                t0 = time.perf_counter()
                listed = await command("airlock.listRuns", {"limit": 50})
                lat.append(time.perf_counter() - t0)
                await asyncio.sleep(0.01)
        assert sum(1 for r in ids if states.get(r) == "running") == LIVE, states  # live the whole time
        assert len(listed) == 50
        for r in ids:
            await command("airlock.killRun", {"runId": r})
        return {"lat": lat, "bytes": writes.bytes, "seconds": writes.seconds}
    finally:
        await client.shutdown_session()
        await client.stop()


def test_bench_state_that_does_not_grow(tmp_path: Path) -> None:
    import docker

    from airlockd.sandbox.image import ensure_image

    ensure_image(docker.from_env())
    env = {**os.environ, "AIRLOCK_STATE_DIR": str(tmp_path / "state"), "AIRLOCK_DAEMON": "off"}
    os.environ["AIRLOCK_STATE_DIR"] = env["AIRLOCK_STATE_DIR"]
    spaces = {}
    for name in ("empty", "big"):
        ws = tmp_path / name
        (ws / "src").mkdir(parents=True)
        (ws / "src" / "main.py").write_text("print('hello')\n")
        (ws / "policies.toml").write_text(POLICY)
        spaces[name] = ws
    t0 = time.perf_counter()
    state, converted_s = write_history(spaces["big"], RUNS)
    made_s = time.perf_counter() - t0
    store_mb = sum(p.stat().st_size for p in state.root.rglob("*.json") if p.is_file()) / 2**20
    audit_mb = sum(p.stat().st_size for p in [state.audit, *(state.root / "audit").glob("*.jsonl")]) / 2**20
    _round(spaces["empty"], env, 0)  # warm-up: engine, image, page cache
    _round(spaces["big"], env, 0)
    took: dict[str, dict[str, list[float]]] = {name: {} for name in spaces}
    for i in range(1, ROUNDS + 1):  # interleaved, so both see the same machine load
        for name, ws in spaces.items():
            for what, s in _round(ws, env, i).items():
                took[name].setdefault(what, []).append(s)
    live = asyncio.run(_live(spaces["big"], state, {**env, "AIRLOCK_DAEMON": "on"}))
    print(
        f"\nstore of {RUNS} past runs x {FILES} files: {store_mb:.0f} MB of store files, audit {audit_mb:.0f} MB;"
        f" written in {made_s:.0f} s, converted from the first layout in {converted_s:.1f} s"
    )
    print(f"{'':24} {'empty (median)':>15} {'big (median)':>13} {'ratio med':>10} {'ratio min':>10}")
    for what in took["empty"]:
        e, b = took["empty"][what], took["big"][what]
        print(
            f"{what:24} {statistics.median(e) * 1000:13.0f}ms {statistics.median(b) * 1000:11.0f}ms"
            f" {statistics.median(b) / statistics.median(e):10.2f} {min(b) / min(e):10.2f}"
        )
    per_s = live["bytes"] / live["seconds"] / LIVE
    print(
        f"airlock.listRuns with {LIVE} runs live ({len(live['lat'])} calls, big store):"
        f" p50 {_pct(live['lat'], 0.5) * 1000:.1f} ms, p99 {_pct(live['lat'], 0.99) * 1000:.1f} ms (target < 20 ms)"
    )
    print(f"store bytes written per live-run second: {per_s:.0f} B over {live['seconds']:.1f} s (target <= 4096)")
    print(f"targets: ratios <= 1.1; runs --limit 50 < 100 ms; rounds {ROUNDS}")
