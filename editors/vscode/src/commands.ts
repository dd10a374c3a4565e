/** The extension's commands. Every decision goes to the daemon (`airlock.approve` / `airlock.reject`
 * with the chosen hunks): nothing here edits a buffer or applies the proposal's WorkspaceEdit. */

import * as vscode from "vscode";

import { display, displayAll, displayLabel, escape, escapeIcons, markLines, pathLabel } from "./logic/escape";
import type { AgentInfo, ApproveResult, Decision, Evidence, Proposal, KnownRun, RunResult, RunSummary } from "./logic/protocol";
import { ErrorCode, isLive } from "./logic/protocol";
import {
  allDecision,
  diskLineOf,
  fileDecision,
  hunkAt,
  hunkAtProposed,
  hunkDecision,
  markedDetail,
  markedFiles,
  pendingFiles,
  plural,
  proposedLineOf,
  runFor,
  step,
  type HunkRef,
} from "./logic/review";
import { ACTION_LABELS, type ActionId } from "./logic/status";
import type { AirlockState, Daemon } from "./logic/state";
import type { Paths } from "./ui/paths";
import { summary } from "./ui/review";
import type { StatusBar } from "./ui/statusBar";
import type { AgentOutput } from "./ui/agentOutput";
import type { EvidenceView } from "./ui/trees";

export interface Deps {
  daemon: Daemon;
  state: AirlockState;
  paths: Paths;
  statusBar: StatusBar;
  evidence: EvidenceView;
  agentOutput?: AgentOutput;
}

interface HunkArg {
  runId: string;
  path: string;
  hunkId: string;
}
interface FileArg {
  runId: string;
  path: string;
}

/** A daemon error as one sentence a person can act on. */
export function describeError(err: unknown): string {
  const e = err as { code?: number; message?: string; data?: { paths?: string[]; reason?: string } };
  if (e?.code === ErrorCode.conflict) {
    const paths = displayAll(e.data?.paths ?? []);
    return `airlock: nothing was written — ${paths} changed since the run (unsaved or edited). Save or revert, then start a new run.`;
  }
  if (e?.code === ErrorCode.admission) return `airlock: run refused: ${display(e.data?.reason ?? e.message ?? "")}`;
  return `airlock: ${escape(e?.message ?? String(err))}`;
}

export class Commands {
  constructor(private readonly d: Deps) {}

  register(context: vscode.ExtensionContext): void {
    const table: Record<string, (...args: never[]) => unknown> = {
      "airlockd.runTask": () => this.runTask(),
      "airlockd.followUp": (run?: string) => this.followUp(run),
      "airlockd.reviewRun": (run?: string) => this.reviewRun(run),
      "airlockd.openDiff": (arg?: FileArg) => this.openDiff(arg),
      "airlockd.openChanges": (run?: string) => this.openChanges(run),
      "airlockd.acceptHunk": (arg?: HunkArg) => this.decideHunk("approve", arg),
      "airlockd.rejectHunk": (arg?: HunkArg) => this.decideHunk("reject", arg),
      "airlockd.acceptFile": (arg?: FileArg) => this.decideFile("approve", arg),
      "airlockd.rejectFile": (arg?: FileArg) => this.decideFile("reject", arg),
      "airlockd.acceptAll": (run?: string) => this.decideAll("approve", run),
      "airlockd.rejectAll": (run?: string) => this.decideAll("reject", run),
      "airlockd.nextHunk": () => this.stepHunk(1),
      "airlockd.previousHunk": () => this.stepHunk(-1),
      "airlockd.revealHunk": (arg: { runId: string; path: string; line: number }) => this.reveal(arg),
      "airlockd.undoRun": (run?: string) => this.simpleRun("airlock.undo", run, "undo", (r) => isUndoable(r)),
      "airlockd.stopRun": (run?: string) => this.simpleRun("airlock.stopRun", run, "stop", (r) => isLive(r.state)),
      "airlockd.killRun": (run?: string) => this.simpleRun("airlock.killRun", run, "kill", (r) => isLive(r.state)),
      "airlockd.releaseAgent": (agent?: string) => this.releaseAgent(agent),
      "airlockd.showEvidence": (run?: string) => this.showEvidence(run),
      "airlockd.showLog": () => this.d.daemon.showLog(),
      "airlockd.showAgentOutput": () => this.d.agentOutput?.show(),
      "airlockd.restart": () => this.d.daemon.restart(),
      "airlockd.statusActions": () => this.statusActions(),
    };
    for (const [name, fn] of Object.entries(table)) {
      context.subscriptions.push(
        vscode.commands.registerCommand(name, async (...args: never[]) => {
          try {
            return await fn(...args);
          } catch (err) {
            this.d.daemon.log(`${name} failed: ${describeError(err)}`);
            void vscode.window.showErrorMessage(describeError(err));
            return undefined;
          }
        }),
      );
    }
  }

  // -- runs ---------------------------------------------------------------------------------------

  async runTask(followUp?: KnownRun): Promise<string | undefined> {
    let agent = followUp?.agent;
    if (!agent) {
      const agents = await this.d.daemon.request<AgentInfo[]>("airlock.listAgents");
      this.d.state.setAgents(agents);
      if (!agents.length) {
        void vscode.window.showWarningMessage("airlock: no agent is defined in policies.toml");
        return undefined;
      }
      const pick = await vscode.window.showQuickPick(
        agents.map((a) => ({
          label: a.agent,
          description: [a.adapter, a.mode].filter(Boolean).join(" · "),
          detail: a.quarantined
            ? `$(error) quarantined: ${displayLabel(a.reason ?? "limit violations")}`
            : `${a.runsUsed} runs, ${a.tokensUsed} tokens used`,
        })),
        { title: "Airlock: Run Agent Task", placeHolder: "Which agent?" },
      );
      agent = pick?.label;
    }
    if (!agent) return undefined;
    const prompt = await vscode.window.showInputBox({
      title: followUp ? `Airlock: follow up on run ${followUp.runId}` : `Airlock: task for ${agent}`,
      prompt: "What should the agent do? It works on a staged copy; nothing changes before you accept.",
      ignoreFocusOut: true,
      validateInput: (v) => (v.trim() ? undefined : "The task cannot be empty"),
    });
    if (!prompt?.trim()) return undefined;
    const args: Record<string, string> = { agent, prompt };
    if (followUp) args["followUp"] = followUp.runId;
    const res = await this.d.daemon.request<RunResult>("airlock.runTask", args);
    this.d.state.setRunStatus({
      runId: res.runId,
      agent,
      state: res.state,
      elapsedS: 0,
      cpuPct: 0,
      memBytes: 0,
      outputBytes: 0,
      tokens: 0,
    });
    this.d.daemon.log(`run ${res.runId} (${agent}) ${res.state}`);
    return res.runId;
  }

  async followUp(run?: string): Promise<string | undefined> {
    const prev = await this.pickRun(run, "Follow up on which run?", (r) => !isLive(r.state) && r.state !== "rejected_at_admission");
    return prev ? this.runTask(prev) : undefined;
  }

  async refreshRuns(): Promise<KnownRun[]> {
    const runs = await this.d.daemon.request<RunSummary[]>("airlock.listRuns", { limit: 200 });
    this.d.state.setSummaries(runs);
    return this.d.state.runList();
  }

  async pickRun(run: string | undefined, placeHolder: string, keep: (r: KnownRun) => boolean): Promise<KnownRun | undefined> {
    const runs = (await this.refreshRuns()).filter(keep);
    if (run) return runs.find((r) => r.runId === run) ?? this.d.state.summaries.get(run);
    if (!runs.length) {
      void vscode.window.showInformationMessage(`airlock: no run to ${placeHolder.split(" ")[0].toLowerCase()}`);
      return undefined;
    }
    if (runs.length === 1) return runs[0];
    const pick = await vscode.window.showQuickPick(
      runs.map((r) => ({
        label: r.runId,
        description: `${r.agent} · ${r.state}`,
        detail: displayLabel(r.prompt),
        run: r,
      })),
      { placeHolder },
    );
    return pick?.run;
  }

  async simpleRun(command: string, run: string | undefined, verb: string, keep: (r: KnownRun) => boolean): Promise<void> {
    const r = await this.pickRun(run, `${verb[0].toUpperCase()}${verb.slice(1)} which run?`, keep);
    if (!r) return;
    const res = await this.d.daemon.request<{ runId: string; state: string }>(command, { runId: r.runId });
    void vscode.window.showInformationMessage(`airlock: run ${res.runId} ${res.state}`);
    await this.refreshRuns();
  }

  async releaseAgent(agent?: string): Promise<void> {
    const agents = await this.d.daemon.request<AgentInfo[]>("airlock.listAgents");
    this.d.state.setAgents(agents);
    const benched = agents.filter((a) => a.quarantined);
    let chosen = agent ? agents.find((a) => a.agent === agent) : undefined;
    if (!chosen) {
      if (!benched.length) {
        void vscode.window.showInformationMessage("airlock: no agent is quarantined");
        return;
      }
      const pick = await vscode.window.showQuickPick(
        benched.map((a) => ({ label: a.agent, detail: displayLabel(a.reason ?? ""), agent: a })),
        { placeHolder: "Release which agent from quarantine?" },
      );
      chosen = pick?.agent;
    }
    if (!chosen) return;
    const ok = await vscode.window.showWarningMessage(
      `Release agent "${chosen.agent}" from quarantine?`,
      { modal: true, detail: `It was quarantined for: ${display(chosen.reason ?? "repeated limit violations")}.` },
      "Release",
    );
    if (ok !== "Release") return;
    const after = await this.d.daemon.request<AgentInfo>("airlock.releaseAgent", { agent: chosen.agent });
    this.d.state.setAgentStatus(after);
    void vscode.window.showInformationMessage(`airlock: agent ${chosen.agent} released`);
  }

  async showEvidence(run?: string): Promise<Evidence | undefined> {
    const focus = run ?? this.d.state.focusRun;
    const r = await this.pickRun(focus, "Evidence of which run?", (x) => x.state !== "rejected_at_admission" || !!focus);
    if (!r) return undefined;
    const ev = await this.d.daemon.request<Evidence>("airlock.getEvidence", { runId: r.runId });
    this.d.evidence.show(ev);
    await vscode.commands.executeCommand("airlock.evidence.focus");
    return ev;
  }

  async statusActions(): Promise<void> {
    const actions = this.d.statusBar.update().actions;
    const pick = await vscode.window.showQuickPick(
      actions.map((id) => ({ label: ACTION_LABELS[id], id })),
      { placeHolder: this.d.statusBar.item.tooltip?.toString().split("\n")[0] },
    );
    if (pick) await vscode.commands.executeCommand(`airlockd.${pick.id satisfies ActionId}`);
  }

  // -- review -------------------------------------------------------------------------------------

  private async pickProposal(run?: string): Promise<Proposal | undefined> {
    const open = this.d.state.open();
    if (run) return this.d.state.proposals.get(run);
    if (open.length <= 1) {
      if (!open.length) void vscode.window.showInformationMessage("airlock: no proposal is waiting for review");
      return open[0];
    }
    const pick = await vscode.window.showQuickPick(
      open.map((p) => ({ label: p.runId, description: `${p.agent} · ${summary(p)}`, p })),
      { placeHolder: "Which run?" },
    );
    return pick?.p;
  }

  async reviewRun(run?: string): Promise<void> {
    const p = await this.pickProposal(run);
    if (!p) return;
    this.d.state.focusRun = p.runId;
    this.d.state.changed();
    await this.openChanges(p.runId);
    await vscode.commands.executeCommand("airlock.review.focus");
  }

  async openChanges(run?: string): Promise<void> {
    const p = await this.pickProposal(run ?? this.d.state.open()[0]?.runId);
    if (!p) return;
    const { paths } = this.d;
    const resources = pendingFiles(p)
      .filter((f) => !f.binary)
      .map((f) => [
        paths.fileUri(f.path),
        f.change === "created" ? paths.proposedUri(p.runId, f.path, "empty") : paths.fileUri(f.path),
        paths.proposedUri(p.runId, f.path),
      ]);
    await vscode.commands.executeCommand("vscode.changes", `airlock ${p.runId}: ${summary(p)} (proposed)`, resources);
  }

  async openDiff(arg?: FileArg): Promise<void> {
    let target = arg;
    if (!target) {
      const rel = this.d.paths.relative(vscode.window.activeTextEditor?.document.uri);
      const p = rel ? runFor(this.d.state.open(), rel) : undefined;
      if (p && rel) target = { runId: p.runId, path: rel };
    }
    if (!target) {
      const items = this.d.state.open().flatMap((p) =>
        pendingFiles(p).map((f) => ({
          label: escapeIcons(pathLabel(f.path, f.marks)),
          description: `run ${p.runId} · ${f.change}`,
          detail: f.marks?.length ? escapeIcons(markLines(f.marks).join(" · ")) : undefined,
          t: { runId: p.runId, path: f.path },
        })),
      );
      if (!items.length) {
        void vscode.window.showInformationMessage("airlock: no proposal is waiting for review");
        return;
      }
      target = items.length === 1 ? items[0].t : (await vscode.window.showQuickPick(items, { placeHolder: "Diff which file?" }))?.t;
    }
    if (!target) return;
    const { paths } = this.d;
    const f = this.d.state.proposals.get(target.runId)?.files.find((x) => x.path === target!.path);
    const left = f?.change === "created" ? paths.proposedUri(target.runId, target.path, "empty") : paths.fileUri(target.path);
    const right = paths.proposedUri(target.runId, target.path);
    await vscode.commands.executeCommand("vscode.diff", left, right, `${display(target.path)} ↔ airlock ${target.runId} (proposed)`, {
      preview: false,
    });
  }

  /** The pending hunk under the cursor, in the file or in its proposed document. */
  hunkAtCursor(): HunkRef | undefined {
    const editor = vscode.window.activeTextEditor;
    if (!editor) return undefined;
    const line = editor.selection.active.line;
    const proposed = this.d.paths.parseProposed(editor.document.uri);
    if (proposed) return hunkAtProposed(this.d.state.proposals.get(proposed.runId), proposed.rel, line);
    const rel = this.d.paths.relative(editor.document.uri);
    return rel ? hunkAt(this.d.state.open(), rel, line, editor.document.lineCount) : undefined;
  }

  async decideHunk(kind: "approve" | "reject", arg?: HunkArg): Promise<ApproveResult | undefined> {
    let ref: HunkRef | undefined;
    if (arg) {
      const f = this.d.state.proposals.get(arg.runId)?.files.find((x) => x.path === arg.path);
      const h = f?.hunks.find((x) => x.id === arg.hunkId);
      ref = h ? { runId: arg.runId, path: arg.path, hunk: h } : undefined;
      if (!ref) return this.decide(kind, { runId: arg.runId, hunks: { [arg.path]: [arg.hunkId] } });
    }
    ref ??= this.hunkAtCursor();
    if (!ref) {
      void vscode.window.showInformationMessage("airlock: the cursor is not on a pending hunk");
      return undefined;
    }
    return this.decide(kind, hunkDecision(ref));
  }

  async decideFile(kind: "approve" | "reject", arg?: FileArg): Promise<ApproveResult | undefined> {
    let target = arg;
    if (!target) {
      const rel = this.d.paths.relative(vscode.window.activeTextEditor?.document.uri);
      const proposed = this.d.paths.parseProposed(vscode.window.activeTextEditor?.document.uri ?? vscode.Uri.file("/"));
      const p = proposed ? this.d.state.proposals.get(proposed.runId) : rel ? runFor(this.d.state.open(), rel) : undefined;
      if (p && rel) target = { runId: p.runId, path: rel };
    }
    if (!target) {
      void vscode.window.showInformationMessage("airlock: this file has no pending change");
      return undefined;
    }
    return this.decide(kind, fileDecision(target.runId, target.path));
  }

  /** Accept or reject everything pending in a run; accepting a run with marked files asks first. */
  async decideAll(kind: "approve" | "reject", run?: string): Promise<ApproveResult | undefined> {
    const p = await this.pickProposal(run);
    if (!p) return undefined;
    const marked = kind === "approve" ? markedFiles(p) : [];
    if (marked.length) {
      const ok = await vscode.window.showWarningMessage(
        `Accept everything pending in run ${p.runId}, ${plural(marked.length, "marked file")} included?`,
        { modal: true, detail: markedDetail(marked) },
        "Accept all",
      );
      if (ok !== "Accept all") return undefined;
    }
    return this.decide(kind, allDecision(p.runId));
  }

  /** One decision through the daemon's transaction; then the editor shows the files as on disk. */
  async decide(kind: "approve" | "reject", decision: Decision): Promise<ApproveResult | undefined> {
    const command = kind === "approve" ? "airlock.approve" : "airlock.reject";
    let result: ApproveResult | undefined;
    try {
      result = await this.d.daemon.request<ApproveResult>(command, decision);
    } finally {
      await this.refreshProposal(decision.runId);
    }
    if (kind === "approve" && result) {
      await this.showAsOnDisk(result.applied ?? []);
      if (result.conflicts?.length) {
        void vscode.window.showWarningMessage(`airlock: not written (conflicted): ${displayAll(result.conflicts)}`);
      }
      this.d.daemon.log(`run ${decision.runId}: applied ${displayAll(result.applied) || "nothing"}`);
    }
    return result;
  }

  async refreshProposal(runId: string): Promise<void> {
    try {
      this.d.state.setProposal(await this.d.daemon.request<Proposal>("airlock.getProposal", { runId }));
    } catch (err) {
      this.d.daemon.log(`getProposal ${runId}: ${describeError(err)}`);
    }
  }

  /** Files the daemon wrote: a clean open document is reverted to the disk's text (VS Code's watcher
   * would do it too); a dirty one is never touched (the daemon refuses to commit over it anyway). */
  async showAsOnDisk(applied: string[]): Promise<void> {
    const wanted = new Set(applied.map((p) => this.d.paths.fileUri(p).toString()));
    for (const doc of vscode.workspace.textDocuments) {
      if (!wanted.has(doc.uri.toString()) || doc.isDirty) continue;
      const editor = vscode.window.visibleTextEditors.find((e) => e.document === doc);
      if (!editor) continue;
      const active = vscode.window.activeTextEditor;
      await vscode.window.showTextDocument(doc, { viewColumn: editor.viewColumn, preserveFocus: false });
      await vscode.commands.executeCommand("workbench.action.files.revert");
      if (active && active.document !== doc) {
        await vscode.window.showTextDocument(active.document, { viewColumn: active.viewColumn });
      }
    }
  }

  async stepHunk(direction: 1 | -1): Promise<void> {
    const editor = vscode.window.activeTextEditor;
    const proposed = editor ? this.d.paths.parseProposed(editor.document.uri) : undefined;
    const rel = this.d.paths.relative(editor?.document.uri);
    let line = editor?.selection.active.line ?? -1;
    if (proposed && editor) {
      const f = this.d.state.proposals.get(proposed.runId)?.files.find((x) => x.path === proposed.rel);
      if (f) line = diskLineOf(f, line);
    }
    const to = step(this.d.state.open(), { path: rel, line }, direction);
    if (!to) {
      void vscode.window.showInformationMessage("airlock: no pending hunk");
      return;
    }
    await this.reveal(to);
  }

  /** Put the cursor on a pending change: in the proposed document when one is active for the same
   * file, else in the file itself. */
  async reveal(to: { runId: string; path: string; line: number }): Promise<void> {
    const editor = vscode.window.activeTextEditor;
    const proposed = editor ? this.d.paths.parseProposed(editor.document.uri) : undefined;
    let target: vscode.TextEditor;
    let line = to.line;
    if (editor && proposed && proposed.rel === to.path && proposed.runId === to.runId) {
      target = editor;
      const f = this.d.state.proposals.get(to.runId)?.files.find((x) => x.path === to.path);
      if (f) line = proposedLineOf(f, to.line);
    } else {
      target = await vscode.window.showTextDocument(this.d.paths.fileUri(to.path), { preview: false });
    }
    const pos = new vscode.Position(Math.min(line, Math.max(target.document.lineCount - 1, 0)), 0);
    target.selection = new vscode.Selection(pos, pos);
    target.revealRange(new vscode.Range(pos, pos), vscode.TextEditorRevealType.InCenterIfOutsideViewport);
  }
}

function isUndoable(r: KnownRun): boolean {
  return r.state === "applied" || (r.review["accepted"] ?? 0) > 0;
}

