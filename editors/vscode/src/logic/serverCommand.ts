/** The ONE function that builds the daemon's command line from the settings (as the Python tools
 * extension template does), and the debounced restart. No `vscode` import. */

export interface ServerSettings {
  /** `airlockd.path`: the daemon executable and leading arguments, e.g. ["/opt/bin/airlockd"]. */
  path: string[];
  /** `airlockd.interpreter`: a Python interpreter with airlockd installed; wins over `path`. */
  interpreter: string[];
  /** `airlockd.serverArgs`: extra arguments before `serve` (e.g. ["-v"]). */
  serverArgs: string[];
  /** `airlockd.env`: extra environment for the daemon (e.g. AIRLOCK_STATE_DIR). */
  env: Record<string, string>;
}

export const DEFAULT_SETTINGS: ServerSettings = { path: ["airlockd"], interpreter: [], serverArgs: [], env: {} };

export interface ServerCommand {
  command: string;
  args: string[];
  cwd: string;
  env: Record<string, string>;
}

function clean(v: unknown): string[] {
  return Array.isArray(v) ? v.filter((x): x is string => typeof x === "string" && x.length > 0) : [];
}

/** Settings as read from the configuration, with defaults for anything missing or malformed;
 * `${workspaceFolder}` in any string is replaced by the folder's path. */
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
  return {
    path: path.length ? path : DEFAULT_SETTINGS.path,
    interpreter: clean(get("interpreter")).map(sub),
    serverArgs: clean(get("serverArgs")).map(sub),
    env,
  };
}

/** `airlockd --workspace <folder> [serverArgs] serve --stdio`, through the interpreter when one is
 * set (`python -m airlockd …`). Never a shell: arguments are passed as they are. */
export function buildServerCommand(
  settings: ServerSettings,
  workspaceFolder: string,
  baseEnv: Record<string, string | undefined> = {},
): ServerCommand {
  const head = settings.interpreter.length ? [...settings.interpreter, "-m", "airlockd"] : settings.path;
  const [command, ...lead] = head.length ? head : DEFAULT_SETTINGS.path;
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(baseEnv)) if (v !== undefined) env[k] = v;
  Object.assign(env, settings.env);
  return {
    command,
    args: [...lead, "--workspace", workspaceFolder, ...settings.serverArgs, "serve", "--stdio"],
    cwd: workspaceFolder,
    env,
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
