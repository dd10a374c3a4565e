import assert from "node:assert/strict";
import { test } from "node:test";

import type { AgentInfo, RunStatus } from "../../src/logic/protocol";
import { statusView, usages, type StatusInput } from "../../src/logic/status";
import { modProposal } from "./fixtures";

const agent: AgentInfo = {
  agent: "bot",
  adapter: "command",
  mode: "review",
  consecutiveViolations: 0,
  quarantined: false,
  reason: null,
  runsUsed: 1,
  tokensUsed: 0,
  limits: { memory_mb: 1024, wall_time_s: 100, output_bytes: 1000, cpus: 1 },
  admission: { max_tokens: 0 },
};

function running(extra: Partial<RunStatus> = {}): RunStatus {
  return { runId: "r1", agent: "bot", state: "running", elapsedS: 12, cpuPct: 35, memBytes: 100 * 1024 * 1024, outputBytes: 10, tokens: 1200, ...extra };
}

function input(extra: Partial<StatusInput> = {}): StatusInput {
  return { runs: [], proposals: [], agents: [agent], connected: true, hasFinishedRun: false, ...extra };
}

test("idle", () => {
  const v = statusView(input());
  assert.equal(v.phase, "idle");
  assert.equal(v.background, undefined);
  assert.deepEqual(v.actions, ["runTask", "showLog", "restart"]);
});

test("running: spinner, elapsed, CPU, memory against the limit, tokens", () => {
  const v = statusView(input({ runs: [running()] }));
  assert.equal(v.phase, "running");
  assert.match(v.text, /^\$\(sync~spin\) bot running 12s · CPU 35% · 100 MB\/1\.0 GB · 1\.2k tok$/);
  assert.equal(v.background, undefined);
  assert.deepEqual(v.actions.slice(0, 2), ["stopRun", "killRun"]);
});

test("warning background above 80% of any limit", () => {
  assert.equal(statusView(input({ runs: [running({ memBytes: 900 * 1024 * 1024 })] })).background, "warning");
  assert.equal(statusView(input({ runs: [running({ elapsedS: 81 })] })).background, "warning");
  assert.equal(statusView(input({ runs: [running({ elapsedS: 80 })] })).background, undefined);
  const v = statusView(input({ runs: [running({ outputBytes: 900 })] }));
  assert.equal(v.background, "warning");
  assert.match(v.tooltip, /output limit/);
  const tokenAgent = { ...agent, tokensUsed: 700, admission: { max_tokens: 1000 } };
  assert.equal(statusView(input({ agents: [tokenAgent], runs: [running({ tokens: 200 })] })).background, "warning");
  assert.deepEqual(
    usages(running(), { ...agent, limits: {} }).map((u) => u.what),
    [],
  );
});

test("reviewing: N hunks in M files, review actions", () => {
  const v = statusView(input({ proposals: [modProposal()] }));
  assert.equal(v.phase, "reviewing");
  assert.equal(v.text, "$(git-pull-request) airlock: 4 hunks in 3 files");
  assert.ok(v.actions.includes("acceptAll") && v.actions.includes("reviewRun"));
  assert.ok(!v.actions.includes("killRun"));
});

test("quarantined: error background and release offered", () => {
  const q = { ...agent, quarantined: true, reason: "3 limit violations" };
  const v = statusView(input({ agents: [q] }));
  assert.equal(v.phase, "quarantined");
  assert.equal(v.background, "error");
  assert.equal(v.actions[0], "releaseAgent");
  assert.match(v.tooltip, /3 limit violations/);
  // error wins over warning while something else runs
  assert.equal(statusView(input({ agents: [q], runs: [running({ memBytes: 2e9 })] })).background, "error");
});

test("disconnected", () => {
  const v = statusView(input({ connected: false }));
  assert.match(v.text, /off/);
  assert.deepEqual(v.actions, ["restart", "showLog"]);
});

test("finished runs are not running", () => {
  const v = statusView(input({ runs: [running({ state: "applied" })], hasFinishedRun: true }));
  assert.equal(v.phase, "idle");
  assert.ok(v.actions.includes("undoRun") && v.actions.includes("followUp"));
});
