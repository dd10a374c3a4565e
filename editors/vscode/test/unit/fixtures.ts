import type { FileChange, Hunk, Proposal } from "../../src/logic/protocol";

export const MOD = Array.from({ length: 20 }, (_, i) => `line ${i + 1}\n`).join("");

export function hunk(id: string, start: number, oldText: string, newText: string, state: Hunk["state"] = "pending"): Hunk {
  const n = (s: string): number => (s ? s.split("\n").length - (s.endsWith("\n") ? 1 : 0) : 0);
  return {
    id,
    range: { start: { line: start, character: 0 }, end: { line: start + n(oldText), character: 0 } },
    state,
    oldLines: n(oldText),
    newLines: n(newText),
    oldText,
    newText,
  };
}

export function file(path: string, hunks: Hunk[], extra: Partial<FileChange> = {}): FileChange {
  return {
    path,
    change: "modified",
    kind: "file",
    decision: "auto",
    rule: "rules[2]",
    rules: ["rules[2]"],
    reason: "ordinary source code",
    state: "pending",
    binary: false,
    hunks,
    ...extra,
  };
}

export function proposal(files: FileChange[], extra: Partial<Proposal> = {}): Proposal {
  return {
    runId: "r1",
    agent: "bot",
    state: "proposed",
    edit: { documentChanges: [] },
    files,
    denied: [],
    ...extra,
  };
}

/** src/mod.py as the daemon's test proposes it: line 2 and line 18 rewritten. */
export function modProposal(): Proposal {
  return proposal(
    [
      file("src/mod.py", [hunk("h2", 1, "line 2\n", "line two\n"), hunk("h18", 17, "line 18\n", "line eighteen\n")]),
      file("src/new.py", [], { change: "created" }),
      file("docs/old.md", [], { change: "deleted", decision: "auto" }),
    ],
    {
      edit: {
        documentChanges: [
          { kind: "create", uri: "file:///ws/src/new.py" },
          {
            textDocument: { uri: "file:///ws/src/new.py", version: null },
            edits: [{ range: { start: { line: 0, character: 0 }, end: { line: 0, character: 0 } }, newText: "def new():\n    return 1\n" }],
          },
        ],
      },
      denied: [{ path: "AGENTS.md", change: "modified", rule: "invariant:protected", reason: "protected instruction file" }],
    },
  );
}
