import assert from "node:assert/strict";
import { test } from "node:test";

import { evidenceTree, type Node } from "../../src/logic/evidence";
import type { Evidence } from "../../src/logic/protocol";
import { AirlockState } from "../../src/logic/state";
import { modProposal } from "./fixtures";

// a key the tree must never show, as a newer daemon might add one
const envWithheld = { path: ".env", rule: "withhold:.env", value_sha256: "never shown" };

const ev: Evidence = {
  runId: "r1",
  run: "r1",
  agent: "bot",
  state: "proposed",
  mode: "review",
  policy: { revision: "p-abc123", file: null, show: "airlockd policy show p-abc123", current: true, snapshot: "{}" },
  admission: { prompt_sha256: "0".repeat(64), injection_markers: [], detail: "admitted" },
  rules: [
    { path: "src/mod.py", change: "modified", decision: "auto", rule: "rules[2]", reason: "ordinary source code" },
    { path: "src/new.py", change: "created", decision: "auto", rule: "rules[2]", reason: "ordinary source code" },
    { path: "AGENTS.md", change: "modified", decision: "deny", rule: "invariant:protected", reason: "protected" },
  ],
  rulesFired: [
    { rule: "rules[2]", decision: "auto", reason: "ordinary source code", paths: ["src/mod.py", "src/new.py"] },
    { rule: "invariant:protected", decision: "deny", reason: "protected", paths: ["AGENTS.md"] },
  ],
  decisions: [],
  classifier: [],
  withheld: [envWithheld],
  container: { network_mode: "none", cap_drop: ["ALL"], exit_code: 0 },
  tokens: { used: 0, source: "not metered" },
  workspace: { unchanged: true },
  resources: {
    effective: { memory_bytes: 1073741824, cpus: 1 },
    peak: {},
    duration_s: 1.5,
    output_bytes: 42,
    limit_hit: null,
    container: { image: "airlockd-runtime", exit_code: 0, duration_s: 1.5, effective: { network_mode: "none", cap_drop: ["ALL"], cap_add: null, memory_bytes: 1073741824, cpus: 1 } },
    outputBytes: 42,
    tokens: 0,
    limit: null,
  },
  transitions: [{ state: "admitted", at: 1 }],
  timeline: [{ seq: 0, at: 1700000000, kind: "admission.admitted", run: "r1", data: { reason: null } }],
  applied: [],
};

function find(nodes: Node[], label: string): Node {
  const n = nodes.find((x) => x.label === label);
  assert.ok(n, `no node ${label}`);
  return n;
}

test("evidence tree: policy revision, rules hit, withheld names only, network, capabilities, peaks, timeline", () => {
  const tree = evidenceTree(ev, { cpuPct: 87.4, memBytes: 200 * 1024 * 1024 });
  assert.equal(find(tree, "policy").description, "revision p-abc123");
  const rules = find(tree, "rules hit");
  assert.equal(rules.description, "2");
  assert.deepEqual(find(rules.children!, "rules[2]").children!.map((c) => c.label), ["src/mod.py (modified)", "src/new.py (created)"]);
  const withheld = find(tree, "withheld files");
  assert.deepEqual(withheld.children!.map((c) => c.label), [".env"]);
  assert.ok(!JSON.stringify(withheld).includes("never shown"));
  const container = find(tree, "container");
  assert.equal(container.description, "network none · runtime runc");
  assert.equal(find(container.children!, "runtime").description, "runc");
  assert.equal(find(container.children!, "capabilities dropped").description, "ALL");
  const res = find(tree, "resources");
  assert.equal(find(res.children!, "peak memory").description, "200 MB");
  assert.equal(find(res.children!, "peak CPU").description, "87%");
  assert.equal(find(res.children!, "memory limit").description, "1.0 GB");
  const tl = find(tree, "audit timeline");
  assert.equal(tl.children![0].label, "admission.admitted");
});

test("evidence tree: a gVisor run names its runtime and its process cap inside gVisor's kernel", () => {
  const effective = { network_mode: "none", runtime: "runsc", pids_limit: 576, ulimits: { nproc: [40, 40] } };
  const hard: Evidence = { ...ev, resources: { ...ev.resources!, container: { ...ev.resources!.container, runtime: "runsc", effective } } };
  const tree = evidenceTree(hard);
  const container = find(tree, "container");
  assert.equal(container.description, "network none · runtime runsc");
  assert.match(find(container.children!, "runtime").description!, /gVisor/);
  const res = find(tree, "resources");
  assert.equal(find(res.children!, "pids limit").description, "40 (nproc, in gVisor; host backstop 576)");
});

test("state: peaks from runStatus samples; proposals mark the run", () => {
  const s = new AirlockState();
  let changes = 0;
  s.onChange(() => changes++);
  const base = { runId: "r1", agent: "bot", elapsedS: 1, outputBytes: 0, tokens: 0 };
  s.setRunStatus({ ...base, state: "running", cpuPct: 50, memBytes: 10 });
  s.setRunStatus({ ...base, state: "running", cpuPct: 20, memBytes: 30 });
  assert.deepEqual(s.peaks.get("r1"), { cpuPct: 50, memBytes: 30 });
  assert.equal(s.liveRuns().length, 1);
  s.setProposal(modProposal());
  assert.equal(s.liveRuns().length, 0);
  assert.equal(s.open().length, 1);
  s.setAgentStatus({ agent: "bot", quarantined: true, reason: "x", runsUsed: 1, tokensUsed: 0 });
  assert.equal(s.agents.get("bot")!.quarantined, true);
  assert.equal(changes, 4);
});

test("evidence tree: what the package broker let through and refused, escaped; no node without a broker", () => {
  assert.equal(evidenceTree(ev).find((n) => n.label === "package broker"), undefined);
  const withBroker: Evidence = {
    ...ev,
    egress: {
      allowed: ["pkgs.example.org:443", "127.0.0.1:8443"],
      tunnels: 3,
      bytes: 3 * 1024 * 1024,
      hosts: [{ host: "127.0.0.1:8443", bytes: 3 * 1024 * 1024 }],
      refused: 22,
      refusals: [
        { host: "evil.example", port: 443, status: 403, reason: "evil.example:443 is not in the broker's allow-list\u001b]52;c;eA==\u0007" },
        { target: "nonsense", status: 400, reason: "CONNECT needs host:port" },
      ],
    },
  };
  const broker = find(evidenceTree(withBroker), "package broker");
  assert.equal(broker.description, "3 tunnels · 3.0 MB · 22 refused");
  assert.equal(find(broker.children ?? [], "allowed").description, "pkgs.example.org:443, 127.0.0.1:8443");
  assert.equal(find(broker.children ?? [], "reached").children?.[0]?.label, "127.0.0.1:8443");
  const refused = find(broker.children ?? [], "refused").children ?? [];
  assert.equal(refused[0]?.label, "evil.example:443");
  assert.ok(!refused[0]?.description?.includes("\u001b"), "a terminal escape reaches the tree");
  assert.equal(refused[1]?.label, "nonsense");
  assert.equal(refused[2]?.label, "20 more");
});
