/** What the status bar says and which actions its quick pick offers, from the daemon's
 * notifications. No `vscode` import: the glue turns a `StatusView` into a status bar item. */

import { display } from "./escape";
import { bytes, count, duration, percent } from "./format";
import type { KnownAgent, Proposal, RunStatus } from "./protocol";
import { isLive } from "./protocol";
import { plural, reviewCount } from "./review";

export type Phase = "idle" | "running" | "reviewing" | "quarantined";
export type Background = "error" | "warning" | undefined;

export type ActionId =
  | "runTask"
  | "followUp"
  | "reviewRun"
  | "openChanges"
  | "acceptAll"
  | "rejectAll"
  | "undoRun"
  | "stopRun"
  | "killRun"
  | "releaseAgent"
  | "showEvidence"
  | "showLog"
  | "restart";

export interface StatusView {
  phase: Phase;
  text: string;
  tooltip: string;
  background: Background;
  actions: ActionId[];
}

export interface StatusInput {
  runs: Iterable<RunStatus>; // the latest airlock/runStatus of each run
  proposals: Iterable<Proposal>;
  agents: Iterable<KnownAgent>;
  connected: boolean;
  hasFinishedRun: boolean; // something to follow up on, undo or inspect
}

/** A share above this of any limit turns the item's background to warning. */
export const WARN_RATIO = 0.8;

export interface Usage {
  what: string;
  used: number;
  limit: number;
}

/** The limits a running run is measured against (those that are set, i.e. > 0). */
export function usages(run: RunStatus, agent: KnownAgent | undefined): Usage[] {
  const out: Usage[] = [];
  const lim = agent?.limits ?? {};
  if (lim.memory_mb) out.push({ what: "memory", used: run.memBytes, limit: lim.memory_mb * 1024 * 1024 });
  if (lim.wall_time_s) out.push({ what: "wall time", used: run.elapsedS, limit: lim.wall_time_s });
  if (lim.output_bytes) out.push({ what: "output", used: run.outputBytes, limit: lim.output_bytes });
  if (lim.cpus) out.push({ what: "CPU", used: run.cpuPct, limit: lim.cpus * 100 });
  const maxTokens = agent?.admission?.max_tokens ?? 0;
  if (maxTokens) out.push({ what: "tokens", used: agent!.tokensUsed + run.tokens, limit: maxTokens });
  return out;
}

export function overWarning(u: Usage[]): Usage[] {
  return u.filter((x) => x.limit > 0 && x.used / x.limit > WARN_RATIO);
}

function runLine(run: RunStatus, agent: KnownAgent | undefined): string {
  const parts = [`${run.agent} ${run.state} ${duration(run.elapsedS)}`];
  if (run.state === "running") {
    parts.push(`CPU ${percent(run.cpuPct)}`);
    const memLimit = agent?.limits?.memory_mb;
    parts.push(memLimit ? `${bytes(run.memBytes)}/${bytes(memLimit * 1024 * 1024)}` : bytes(run.memBytes));
    parts.push(`${count(run.tokens)} tok`);
  }
  return parts.join(" · ");
}

export function statusView(input: StatusInput): StatusView {
  const agents = new Map([...input.agents].map((a) => [a.agent, a]));
  const live = [...input.runs].filter((r) => isLive(r.state));
  const proposals = [...input.proposals];
  const review = reviewCount(proposals);
  const quarantined = [...agents.values()].filter((a) => a.quarantined);
  const base: ActionId[] = ["runTask"];
  if (input.hasFinishedRun) base.push("followUp");
  const tail: ActionId[] = ["showLog", "restart"];

  if (!input.connected) {
    return {
      phase: "idle",
      text: "$(circle-slash) airlock: off",
      tooltip: "airlockd serve is not running — click to restart it or open its log",
      background: "warning",
      actions: ["restart", "showLog"],
    };
  }

  let background: Background = quarantined.length ? "error" : undefined;
  const quarantineNote = quarantined.map((a) => `${a.agent} quarantined: ${display(a.reason ?? "limit violations")}`);

  if (live.length) {
    const warn = live.flatMap((r) => overWarning(usages(r, agents.get(r.agent))));
    if (!background && warn.length) background = "warning";
    const first = live[0];
    const more = live.length > 1 ? ` (+${live.length - 1})` : "";
    const tooltip = [
      ...live.map((r) => `run ${r.runId}: ${runLine(r, agents.get(r.agent))}`),
      ...warn.map((u) => `above ${WARN_RATIO * 100}% of its ${u.what} limit`),
      ...quarantineNote,
      "click for actions",
    ].join("\n");
    return {
      phase: "running",
      text: `$(sync~spin) ${runLine(first, agents.get(first.agent))}${more}`,
      tooltip,
      background,
      actions: ["stopRun", "killRun", "showEvidence", ...(quarantined.length ? (["releaseAgent"] as ActionId[]) : []), ...base, ...tail],
    };
  }
  if (review.hunks > 0) {
    return {
      phase: "reviewing",
      text: `$(git-pull-request) airlock: ${plural(review.hunks, "hunk")} in ${plural(review.files, "file")}`,
      tooltip: [`${plural(review.hunks, "change")} waiting for review`, ...quarantineNote, "click for actions"].join("\n"),
      background,
      actions: [
        "reviewRun",
        "openChanges",
        "acceptAll",
        "rejectAll",
        "showEvidence",
        ...(quarantined.length ? (["releaseAgent"] as ActionId[]) : []),
        ...base,
        ...tail,
      ],
    };
  }
  if (quarantined.length) {
    return {
      phase: "quarantined",
      text: `$(error) airlock: ${quarantined.map((a) => a.agent).join(", ")} quarantined`,
      tooltip: [...quarantineNote, "click to release or inspect"].join("\n"),
      background: "error",
      actions: ["releaseAgent", "showEvidence", ...base, ...(input.hasFinishedRun ? (["undoRun"] as ActionId[]) : []), ...tail],
    };
  }
  return {
    phase: "idle",
    text: "$(shield) airlock",
    tooltip: "airlockd: no run in progress — click for actions",
    background: undefined,
    actions: [...base, ...(input.hasFinishedRun ? (["undoRun", "showEvidence"] as ActionId[]) : []), ...tail],
  };
}

export const ACTION_LABELS: Record<ActionId, string> = {
  runTask: "$(play) Run Agent Task…",
  followUp: "$(reply) Follow Up…",
  reviewRun: "$(eye) Review Run",
  openChanges: "$(diff) Open All Changes",
  acceptAll: "$(check-all) Accept All",
  rejectAll: "$(close-all) Reject All",
  undoRun: "$(discard) Undo Run…",
  stopRun: "$(debug-stop) Stop Run",
  killRun: "$(trash) Kill Run",
  releaseAgent: "$(unlock) Release Agent…",
  showEvidence: "$(law) Show Evidence",
  showLog: "$(output) Show Log",
  restart: "$(refresh) Restart Server",
};
