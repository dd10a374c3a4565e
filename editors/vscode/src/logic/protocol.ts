/** The shapes airlockd's LSP daemon sends and answers (docs/lsp.md). No `vscode` import here. */

export interface LspPosition {
  line: number;
  character: number;
}

export interface LspRange {
  start: LspPosition;
  end: LspPosition;
}

export type HunkState = "pending" | "accepted" | "rejected" | "conflicted";

export interface Hunk {
  id: string;
  range: LspRange;
  state: HunkState;
  oldLines: number;
  newLines: number;
  oldText: string;
  newText: string;
}

export interface FileChange {
  path: string;
  change: "created" | "modified" | "deleted" | string;
  kind: string;
  decision: string;
  rule: string;
  rules?: string[];
  reason: string;
  state: "pending" | "accepted" | "rejected" | "conflicted" | "denied" | string;
  binary: boolean;
  hunks: Hunk[];
}

export interface DeniedChange {
  path: string;
  change: string;
  rule: string;
  reason: string;
}

export interface Proposal {
  runId: string;
  agent: string;
  state: string;
  edit: WorkspaceEditJson;
  files: FileChange[];
  denied: DeniedChange[];
}

export interface TextEditJson {
  range: LspRange;
  newText: string;
}

export interface DocumentChangeJson {
  kind?: "create" | "rename" | "delete";
  uri?: string;
  textDocument?: { uri: string; version: number | null };
  edits?: TextEditJson[];
}

export interface WorkspaceEditJson {
  changes?: Record<string, TextEditJson[]>;
  documentChanges?: DocumentChangeJson[];
}

export interface RunStatus {
  runId: string;
  agent: string;
  state: string;
  elapsedS: number;
  cpuPct: number;
  memBytes: number;
  outputBytes: number;
  tokens: number;
  conflicts?: string[];
}

export interface AgentLimits {
  wall_time_s?: number;
  cpus?: number;
  memory_mb?: number;
  output_bytes?: number;
  [key: string]: unknown;
}

export interface AgentInfo {
  agent: string;
  adapter?: string;
  mode?: string;
  quarantined: boolean;
  reason: string | null;
  runsUsed: number;
  tokensUsed: number;
  limits?: AgentLimits;
  admission?: { max_tokens?: number; [key: string]: unknown };
}

export interface AgentStatus {
  agent: string;
  quarantined: boolean;
  reason: string | null;
  runsUsed: number;
  tokensUsed: number;
}

export interface RunSummary {
  runId: string;
  agent: string;
  mode: string;
  state: string;
  createdAt: number;
  prompt: string;
  files: number;
  review: Record<string, number>;
  detail: string;
}

export interface ApproveResult {
  runId: string;
  state: string;
  applied: string[];
  conflicts: string[];
}

export interface Evidence {
  runId: string;
  agent: string;
  state: string;
  policy: { revision: string; snapshot: string | null };
  rules: { path: string; change: string; decision: string; rule: string; reason: string }[];
  withheld: { path: string; rule?: string; [key: string]: unknown }[];
  resources: {
    container: Record<string, unknown>;
    outputBytes: number;
    tokens: number;
    limit: Record<string, unknown> | null;
    peak?: Record<string, number>;
  };
  transitions: { state: string; at: number; detail?: string }[];
  timeline: Record<string, unknown>[];
  applied: { txid: string; paths: string[]; at: number; undone?: boolean }[];
}

/** Selection of `airlock.approve` / `airlock.reject`. */
export interface Decision {
  runId: string;
  paths?: string[];
  hunks?: Record<string, string[]>;
}

export const LIVE_STATES = new Set(["admitted", "staging", "running", "inspecting"]);

export function isLive(state: string): boolean {
  return LIVE_STATES.has(state);
}

/** JSON-RPC error codes of airlockd/errors.py that the extension treats specially. */
export const ErrorCode = {
  conflict: -32030,
  admission: -32020,
  notFound: -32011,
  state: -32012,
} as const;
