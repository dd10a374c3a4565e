import assert from "node:assert/strict";
import { test } from "node:test";

import {
  allDecision,
  createdContent,
  diskLineOf,
  fileDecision,
  hunkAt,
  hunkAtProposed,
  hunkDecision,
  openProposals,
  pendingChanges,
  proposedLineOf,
  proposedText,
  reviewCount,
  splitLines,
  step,
} from "../../src/logic/review";
import { MOD, file, hunk, modProposal, proposal } from "./fixtures";
import type { Proposal } from "../../src/logic/protocol";

test("splitLines keeps endings and joins back", () => {
  for (const text of ["", "a", "a\n", "a\r\nb\rc\n", "x\n\n\ny", "\n"]) {
    assert.equal(splitLines(text).join(""), text);
  }
  assert.deepEqual(splitLines("a\r\nb\rc"), ["a\r\n", "b\r", "c"]);
});

test("proposedText applies every pending hunk to the live file", () => {
  const p = modProposal();
  const want = MOD.replace("line 2\n", "line two\n").replace("line 18\n", "line eighteen\n");
  assert.equal(proposedText(MOD, p.files[0], p), want);
});

test("proposedText skips decided hunks and uses live ranges after a landed hunk", () => {
  // h2 landed (+1 line: "line two\nline 2.5\n"), so h18 now starts one line lower in the live file
  const live = MOD.replace("line 2\n", "line two\nline 2.5\n");
  const f = file("src/mod.py", [
    hunk("h2", 1, "line 2\n", "line two\nline 2.5\n", "accepted"),
    hunk("h18", 18, "line 18\n", "line eighteen\n"),
  ]);
  const p = proposal([f]);
  assert.equal(proposedText(live, f, p), live.replace("line 18\n", "line eighteen\n"));
});

test("insertions and deletions", () => {
  const f = file("a.txt", [hunk("ins", 0, "", "first\n"), hunk("del", 19, "line 20\n", "")]);
  const p = proposal([f]);
  const out = proposedText(MOD, f, p);
  assert.ok(out.startsWith("first\nline 1\n"));
  assert.ok(out.endsWith("line 19\n"));
});

test("created files take the edit's content, deleted files are empty", () => {
  const p = modProposal();
  assert.equal(proposedText("", p.files[1], p), "def new():\n    return 1\n");
  assert.equal(proposedText("old\n", p.files[2], p), "");
  assert.equal(createdContent(p, "new.py"), "def new():\n    return 1\n"); // suffix on a path boundary
  assert.equal(createdContent(p, "w.py"), undefined);
});

test("review count: hunks and hunkless files, denied never counted", () => {
  const p = modProposal();
  assert.deepEqual(reviewCount([p]), { hunks: 4, files: 3 });
  assert.equal(pendingChanges(file("x", [hunk("a", 0, "x\n", "y\n", "rejected")])), 0);
  assert.deepEqual(reviewCount([{ ...p, state: "applied" }]), { hunks: 0, files: 0 });
});

test("hunkAt finds the hunk under the cursor in the live file", () => {
  const p = modProposal();
  assert.equal(hunkAt([p], "src/mod.py", 1, 20)?.hunk.id, "h2");
  assert.equal(hunkAt([p], "src/mod.py", 17, 20)?.hunk.id, "h18");
  assert.equal(hunkAt([p], "src/mod.py", 5, 20), undefined);
  assert.equal(hunkAt([p], "src/other.py", 1, 20), undefined);
});

test("hunks in the proposed document: positions shift by earlier hunks", () => {
  const f = file("m", [hunk("a", 1, "line 2\n", "two\ntwo b\n"), hunk("b", 10, "line 11\n", "eleven\n")]);
  const p = proposal([f]);
  assert.equal(hunkAtProposed(p, "m", 1)?.hunk.id, "a");
  assert.equal(hunkAtProposed(p, "m", 2)?.hunk.id, "a");
  assert.equal(hunkAtProposed(p, "m", 11)?.hunk.id, "b");
  assert.equal(hunkAtProposed(p, "m", 10), undefined);
  assert.equal(proposedLineOf(f, 10), 11);
  assert.equal(diskLineOf(f, 11), 10);
  assert.equal(diskLineOf(f, 15), 14);
  assert.equal(diskLineOf(f, 0), 0);
});

test("next/previous hunk walks every pending change in path order and wraps", () => {
  const p = modProposal();
  const at = (path: string | undefined, line: number, d: 1 | -1): string => {
    const s = step([p], { path, line }, d);
    return s ? `${s.path}:${s.line}` : "none";
  };
  assert.equal(at(undefined, -1, 1), "docs/old.md:0");
  assert.equal(at("docs/old.md", 0, 1), "src/mod.py:1");
  assert.equal(at("src/mod.py", 1, 1), "src/mod.py:17");
  assert.equal(at("src/mod.py", 17, 1), "src/new.py:0");
  assert.equal(at("src/new.py", 0, 1), "docs/old.md:0");
  assert.equal(at("src/mod.py", 1, -1), "docs/old.md:0");
  assert.equal(at("docs/old.md", 0, -1), "src/new.py:0");
  assert.equal(step([], { path: undefined, line: 0 }, 1), undefined);
});

test("selections sent to airlock.approve", () => {
  const p = modProposal();
  assert.deepEqual(hunkDecision({ runId: "r1", path: "src/mod.py", hunk: p.files[0].hunks[1] }), {
    runId: "r1",
    hunks: { "src/mod.py": ["h18"] },
  });
  assert.deepEqual(fileDecision("r1", "src/new.py"), { runId: "r1", paths: ["src/new.py"] });
  assert.deepEqual(allDecision("r1"), { runId: "r1" });
});

test("open proposals: newest first, finished ones dropped", () => {
  const a = { ...modProposal(), runId: "a" };
  const b = { ...modProposal(), runId: "b" };
  const c: Proposal = { ...modProposal(), runId: "c", state: "applied" };
  assert.deepEqual(openProposals([a, b, c]).map((p) => p.runId), ["b", "a"]);
});
