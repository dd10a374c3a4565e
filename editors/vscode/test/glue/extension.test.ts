/** The glue against the `vscode` stub and a fake daemon: commands, status bar, review UI, and that
 * nothing but `airlock.approve` ever changes a file. */

import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { beforeEach, test } from "node:test";

import * as vscode from "vscode";

import type { Daemon } from "../../src/logic/state";
import { activateWith, type Extension } from "../../src/main";
import { ATTACKS, LOOKALIKE, LOOKALIKE_MARK, MOD, UNDRAWN, file, hostileProposal, hunk, modProposal, proposal } from "../unit/fixtures";
import * as stub from "./vscode-stub";

const world = stub.world;

class FakeDaemon implements Daemon {
  requests: { command: string; args: object }[] = [];
  answers: Record<string, (args: Record<string, unknown>) => unknown> = {};
  handlers = new Map<string, (p: unknown) => void>();
  ready: ((r: boolean) => void)[] = [];
  restarts = 0;
  async request<T>(command: string, args: object = {}): Promise<T> {
    this.requests.push({ command, args });
    const a = this.answers[command];
    if (!a) throw Object.assign(new Error(`no answer for ${command}`), { code: -32601 });
    return a(args as Record<string, unknown>) as T;
  }
  onNotification(method: string, handler: (p: unknown) => void): void {
    this.handlers.set(method, handler);
  }
  onReady(h: (r: boolean) => void): void {
    this.ready.push(h);
  }
  notify(method: string, params: unknown): void {
    this.handlers.get(method)!(params);
  }
  restart(): void {
    this.restarts++;
  }
  showLog(): void {}
  log(): void {}
  async dispose(): Promise<void> {}
  sent(command: string): object[] {
    return this.requests.filter((r) => r.command === command).map((r) => r.args);
  }
}

let root: string;
let daemon: FakeDaemon;
let ext: Extension;
const pkg = JSON.parse(fs.readFileSync(path.join(__dirname, "../../../../package.json"), "utf8"));

function context(): vscode.ExtensionContext {
  return { subscriptions: [] } as unknown as vscode.ExtensionContext;
}

const AGENTS = [
  { agent: "bot", adapter: "command", mode: "review", quarantined: false, reason: null, runsUsed: 0, tokensUsed: 0, limits: { memory_mb: 128, wall_time_s: 60 }, admission: { max_tokens: 0 } },
];

beforeEach(() => {
  world.reset();
  root = fs.mkdtempSync(path.join(os.tmpdir(), "airlock-glue-"));
  fs.mkdirSync(path.join(root, "src"));
  fs.writeFileSync(path.join(root, "src/mod.py"), MOD);
  world.workspaceRoot = root;
  daemon = new FakeDaemon();
  daemon.answers["airlock.listAgents"] = () => AGENTS;
  daemon.answers["airlock.listRuns"] = () => [];
  daemon.answers["airlock.getProposal"] = () => modProposal();
  ext = activateWith(context(), () => daemon)!;
  for (const r of daemon.ready) r(true);
});

function statusItem(): stub.StatusBarItem {
  return world.statusItems.find((i) => i.id === "airlockd.status")!;
}

test("every contributed command is registered, and every registered command is contributed", () => {
  const contributed = new Set<string>(pkg.contributes.commands.map((c: { command: string }) => c.command));
  const registered = new Set([...world.commands.keys()].filter((c) => c.startsWith("airlockd.")));
  registered.delete("airlockd.revealHunk"); // internal: the review tree's hunk items
  assert.deepEqual([...registered].sort(), [...contributed].sort());
  for (const kb of pkg.contributes.keybindings) {
    assert.match(kb.when, /airlock\.(reviewActive|hunkAtCursor)/, `${kb.command} must be scoped to a review`);
  }
});

test("status bar: idle → running → reviewing; quarantine is an error background", async () => {
  await new Promise((r) => setImmediate(r));
  assert.equal(statusItem().text, "$(shield) airlock");
  daemon.notify("airlock/runStatus", { runId: "r1", agent: "bot", state: "running", elapsedS: 3, cpuPct: 10, memBytes: 110 * 1024 * 1024, outputBytes: 0, tokens: 5 });
  assert.match(statusItem().text, /sync~spin.*bot running 3s/);
  assert.equal(statusItem().backgroundColor?.id, "statusBarItem.warningBackground"); // 110 of 128 MB
  daemon.notify("airlock/proposal", modProposal());
  assert.equal(statusItem().text, "$(git-pull-request) airlock: 4 hunks in 3 files");
  assert.equal(statusItem().backgroundColor, undefined);
  daemon.notify("airlock/agentStatus", { agent: "bot", quarantined: true, reason: "3 violations", runsUsed: 3, tokensUsed: 0 });
  assert.equal(statusItem().backgroundColor?.id, "statusBarItem.errorBackground");
  assert.equal(statusItem().command, "airlockd.statusActions");
});

test("a proposal: review context key, proposed document, lenses, decorations, denied in the tree", async () => {
  const doc = await vscode.workspace.openTextDocument(vscode.Uri.file(path.join(root, "src/mod.py")));
  const editor = (await vscode.window.showTextDocument(doc)) as unknown as stub.TextEditor;
  daemon.notify("airlock/proposal", modProposal());
  assert.equal(world.context.get("airlock.reviewActive"), true);
  assert.equal(world.context.get("airlock.hunkAtCursor"), false);

  const uri = vscode.Uri.from({ scheme: "airlock-proposed", path: "/src/mod.py", query: "run=r1&side=proposed" });
  const text = await world.contentProviders.get("airlock-proposed")!.provideTextDocumentContent(uri as never);
  assert.equal(text, MOD.replace("line 2\n", "line two\n").replace("line 18\n", "line eighteen\n"));
  assert.equal(fs.readFileSync(path.join(root, "src/mod.py"), "utf8"), MOD, "the file is untouched");

  const lenses = world.lensProviders[0].provideCodeLenses(doc as never);
  assert.deepEqual(
    lenses.map((l) => `${l.range.start.line}:${l.command!.title.replace(/\$\([a-z-]+\) /, "")}`),
    ["1:Accept", "1:Reject", "1:Diff", "17:Accept", "17:Reject", "17:Diff"],
  );
  assert.deepEqual(lenses[0].command!.arguments, [{ runId: "r1", path: "src/mod.py", hunkId: "h2" }]);
  const decorated = [...editor.decorations.values()].flat();
  assert.equal(decorated.length, 2);

  const tree = world.trees.get("airlock.review")!;
  const [run] = tree.getChildren() as { children: { label: string; description: string; command?: unknown }[] }[];
  const denied = run.children.find((c) => c.label === "AGENTS.md")!;
  assert.match(denied.description, /denied · invariant:protected/);
  assert.equal(denied.command, undefined, "a denied change is never offered");
});

test("names, reasons and text an agent chose are shown escaped; marks are shown; the file's bytes are not escaped", async () => {
  fs.writeFileSync(path.join(root, LOOKALIKE), MOD);
  const doc = await vscode.workspace.openTextDocument(vscode.Uri.file(path.join(root, LOOKALIKE)));
  const editor = (await vscode.window.showTextDocument(doc)) as unknown as stub.TextEditor;
  daemon.notify("airlock/proposal", hostileProposal());
  const shown: string[] = [];

  const tree = world.trees.get("airlock.review")!;
  type Item = { label: string; description?: string; tooltip?: string; children?: Item[] };
  const [run] = tree.getChildren() as Item[];
  const walk = (n: Item): void => {
    shown.push(n.label, n.description ?? "", n.tooltip ?? "");
    n.children?.forEach(walk);
  };
  walk(run);
  const [lookalike, denied] = run.children!;
  assert.equal(lookalike.label, `⚠ ${LOOKALIKE}`);
  assert.ok(lookalike.tooltip!.includes(`⚠ ${LOOKALIKE_MARK}`), lookalike.tooltip);
  assert.ok(lookalike.tooltip!.startsWith("look-alike name\\x1b[8m hidden"), lookalike.tooltip);
  assert.ok(lookalike.children![0].tooltip!.includes(ATTACKS["concealed text (SGR 8)"][1]));
  assert.equal(denied.label, "⚠ evil\\u202etxt.exe");
  assert.match(denied.tooltip!, /no\\x1b\]52;c;eA==\\x07\. Never offered[^]*⚠ bidirectional control in the name/);

  const lenses = world.lensProviders[0].provideCodeLenses(doc as never);
  assert.equal(lenses[0].range.start.line, 0);
  assert.equal(lenses[0].command!.title, `⚠ ${LOOKALIKE_MARK} · ⚠ the proposed text holds a terminal escape (ESC): shown escaped`);
  assert.equal(lenses[0].command!.command, "", "a mark is text, not an action");
  for (const l of lenses) shown.push(l.command!.title, l.command!.tooltip ?? "");

  const hovers = [...editor.decorations.values()].flat().map((d) => (d as { hoverMessage: { value: string } }).hoverMessage.value);
  assert.equal(hovers.length, 1);
  assert.ok(hovers[0].includes("+evil()\\x1b[1A\\x1b[2K") && hovers[0].includes("+rm -rf ~\\rls -l"), hovers[0]);
  shown.push(...hovers);

  // the proposed document is the file's real bytes: VS Code's editor shows what is hidden in them
  const uri = vscode.Uri.from({ scheme: "airlock-proposed", path: `/${LOOKALIKE}`, query: "run=r1&side=proposed" });
  const text = await world.contentProviders.get("airlock-proposed")!.provideTextDocumentContent(uri as never);
  assert.ok(text.includes("\x1b[8m") && text.includes("\u202e"));

  daemon.answers["airlock.approve"] = () => {
    throw Object.assign(new Error("conflict"), { code: -32030, data: { paths: [`${LOOKALIKE}\x1b[2K`] } });
  };
  await vscode.commands.executeCommand("airlockd.acceptFile", { runId: "r1", path: LOOKALIKE });
  shown.push(...world.messages.map((m) => m.text));
  assert.ok(world.messages.some((m) => m.text.includes(`${LOOKALIKE}\\x1b[2K changed since the run`)));

  for (const t of shown) assert.doesNotMatch(t, UNDRAWN, JSON.stringify(t));
});

test("$(name) in a path or mark is shown as written where VS Code draws icons, and as it is elsewhere", async () => {
  const ICONIC = "$(check) approved.py";
  const MARK = "look-alike name: reads as '$(pass) ok'";
  fs.writeFileSync(path.join(root, ICONIC), MOD);
  daemon.notify("airlock/proposal", proposal([file(ICONIC, [hunk("h1", 0, "line 1\n", "one\n")], { marks: [MARK] }), file("src/new.py", [])]));

  const doc = await vscode.workspace.openTextDocument(vscode.Uri.file(path.join(root, ICONIC)));
  const lenses = world.lensProviders[0].provideCodeLenses(doc as never);
  assert.equal(lenses[0].command!.title, "⚠ look-alike name: reads as '\\$(pass) ok'", "a lens title draws icons");
  assert.equal(lenses[0].command!.tooltip, `⚠ ${MARK}`, "a tooltip does not");

  world.answers.quickPick.push(() => undefined);
  await vscode.commands.executeCommand("airlockd.openDiff");
  const item = (world.quickPicks[0] as { label: string; detail?: string }[])[0];
  assert.equal(item.label, "⚠ \\$(check) approved.py");
  assert.equal(item.detail, "⚠ look-alike name: reads as '\\$(pass) ok'");

  const [run] = world.trees.get("airlock.review")!.getChildren() as { children: { label: string }[] }[];
  assert.equal(run.children[0].label, `⚠ ${ICONIC}`, "a tree item draws no icons: no backslash");

  world.answers.warning.push(undefined);
  await vscode.commands.executeCommand("airlockd.acceptAll");
  assert.equal(world.messages.at(-1)!.options!.detail, `${ICONIC}\n  ⚠ ${MARK}`, "nor does a dialog");
});

test("accept all asks first when a pending file is marked: its path and marks; no answer, nothing sent", async () => {
  daemon.notify("airlock/proposal", hostileProposal());
  daemon.answers["airlock.approve"] = () => ({ runId: "r1", state: "applied", applied: [], conflicts: [] });
  daemon.answers["airlock.reject"] = () => ({ runId: "r1", state: "rejected" });
  world.answers.warning.push(undefined);
  await vscode.commands.executeCommand("airlockd.acceptAll");
  assert.deepEqual(daemon.sent("airlock.approve"), [], "cancelled: nothing is sent");
  const asked = world.messages.at(-1)!;
  assert.equal(asked.text, "Accept everything pending in run r1, 1 marked file included?");
  assert.equal(asked.options?.modal, true);
  assert.deepEqual(asked.items, ["Accept all"]);
  assert.equal(asked.options?.detail, `${LOOKALIKE}\n  ⚠ ${LOOKALIKE_MARK}\n  ⚠ the proposed text holds a terminal escape (ESC): shown escaped`);

  world.answers.warning.push("Accept all");
  await vscode.commands.executeCommand("airlockd.acceptAll", "r1");
  assert.deepEqual(daemon.sent("airlock.approve"), [{ runId: "r1" }]);

  const before = world.messages.length;
  daemon.notify("airlock/proposal", hostileProposal());
  await vscode.commands.executeCommand("airlockd.acceptFile", { runId: "r1", path: LOOKALIKE });
  await vscode.commands.executeCommand("airlockd.rejectAll", "r1");
  assert.deepEqual(daemon.sent("airlock.approve"), [{ runId: "r1" }, { runId: "r1", paths: [LOOKALIKE] }], "one file: not asked");
  assert.deepEqual(daemon.sent("airlock.reject"), [{ runId: "r1" }], "reject all: not asked");
  assert.equal(world.messages.slice(before).filter((m) => m.options?.modal).length, 0);
});

test("accept hunk sends airlock.approve with that hunk, reverts the clean buffer, never applies an edit", async () => {
  const doc = await vscode.workspace.openTextDocument(vscode.Uri.file(path.join(root, "src/mod.py")));
  await vscode.window.showTextDocument(doc);
  daemon.notify("airlock/proposal", modProposal());
  daemon.answers["airlock.approve"] = () => {
    fs.writeFileSync(path.join(root, "src/mod.py"), MOD.replace("line 2\n", "line two\n"));
    return { runId: "r1", state: "proposed", applied: ["src/mod.py"], conflicts: [] };
  };
  const editor = vscode.window.activeTextEditor!;
  editor.selection = new vscode.Selection(new vscode.Position(1, 0), new vscode.Position(1, 0));
  (ext.commands as unknown as { d: { state: { changed(): void } } }).d.state.changed();
  assert.equal(world.context.get("airlock.hunkAtCursor"), true);

  await vscode.commands.executeCommand("airlockd.acceptHunk");
  assert.deepEqual(daemon.sent("airlock.approve"), [{ runId: "r1", hunks: { "src/mod.py": ["h2"] } }]);
  assert.ok(daemon.sent("airlock.getProposal").length >= 1, "the review state is read back from the daemon");
  assert.ok(world.executed.some((e) => e.command === "workbench.action.files.revert"));
  assert.deepEqual(world.appliedEdits, []);
});

test("a dirty buffer is never reverted; a conflict is reported with its paths", async () => {
  const doc = (await vscode.workspace.openTextDocument(vscode.Uri.file(path.join(root, "src/mod.py")))) as unknown as stub.TextDocument;
  doc.isDirty = true;
  await vscode.window.showTextDocument(doc as never);
  daemon.notify("airlock/proposal", modProposal());
  daemon.answers["airlock.approve"] = () => {
    throw Object.assign(new Error("conflict"), { code: -32030, data: { paths: ["src/mod.py"] } });
  };
  await vscode.commands.executeCommand("airlockd.acceptFile", { runId: "r1", path: "src/mod.py" });
  assert.deepEqual(daemon.sent("airlock.approve"), [{ runId: "r1", paths: ["src/mod.py"] }]);
  assert.ok(!world.executed.some((e) => e.command === "workbench.action.files.revert"));
  assert.ok(world.messages.some((m) => m.level === "error" && m.text.includes("nothing was written") && m.text.includes("src/mod.py")));
});

test("run agent task: agent picker from listAgents, then the prompt", async () => {
  daemon.answers["airlock.runTask"] = () => ({ runId: "r9", state: "admitted" });
  world.answers.quickPick.push((items) => items.find((i) => i.label === "bot"));
  world.answers.inputBox.push("fix the bug");
  await vscode.commands.executeCommand("airlockd.runTask");
  assert.deepEqual(daemon.sent("airlock.runTask"), [{ agent: "bot", prompt: "fix the bug" }]);
  assert.match(statusItem().text, /bot admitted/);
});

test("release agent asks first; no answer, no release", async () => {
  daemon.answers["airlock.listAgents"] = () => [{ ...AGENTS[0], quarantined: true, reason: "3 violations" }];
  daemon.answers["airlock.releaseAgent"] = () => ({ ...AGENTS[0] });
  world.answers.warning.push(undefined);
  await vscode.commands.executeCommand("airlockd.releaseAgent", "bot");
  assert.deepEqual(daemon.sent("airlock.releaseAgent"), []);
  world.answers.warning.push("Release");
  await vscode.commands.executeCommand("airlockd.releaseAgent", "bot");
  assert.deepEqual(daemon.sent("airlock.releaseAgent"), [{ agent: "bot" }]);
});

test("accept all / reject file / next hunk / open diff use the daemon's selection and VS Code's diff", async () => {
  daemon.notify("airlock/proposal", modProposal());
  daemon.answers["airlock.approve"] = () => ({ runId: "r1", state: "applied", applied: [], conflicts: [] });
  daemon.answers["airlock.reject"] = () => ({ runId: "r1", state: "proposed" });
  await vscode.commands.executeCommand("airlockd.acceptAll");
  assert.deepEqual(daemon.sent("airlock.approve"), [{ runId: "r1" }]);
  await vscode.commands.executeCommand("airlockd.rejectFile", { runId: "r1", path: "src/new.py" });
  assert.deepEqual(daemon.sent("airlock.reject"), [{ runId: "r1", paths: ["src/new.py"] }]);

  daemon.notify("airlock/proposal", modProposal());
  await vscode.commands.executeCommand("airlockd.nextHunk");
  assert.equal(path.relative(root, vscode.window.activeTextEditor!.document.uri.fsPath), path.join("docs", "old.md"));

  await vscode.commands.executeCommand("airlockd.openDiff", { runId: "r1", path: "src/mod.py" });
  const diff = world.executed.find((e) => e.command === "vscode.diff")!;
  assert.equal((diff.args[0] as vscode.Uri).scheme, "file");
  assert.equal((diff.args[1] as vscode.Uri).scheme, "airlock-proposed");
  await vscode.commands.executeCommand("airlockd.openChanges", "r1");
  const changes = world.executed.find((e) => e.command === "vscode.changes")!;
  assert.equal((changes.args[1] as unknown[]).length, 3);
  assert.deepEqual(world.appliedEdits, []);
});

test("evidence view shows the run's evidence", async () => {
  daemon.answers["airlock.listRuns"] = () => [
    { runId: "r1", agent: "bot", mode: "review", state: "proposed", createdAt: 1, prompt: "p", files: 3, review: {}, detail: "" },
  ];
  daemon.answers["airlock.getEvidence"] = () => ({
    runId: "r1", agent: "bot", state: "proposed", policy: { revision: "rev1", snapshot: null }, rules: [], withheld: [{ path: ".env", rule: "w" }],
    resources: { container: { effective: { network_mode: "none", cap_drop: ["ALL"] } }, outputBytes: 0, tokens: 0, limit: null },
    transitions: [], timeline: [], applied: [],
  });
  await vscode.commands.executeCommand("airlockd.showEvidence");
  const roots = world.trees.get("airlock.evidence")!.getChildren() as { label: string; description?: string }[];
  assert.equal(roots.find((n) => n.label === "policy")!.description, "revision rev1");
  assert.ok(world.executed.some((e) => e.command === "airlock.evidence.focus"));
});

test("settings changes restart the daemon (the client debounces)", () => {
  assert.equal(daemon.restarts, 0);
  void vscode.commands.executeCommand("airlockd.restart");
  assert.equal(daemon.restarts, 1);
});

test("the agent's output: each run under its header, what was dropped said, shown on the command", async () => {
  daemon.notify("airlock/runStatus", { runId: "r7", agent: "claude", state: "running", elapsedS: 1, cpuPct: 1, memBytes: 1, outputBytes: 0, tokens: 0 });
  daemon.notify("airlock/runOutput", { runId: "r7", text: "reading src/\\x1b[2J\n" });
  daemon.notify("airlock/runOutput", { runId: "r7", text: "done\n", dropped: 2048 });
  daemon.notify("airlock/runOutput", { runId: "r8", text: "other run\n" });
  const channel = world.channels.get("Airlock: agent output")!;
  assert.equal(
    channel.text,
    "── run r7 (claude) ──\nreading src/\\x1b[2J\n[… 2048 bytes not shown: the agent printed faster than it is followed]\ndone\n── run r8 ──\nother run\n",
  );
  assert.equal(channel.shown, 0); // never steals the view by itself
  await world.commands.get("airlockd.showAgentOutput")!();
  assert.equal(channel.shown, 1);
});
