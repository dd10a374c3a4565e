/** The status bar item: a `StatusView` (logic/status.ts) drawn with VS Code's two allowed
 * backgrounds; clicking it runs `airlockd.statusActions`. */

import * as vscode from "vscode";

import { statusView, type StatusView } from "../logic/status";
import type { AirlockState } from "../logic/state";

export class StatusBar implements vscode.Disposable {
  readonly item = vscode.window.createStatusBarItem("airlockd.status", vscode.StatusBarAlignment.Left, 50);
  view: StatusView | undefined;

  constructor(private readonly state: AirlockState) {
    this.item.name = "airlockd";
    this.item.command = "airlockd.statusActions";
    this.update();
    this.item.show();
  }

  update(): StatusView {
    const view = statusView({
      runs: this.state.runs.values(),
      proposals: this.state.proposals.values(),
      agents: this.state.agents.values(),
      connected: this.state.connected,
      hasFinishedRun: this.state.finishedRuns().length > 0,
    });
    this.view = view;
    this.item.text = view.text;
    this.item.tooltip = view.tooltip;
    this.item.backgroundColor =
      view.background === "error"
        ? new vscode.ThemeColor("statusBarItem.errorBackground")
        : view.background === "warning"
          ? new vscode.ThemeColor("statusBarItem.warningBackground")
          : undefined;
    return view;
  }

  dispose(): void {
    this.item.dispose();
  }
}
