/** Review logic over the daemon's proposals: which hunks are pending, where they are, the proposed
 * text of a file, navigation and the selections sent to `airlock.approve`. No `vscode` import. */

import { display, escape, markLines } from "./escape";
import type { Decision, FileChange, Hunk, Proposal } from "./protocol";

/** `text` split into lines that keep their endings (`\r\n`, `\n` or `\r`), as airlockd splits. */
export function splitLines(text: string): string[] {
  return text.match(/[^\r\n]*(?:\r\n|\n|\r)|[^\r\n]+$/g) ?? [];
}

export function isPendingFile(f: FileChange): boolean {
  return f.state === "pending";
}

export function pendingHunks(f: FileChange): Hunk[] {
  if (!isPendingFile(f)) return [];
  return f.hunks.filter((h) => h.state === "pending").sort((a, b) => a.range.start.line - b.range.start.line);
}

/** Changes that can still be decided: pending hunks, and each pending file that has no hunks
 * (created, deleted, binary) counts as one. */
export function pendingChanges(f: FileChange): number {
  if (!isPendingFile(f)) return 0;
  return f.hunks.length ? pendingHunks(f).length : 1;
}

export function pendingFiles(p: Proposal): FileChange[] {
  return p.state === "proposed" ? p.files.filter((f) => pendingChanges(f) > 0) : [];
}

/** Pending files whose change the daemon marked (a look-alike name, hidden characters, escapes in
 * the text): accepting the whole run names them first. */
export function markedFiles(p: Proposal): FileChange[] {
  return pendingFiles(p).filter((f) => f.marks?.length);
}

/** Marked files for a dialog's plain-text detail: each path escaped, its marks below it. */
export function markedDetail(files: readonly FileChange[]): string {
  return files.map((f) => [display(f.path), ...markLines(f.marks).map((m) => `  ${m}`)].join("\n")).join("\n");
}

export interface ReviewCount {
  hunks: number;
  files: number;
}

export function reviewCount(proposals: Iterable<Proposal>): ReviewCount {
  let hunks = 0;
  let files = 0;
  for (const p of proposals) {
    for (const f of pendingFiles(p)) {
      hunks += pendingChanges(f);
      files += 1;
    }
  }
  return { hunks, files };
}

export function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

/** Lines `[start, end)` a pending hunk covers in the live file; an insertion covers the line it goes
 * before (at least one line, so the cursor can be on it). */
export function hunkLines(h: Hunk): { start: number; end: number } {
  const start = h.range.start.line;
  return { start, end: start + Math.max(h.oldLines, 1) };
}

/** The line where a hunk's marker and lens go: an insertion after the last line sits on that line. */
export function hunkAnchor(h: Hunk, lineCount: number): number {
  const start = h.range.start.line;
  return Math.max(0, Math.min(start, lineCount - 1));
}

export interface HunkRef {
  runId: string;
  path: string;
  hunk: Hunk;
}

/** The pending hunk of `path` under `line`, if any (the first run's wins). */
export function hunkAt(proposals: Iterable<Proposal>, path: string, line: number, lineCount: number): HunkRef | undefined {
  for (const p of proposals) {
    if (p.state !== "proposed") continue;
    const f = p.files.find((x) => x.path === path);
    if (!f) continue;
    for (const h of pendingHunks(f)) {
      const { start, end } = hunkLines(h);
      const anchor = hunkAnchor(h, lineCount);
      if ((line >= start && line < end) || line === anchor) return { runId: p.runId, path, hunk: h };
    }
  }
  return undefined;
}

export interface Location {
  runId: string;
  path: string;
  line: number;
}

/** Every pending change of every proposal in review order: by path, then by line. */
export function reviewStops(proposals: Iterable<Proposal>): Location[] {
  const out: Location[] = [];
  for (const p of proposals) {
    for (const f of pendingFiles(p)) {
      const hs = pendingHunks(f);
      if (hs.length === 0) out.push({ runId: p.runId, path: f.path, line: 0 });
      for (const h of hs) out.push({ runId: p.runId, path: f.path, line: h.range.start.line });
    }
  }
  return out.sort((a, b) => (a.path === b.path ? a.line - b.line : a.path < b.path ? -1 : 1));
}

/** The next (or previous) pending change from `path`:`line`, wrapping around; undefined when none. */
export function step(
  proposals: Iterable<Proposal>,
  from: { path: string | undefined; line: number },
  direction: 1 | -1,
): Location | undefined {
  const stops = reviewStops(proposals);
  if (stops.length === 0) return undefined;
  const key = (s: { path: string; line: number }): [string, number] => [s.path, s.line];
  const cmp = (a: [string, number], b: [string, number]): number =>
    a[0] === b[0] ? a[1] - b[1] : a[0] < b[0] ? -1 : 1;
  const here: [string, number] = [from.path ?? "", from.line];
  if (direction === 1) return stops.find((s) => cmp(key(s), here) > 0) ?? stops[0];
  const before = stops.filter((s) => cmp(key(s), here) < 0);
  return before.length ? before[before.length - 1] : stops[stops.length - 1];
}

/** The text a file would have if every pending hunk of `f` landed on `disk` (the live file).
 * Created files take their content from the proposal's edit; deleted files are empty. */
export function proposedText(disk: string, f: FileChange, p: Proposal): string {
  if (f.change === "deleted") return "";
  if (f.change === "created") return createdContent(p, f.path) ?? disk;
  const lines = splitLines(disk);
  const hs = pendingHunks(f).slice().sort((a, b) => b.range.start.line - a.range.start.line);
  for (const h of hs) {
    const start = Math.min(h.range.start.line, lines.length);
    lines.splice(start, h.oldLines, ...splitLines(h.newText));
  }
  return lines.join("");
}

function uriPath(uri: string): string {
  try {
    return decodeURIComponent(new URL(uri).pathname);
  } catch {
    return uri;
  }
}

/** Content of a created file in the proposal's edit (`CreateFile` + an insert at 0:0). */
export function createdContent(p: Proposal, path: string): string | undefined {
  const matches = (uri: string): boolean => uriPath(uri).endsWith("/" + path);
  for (const dc of p.edit?.documentChanges ?? []) {
    if (dc.textDocument && matches(dc.textDocument.uri) && dc.edits?.length) {
      return dc.edits.map((e) => e.newText).join("");
    }
  }
  for (const [uri, edits] of Object.entries(p.edit?.changes ?? {})) {
    if (matches(uri) && edits.length === 1) return edits[0].newText;
  }
  return undefined;
}

// -- selections ------------------------------------------------------------------------------------

export function hunkDecision(ref: HunkRef): Decision {
  return { runId: ref.runId, hunks: { [ref.path]: [ref.hunk.id] } };
}

export function fileDecision(runId: string, path: string): Decision {
  return { runId, paths: [path] };
}

export function allDecision(runId: string): Decision {
  return { runId };
}

/** Proposals that still wait for a decision, newest first. */
export function openProposals(proposals: Iterable<Proposal>): Proposal[] {
  return [...proposals].filter((p) => pendingFiles(p).length > 0).reverse();
}

/** The run a file-level command acts on: the proposal with a pending change at `path`. */
export function runFor(proposals: Iterable<Proposal>, path: string): Proposal | undefined {
  return openProposals(proposals).find((p) => pendingFiles(p).some((f) => f.path === path));
}

/** A one-line description of a pending file for pickers and trees. */
export function describeFile(f: FileChange): string {
  const n = pendingHunks(f).length;
  const what = f.binary ? "binary" : f.hunks.length ? plural(n, "hunk") : f.change;
  return `${f.change} · ${what} · ${f.decision} (${f.rule})`;
}

/** A hunk as "-old" / "+new" lines for a hover, each escaped (line endings are not part of a line). */
export function diffText(h: Pick<Hunk, "oldText" | "newText">): string {
  const strip = (s: string): string[] => (s ? s.replace(/\r?\n$/, "").split(/\r?\n/).map((l) => escape(l)) : []);
  return [...strip(h.oldText).map((l) => `-${l}`), ...strip(h.newText).map((l) => `+${l}`)].join("\n");
}

/** Where each pending hunk of `f` starts in the proposed text (earlier hunks shift it). */
export function proposedStarts(f: FileChange): { hunk: Hunk; start: number; lines: number }[] {
  let delta = 0;
  return pendingHunks(f).map((h) => {
    const start = h.range.start.line + delta;
    delta += h.newLines - h.oldLines;
    return { hunk: h, start, lines: h.newLines };
  });
}

/** The pending hunk under `line` of the proposed document of `path` in run `runId`. */
export function hunkAtProposed(p: Proposal | undefined, path: string, line: number): HunkRef | undefined {
  const f = p?.files.find((x) => x.path === path);
  if (!p || !f) return undefined;
  for (const { hunk, start, lines } of proposedStarts(f)) {
    if (line >= start && line < start + Math.max(lines, 1)) return { runId: p.runId, path, hunk };
  }
  return undefined;
}

/** Disk line of `line` in the proposed text of `f`: lines inside a hunk map to the hunk's start. */
export function diskLineOf(f: FileChange, line: number): number {
  let delta = 0;
  for (const { hunk, start, lines } of proposedStarts(f)) {
    if (line < start) break;
    if (line < start + lines) return hunk.range.start.line;
    delta = start + lines - (hunk.range.start.line + hunk.oldLines);
  }
  return Math.max(0, line - delta);
}

/** Line where the pending hunk of `f` that starts at disk line `diskLine` starts in the proposed
 * text (for a line that starts no pending hunk: the line shifted by the hunks above it). */
export function proposedLineOf(f: FileChange, diskLine: number): number {
  let delta = 0;
  for (const { hunk, start } of proposedStarts(f)) {
    const s = hunk.range.start.line;
    if (diskLine === s) return start;
    if (diskLine < s) break;
    if (diskLine < s + hunk.oldLines) return start;
    delta = start - s + hunk.newLines - hunk.oldLines;
  }
  return diskLine + delta;
}
