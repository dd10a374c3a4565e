/** What the extension knows about the daemon, fed only by its answers and notifications (the
 * review state lives in the daemon). Listeners are told after every change. No `vscode` import. */

import type { AgentInfo, AgentStatus, KnownAgent, KnownRun, Proposal, RunStatus, RunSummary } from "./protocol";
import { isLive } from "./protocol";
import type { Peaks } from "./evidence";
import { openProposals } from "./review";

/** The calls the extension makes to the daemon (`workspace/executeCommand`) and its notifications. */
export interface Daemon {
  request<T>(command: string, args?: object): Promise<T>;
  onNotification(method: string, handler: (params: unknown) => void): void;
  /** Told true once the server is initialized, false when it stopped. */
  onReady(handler: (ready: boolean) => void): void;
  /** Stop and start again, debounced. */
  restart(): void;
  showLog(): void;
  log(line: string): void;
  dispose(): Promise<void>;
}

export class AirlockState {
  readonly proposals = new Map<string, Proposal>();
  readonly runs = new Map<string, RunStatus>();
  readonly summaries = new Map<string, KnownRun>();
  readonly agents = new Map<string, KnownAgent>();
  readonly peaks = new Map<string, Peaks>();
  connected = false;
  /** The run a person chose to review (Review Run); otherwise the newest open proposal. */
  focusRun: string | undefined;
  private listeners: (() => void)[] = [];

  onChange(fn: () => void): void {
    this.listeners.push(fn);
  }

  changed(): void {
    for (const fn of this.listeners) fn();
  }

  setConnected(ready: boolean): void {
    this.connected = ready;
    this.changed();
  }

  setProposal(p: Proposal): void {
    this.proposals.set(p.runId, p);
    const s = this.summaries.get(p.runId);
    if (s) s.state = p.state;
    const r = this.runs.get(p.runId);
    if (r) r.state = p.state;
    this.changed();
  }

  setRunStatus(r: RunStatus): void {
    const prev = this.runs.get(r.runId);
    this.runs.set(r.runId, { ...prev, ...r });
    const pk = this.peaks.get(r.runId) ?? { cpuPct: 0, memBytes: 0 };
    this.peaks.set(r.runId, { cpuPct: Math.max(pk.cpuPct, r.cpuPct || 0), memBytes: Math.max(pk.memBytes, r.memBytes || 0) });
    const s = this.summaries.get(r.runId);
    if (s) s.state = r.state;
    else
      this.summaries.set(r.runId, {
        runId: r.runId,
        agent: r.agent,
        state: r.state,
        createdAt: Date.now() / 1000,
        prompt: "",
        files: 0,
        review: {},
        detail: "",
      });
    const p = this.proposals.get(r.runId);
    if (p && p.state !== r.state && r.state !== "proposed") p.state = r.state;
    this.changed();
  }

  setAgents(list: AgentInfo[]): void {
    this.agents.clear();
    for (const a of list) this.agents.set(a.agent, a);
    this.changed();
  }

  setAgentStatus(a: AgentStatus): void {
    const prev = this.agents.get(a.agent);
    this.agents.set(a.agent, { ...(prev ?? {}), ...a });
    this.changed();
  }

  setSummaries(list: RunSummary[]): void {
    for (const s of list) {
      this.summaries.set(s.runId, s);
      const r = this.runs.get(s.runId);
      if (r) r.state = s.state;
      else if (isLive(s.state))
        this.runs.set(s.runId, {
          runId: s.runId,
          agent: s.agent,
          state: s.state,
          elapsedS: Math.max(0, Date.now() / 1000 - s.createdAt),
          cpuPct: 0,
          memBytes: 0,
          outputBytes: 0,
          tokens: 0,
        });
    }
    this.changed();
  }

  liveRuns(): RunStatus[] {
    return [...this.runs.values()].filter((r) => isLive(r.state));
  }

  /** Runs newest first (by creation). */
  runList(): KnownRun[] {
    return [...this.summaries.values()].sort((a, b) => b.createdAt - a.createdAt);
  }

  finishedRuns(): KnownRun[] {
    return this.runList().filter((r) => !isLive(r.state) && r.state !== "rejected_at_admission");
  }

  /** Proposals with something still pending, newest first; the focused one first. */
  open(): Proposal[] {
    const list = openProposals(this.proposals.values());
    const i = list.findIndex((p) => p.runId === this.focusRun);
    if (i > 0) list.unshift(...list.splice(i, 1));
    return list;
  }
}
