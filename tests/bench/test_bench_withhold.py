"""Benchmark: staging with the withholding work ("Secrets absent means absent") ÷ the code before
it, in one run, on the same workspace.

    .venv/bin/pytest tests/bench/test_bench_withhold.py -s -q

The baseline is the revision AIRLOCK_BENCH_BASELINE (default `1e6f7fc`: the last commit before
the withholding work, `git log --oneline 1e6f7fc..HEAD` lists that work: the fresh repository in
place of `.git`, withholding by identity, archives scanned, patterns in any case and depth,
secrets in names, the new detectors). It is exported with `git archive` into a temporary folder;
the current code is this checkout. Each contender runs in its own Python process with PYTHONPATH
set to its tree and its cwd outside both checkouts (the process checks that `airlockd.__file__`
is under the tree meant), and each uses its own tree's default policy (the new one's patterns and
detectors are part of "the new checks").

The workspace is treegen's `big_tree` (20,000 files, 210 MiB) copied, plus what gives the new
checks work: a `.git` with history (the tree committed, edits, a secret committed and removed;
packed, as a clone is), four archives (two clean, one with a `.env` member, one with a key in a
member), a `.env`, a hard link and a byte copy of it, a `.Env` below the root and a file whose name
is a token. Both contenders stage that same workspace.

Measured for each contender, by the same script (`_measure`, at the end of this file):
1. the cold mirror build: the daemon's keeper (`staging/keeper.py`) refreshing a workspace's
   mirror for the first time (a walk into an empty state directory);
2. the daemon path's staging of a run: 10 files of the workspace edited (untimed; the watcher's
   queue drained, as the daemon does when it is readable), then, timed, what a run's staging does
   in a process with a keeper (`runs/execution.stage`): `OverlayStager.stage` with the keeper's
   incremental refresh as the request's `refresh` (the capped tmpfs of the upper layer mounted,
   upper and work directories, the run's records, the live-tree digest). The engine volume that
   `test_bench_overlay.py` also creates is left out: engine work, the same code in both.
Method: rounds interleaved (baseline, current, baseline, current...), each round a fresh process
and a fresh state directory; round 0 is an untimed warm-up of each; ROUNDS timed rounds follow.
In each process: the cold build (timed), a walk past its racy entries, one untimed staging, then
STEPS timed stagings; `sync` before everything timed. Reported: min and median, ratios current ÷
baseline (targets: refresh + stage <= 1.2, cold build <= 1.5). Printed, never asserted; only
sanity is asserted (the right code imported; the staged trees hold the same files but those the
new code withholds on purpose, with a rule; no `.env` of any case in the new one; the new one's
`.git` is one commit).

Shims (the script uses only APIs both revisions have): the current Service gives its Redactor
the policy's custom detectors (`Redactor.add_detectors`, absent in the baseline): done when the
method exists. The keeper's `_walk` is wrapped in both to count walks (a refresh that walks is not
the incremental path this measures; printed when one happens). pathspec's default backend is set
to its `re` one in both (`_simple_pathspec`): with Hyperscan installed (a dependency since the
detectors' prefilter) its "best" default compiles each spec for tens of milliseconds, which the
baseline never paid where it ran, and which the current code avoids by asking for `re` itself.

Knobs: AIRLOCK_BENCH_DIR (where the tree and the work go, e.g. /dev/shm), AIRLOCK_BENCH_FILES
(a smaller tree, e.g. 2000, for trying the benchmark out; bytes scale with it),
AIRLOCK_BENCH_PROFILE=<dir> (each process also writes cProfile stats of its cold build and of its
timed stagings there: timings are then inflated, for diagnosis only).
"""

from __future__ import annotations

import io
import json
import os
import random
import re
import shutil
import statistics
import string
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from treegen import Tree, big_tree, spec_from_env

BASELINE = os.environ.get("AIRLOCK_BENCH_BASELINE", "1e6f7fc")
ROUNDS = 3  # timed rounds (each a fresh process per contender), after one untimed
STEPS = 8  # timed stagings per round (10 files edited before each), after one untimed
EDITS = 10
REPO = Path(__file__).resolve().parents[2]
MASK = "[REDACTED]"  # redact.MASK, in both revisions
pytestmark = pytest.mark.slow

_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = os.environ.get("AIRLOCK_BENCH_DIR")
    if base:
        root = Path(base) / f"airlock-bench-withhold-{os.getpid()}"
        root.mkdir(parents=True, exist_ok=True)
        yield root
        shutil.rmtree(root, ignore_errors=True)
    else:
        yield tmp_path_factory.getbasetemp()


@pytest.fixture(scope="module")
def tree(bench_dir: Path) -> Tree:
    return big_tree(bench_dir, spec_from_env())


# -- the workspace ---------------------------------------------------------------------------------


def _git(ws: Path, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV, "HOME": str(ws.parent)}
    proc = subprocess.run(
        ["git", "-c", "gc.auto=0", *args], cwd=ws, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, (args, proc.stderr)
    return proc.stdout


def _token(rnd: random.Random, n: int, alphabet: str = string.ascii_letters + string.digits) -> str:
    return "".join(rnd.choice(alphabet) for _ in range(n))


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_767_225_600, 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    return buf.getvalue()


def _workspace(tree: Tree, ws: Path) -> dict[str, str]:
    """The tree copied to `ws`, with a `.git` of some history, archives and secrets. Returns the
    paths the new code is meant to withhold and the baseline stages, each with why."""
    rnd = random.Random(7)
    subprocess.run(["cp", "-a", str(tree.root), str(ws)], check=True)
    src = [p for p in tree.paths if not p.startswith("assets/")]
    py = [p for p in src if p.endswith(".py")]
    docs = [p for p in src if p.endswith((".md", ".txt"))]
    aws = "AKIA" + _token(rnd, 16, string.ascii_uppercase + string.digits)
    archives = {
        "dist/docs.zip": _zip({f"docs/{p}": (ws / p).read_bytes() for p in docs[:300]}),
        "vendor/sdk-1.4.2.tar.gz": _tar_gz({f"sdk/{p}": (ws / p).read_bytes() for p in py[:1000]}),
        "backups/config.tar.gz": _tar_gz(
            {"app/settings.py": b"DEBUG = False\n", "app/.env": f"SECRET_KEY={_token(rnd, 40)}\n".encode()}
        ),
        "fixtures/creds.zip": _zip({"ci/aws.txt": f"aws_access_key_id = {aws}\n".encode()}),
    }
    for rel, data in archives.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_bytes(data)

    # history: the tree, two rounds of edits, a secret committed and then removed; packed
    _git(ws, "init", "-q", "-b", "main")
    (ws / ".gitignore").write_text(".env\n")
    _git(ws, "add", "-A")
    _git(ws, "commit", "-qm", "initial import")
    for i in range(2):
        for rel in src[1000 + 20 * i : 1020 + 20 * i]:
            with open(ws / rel, "ab") as fh:
                fh.write(f"# history {i}\n".encode())
        _git(ws, "commit", "-qam", f"edits {i}")
    (ws / "config").mkdir(exist_ok=True)
    (ws / "config" / "local.py").write_text(f'AWS_ACCESS_KEY_ID = "{aws}"\n')
    _git(ws, "add", "-A")
    _git(ws, "commit", "-qm", "local settings")
    _git(ws, "rm", "-q", "config/local.py")
    _git(ws, "commit", "-qm", "no credentials in the repository")
    _git(ws, "gc", "-q", "--prune=now")

    # what a workspace holds beside its history (never committed)
    env = f"DATABASE_HOST=db.internal\nDATABASE_PASSWORD={_token(rnd, 24)}\nSECRET_KEY={_token(rnd, 40)}\n"
    (ws / ".env").write_text(env)
    (ws / "deploy").mkdir(exist_ok=True)
    os.link(ws / ".env", ws / "deploy" / "env.backup")
    (ws / "scripts").mkdir(exist_ok=True)
    (ws / "scripts" / "env.copy").write_text(env)
    (ws / "services" / "api").mkdir(parents=True, exist_ok=True)
    (ws / "services" / "api" / ".Env").write_text(f"API_TOKEN={_token(rnd, 32)}\n")
    (ws / "keys").mkdir(exist_ok=True)
    name = f"keys/ghp_{_token(rnd, 36)}.json"
    (ws / name).write_text('{"scope": "repo"}\n')
    return {
        "deploy/env.backup": "a hard link to .env",
        "scripts/env.copy": "a byte copy of .env",
        "services/api/.Env": ".env in another case, below the root",
        name: "a token in the name",
        "backups/config.tar.gz": "an archive with a .env member",
        "fixtures/creds.zip": "an archive with an AWS key in a member",
    }


def _baseline_tree(rev: str, dest: Path) -> str:
    """The code at `rev` exported into `dest` (git archive); its full commit id."""
    full = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", full], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return full


def _contender(code: Path, cfg: dict[str, Any], cwd: Path) -> dict[str, Any]:
    cfg_file = cwd / f"{cfg['label']}-{cfg['round']}.json"
    cfg_file.write_text(json.dumps(cfg))
    env = {**os.environ, "PYTHONPATH": str(code)}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(cfg_file)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, f"{cfg['label']} round {cfg['round']}: {proc.stderr[-4000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(out["airlockd"]).resolve().is_relative_to(code.resolve()), out["airlockd"]
    return out


# -- the benchmark -----------------------------------------------------------------------------------


def test_withholding_against_baseline(tree: Tree, bench_dir: Path) -> None:
    work = bench_dir / f"withhold-bench-{time.time_ns()}"
    work.mkdir()
    try:
        _bench(tree, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench(tree: Tree, work: Path) -> None:
    t0 = time.monotonic()
    ws = work / "ws"
    planted = _workspace(tree, ws)
    made = time.monotonic() - t0
    commits = int(_git(ws, "rev-list", "--count", "HEAD"))
    git_bytes = sum(p.stat().st_size for p in (ws / ".git").rglob("*") if p.is_file())
    full = _baseline_tree(BASELINE, work / "baseline")
    contenders = [("baseline", work / "baseline"), ("current", REPO)]
    editable = [p for p in tree.paths if not p.startswith("assets/")]
    editable = editable[len(editable) // 10 :]  # past the files the history edits
    step = iter(range(10_000))
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in contenders}
    for rnd in range(ROUNDS + 1):
        for label, code in contenders:
            edits = []
            for _ in range(STEPS + 1):
                k = next(step) * EDITS % (len(editable) - EDITS)
                edits.append(editable[k : k + EDITS])
            state = work / f"state-{label}-{rnd}"
            cfg: dict[str, Any] = {
                "label": label,
                "round": rnd,
                "code": str(code),
                "workspace": str(ws),
                "state": str(state),
                "edits": edits,
                "sanity": rnd == ROUNDS,
                "profile": os.environ.get("AIRLOCK_BENCH_PROFILE", ""),
            }
            out = _contender(code, cfg, work)
            shutil.rmtree(state, ignore_errors=True)
            if rnd:
                runs[label].append(out)

    base, cur = runs["baseline"][-1], runs["current"][-1]
    only_base = sorted(set(base["files"]) - set(cur["files"]))
    only_cur = sorted(set(cur["files"]) - set(base["files"]))
    records = {p: _record_of(p, cur["withheld"]) for p in only_base}
    assert not only_cur, only_cur[:20]
    assert all(records.values()), [p for p, rec in records.items() if rec is None]  # withheld on purpose
    cur_withheld = {p: rec for p, rec in records.items() if rec is not None}
    assert not [p for p in cur["files"] if any(part.casefold() == ".env" for part in p.split("/"))]
    assert set(planted) <= set(only_base), sorted(set(planted) - set(only_base))
    assert cur["git_commits"] in (1, None), cur["git_commits"]
    assert all(n >= EDITS for rs in runs.values() for r in rs for n in r["reads"]), "an edit was not seen"

    mib = tree.bytes / 2**20
    print(
        f"\n=== withholding work ÷ baseline {BASELINE} ({full[:12]}): {tree.files} files, {mib:.0f} MiB"
        f" + .git ({commits} commits, {git_bytes / 2**20:.0f} MiB packed), 4 archives, planted secrets;"
        f" workspace made in {made:.0f} s ==="
    )
    print(
        f"  {ROUNDS} timed rounds after 1 untimed, interleaved, a fresh process each; {STEPS} timed"
        f" stagings per round; sync before each; stager: {cur['stager']}"
    )
    cold = {label: [r["cold"] for r in rs] for label, rs in runs.items()}
    steps = {label: [t for r in rs for t in r["steps"]] for label, rs in runs.items()}
    _figures("cold mirror build (first use)", cold["baseline"], cold["current"], 1.5)
    repo = [r["repo_cold"] for r in runs["current"]]
    print(f"    of which the current's fresh repository (gitcopy): {_span(repo)}")
    _figures(f"daemon: {EDITS} files edited, the keeper's refresh + stage", steps["baseline"], steps["current"], 1.2)
    repo = [t for r in runs["current"] for t in r["repo_steps"]]
    print(f"    of which the current's fresh repository (gitcopy): {_span(repo)}")
    for label in runs:
        walks = sum(r["walks"] for r in runs[label])
        reads = sorted({n for r in runs[label] for n in r["reads"]})
        note = f"; {walks} refreshes WALKED (not the incremental path)" if walks else ""
        print(f"  {label:<8} files read per refresh {reads}{note}; keeper: {runs[label][-1]['keeper'] or 'watching'}")
    print(f"  staged (outside .git): baseline {len(base['files'])} files, current {len(cur['files'])} files")
    print(f"  .git in the staged tree: baseline {base['git_commits']} commits, current {cur['git_commits']}")
    print(f"  withheld by both: {sorted(set(dict(base['withheld'])) & set(dict(cur['withheld'])))}")
    print("  withheld by the current code only (the baseline staged them):")
    for p, (shown, rule) in cur_withheld.items():
        print(f"    {shown:<30} {rule:<44} {planted.get(p, 'NOT PLANTED: a file of the tree')}")


def _record_of(path: str, withheld: list[list[str]]) -> tuple[str, str] | None:
    """(path as recorded, rule) of `path` in `withheld`, where a name that holds a secret is
    recorded masked (`[REDACTED]` stands for any text); None when it is not there."""
    for shown, rule in withheld:
        if shown == path or (MASK in shown and re.fullmatch(".+".join(map(re.escape, shown.split(MASK))), path)):
            return shown, rule
    return None


def _span(xs: list[float]) -> str:
    unit, scale = ("ms", 1000) if max(xs) < 1 else ("s", 1)
    runs = " ".join(f"{x * scale:.{1 if unit == 'ms' else 2}f}" for x in xs)
    return f"min {min(xs) * scale:7.2f} {unit}, median {statistics.median(xs) * scale:7.2f} {unit}   ({runs})"


def _figures(what: str, base: list[float], cur: list[float], target: float) -> None:
    of_min, of_med = min(cur) / min(base), statistics.median(cur) / statistics.median(base)
    print(f"  {what}")
    print(f"    baseline {_span(base)}")
    print(f"    current  {_span(cur)}")
    print(f"    current ÷ baseline: {of_min:.2f} of mins, {of_med:.2f} of medians   (target <= {target})")


# -- the measurement script: one contender, one round, in its own process ---------------------------


def _timed(fn: Callable[[], object]) -> float:
    os.sync()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _files_of(tree: Path) -> list[str]:
    """Every file and symlink under `tree`, relative, `.git` at the top left out."""
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(tree):
        rel = os.path.relpath(dirpath, tree)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if d != ".git"]
            rel = ""
        out.extend(f"{rel}/{f}" if rel else f for f in filenames)
        out.extend(f"{rel}/{d}" if rel else d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))
    return sorted(out)


def _commits(tree: Path) -> int | None:
    if not (tree / ".git").is_dir() or shutil.which("git") is None:
        return None
    proc = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(tree), "rev-list", "--all", "--count"],
        capture_output=True,
        text=True,
        check=False,
    )
    return int(proc.stdout) if proc.returncode == 0 else None


class _Round:
    """One contender's round: its keeper on the workspace, a state directory of its own. Uses
    only what both revisions have (see the module docstring for the shims)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import airlockd
        from airlockd.policy import Level, load_policy
        from airlockd.redact import Redactor
        from airlockd.runs.execution import AGENT_UID
        from airlockd.staging import capfs, overlay
        from airlockd.staging.keeper import MirrorKeeper
        from airlockd.staging.stagers import OverlayStager

        code = Path(cfg["code"]).resolve()
        if not Path(airlockd.__file__).resolve().is_relative_to(code):
            raise SystemExit(f"imported {airlockd.__file__}, not the airlockd of {code}")
        self.cfg, self.level, self.capfs = cfg, Level.INTERNAL, capfs
        self.ws, self.state = Path(cfg["workspace"]), Path(cfg["state"])
        self.policy = load_policy(self.ws).policy
        self.redactor = Redactor()
        if hasattr(self.redactor, "add_detectors"):  # shim: as the current Service's redactor
            self.redactor.add_detectors(*(d.detector for d in self.policy.withhold.custom))
        self.owner = AGENT_UID if os.getuid() == 0 else None  # as runs/execution.mirror_owner()
        self.state.mkdir(parents=True)
        self.capped = capfs.available() is None
        self.no_overlay = overlay.unavailable(self.state)
        self.keeper = MirrorKeeper(self.ws, self.state)
        self.keeper.start()
        self.stager = OverlayStager("benchmark")
        self.walks = 0
        self.repo: list[float] = []  # seconds in the fresh repository's refresh (current code only)
        self._count_walks()
        self._time_repo()

    def _count_walks(self) -> None:
        walk = self.keeper._walk

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.walks += 1
            return walk(*args, **kwargs)

        self.keeper._walk = counted  # type: ignore[method-assign]

    def _time_repo(self) -> None:
        try:  # the current code only: the baseline has no fresh repository
            from airlockd.staging import mirrorrepo
        except ImportError:
            return
        refresh = mirrorrepo.MIRRORS.refresh

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return refresh(*args, **kwargs)
            finally:
                self.repo.append(time.perf_counter() - t0)

        mirrorrepo.MIRRORS.refresh = timed  # type: ignore[method-assign]

    def refresh(self, run_id: str | None = None, walk: bool = False) -> Any:
        return self.keeper.refresh(
            self.policy,
            self.level,
            owner=self.owner,
            redactor=self.redactor,
            run_id=run_id,
            is_live=lambda r: False,  # every earlier run has ended
            walk=walk,
        )

    def stage(self, i: int, time_it: Callable[[Callable[[], object]], float]) -> tuple[float, Any, Any]:
        """Edit this step's files (untimed), then stage a run as the daemon does (timed);
        (seconds, Staged, the run's lower layer), the run's staging undone after."""
        from airlockd.staging.base import StageRequest

        for rel in self.cfg["edits"][i]:
            with open(self.ws / rel, "ab") as fh:
                fh.write(f"# edit {self.cfg['label']} {self.cfg['round']} {i}\n".encode())
        self.keeper.drain()  # the daemon drains when the watcher's queue is readable
        run_id = f"bench{i}"
        run_dir = self.state / "runs" / run_id
        run_dir.mkdir(parents=True)
        req = StageRequest(
            run_dir=run_dir,
            workspace=self.ws,
            policy=self.policy,
            clearance=self.level,
            owner=self.owner,
            redactor=self.redactor,
            growth=self.policy.defaults.limits.workspace_growth_mb * 2**20,
            capped=self.capped,
            refresh=lambda: self.refresh(run_id),
            screen=lambda tree, result, hide: None,  # no label classifier
        )
        got: list[Any] = []
        try:
            took = time_it(lambda: got.append(self.stager.stage(req)))
            lower = self.stager.layers(run_dir).lower
            last = self.cfg["sanity"] and i == len(self.cfg["edits"]) - 1
            files = _files_of(lower) if last else None
            return took, got[0], (files, _commits(lower) if files is not None else None)
        finally:
            if self.capped and self.capfs.is_mount(run_dir / "staging"):
                self.capfs.unmount(run_dir / "staging")
            self.stager.release(run_dir, lambda r: False)

    def describe(self) -> str:
        if self.no_overlay is not None:
            return f"overlay UNAVAILABLE ({self.no_overlay}): its staging steps measured all the same"
        return f"overlay ({'capped tmpfs upper layer' if self.capped else 'uncapped: ' + str(self.capfs.available())})"


def _simple_pathspec() -> None:
    """pathspec's "best" backend as its `re` one, in whichever revision runs (shim: see the module
    docstring); a pathspec without backends is left as it is."""
    try:
        from pathspec._backends import agg
    except ImportError:
        return
    agg._BEST_BACKEND = "simple"


def _measure(cfg_file: str) -> None:
    """One contender's round (see the module docstring); prints one JSON line."""
    import cProfile

    import airlockd

    cfg = json.loads(Path(cfg_file).read_text())
    _simple_pathspec()
    rnd = _Round(cfg)
    profile = Path(cfg["profile"]) if cfg["profile"] else None
    profs = {"cold": cProfile.Profile(), "steps": cProfile.Profile()}

    def timer(kind: str) -> Callable[[Callable[[], object]], float]:
        return lambda fn: _timed((lambda: profs[kind].runcall(fn)) if profile else fn)

    out: dict[str, Any] = {"airlockd": airlockd.__file__, "steps": [], "reads": [], "keeper": rnd.keeper.why}
    try:
        out["cold"] = timer("cold")(rnd.refresh)
        out["repo_cold"] = sum(rnd.repo)
        time.sleep(0.05)
        rnd.refresh(walk=True)  # past the cold build's racy entries
        rnd.walks, out["repo_steps"] = 0, []
        for i in range(len(cfg["edits"])):
            del rnd.repo[:]
            took, staged, (files, commits) = rnd.stage(i, timer("steps"))
            if i:  # the first is a warm-up
                out["steps"].append(took)
                out["repo_steps"].append(sum(rnd.repo))
                out["reads"].append(staged.mirror.get("read"))
        out.update(walks=rnd.walks, stager=rnd.describe(), files=files, git_commits=commits)
        out["withheld"] = [[w.path, w.rule] for w in staged.result.withheld]
    finally:
        rnd.keeper.close()
    if profile:
        profile.mkdir(parents=True, exist_ok=True)
        for kind, prof in profs.items():
            prof.dump_stats(str(profile / f"{cfg['label']}-{cfg['round']}-{kind}.prof"))
    print(json.dumps(out))


if __name__ == "__main__":
    _measure(sys.argv[1])
