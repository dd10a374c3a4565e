/** Inline review on the real file, which is never modified here: the proposed side as a read-only
 * virtual document, decorations on pending hunks, "Accept | Reject | Diff" lenses and the context
 * keys that scope the review keybindings. */

import * as vscode from "vscode";

import { display, escapeIcons, fenced, markLines } from "../logic/escape";
import type { FileChange, Proposal } from "../logic/protocol";
import { diffText, hunkAnchor, hunkAt, hunkLines, pendingHunks, plural, proposedText, type HunkRef } from "../logic/review";
import type { AirlockState } from "../logic/state";
import { PROPOSED_SCHEME, type Paths } from "./paths";

export const CTX_REVIEW_ACTIVE = "airlock.reviewActive";
export const CTX_HUNK_AT_CURSOR = "airlock.hunkAtCursor";
export const CTX_RUNNING = "airlock.running";

/** Serves `airlock-proposed:` documents: the file on disk with the run's pending hunks applied.
 * The text is the file's real bytes, never escaped: VS Code's editor draws control characters and
 * highlights bidirectional and invisible ones by itself (`editor.renderControlCharacters`,
 * `editor.unicodeHighlight.*`). Everything around it (labels, lenses, hovers) is escaped here. */
export class ProposedDocuments implements vscode.TextDocumentContentProvider {
  private readonly emitter = new vscode.EventEmitter<vscode.Uri>();
  readonly onDidChange = this.emitter.event;

  constructor(
    private readonly state: AirlockState,
    private readonly paths: Paths,
  ) {}

  async provideTextDocumentContent(uri: vscode.Uri): Promise<string> {
    const ref = this.paths.parseProposed(uri);
    if (!ref || ref.side === "empty") return "";
    const p = this.state.proposals.get(ref.runId);
    const f = p?.files.find((x) => x.path === ref.rel);
    const disk = await readText(this.paths.fileUri(ref.rel));
    if (!p || !f) return disk;
    if (f.binary) return `(binary file ${display(f.path)}: ${f.change}; not shown)\n`;
    return proposedText(disk, f, p);
  }

  /** Tell VS Code every open proposed document may have changed. */
  refresh(): void {
    for (const doc of vscode.workspace.textDocuments) {
      if (doc.uri.scheme === PROPOSED_SCHEME) this.emitter.fire(doc.uri);
    }
  }
}

export async function readText(uri: vscode.Uri): Promise<string> {
  try {
    return new TextDecoder().decode(await vscode.workspace.fs.readFile(uri));
  } catch {
    return "";
  }
}

/** Pending hunks of `path` across the open proposals. */
export function pendingAt(state: AirlockState, path: string): { proposal: Proposal; file: FileChange }[] {
  const out: { proposal: Proposal; file: FileChange }[] = [];
  for (const p of state.open()) {
    const f = p.files.find((x) => x.path === path && x.state === "pending");
    if (f) out.push({ proposal: p, file: f });
  }
  return out;
}

export class ReviewDecorations implements vscode.Disposable {
  private readonly pending = vscode.window.createTextEditorDecorationType({
    isWholeLine: true,
    backgroundColor: new vscode.ThemeColor("diffEditor.removedLineBackground"),
    overviewRulerColor: new vscode.ThemeColor("editorOverviewRuler.modifiedForeground"),
    overviewRulerLane: vscode.OverviewRulerLane.Left,
  });
  private readonly insertion = vscode.window.createTextEditorDecorationType({
    isWholeLine: true,
    borderColor: new vscode.ThemeColor("diffEditor.insertedTextBorder"),
    borderStyle: "dashed none none none",
    borderWidth: "1px",
    overviewRulerColor: new vscode.ThemeColor("editorOverviewRuler.addedForeground"),
    overviewRulerLane: vscode.OverviewRulerLane.Left,
  });

  constructor(
    private readonly state: AirlockState,
    private readonly paths: Paths,
  ) {}

  update(editors: readonly vscode.TextEditor[] = vscode.window.visibleTextEditors): void {
    for (const editor of editors) {
      const rel = editor.document.uri.scheme === "file" ? this.paths.relative(editor.document.uri) : undefined;
      const changed: vscode.DecorationOptions[] = [];
      const inserted: vscode.DecorationOptions[] = [];
      for (const { proposal, file } of rel ? pendingAt(this.state, rel) : []) {
        for (const h of pendingHunks(file)) {
          const { start, end } = hunkLines(h);
          const note = {
            after: {
              contentText: `  ⟵ airlock ${proposal.runId}: ${h.oldLines ? `-${h.oldLines}` : ""}${h.newLines ? ` +${h.newLines}` : ""} proposed (${file.decision})`,
              color: new vscode.ThemeColor("editorCodeLens.foreground"),
            },
          };
          const hover = new vscode.MarkdownString(
            `**airlock** run \`${proposal.runId}\` (${proposal.agent}) proposes:\n\n${fenced(diffText(h), "diff")}`,
          );
          if (h.oldLines === 0) {
            const line = hunkAnchor(h, editor.document.lineCount);
            inserted.push({ range: new vscode.Range(line, 0, line, 0), renderOptions: note, hoverMessage: hover });
          } else {
            const last = Math.min(end, editor.document.lineCount) - 1;
            changed.push({
              range: new vscode.Range(start, 0, Math.max(start, last), 0),
              renderOptions: note,
              hoverMessage: hover,
            });
          }
        }
      }
      editor.setDecorations(this.pending, changed);
      editor.setDecorations(this.insertion, inserted);
    }
  }

  dispose(): void {
    this.pending.dispose();
    this.insertion.dispose();
  }
}

/** "Accept | Reject | Diff" above each pending hunk (line 0 for a change without hunks). */
export class ReviewLenses implements vscode.CodeLensProvider {
  private readonly emitter = new vscode.EventEmitter<void>();
  readonly onDidChangeCodeLenses = this.emitter.event;

  constructor(
    private readonly state: AirlockState,
    private readonly paths: Paths,
  ) {}

  refresh(): void {
    this.emitter.fire();
  }

  provideCodeLenses(doc: vscode.TextDocument): vscode.CodeLens[] {
    const rel = this.paths.relative(doc.uri);
    if (!rel || doc.uri.scheme !== "file") return [];
    const out: vscode.CodeLens[] = [];
    for (const { proposal, file } of pendingAt(this.state, rel)) {
      const hs = pendingHunks(file);
      const targets: { line: number; ref?: HunkRef }[] = hs.length
        ? hs.map((h) => ({ line: hunkAnchor(h, doc.lineCount), ref: { runId: proposal.runId, path: rel, hunk: h } }))
        : [{ line: 0 }];
      const marks = markLines(file.marks);
      if (marks.length) {
        // text, not a command: what the reviewer must know before trusting how the file looks
        const top = new vscode.Range(0, 0, 0, 0);
        out.push(new vscode.CodeLens(top, { title: escapeIcons(marks.join(" · ")), tooltip: marks.join("\n"), command: "" }));
      }
      for (const t of targets) {
        const range = new vscode.Range(t.line, 0, t.line, 0);
        const arg = t.ref ? { runId: t.ref.runId, path: rel, hunkId: t.ref.hunk.id } : { runId: proposal.runId, path: rel };
        const what = t.ref ? "hunk" : `${file.change} file`;
        out.push(
          new vscode.CodeLens(range, {
            title: `$(check) Accept`,
            tooltip: `accept this ${what} (run ${proposal.runId}, ${file.decision}: ${display(file.reason)})`,
            command: t.ref ? "airlockd.acceptHunk" : "airlockd.acceptFile",
            arguments: [arg],
          }),
          new vscode.CodeLens(range, {
            title: `$(close) Reject`,
            tooltip: `reject this ${what}`,
            command: t.ref ? "airlockd.rejectHunk" : "airlockd.rejectFile",
            arguments: [arg],
          }),
          new vscode.CodeLens(range, {
            title: "Diff",
            tooltip: `compare with what run ${proposal.runId} proposes`,
            command: "airlockd.openDiff",
            arguments: [{ runId: proposal.runId, path: rel }],
          }),
        );
      }
    }
    return out;
  }
}

/** Context keys: review keybindings exist only while something is pending (and the hunk ones only
 * with the cursor on a pending hunk). */
export class ReviewContext {
  private last = new Map<string, boolean>();

  constructor(
    private readonly state: AirlockState,
    private readonly paths: Paths,
  ) {}

  update(): void {
    const editor = vscode.window.activeTextEditor;
    const rel = this.paths.relative(editor?.document.uri);
    const active = this.state.open().length > 0;
    const atCursor =
      !!editor && !!rel && !!hunkAt(this.state.open(), rel, editor.selection.active.line, editor.document.lineCount);
    this.set(CTX_REVIEW_ACTIVE, active);
    this.set(CTX_HUNK_AT_CURSOR, active && atCursor);
    this.set(CTX_RUNNING, this.state.liveRuns().length > 0);
  }

  private set(key: string, value: boolean): void {
    if (this.last.get(key) === value) return;
    this.last.set(key, value);
    void vscode.commands.executeCommand("setContext", key, value);
  }
}

export function summary(p: Proposal): string {
  const files = p.files.filter((f) => f.state === "pending");
  const hunks = files.reduce((n, f) => n + (f.hunks.length ? pendingHunks(f).length : 1), 0);
  return `${plural(hunks, "change")} in ${plural(files.length, "file")}`;
}
