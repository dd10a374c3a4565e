/** The daemon as a language client: starts `airlockd serve --stdio` with the command built by
 * `buildServerCommand`, restarts it (debounced) when the settings change or on request. */

import * as fs from "node:fs";

import * as vscode from "vscode";
import {
  ExecuteCommandRequest,
  LanguageClient,
  type LanguageClientOptions,
  type ServerOptions,
  State,
} from "vscode-languageclient/node";

import { AirlockdNotFound, buildServerCommand, debounce, readSettings, type ServerCommand } from "./logic/serverCommand";
import type { Daemon } from "./logic/state";

export const RESTART_DEBOUNCE_MS = 500;

/** A regular file (or a link to one) this user may execute, as the search for airlockd needs. */
function isExecutable(path: string): boolean {
  try {
    fs.accessSync(path, fs.constants.X_OK);
    return fs.statSync(path).isFile();
  } catch {
    return false;
  }
}

export class LanguageClientDaemon implements Daemon {
  private client: LanguageClient | undefined;
  private readonly handlers: [string, (params: unknown) => void][] = [];
  private readonly readyHandlers: ((ready: boolean) => void)[] = [];
  private starting: Promise<void> | undefined;
  readonly restart: () => void;

  constructor(
    private readonly output: vscode.LogOutputChannel,
    private readonly folder: string,
  ) {
    this.restart = debounce(() => void this.restartNow(), RESTART_DEBOUNCE_MS);
  }

  log(line: string): void {
    this.output.info(line);
  }

  showLog(): void {
    this.output.show(true);
  }

  onNotification(method: string, handler: (params: unknown) => void): void {
    this.handlers.push([method, handler]);
    this.client?.onNotification(method, handler);
  }

  onReady(handler: (ready: boolean) => void): void {
    this.readyHandlers.push(handler);
  }

  async request<T>(command: string, args: object = {}): Promise<T> {
    if (this.starting) await this.starting;
    const client = this.client;
    if (!client || client.state !== State.Running) throw new Error("airlockd serve is not running (Airlock: Restart Server)");
    return (await client.sendRequest(ExecuteCommandRequest.type, { command, arguments: [args] })) as T;
  }

  start(): Promise<void> {
    this.starting = this.startNow().finally(() => (this.starting = undefined));
    return this.starting;
  }

  private async startNow(): Promise<void> {
    const cmd = this.serverCommand();
    if (!cmd) {
      for (const h of this.readyHandlers) h(false);
      return;
    }
    this.output.info(`starting (${cmd.source}): ${[cmd.command, ...cmd.args].join(" ")}`);
    const serverOptions: ServerOptions = {
      command: cmd.command,
      args: cmd.args,
      options: { cwd: cmd.cwd, env: cmd.env },
    };
    const clientOptions: LanguageClientOptions = {
      // every file: the daemon must know unsaved buffers to refuse committing over them
      documentSelector: [{ scheme: "file" }],
      outputChannel: this.output,
      middleware: {
        // the extension draws its own lenses (Accept | Reject | Diff open the diff in VS Code)
        provideCodeLenses: () => [],
      },
    };
    const client = new LanguageClient("airlockd", "airlockd", serverOptions, clientOptions);
    client.onDidChangeState((e) => {
      if (e.newState === State.Stopped) for (const h of this.readyHandlers) h(false);
    });
    for (const [method, handler] of this.handlers) client.onNotification(method, handler);
    this.client = client;
    try {
      await client.start();
    } catch (err) {
      this.output.error(`airlockd serve did not start: ${String(err)}`);
      for (const h of this.readyHandlers) h(false);
      return;
    }
    for (const h of this.readyHandlers) h(true);
  }

  /** The command from the settings, or airlockd found where `make setup` and pip put it; when
   * there is none, the user is told where it was looked for and which setting to set. */
  private serverCommand(): ServerCommand | undefined {
    const cfg = vscode.workspace.getConfiguration("airlockd");
    const settings = readSettings((k) => cfg.get(k), this.folder);
    try {
      return buildServerCommand(settings, this.folder, process.env, isExecutable);
    } catch (err) {
      if (!(err instanceof AirlockdNotFound)) throw err;
      this.output.error(err.message);
      void vscode.window.showErrorMessage(err.message, "Open Settings").then((choice) => {
        if (choice) void vscode.commands.executeCommand("workbench.action.openSettings", "airlockd.path");
      });
      return undefined;
    }
  }

  private async restartNow(): Promise<void> {
    this.output.info("restarting airlockd serve");
    await this.stop();
    await this.start();
  }

  private async stop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    if (client && client.state !== State.Stopped) {
      try {
        await client.stop(5000);
      } catch (err) {
        this.output.warn(`stopping airlockd serve: ${String(err)}`);
      }
    }
  }

  async dispose(): Promise<void> {
    await this.stop();
  }
}
