import assert from "node:assert/strict";
import { test } from "node:test";

import { display, displayAll, displayLabel, escape, escapeIcons, fenced, hasHidden, markLines, pathLabel } from "../../src/logic/escape";
import { evidenceTree, type Node } from "../../src/logic/evidence";
import type { Evidence } from "../../src/logic/protocol";
import { diffText, markedDetail, markedFiles } from "../../src/logic/review";
import { ATTACKS, LOOKALIKE, LOOKALIKE_MARK, UNDRAWN, file, hostileProposal, proposal } from "./fixtures";

test("each attack is escaped as airlockd's names.escape writes it; lines stay lines", () => {
  for (const [name, [attack, want]] of Object.entries(ATTACKS)) {
    assert.equal(escape(attack), want, name);
    assert.doesNotMatch(escape(attack), UNDRAWN, name);
    assert.equal(hasHidden(attack), true, name);
    assert.equal(hasHidden(escape(attack)), false, name);
    assert.equal(escape(escape(attack)), escape(attack), `${name}: escaping twice changes nothing`);
  }
});

test("the spelling is Python's repr: \\xNN, \\n \\t \\r, \\uNNNN, \\UNNNNNNNN, lone surrogates too", () => {
  assert.equal(display("a\nb\tc\rd\x00\x7f"), "a\\nb\\tc\\rd\\x00\\x7f");
  assert.equal(escape("a\nb\tc"), "a\nb\tc");
  assert.equal(escape("\u00ad\u061c\u200b\u2028\u2066\ufeff\ufe0f\ue000\u115f"), "\\xad\\u061c\\u200b\\u2028\\u2066\\ufeff\\ufe0f\\ue000\\u115f");
  assert.equal(escape("\u{e0001}\u{10fffd}"), "\\U000e0001\\U0010fffd");
  assert.equal(escape("x\ud800y"), "x\\ud800y");
});

test("what is drawn is left as it is: letters of any script, emoji, the replacement character", () => {
  for (const s of [LOOKALIKE, "café/naïve.md", "日本語.txt", "😀.txt", "\ufffd", "a b"]) assert.equal(display(s), s);
});

test("marks and labels: ⚠ in front, escaped", () => {
  assert.deepEqual(markLines([LOOKALIKE_MARK, "x\x1b"]), [`⚠ ${LOOKALIKE_MARK}`, "⚠ x\\x1b"]);
  assert.equal(pathLabel(LOOKALIKE, [LOOKALIKE_MARK]), `⚠ ${LOOKALIKE}`);
  assert.equal(pathLabel("evil\u202etxt.exe", []), "evil\\u202etxt.exe");
  assert.equal(displayAll(["a\x1b", "b\n"]), "a\\x1b, b\\n");
});

/** What VS Code draws of a label with icons (its renderLabelWithIcons): the text, and the icons. */
function drawn(label: string): { text: string; icons: string[] } {
  const icons: string[] = [];
  const text = label.replace(/(\\)?\$\(([A-Za-z0-9-]+(?:~[A-Za-z]+)?)\)/g, (_, escaped: string | undefined, name: string) => {
    if (escaped) return `$(${name})`;
    icons.push(name);
    return "";
  });
  return { text, icons };
}

test("$(name) in a label, lens or status text an agent chose is shown as written, never as an icon", () => {
  for (const s of ["$(check) approved.py", "a$(sync~spin)b", "$(pass)$(pass)", "a\\$(check).py", "\\\\$(x)", "$(check"]) {
    assert.deepEqual(drawn(escapeIcons(s)), { text: s, icons: [] }, s);
  }
  assert.equal(escapeIcons("$(check) ok"), "\\$(check) ok");
  assert.equal(escapeIcons("$(not an icon) $5 (x) $() $(a~1)"), "$(not an icon) $5 (x) $() $(a~1)", "drawn as it is: left alone");
  assert.equal(displayLabel("$(check)\x1b[8m\n"), "\\$(check)\\x1b[8m\\n");
  assert.deepEqual(drawn(`$(error) quarantined: ${displayLabel("$(pass) fine")}`), { text: " quarantined: $(pass) fine", icons: ["error"] });
});

test("accept all: the marked pending files, each path escaped with its marks", () => {
  assert.deepEqual(markedFiles(hostileProposal()).map((f) => f.path), [LOOKALIKE], "a denied change is never accepted: not listed");
  const p = proposal([
    file("a\u202e.py", [], { marks: ["bidirectional control in the name"] }),
    file("b.py", [], { marks: [] }),
    file("c.py", [], { marks: ["x"], state: "accepted" }),
  ]);
  assert.deepEqual(markedFiles(p).map((f) => f.path), ["a\u202e.py"]);
  assert.equal(markedDetail(markedFiles(p)), "a\\u202e.py\n  ⚠ bidirectional control in the name");
  assert.equal(markedFiles(proposal([file("d.py", [])])).length, 0);
});

test("a hunk for a hover: each line escaped, CRLF endings are not shown, no fence can be closed", () => {
  assert.equal(diffText({ oldText: "a\r\nb\r\n", newText: "a\x1b[8m\rb\r\n" }), "-a\n-b\n+a\\x1b[8m\\rb");
  const text = "```\nescaped?\n````";
  const block = fenced(text, "diff");
  assert.ok(block.startsWith("`````diff\n") && block.endsWith("\n`````"), block);
});

test("the evidence tree shows nothing undrawn: paths, reasons, withheld names and audit data", () => {
  const attack = Object.values(ATTACKS).map(([a]) => a).join("");
  const ev = {
    runId: "r1",
    agent: "bot",
    state: "proposed",
    policy: { revision: "p1" },
    rules: [{ path: `src/${attack}`, change: "created", decision: "review", rule: "invariant:hidden-characters", reason: attack }],
    withheld: [{ path: "\u202e.env", rule: "w" }],
    resources: { container: {}, peak: {}, outputBytes: 0, tokens: 0, limit: null },
    timeline: [{ kind: "inspected", at: 1, data: { path: `a\x1b]52;c;eA==\x07`, note: attack } }],
    applied: [{ txid: "t1", at: 1, undone: false, paths: [`b\u009b2K`] }],
  } as unknown as Evidence;
  const texts: string[] = [];
  const walk = (n: Node): void => {
    texts.push(n.label, n.description ?? "", n.tooltip ?? "");
    n.children?.forEach(walk);
  };
  evidenceTree(ev).forEach(walk);
  for (const t of texts) assert.doesNotMatch(t, UNDRAWN, JSON.stringify(t));
  assert.ok(texts.some((t) => t.includes("\\x1b[8m")) && texts.some((t) => t.includes("\\u202e.env")));
});
