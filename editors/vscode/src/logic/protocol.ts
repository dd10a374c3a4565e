/** The shapes airlockd's LSP daemon sends and answers (docs/lsp.md). No `vscode` import here.
 *
 * The wire shapes are generated from airlockd/protocol.py (`make protocol`: the JSON Schema in
 * schema/airlock.schema.json, then protocol.gen.ts); this module re-exports them under the names
 * the extension uses and keeps the helpers that are not wire shapes. */

import type {
  AgentInfo,
  AgentStatus,
  DecideArgs,
  Mode,
  Position,
  Range,
  RunState,
  RunSummary,
  TextEdit,
  WorkspaceEdit,
} from "./protocol.gen";

export type {
  AgentInfo,
  AgentStatus,
  ApproveResult,
  ChangeKind,
  DecideArgs,
  DeniedChange,
  DiffResult,
  DocumentChange,
  Evidence,
  FileChange,
  FileState,
  Hunk,
  HunkState,
  Mode,
  Proposal,
  RunOutput,
  RunResult,
  RunState,
  RunStatus,
  RunSummary,
  RunTaskArgs,
} from "./protocol.gen";
export type { Decision as DecisionKind } from "./protocol.gen";

export type LspPosition = Position;
export type LspRange = Range;
export type TextEditJson = TextEdit;
export type WorkspaceEditJson = WorkspaceEdit;

/** Selection of `airlock.approve` / `airlock.reject`. */
export type Decision = DecideArgs;

/** What the extension knows of an agent: its last `airlock/agentStatus`, and its configuration
 * once `airlock.listAgents` answered. */
export type KnownAgent = AgentStatus & Partial<AgentInfo>;

/** What the extension knows of a run: its summary, or, before `airlock.listRuns` answered, what
 * its `airlock/runStatus` said (no mode yet). */
export type KnownRun = Omit<RunSummary, "mode"> & { mode?: Mode };

export const LIVE_STATES: ReadonlySet<string> = new Set<RunState>(["admitted", "staging", "running", "inspecting"]);

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
