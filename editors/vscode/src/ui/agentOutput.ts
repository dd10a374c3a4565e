/** The agents' own account, live: what a run's agent prints (`airlock/runOutput`: whole lines,
 * redacted and with hidden characters already escaped by the daemon) in one output channel, each
 * run under a header line. It is what the agent says, never evidence: the review shows what the
 * staging filesystem holds. */

import * as vscode from "vscode";

import type { RunOutput } from "../logic/protocol";

export const AGENT_OUTPUT = "Airlock: agent output";

export class AgentOutput implements vscode.Disposable {
  private readonly channel: vscode.OutputChannel;
  private lastRun: string | undefined;

  constructor(private readonly agentOf: (runId: string) => string | undefined) {
    this.channel = vscode.window.createOutputChannel(AGENT_OUTPUT);
  }

  add(out: RunOutput): void {
    if (out.runId !== this.lastRun) {
      const agent = this.agentOf(out.runId);
      this.channel.appendLine(
        `── run ${out.runId}${agent ? ` (${agent})` : ""} ──`,
      );
      this.lastRun = out.runId;
    }
    if (out.dropped)
      this.channel.appendLine(
        `[… ${out.dropped} bytes not shown: the agent printed faster than it is followed]`,
      );
    this.channel.append(out.text);
  }

  show(): void {
    this.channel.show(true);
  }

  dispose(): void {
    this.channel.dispose();
  }
}
