/** A small stand-in for the `vscode` module: enough of the API for the extension's glue, recording
 * what the extension did (commands, context keys, decorations, status bar, messages, edits). */

import * as fs from "node:fs";
import * as nodePath from "node:path";

type Listener<T> = (e: T) => unknown;

export class EventEmitter<T> {
  private listeners: Listener<T>[] = [];
  readonly event = (l: Listener<T>): Disposable => {
    this.listeners.push(l);
    return new Disposable(() => (this.listeners = this.listeners.filter((x) => x !== l)));
  };
  fire(e: T): void {
    for (const l of [...this.listeners]) l(e);
  }
  dispose(): void {
    this.listeners = [];
  }
}

export class Disposable {
  constructor(private readonly fn: () => void = () => undefined) {}
  dispose(): void {
    this.fn();
  }
}

export class Uri {
  private constructor(
    readonly scheme: string,
    readonly path: string,
    readonly query: string,
  ) {}
  static file(p: string): Uri {
    return new Uri("file", nodePath.posix.normalize(p), "");
  }
  static from(c: { scheme: string; path?: string; query?: string }): Uri {
    return new Uri(c.scheme, c.path ?? "", c.query ?? "");
  }
  get fsPath(): string {
    return this.path;
  }
  toString(): string {
    return `${this.scheme}://${this.path}${this.query ? `?${this.query}` : ""}`;
  }
}

export class Position {
  constructor(
    readonly line: number,
    readonly character: number,
  ) {}
}
export class Range {
  readonly start: Position;
  readonly end: Position;
  constructor(a: number | Position, b: number | Position, c?: number, d?: number) {
    this.start = typeof a === "number" ? new Position(a, b as number) : a;
    this.end = typeof a === "number" ? new Position(c!, d!) : (b as Position);
  }
}
export class Selection extends Range {
  constructor(
    readonly anchor: Position,
    readonly active: Position,
  ) {
    super(anchor, active);
  }
}
export class ThemeColor {
  constructor(readonly id: string) {}
}
export class ThemeIcon {
  constructor(readonly id: string) {}
}
export class MarkdownString {
  constructor(readonly value: string = "") {}
}
export class CodeLens {
  constructor(
    readonly range: Range,
    readonly command?: { title: string; command: string; arguments?: unknown[]; tooltip?: string },
  ) {}
}
export class TreeItem {
  description?: string;
  tooltip?: string;
  iconPath?: unknown;
  command?: unknown;
  contextValue?: string;
  constructor(
    readonly label: string,
    public collapsibleState: number = 0,
  ) {}
}
export const TreeItemCollapsibleState = { None: 0, Collapsed: 1, Expanded: 2 };
export const StatusBarAlignment = { Left: 1, Right: 2 };
export const OverviewRulerLane = { Left: 1, Center: 2, Right: 4, Full: 7 };
export const TextEditorRevealType = { Default: 0, InCenter: 1, InCenterIfOutsideViewport: 2, AtTop: 3 };

// -- recorded world --------------------------------------------------------------------------------

export class TextDocument {
  isDirty = false;
  constructor(
    readonly uri: Uri,
    public text: string,
  ) {}
  get lineCount(): number {
    return this.text.split("\n").length;
  }
}

export class TextEditor {
  selection = new Selection(new Position(0, 0), new Position(0, 0));
  decorations = new Map<unknown, unknown[]>();
  viewColumn = 1;
  constructor(readonly document: TextDocument) {}
  setDecorations(type: unknown, options: unknown[]): void {
    this.decorations.set(type, options);
  }
  revealRange(): void {}
}

export const world = {
  commands: new Map<string, (...args: unknown[]) => unknown>(),
  executed: [] as { command: string; args: unknown[] }[],
  context: new Map<string, unknown>(),
  messages: [] as { level: string; text: string; options?: { modal?: boolean; detail?: string }; items?: string[] }[],
  quickPicks: [] as unknown[][],
  answers: { quickPick: [] as ((items: { label: string }[]) => unknown)[], inputBox: [] as (string | undefined)[], warning: [] as (string | undefined)[] },
  statusItems: [] as StatusBarItem[],
  contentProviders: new Map<string, { provideTextDocumentContent(u: Uri): Promise<string> | string }>(),
  lensProviders: [] as { provideCodeLenses(d: TextDocument): CodeLens[] }[],
  trees: new Map<string, { getChildren(n?: unknown): unknown[]; getTreeItem(n: unknown): TreeItem }>(),
  appliedEdits: [] as unknown[],
  channels: new Map<string, { text: string; shown: number }>(),
  config: {} as Record<string, unknown>,
  workspaceRoot: "/ws",
  reset(): void {
    this.commands.clear();
    this.executed = [];
    this.context.clear();
    this.messages = [];
    this.quickPicks = [];
    this.answers = { quickPick: [], inputBox: [], warning: [] };
    this.statusItems = [];
    this.contentProviders.clear();
    this.lensProviders = [];
    this.trees.clear();
    this.appliedEdits = [];
    window.visibleTextEditors = [];
    window.activeTextEditor = undefined;
    workspace.textDocuments = [];
  },
};

export class StatusBarItem {
  text = "";
  tooltip: string | undefined;
  command: string | undefined;
  name: string | undefined;
  backgroundColor: ThemeColor | undefined;
  visible = false;
  constructor(readonly id: string) {}
  show(): void {
    this.visible = true;
  }
  hide(): void {
    this.visible = false;
  }
  dispose(): void {}
}

const activeEditorChanged = new EventEmitter<TextEditor | undefined>();

export const window = {
  activeTextEditor: undefined as TextEditor | undefined,
  visibleTextEditors: [] as TextEditor[],
  createOutputChannel: (name: string) => {
    const channel = {
      name,
      lines: [] as string[],
      text: "",
      shown: 0,
      info(l: string) {
        this.lines.push(l);
      },
      warn(l: string) {
        this.lines.push(l);
      },
      error(l: string) {
        this.lines.push(l);
      },
      append(t: string) {
        this.text += t;
      },
      appendLine(l: string) {
        this.lines.push(l);
        this.text += `${l}\n`;
      },
      show() {
        this.shown++;
      },
      dispose() {},
    };
    world.channels.set(name, channel);
    return channel;
  },
  createStatusBarItem: (id: string) => {
    const item = new StatusBarItem(id);
    world.statusItems.push(item);
    return item;
  },
  createTextEditorDecorationType: (options: unknown) => ({ options, dispose() {} }),
  registerTreeDataProvider: (id: string, provider: { getChildren(n?: unknown): unknown[]; getTreeItem(n: unknown): TreeItem }) => {
    world.trees.set(id, provider);
    return new Disposable();
  },
  showQuickPick: async (items: { label: string }[]) => {
    world.quickPicks.push(items);
    const answer = world.answers.quickPick.shift();
    return answer ? answer(items) : undefined;
  },
  showInputBox: async () => world.answers.inputBox.shift(),
  showInformationMessage: async (text: string) => {
    world.messages.push({ level: "info", text });
    return undefined;
  },
  showWarningMessage: async (text: string, ...rest: unknown[]) => {
    const options = typeof rest[0] === "object" ? (rest.shift() as { modal?: boolean; detail?: string }) : undefined;
    world.messages.push({ level: "warning", text, options, items: rest as string[] });
    return world.answers.warning.shift();
  },
  showErrorMessage: async (text: string) => {
    world.messages.push({ level: "error", text });
    return undefined;
  },
  showTextDocument: async (doc: TextDocument | Uri) => {
    const d = doc instanceof Uri ? await workspace.openTextDocument(doc) : doc;
    let editor = window.visibleTextEditors.find((e) => e.document === d);
    if (!editor) {
      editor = new TextEditor(d);
      window.visibleTextEditors.push(editor);
    }
    window.activeTextEditor = editor;
    activeEditorChanged.fire(editor);
    return editor;
  },
  onDidChangeActiveTextEditor: activeEditorChanged.event,
  onDidChangeVisibleTextEditors: new EventEmitter<TextEditor[]>().event,
  onDidChangeTextEditorSelection: new EventEmitter<unknown>().event,
};

export const commands = {
  registerCommand: (name: string, fn: (...args: unknown[]) => unknown) => {
    if (world.commands.has(name)) throw new Error(`command ${name} registered twice`);
    world.commands.set(name, fn);
    return new Disposable(() => world.commands.delete(name));
  },
  executeCommand: async (command: string, ...args: unknown[]) => {
    world.executed.push({ command, args });
    if (command === "setContext") world.context.set(args[0] as string, args[1]);
    const fn = world.commands.get(command);
    return fn ? fn(...args) : undefined;
  },
};

export const workspace = {
  get workspaceFolders() {
    return [{ uri: Uri.file(world.workspaceRoot), name: "ws", index: 0 }];
  },
  textDocuments: [] as TextDocument[],
  getConfiguration: () => ({ get: (k: string) => world.config[k] }),
  onDidChangeConfiguration: new EventEmitter<unknown>().event,
  registerTextDocumentContentProvider: (scheme: string, p: { provideTextDocumentContent(u: Uri): Promise<string> }) => {
    world.contentProviders.set(scheme, p);
    return new Disposable();
  },
  openTextDocument: async (uri: Uri) => {
    let doc = workspace.textDocuments.find((d) => d.uri.toString() === uri.toString());
    if (!doc) {
      doc = new TextDocument(uri, fs.existsSync(uri.fsPath) ? fs.readFileSync(uri.fsPath, "utf8") : "");
      workspace.textDocuments.push(doc);
    }
    return doc;
  },
  applyEdit: async (edit: unknown) => {
    world.appliedEdits.push(edit);
    return true;
  },
  fs: {
    readFile: async (uri: Uri) => new Uint8Array(fs.readFileSync(uri.fsPath)),
  },
};

export const languages = {
  registerCodeLensProvider: (_sel: unknown, p: { provideCodeLenses(d: TextDocument): CodeLens[] }) => {
    world.lensProviders.push(p);
    return new Disposable();
  },
};
