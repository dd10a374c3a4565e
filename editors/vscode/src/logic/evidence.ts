/** The evidence of a run as a tree of labelled nodes (the Evidence view renders it). Withheld files
 * are shown by name only: the daemon sends no content, and nothing here would show it. Every label,
 * description and tooltip is escaped (logic/escape.ts): paths, reasons and audit data are text an
 * agent may have chosen. No `vscode`. */

import { display, escape } from "./escape";
import { bytes, duration, time } from "./format";
import type { Evidence } from "./protocol";

export interface Node {
  label: string;
  description?: string;
  tooltip?: string;
  icon?: string;
  children?: Node[];
}

/** Highest CPU/memory the extension saw in this run's `airlock/runStatus` samples. */
export interface Peaks {
  cpuPct: number;
  memBytes: number;
}

function leaf(label: string, description?: unknown, icon?: string): Node {
  const d = description === undefined || description === null ? undefined : String(description);
  return { label, description: d, tooltip: d ? `${label}: ${d}` : label, icon };
}

function list(v: unknown): string {
  if (Array.isArray(v)) return v.length ? v.join(", ") : "none";
  if (v === undefined || v === null) return "—";
  return String(v);
}

/** The runtime a run's container had, as a reviewer reads it. */
function runtimeText(runtime: string): string {
  return runtime === "runsc" ? "runsc (gVisor: its own kernel between the agent and the host)" : runtime;
}

/** The process cap: the pids cgroup under runc; under runsc RLIMIT_NPROC inside gVisor's kernel
 * (the host's pids cgroup is then only a backstop for gVisor's own threads). */
function processCap(eff: Record<string, unknown>): string {
  const ulimits = eff["ulimits"] as Record<string, unknown[]> | undefined;
  const nproc = ulimits?.["nproc"];
  if (Array.isArray(nproc) && nproc.length > 1) {
    return `${String(nproc[1])} (nproc, in gVisor; host backstop ${list(eff["pids_limit"])})`;
  }
  return list(eff["pids_limit"]);
}

function effective(ev: Evidence): Record<string, unknown> {
  const c = ev.resources?.container ?? {};
  const e = (c as { effective?: unknown }).effective;
  return e && typeof e === "object" ? (e as Record<string, unknown>) : {};
}

/** `n` and its children as a person is shown them: one-line texts escaped whole, tooltips by line. */
function shown(n: Node): Node {
  return {
    ...n,
    label: display(n.label),
    description: n.description === undefined ? undefined : display(n.description),
    tooltip: n.tooltip === undefined ? undefined : escape(n.tooltip),
    children: n.children?.map(shown),
  };
}

export function evidenceTree(ev: Evidence, observed?: Peaks): Node[] {
  return nodes(ev, observed).map(shown);
}

function nodes(ev: Evidence, observed?: Peaks): Node[] {
  const eff = effective(ev);
  const c = ev.resources?.container ?? {};
  const rules = new Map<string, { decision: string; reason: string; paths: string[] }>();
  for (const r of ev.rules ?? []) {
    const e = rules.get(r.rule) ?? { decision: r.decision, reason: r.reason, paths: [] };
    e.paths.push(`${r.path} (${r.change})`);
    rules.set(r.rule, e);
  }
  const peak = ev.resources?.peak ?? {};
  const peakMem = Math.max(Number(peak["mem_bytes"] ?? 0), observed?.memBytes ?? 0);
  const peakCpu = Math.max(Number(peak["cpu_pct"] ?? 0), observed?.cpuPct ?? 0);

  return [
    {
      label: `run ${ev.runId}`,
      description: `${ev.agent} · ${ev.state}`,
      icon: "pulse",
      children: [leaf("agent", ev.agent), leaf("state", ev.state)],
    },
    { label: "policy", description: `revision ${ev.policy?.revision ?? "?"}`, icon: "law", children: [leaf("revision", ev.policy?.revision)] },
    {
      label: "rules hit",
      description: String(rules.size),
      icon: "checklist",
      children: [...rules.entries()].map(([rule, r]) => ({
        label: rule,
        description: `${r.decision} · ${r.reason}`,
        tooltip: `${rule} → ${r.decision}: ${r.reason}`,
        children: r.paths.map((p) => leaf(p)),
      })),
    },
    {
      label: "withheld files",
      description: String(ev.withheld?.length ?? 0),
      icon: "eye-closed",
      // names and the rule only: never a value
      children: (ev.withheld ?? []).map((w) => leaf(String(w.path), w.rule ? `rule ${w.rule}` : undefined)),
    },
    {
      label: "container",
      description: `network ${list(eff["network_mode"])} · runtime ${list(eff["runtime"] ?? c["runtime"] ?? "runc")}`,
      icon: "server-environment",
      children: [
        leaf("runtime", runtimeText(String(eff["runtime"] ?? c["runtime"] ?? "runc"))),
        leaf("network mode", list(eff["network_mode"])),
        leaf("capabilities dropped", list(eff["cap_drop"])),
        leaf("capabilities added", list(eff["cap_add"])),
        leaf("privileged", list(eff["privileged"])),
        leaf("read-only root", list(eff["read_only_root"])),
        leaf("security options", list(eff["security_opt"])),
        leaf("user", list(eff["user"])),
        leaf("image", list(c["image"] ?? eff["image"])),
        leaf("exit code", list(c["exit_code"])),
      ],
    },
    {
      label: "resources",
      description: `peak ${bytes(peakMem)}`,
      icon: "dashboard",
      children: [
        leaf("peak memory", bytes(peakMem)),
        leaf("peak CPU", `${Math.round(peakCpu)}%`),
        leaf("memory limit", eff["memory_bytes"] ? bytes(Number(eff["memory_bytes"])) : "—"),
        leaf("CPUs", list(eff["cpus"])),
        leaf("pids limit", processCap(eff)),
        leaf("duration", c["duration_s"] !== undefined ? duration(Number(c["duration_s"])) : "—"),
        leaf("output", bytes(ev.resources?.outputBytes ?? 0)),
        leaf("tokens", ev.resources?.tokens ?? 0),
        leaf("limit hit", ev.resources?.limit ? JSON.stringify(ev.resources.limit) : "none"),
      ],
    },
    ...egressNodes(ev),
    {
      label: "audit timeline",
      description: String(ev.timeline?.length ?? 0),
      icon: "history",
      children: (ev.timeline ?? []).map(timelineNode),
    },
    {
      label: "applied",
      description: String(ev.applied?.length ?? 0),
      icon: "git-commit",
      children: (ev.applied ?? []).map((a) =>
        leaf(`${a.txid}${a.undone ? " (undone)" : ""}`, `${time(a.at)} · ${a.paths.join(", ")}`),
      ),
    },
  ];
}

/** What the package broker let the agent reach and refused (none: the run had no broker). */
function egressNodes(ev: Evidence): Node[] {
  const e = ev.egress;
  if (!e) return [];
  const refusals = e.refusals.map((r) =>
    leaf(r.host !== undefined ? `${r.host}:${r.port ?? "?"}` : String(r.target ?? "?"), `${r.status} · ${r.reason}`),
  );
  if (e.refused > e.refusals.length) refusals.push(leaf(`${e.refused - e.refusals.length} more`, "in the audit trail"));
  return [
    {
      label: "package broker",
      description: `${e.tunnels} tunnels · ${bytes(e.bytes)} · ${e.refused} refused`,
      icon: "globe",
      children: [
        leaf("allowed", list(e.allowed)),
        { label: "reached", description: String(e.hosts.length), children: e.hosts.map((h) => leaf(h.host, bytes(h.bytes))) },
        { label: "refused", description: String(e.refused), children: refusals },
      ],
    },
  ];
}

/** One audit event (`{seq, at, kind, run, agent, policy, data, prev, hash}`) as a node. */
function timelineNode(e: Record<string, unknown>): Node {
  const name = String(e["kind"] ?? e["event"] ?? "event");
  const at = e["at"];
  const when = typeof at === "number" ? time(at) : typeof at === "string" ? at : "";
  const data = e["data"] && typeof e["data"] === "object" ? (e["data"] as Record<string, unknown>) : {};
  const details = Object.entries(data)
    .filter(([, v]) => v !== null && v !== undefined)
    .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : String(v)}`);
  return {
    label: name,
    description: [when, details.slice(0, 2).join(" ")].filter(Boolean).join(" · "),
    tooltip: [name, when, ...details].filter(Boolean).join("\n"),
  };
}
