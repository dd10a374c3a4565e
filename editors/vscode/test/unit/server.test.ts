import assert from "node:assert/strict";
import { test } from "node:test";

import { buildServerCommand, debounce, readSettings, type Timers } from "../../src/logic/serverCommand";
import { bytes, count, duration } from "../../src/logic/format";

const get = (values: Record<string, unknown>) => (key: string) => values[key];

test("default: airlockd on PATH, stdio, the workspace folder", () => {
  const cmd = buildServerCommand(readSettings(get({}), "/ws"), "/ws", { PATH: "/bin", GONE: undefined });
  assert.equal(cmd.command, "airlockd");
  assert.deepEqual(cmd.args, ["--workspace", "/ws", "serve", "--stdio"]);
  assert.equal(cmd.cwd, "/ws");
  assert.deepEqual(cmd.env, { PATH: "/bin" });
});

test("interpreter wins over path and runs the module", () => {
  const s = readSettings(
    get({ path: ["/x/airlockd"], interpreter: ["${workspaceFolder}/.venv/bin/python"], serverArgs: ["-v"], env: { AIRLOCK_STATE_DIR: "${workspaceFolder}/.st", N: 3 } }),
    "/ws",
  );
  const cmd = buildServerCommand(s, "/ws", {});
  assert.equal(cmd.command, "/ws/.venv/bin/python");
  assert.deepEqual(cmd.args, ["-m", "airlockd", "--workspace", "/ws", "-v", "serve", "--stdio"]);
  assert.deepEqual(cmd.env, { AIRLOCK_STATE_DIR: "/ws/.st" });
});

test("path with leading arguments; malformed settings fall back to defaults", () => {
  const cmd = buildServerCommand(readSettings(get({ path: ["/opt/air", "--quiet"] }), "/w"), "/w");
  assert.equal(cmd.command, "/opt/air");
  assert.deepEqual(cmd.args.slice(0, 3), ["--quiet", "--workspace", "/w"]);
  const bad = readSettings(get({ path: "airlockd", interpreter: [1, ""], env: "x" }), "/w");
  assert.deepEqual(bad, { path: ["airlockd"], interpreter: [], serverArgs: [], env: {} });
});

test("debounce: a burst of restarts is one restart after the last", () => {
  let now = 0;
  const pending: { at: number; fn: () => void; id: number }[] = [];
  let next = 0;
  const timers: Timers = {
    setTimeout: (fn, ms) => {
      const id = next++;
      pending.push({ at: now + ms, fn, id });
      return id;
    },
    clearTimeout: (id) => {
      const i = pending.findIndex((p) => p.id === id);
      if (i >= 0) pending.splice(i, 1);
    },
  };
  const advance = (ms: number): void => {
    now += ms;
    for (const p of pending.filter((x) => x.at <= now)) {
      pending.splice(pending.indexOf(p), 1);
      p.fn();
    }
  };
  let calls = 0;
  const restart = debounce(() => calls++, 500, timers);
  restart();
  advance(300);
  restart();
  advance(300);
  restart();
  assert.equal(calls, 0);
  advance(500);
  assert.equal(calls, 1);
  restart();
  restart.cancel();
  advance(1000);
  assert.equal(calls, 1);
});

test("formatting", () => {
  assert.equal(bytes(0), "0 B");
  assert.equal(bytes(1536), "1.5 KB");
  assert.equal(bytes(1024 ** 3), "1.0 GB");
  assert.equal(bytes(300 * 1024 * 1024), "300 MB");
  assert.equal(duration(5), "5s");
  assert.equal(duration(125), "2m05s");
  assert.equal(duration(3 * 3600 + 60), "3h01m");
  assert.equal(count(999), "999");
  assert.equal(count(12_345), "12k");
});
