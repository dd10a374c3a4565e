import assert from "node:assert/strict";
import { test } from "node:test";

import {
  AirlockdNotFound,
  buildServerCommand,
  debounce,
  findAirlockd,
  readSettings,
  type Timers,
} from "../../src/logic/serverCommand";
import { bytes, count, duration } from "../../src/logic/format";

const get = (values: Record<string, unknown>) => (key: string) => values[key];

/** A fake filesystem: these paths exist and are executable, nothing else. */
const fakeFs = (...paths: string[]) => {
  const asked: string[] = [];
  const isExecutable = (p: string): boolean => {
    asked.push(p);
    return paths.includes(p);
  };
  return { isExecutable, asked };
};

const ENV = { PATH: "/usr/local/bin:/usr/bin", HOME: "/home/ann" };

test("default: airlockd found on PATH, stdio, the workspace folder", () => {
  const fs = fakeFs("/usr/bin/airlockd", "/ws/.venv/bin/airlockd");
  const cmd = buildServerCommand(readSettings(get({}), "/ws"), "/ws", { ...ENV, GONE: undefined }, fs.isExecutable);
  assert.equal(cmd.command, "/usr/bin/airlockd");
  assert.equal(cmd.source, "on PATH");
  assert.deepEqual(cmd.args, ["--workspace", "/ws", "serve", "--stdio"]);
  assert.equal(cmd.cwd, "/ws");
  assert.deepEqual(cmd.env, ENV);
  assert.deepEqual(fs.asked, ["/usr/local/bin/airlockd", "/usr/bin/airlockd"]);
});

test("the contributed default path (a bare airlockd) searches too", () => {
  const s = readSettings(get({ path: ["airlockd"] }), "/ws");
  assert.deepEqual(s.path, []);
  const cmd = buildServerCommand(s, "/ws", ENV, fakeFs("/ws/.venv/bin/airlockd").isExecutable);
  assert.equal(cmd.command, "/ws/.venv/bin/airlockd");
});

test("search order: PATH, the workspace's .venv, venv, then ~/.local/bin", () => {
  const all = ["/usr/bin/airlockd", "/ws/.venv/bin/airlockd", "/ws/venv/bin/airlockd", "/home/ann/.local/bin/airlockd"];
  const where = ["on PATH", "in the workspace's .venv", "in the workspace's venv", "in ~/.local/bin"];
  for (let i = 0; i < all.length; i++) {
    const found = findAirlockd("/ws", ENV, fakeFs(...all.slice(i)).isExecutable);
    assert.deepEqual(found, { path: all[i], where: where[i] });
  }
  // empty and relative PATH entries are not guessed at; PATH and HOME may be missing altogether
  const fs = fakeFs();
  assert.throws(() => findAirlockd("/ws", { PATH: ":bin:/opt/x/" }, fs.isExecutable), AirlockdNotFound);
  assert.deepEqual(fs.asked, ["/opt/x/airlockd", "/ws/.venv/bin/airlockd", "/ws/venv/bin/airlockd"]);
});

test("the daemon's environment is the one searched: airlockd.env can set PATH", () => {
  const s = readSettings(get({ env: { PATH: "/opt/air/bin" } }), "/ws");
  const cmd = buildServerCommand(s, "/ws", ENV, fakeFs("/opt/air/bin/airlockd", "/usr/bin/airlockd").isExecutable);
  assert.equal(cmd.command, "/opt/air/bin/airlockd");
  assert.equal(cmd.env.PATH, "/opt/air/bin");
});

test("nothing found: the error names the places looked at and the setting to set", () => {
  const s = readSettings(get({}), "/ws");
  let err: unknown;
  try {
    buildServerCommand(s, "/ws", ENV, fakeFs("/ws/bin/airlockd").isExecutable);
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof AirlockdNotFound);
  assert.deepEqual(err.looked, ["/ws/.venv/bin/airlockd", "/ws/venv/bin/airlockd", "/home/ann/.local/bin/airlockd"]);
  for (const part of ["on PATH", "/ws/.venv/bin/airlockd", "/ws/venv/bin/airlockd", "/home/ann/.local/bin/airlockd", "make setup", '"airlockd.path"', '"airlockd.interpreter"']) {
    assert.ok(err.message.includes(part), `${part} missing from: ${err.message}`);
  }
});

test("interpreter wins over path and runs the module; no search", () => {
  const s = readSettings(
    get({ path: ["/x/airlockd"], interpreter: ["${workspaceFolder}/.venv/bin/python"], serverArgs: ["-v"], env: { AIRLOCK_STATE_DIR: "${workspaceFolder}/.st", N: 3 } }),
    "/ws",
  );
  const fs = fakeFs();
  const cmd = buildServerCommand(s, "/ws", {}, fs.isExecutable);
  assert.equal(cmd.command, "/ws/.venv/bin/python");
  assert.equal(cmd.source, "airlockd.interpreter");
  assert.deepEqual(cmd.args, ["-P", "-m", "airlockd", "--workspace", "/ws", "-v", "serve", "--stdio"]);
  assert.deepEqual(cmd.env, { AIRLOCK_STATE_DIR: "/ws/.st" });
  assert.deepEqual(fs.asked, []);
});

test("path with leading arguments, used as set; malformed settings fall back to defaults", () => {
  const fs = fakeFs();
  const cmd = buildServerCommand(readSettings(get({ path: ["/opt/air", "--quiet"] }), "/w"), "/w", {}, fs.isExecutable);
  assert.equal(cmd.command, "/opt/air");
  assert.equal(cmd.source, "airlockd.path");
  assert.deepEqual(cmd.args.slice(0, 3), ["--quiet", "--workspace", "/w"]);
  assert.deepEqual(fs.asked, []);
  const bad = readSettings(get({ path: "airlockd", interpreter: [1, ""], env: "x" }), "/w");
  assert.deepEqual(bad, { path: [], interpreter: [], serverArgs: [], env: {} });
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
