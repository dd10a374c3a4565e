/** Wiring: the daemon's notifications feed the state; every change redraws the status bar, the
 * decorations, the lenses, the proposed documents, the trees and the context keys. Takes the
 * daemon from a factory so the glue tests can run it against a fake. */

import * as vscode from "vscode";

import { displayAll } from "./logic/escape";
import type { AgentInfo, AgentStatus, Proposal, RunOutput, RunStatus, RunSummary } from "./logic/protocol";
import { AirlockState, type Daemon } from "./logic/state";
import { Commands, describeError } from "./commands";
import { AgentOutput } from "./ui/agentOutput";
import { Paths, PROPOSED_SCHEME } from "./ui/paths";
import { ProposedDocuments, ReviewContext, ReviewDecorations, ReviewLenses } from "./ui/review";
import { StatusBar } from "./ui/statusBar";
import { EvidenceView, ReviewTree } from "./ui/trees";

export type DaemonFactory = (output: vscode.LogOutputChannel, folder: string) => Daemon;

export interface Extension {
  state: AirlockState;
  daemon: Daemon;
  commands: Commands;
  statusBar: StatusBar;
  dispose(): Promise<void>;
}

export function activateWith(context: vscode.ExtensionContext, makeDaemon: DaemonFactory): Extension | undefined {
  const folder = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
  const output = vscode.window.createOutputChannel("airlockd", { log: true });
  context.subscriptions.push(output);
  if (!folder) {
    output.info("no workspace folder open: airlockd is not started");
    return undefined;
  }
  const daemon = makeDaemon(output, folder);
  const state = new AirlockState();
  const paths = new Paths(folder);
  const docs = new ProposedDocuments(state, paths);
  const decorations = new ReviewDecorations(state, paths);
  const lenses = new ReviewLenses(state, paths);
  const keys = new ReviewContext(state, paths);
  const statusBar = new StatusBar(state);
  const evidence = new EvidenceView(state);
  const reviewTree = new ReviewTree(state);
  const agentOutput = new AgentOutput((runId) => state.runs.get(runId)?.agent);
  const commands = new Commands({ daemon, state, paths, statusBar, evidence, agentOutput });
  commands.register(context);

  context.subscriptions.push(
    vscode.workspace.registerTextDocumentContentProvider(PROPOSED_SCHEME, docs),
    vscode.languages.registerCodeLensProvider([{ scheme: "file" }], lenses),
    vscode.window.registerTreeDataProvider("airlock.review", reviewTree),
    vscode.window.registerTreeDataProvider("airlock.evidence", evidence),
    decorations,
    statusBar,
    agentOutput,
    vscode.window.onDidChangeActiveTextEditor(() => {
      decorations.update();
      keys.update();
    }),
    vscode.window.onDidChangeVisibleTextEditors((editors) => decorations.update(editors)),
    vscode.window.onDidChangeTextEditorSelection(() => keys.update()),
    vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration("airlockd")) daemon.restart();
    }),
  );

  state.onChange(() => {
    statusBar.update();
    decorations.update();
    lenses.refresh();
    docs.refresh();
    keys.update();
    reviewTree.refresh();
  });

  daemon.onNotification("airlock/proposal", (params) => state.setProposal(params as Proposal));
  daemon.onNotification("airlock/runStatus", (params) => {
    const r = params as RunStatus;
    state.setRunStatus(r);
    if (r.conflicts?.length) {
      void vscode.window.showWarningMessage(`airlock: run ${r.runId}: conflicted (edited since the run): ${displayAll(r.conflicts)}`);
    }
  });
  daemon.onNotification("airlock/agentStatus", (params) => state.setAgentStatus(params as AgentStatus));
  daemon.onNotification("airlock/runOutput", (params) => agentOutput.add(params as RunOutput));
  daemon.onReady((ready) => {
    state.setConnected(ready);
    if (ready) void sync(daemon, state);
  });
  keys.update();

  return {
    state,
    daemon,
    commands,
    statusBar,
    async dispose() {
      await daemon.dispose();
    },
  };
}

/** After a (re)start: agents, runs, and the proposal of every proposed run. */
export async function sync(daemon: Daemon, state: AirlockState): Promise<void> {
  try {
    state.setAgents(await daemon.request<AgentInfo[]>("airlock.listAgents"));
    // the newest runs, and every proposed one however old (a listing is a page, not the history)
    const runs = await daemon.request<RunSummary[]>("airlock.listRuns", { limit: 200 });
    const proposed = await daemon.request<RunSummary[]>("airlock.listRuns", { state: ["proposed"], limit: 10000 });
    state.setSummaries([...runs, ...proposed.filter((p) => !runs.some((r) => r.runId === p.runId))]);
    for (const r of proposed) {
      state.setProposal(await daemon.request<Proposal>("airlock.getProposal", { runId: r.runId }));
    }
  } catch (err) {
    daemon.log(`sync failed: ${describeError(err)}`);
  }
}
