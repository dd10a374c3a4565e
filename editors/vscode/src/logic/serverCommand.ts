/** The ONE function that builds the daemon's command line from the settings (as the Python tools
 * extension template does), the search for `airlockd` when no setting names it, and the debounced
 * restart. No `vscode` import, no filesystem access of its own: the caller passes `isExecutable`. */

import { posix } from "node:path";

export interface ServerSettings {
  /** `airlockd.path`: the daemon executable and leading arguments, e.g. ["/opt/bin/airlockd"];
   * empty (or the contributed default, a bare "airlockd"): search for it, see `searchPlaces`. */
  path: string[];
  /** `airlockd.interpreter`: a Python interpreter with airlockd installed; wins over `path`. */
  interpreter: string[];
  /** `airlockd.serverArgs`: extra arguments before `serve` (e.g. ["-v"]). */
  serverArgs: string[];
  /** `airlockd.env`: extra environment for the daemon (e.g. AIRLOCK_STATE_DIR). */
  env: Record<string, string>;
}

export const DEFAULT_SETTINGS: ServerSettings = { path: [], interpreter: [], serverArgs: [], env: {} };

export interface ServerCommand {
  command: string;
  args: string[];
  cwd: string;
  env: Record<string, string>;
  /** How the command was chosen: "airlockd.path", "airlockd.interpreter", or where the search
   * found it ("on PATH", "in the workspace's .venv", …). */
  source: string;
}

/** Is this path an existing file the user may execute? (fs.accessSync(p, X_OK) on a regular file.) */
export type IsExecutable = (path: string) => boolean;

/** One place `airlockd` is looked for: the file, and how to say where it is. */
export interface Place {
  path: string;
  where: string;
}

/** No setting names airlockd and the search found none: the message names the places looked at
 * and the settings that fix it. */
export class AirlockdNotFound extends Error {
  constructor(readonly looked: string[]) {
    super(
      `airlockd not found: looked on PATH, then at ${looked.join(", ")}. ` +
        "Run `make setup` in your airlockd clone (it puts airlockd on your PATH), " +
        'or set "airlockd.path" (or "airlockd.interpreter") in the settings.',
    );
    this.name = "AirlockdNotFound";
  }
}

function clean(v: unknown): string[] {
  return Array.isArray(v) ? v.filter((x): x is string => typeof x === "string" && x.length > 0) : [];
}

/** Settings as read from the configuration, with defaults for anything missing or malformed;
 * `${workspaceFolder}` in any string is replaced by the folder's path. `airlockd.path` left at its
 * contributed default (a bare "airlockd") reads as empty: search for it. */
export function readSettings(get: (key: string) => unknown, workspaceFolder: string): ServerSettings {
  const sub = (s: string): string => s.split("${workspaceFolder}").join(workspaceFolder);
  const path = clean(get("path")).map(sub);
  const envRaw = get("env");
  const env: Record<string, string> = {};
  if (envRaw && typeof envRaw === "object") {
    for (const [k, v] of Object.entries(envRaw as Record<string, unknown>)) {
      if (typeof v === "string") env[k] = sub(v);
    }
  }
  const searched = path.length === 0 || (path.length === 1 && path[0] === "airlockd");
  return {
    path: searched ? DEFAULT_SETTINGS.path : path,
    interpreter: clean(get("interpreter")).map(sub),
    serverArgs: clean(get("serverArgs")).map(sub),
    env,
  };
}

/** Where `airlockd` is looked for when no setting names it, first match wins: each folder of
 * PATH, the workspace's `.venv/bin/airlockd` and `venv/bin/airlockd`, then `~/.local/bin/airlockd`
 * (where `make setup` puts its launcher for a normal user). */
export function searchPlaces(workspaceFolder: string, env: Record<string, string | undefined>): Place[] {
  const places: Place[] = [];
  for (const dir of (env.PATH ?? "").split(":")) {
    // an empty or relative PATH entry means "wherever the editor was started": never a guess here
    if (posix.isAbsolute(dir)) places.push({ path: posix.join(dir, "airlockd"), where: "on PATH" });
  }
  for (const venv of [".venv", "venv"]) {
    places.push({ path: posix.join(workspaceFolder, venv, "bin", "airlockd"), where: `in the workspace's ${venv}` });
  }
  if (env.HOME && posix.isAbsolute(env.HOME)) {
    places.push({ path: posix.join(env.HOME, ".local", "bin", "airlockd"), where: "in ~/.local/bin" });
  }
  return places;
}

/** The first of `searchPlaces` that is executable; throws `AirlockdNotFound` when none is. */
export function findAirlockd(
  workspaceFolder: string,
  env: Record<string, string | undefined>,
  isExecutable: IsExecutable,
): Place {
  const places = searchPlaces(workspaceFolder, env);
  const found = places.find((p) => isExecutable(p.path));
  if (found) return found;
  throw new AirlockdNotFound(places.filter((p) => p.where !== "on PATH").map((p) => p.path));
}

/** `airlockd --workspace <folder> [serverArgs] serve --stdio`, through the interpreter when one is
 * set (`python -P -m airlockd …`), else the `airlockd.path` command, else the `airlockd` that
 * `findAirlockd` finds (with the daemon's environment: PATH and HOME as the daemon would see them).
 * Never a shell: arguments are passed as they are. Throws `AirlockdNotFound`. */
export function buildServerCommand(
  settings: ServerSettings,
  workspaceFolder: string,
  baseEnv: Record<string, string | undefined>,
  isExecutable: IsExecutable,
): ServerCommand {
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(baseEnv)) if (v !== undefined) env[k] = v;
  Object.assign(env, settings.env);
  let head: string[];
  let source: string;
  if (settings.interpreter.length) {
    // -P: the workspace folder (the daemon's cwd) never on sys.path, so a workspace's own
    // `airlockd/` package is never imported in place of the installed one (Python 3.11+)
    [head, source] = [[...settings.interpreter, "-P", "-m", "airlockd"], "airlockd.interpreter"];
  } else if (settings.path.length) {
    [head, source] = [settings.path, "airlockd.path"];
  } else {
    const found = findAirlockd(workspaceFolder, env, isExecutable);
    [head, source] = [[found.path], found.where];
  }
  const [command, ...lead] = head;
  return {
    command,
    args: [...lead, "--workspace", workspaceFolder, ...settings.serverArgs, "serve", "--stdio"],
    cwd: workspaceFolder,
    env,
    source,
  };
}

export interface Timers {
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

const realTimers: Timers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (h) => clearTimeout(h as ReturnType<typeof setTimeout>),
};

/** `fn` called once, `ms` after the last of a burst of calls (settings saved several times, a
 * restart command pressed twice). */
export function debounce(fn: () => void, ms: number, timers: Timers = realTimers): { (): void; cancel(): void } {
  let handle: unknown;
  const call = (): void => {
    if (handle !== undefined) timers.clearTimeout(handle);
    handle = timers.setTimeout(() => {
      handle = undefined;
      fn();
    }, ms);
  };
  call.cancel = (): void => {
    if (handle !== undefined) timers.clearTimeout(handle);
    handle = undefined;
  };
  return call;
}
