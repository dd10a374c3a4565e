/** Entry point: the real language client wired to the extension's glue (`activateWith`). */

import * as vscode from "vscode";

import { LanguageClientDaemon } from "./client";
import { activateWith, type Extension } from "./main";

let ext: Extension | undefined;

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  ext = activateWith(context, (output, folder) => {
    const daemon = new LanguageClientDaemon(output, folder);
    void daemon.start();
    return daemon;
  });
}

export async function deactivate(): Promise<void> {
  await ext?.dispose();
  ext = undefined;
}
