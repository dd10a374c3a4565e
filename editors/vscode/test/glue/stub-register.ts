/** `require("vscode")` in the extension's modules resolves to the stub (node --require this). */
import Module from "node:module";
import path from "node:path";

const stub = path.join(__dirname, "vscode-stub.js");
const mod = Module as unknown as { _resolveFilename: (request: string, ...rest: unknown[]) => string };
const original = mod._resolveFilename;
mod._resolveFilename = function (request: string, ...rest: unknown[]): string {
  if (request === "vscode") return stub;
  return original.call(this, request, ...rest);
};
