/** Workspace-relative paths and the URIs of the proposed side. */

import * as vscode from "vscode";

export const PROPOSED_SCHEME = "airlock-proposed";

export class Paths {
  constructor(readonly root: string) {}

  fileUri(rel: string): vscode.Uri {
    return vscode.Uri.file(`${this.root}/${rel}`);
  }

  /** The proposed side of `rel` in run `runId` (read-only: a content provider serves it). `side`
   * "empty" is the missing base of a created file. */
  proposedUri(runId: string, rel: string, side: "proposed" | "empty" = "proposed"): vscode.Uri {
    return vscode.Uri.from({ scheme: PROPOSED_SCHEME, path: `/${rel}`, query: `run=${runId}&side=${side}` });
  }

  parseProposed(uri: vscode.Uri): { runId: string; rel: string; side: string } | undefined {
    if (uri.scheme !== PROPOSED_SCHEME) return undefined;
    const q = new URLSearchParams(uri.query);
    return { runId: q.get("run") ?? "", rel: uri.path.replace(/^\//, ""), side: q.get("side") ?? "proposed" };
  }

  /** `uri` as a workspace-relative path: a file under the root, or a proposed document. */
  relative(uri: vscode.Uri | undefined): string | undefined {
    if (!uri) return undefined;
    const proposed = this.parseProposed(uri);
    if (proposed) return proposed.rel;
    if (uri.scheme !== "file") return undefined;
    const p = uri.fsPath;
    return p.startsWith(this.root + "/") ? p.slice(this.root.length + 1) : undefined;
  }
}
