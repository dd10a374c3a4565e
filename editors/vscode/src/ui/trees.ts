/** Two tree views: the review of open proposals (files, hunks, and denied changes with their rule —
 * shown, never offered) and the evidence of one run. */

import * as vscode from "vscode";

import { display, escape, markLines, pathLabel } from "../logic/escape";
import { evidenceTree, type Node } from "../logic/evidence";
import type { Evidence } from "../logic/protocol";
import { describeFile, pendingHunks } from "../logic/review";
import type { AirlockState } from "../logic/state";
import { summary } from "./review";

function toItem(n: Node): vscode.TreeItem {
  const item = new vscode.TreeItem(
    n.label,
    n.children?.length ? vscode.TreeItemCollapsibleState.Collapsed : vscode.TreeItemCollapsibleState.None,
  );
  item.description = n.description;
  item.tooltip = n.tooltip;
  if (n.icon) item.iconPath = new vscode.ThemeIcon(n.icon);
  return item;
}

export class EvidenceView implements vscode.TreeDataProvider<Node> {
  private readonly emitter = new vscode.EventEmitter<Node | undefined>();
  readonly onDidChangeTreeData = this.emitter.event;
  private roots: Node[] = [];
  evidence: Evidence | undefined;

  constructor(private readonly state: AirlockState) {}

  show(ev: Evidence): void {
    this.evidence = ev;
    this.roots = evidenceTree(ev, this.state.peaks.get(ev.runId));
    this.emitter.fire(undefined);
  }

  getTreeItem(n: Node): vscode.TreeItem {
    const item = toItem(n);
    if (this.roots.includes(n) && n.children?.length) item.collapsibleState = vscode.TreeItemCollapsibleState.Expanded;
    return item;
  }

  getChildren(n?: Node): Node[] {
    if (!n) return this.roots.length ? this.roots : [{ label: "Airlock: Show Evidence picks a run", icon: "info" }];
    return n.children ?? [];
  }
}

export interface ReviewNode {
  label: string;
  description?: string;
  tooltip?: string;
  icon?: string;
  children?: ReviewNode[];
  command?: vscode.Command;
  context?: string;
}

export class ReviewTree implements vscode.TreeDataProvider<ReviewNode> {
  private readonly emitter = new vscode.EventEmitter<ReviewNode | undefined>();
  readonly onDidChangeTreeData = this.emitter.event;

  constructor(private readonly state: AirlockState) {}

  refresh(): void {
    this.emitter.fire(undefined);
  }

  getTreeItem(n: ReviewNode): vscode.TreeItem {
    const item = new vscode.TreeItem(
      n.label,
      n.children?.length ? vscode.TreeItemCollapsibleState.Expanded : vscode.TreeItemCollapsibleState.None,
    );
    item.description = n.description;
    item.tooltip = n.tooltip;
    item.command = n.command;
    item.contextValue = n.context;
    if (n.icon) item.iconPath = new vscode.ThemeIcon(n.icon);
    return item;
  }

  getChildren(n?: ReviewNode): ReviewNode[] {
    if (n) return n.children ?? [];
    const open = this.state.open();
    if (!open.length) return [{ label: "No proposal waiting for review", icon: "info" }];
    return open.map((p) => ({
      label: `run ${p.runId}`,
      description: `${p.agent} · ${summary(p)}`,
      icon: "git-pull-request",
      context: "airlock.run",
      children: [
        ...p.files
          .filter((f) => f.state === "pending")
          .map((f) => ({
            label: pathLabel(f.path, f.marks),
            description: display(describeFile(f)),
            tooltip: [display(f.reason), ...markLines(f.marks)].join("\n"),
            icon: f.change === "created" ? "diff-added" : f.change === "deleted" ? "diff-removed" : "diff-modified",
            context: "airlock.file",
            command: { title: "Open Diff", command: "airlockd.openDiff", arguments: [{ runId: p.runId, path: f.path }] },
            children: pendingHunks(f).map((h) => ({
              label: `line ${h.range.start.line + 1}`,
              description: `-${h.oldLines} +${h.newLines}`,
              tooltip: escape(h.newText.replace(/\r\n/g, "\n")),
              icon: "symbol-event",
              context: "airlock.hunk",
              command: {
                title: "Go to hunk",
                command: "airlockd.revealHunk",
                arguments: [{ runId: p.runId, path: f.path, line: h.range.start.line }],
              },
            })),
          })),
        ...p.denied.map((d) => ({
          label: pathLabel(d.path, d.marks),
          description: `denied · ${display(d.rule)}`,
          tooltip: [
            `${d.change}: denied by ${display(d.rule)} — ${display(d.reason)}. Never offered for acceptance.`,
            ...markLines(d.marks),
          ].join("\n"),
          icon: "circle-slash",
          context: "airlock.denied",
        })),
      ],
    }));
  }
}
