"""Live containment of one running agent: resource sampling with peaks, output and token
counting, the token budget enforced mid-flight, and the facts a limit violation is recorded with.

Sampling runs on its own thread, at most once a second; every figure comes from the engine's or
the kernel's own accounting (docker stats, cgroup OOM flag, byte counts, statvfs), never from the
agent's word — except tokens when the run has no model gateway: then the agent adapter's usage
reports are all there is. With the gateway, tokens are what it measured on the upstream's responses
(`add_tokens`), and the agent's own reports are ignored (never counted twice).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from airlockd.errors import AirlockError
from airlockd.policy import Limits
from airlockd.records import LimitHit
from airlockd.sandbox.base import ExitInfo, Sandbox

log = logging.getLogger(__name__)

SAMPLE_INTERVAL_S = 1.0
MAX_LINE = 64 * 1024  # a usage report longer than this is not one


def tokens_in(line: bytes) -> int:
    """Model tokens an agent reported on one output line (Codex's `turn.completed` JSON events,
    or any JSON object with a `usage` block); 0 for anything else."""
    if b'"usage"' not in line:
        return 0
    try:
        event = json.loads(line)
    except ValueError:
        return 0
    usage = event.get("usage") if isinstance(event, dict) else None
    if not isinstance(usage, dict):
        return 0
    if isinstance(usage.get("total_tokens"), int):
        return int(usage["total_tokens"])
    return sum(int(usage.get(k) or 0) for k in ("input_tokens", "output_tokens") if isinstance(usage.get(k), int))


class RunMonitor:
    """Watches one run while its container lives. Thread-safe; `on_output` is the sandbox's
    output callback, `publish(sample)` is called after each sample (persist + notify)."""

    def __init__(
        self,
        sandbox: Sandbox,
        run_id: str,
        limits: Limits,
        *,
        used_bytes: Callable[[], int | None],
        staged_bytes: int,
        tokens_left: int | None,
        publish: Callable[[dict[str, Any]], None],
        tokens_from: str = "agent",  # "gateway": only the gateway's measured usage counts
    ) -> None:
        self.sandbox = sandbox
        self.run_id = run_id
        self.limits = limits
        self.used_bytes = used_bytes  # what the capped filesystem holds now; None: not capped
        self.staged_bytes = staged_bytes
        self.tokens_left = tokens_left
        self.publish = publish
        self.tokens_from = tokens_from
        self.started = time.monotonic()
        # "pids" only once a sample counts the agent's processes (never under gVisor: docker.py)
        self.peak: dict[str, float] = {"cpu_pct": 0.0, "mem_bytes": 0.0, "mem_max_bytes": 0.0}
        self.output_bytes = 0
        self.tokens = 0
        self.growth_bytes = 0
        self.capped = False  # whether a sample found the capped filesystem
        self.token_hit = False
        self._partial = b""
        self._lock = threading.Lock()
        self._publishing = threading.Lock()  # held while a sample is published; finish() waits for it
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"monitor-{run_id}", daemon=True)

    # -- output ---------------------------------------------------------------------------

    def on_output(self, chunk: bytes) -> None:
        with self._lock:
            self.output_bytes += len(chunk)
            data = self._partial + chunk
            *lines, self._partial = data.split(b"\n")
            if len(self._partial) > MAX_LINE:
                self._partial = b""
            for line in lines if self.tokens_from != "gateway" else ():
                self.tokens += tokens_in(line)
            over = self.tokens_left is not None and self.tokens >= self.tokens_left and not self.token_hit
            if over:
                self.token_hit = True
        if over:
            log.warning("run %s spent its token budget; stopping it", self.run_id)
            threading.Thread(target=self._stop_for_tokens, daemon=True).start()

    def add_tokens(self, tokens: int) -> bool:
        """Tokens the model gateway measured; True when the budget is spent (the gateway then
        cuts the stream, and the run is stopped)."""
        with self._lock:
            self.tokens += tokens
            spent = self.tokens_left is not None and self.tokens >= self.tokens_left
            first = spent and not self.token_hit
            if first:
                self.token_hit = True
        if first:
            log.warning("run %s spent its token budget at the gateway; stopping it", self.run_id)
            threading.Thread(target=self._stop_for_tokens, daemon=True).start()
        return spent

    def _stop_for_tokens(self) -> None:
        try:
            self.sandbox.stop(self.run_id, self.limits.grace_s)
        except Exception:  # the run may already be over
            log.exception("stopping run %s for its token budget failed", self.run_id)

    # -- sampling -------------------------------------------------------------------------

    def start(self) -> RunMonitor:
        self._thread.start()
        return self

    def finish(self) -> None:
        """Sampling ends; once this returns no sample is published (a sample still with the engine
        is dropped when it comes back)."""
        self._done.set()
        self._thread.join(timeout=5)
        with self._publishing:
            pass
        self._sample_growth()

    def _sample_growth(self) -> None:
        try:
            used = self.used_bytes()
        except AirlockError as exc:  # the engine that holds it did not answer: the next sample may
            log.warning("cannot measure the growth of run %s: %s", self.run_id, exc)
            return
        if used is not None:
            self.capped = True
            self.growth_bytes = max(self.growth_bytes, used - self.staged_bytes)

    def _loop(self) -> None:
        while not self._done.wait(SAMPLE_INTERVAL_S):
            try:
                sample = self.sandbox.stats(self.run_id)  # about a second: two engine samples
            except Exception:
                log.exception("sampling run %s failed", self.run_id)
                sample = None
            if self._done.is_set():
                return
            self._sample_growth()
            with self._lock:
                if sample:
                    for key, value in sample.items():
                        self.peak[key] = max(self.peak.get(key, 0.0), value)
                snapshot = {
                    **(sample or {}),
                    "elapsed_s": round(time.monotonic() - self.started, 1),
                    "output_bytes": self.output_bytes,
                    "tokens": self.tokens,
                    "growth_bytes": self.growth_bytes,
                    "peak": dict(self.peak),
                }
            with self._publishing:
                if self._done.is_set():
                    return
                self.publish(snapshot)

    # -- verdict --------------------------------------------------------------------------

    def limit_hit(self, info: ExitInfo) -> LimitHit | None:
        """The limit that ended the run, with the measured value, or None."""
        lim = self.limits
        if self.token_hit and self.tokens_left is not None:
            return LimitHit(
                limit="tokens",
                measured=self.tokens,
                allowed=self.tokens_left,
                source="model gateway's measured usage"
                if self.tokens_from == "gateway"
                else "agent adapter's usage report",
            )
        counted = info.counters  # the kernel's own figures, read from the cgroup while it ran
        if info.oom_killed or counted.oom_kills:
            cap = lim.memory_mb * 2**20
            sampled = max(self.peak.get("mem_max_bytes", 0.0), self.peak.get("mem_bytes", 0.0))
            flag = "engine State.OOMKilled" if info.oom_killed else f"{counted.source}: oom_kill {counted.oom_kills}"
            if sampled >= cap * 0.9:
                measured, source = sampled, f"{flag}; measured: cgroup peak usage sampled"
            else:  # killed between two samples: the kernel's OOM kill itself says usage hit the cap
                measured, source = cap, f"{flag}: usage reached the hard limit (no swap)"
            return LimitHit(limit="memory", measured=measured, allowed=cap, source=source)
        if counted.backstop_hits:  # gVisor's own threads met the host's backstop: the sandbox died of it
            return LimitHit(
                limit="pids",
                measured=lim.pids,
                allowed=lim.pids,
                source=(
                    f"{counted.source} (gVisor host backstop: max {counted.backstop_hits}; the sandbox's threads"
                    " reached the host's cap for it, which ends the sandbox; its processes were near their cap)"
                ),
            )
        if counted.pids_refused or counted.pids_peak >= lim.pids:  # even when the agent gave up at once
            why = f"max {counted.pids_refused}: forks refused at the cap" if counted.pids_refused else "peak at the cap"
            return LimitHit(
                limit="pids",
                measured=max(counted.pids_peak, self.peak.get("pids", 0.0)) or lim.pids,
                allowed=lim.pids,
                source=f"{counted.source} ({why})",
            )
        if self.peak.get("pids", 0) >= lim.pids:  # forks were refused at the cap: a fork bomb's mark
            return LimitHit(
                limit="pids", measured=self.peak["pids"], allowed=lim.pids, source="cgroup pids.current sampled"
            )
        if info.timed_out:
            return LimitHit(
                limit="wall_time", measured=round(info.duration_s, 3), allowed=lim.wall_time_s, source="engine wait"
            )
        if info.output_limited:
            return LimitHit(
                limit="output",
                measured=info.output_bytes,
                allowed=lim.output_bytes,
                source="bytes read from the stream",
            )
        cap = lim.workspace_growth_mb * 2**20
        if self.capped and self.growth_bytes >= cap - (1 << 20):
            return LimitHit(
                limit="workspace_growth",
                measured=self.growth_bytes,
                allowed=cap,
                source="statvfs of the capped staging filesystem (on the host, or in the engine's holder)",
            )
        return None
