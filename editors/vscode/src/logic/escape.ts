/** Paths and agent-written text as a person is shown them: the port of airlockd/names.py's
 * `escape` and `display`. Every character a terminal or an editor acts on or does not draw (C0 and
 * C1 controls, DEL, bidirectional controls, zero-width and other format characters, line and
 * paragraph separators, Hangul fillers, variation selectors, private-use and unassigned code points
 * of those blocks) is written as Python writes it (`\x1b`, `\u202e`, `\U000e0001`), so it is seen
 * and never acted on. Only for labels, tooltips and messages: a file's bytes (URIs, the proposed
 * document, the WorkspaceEdit) are never escaped. No `vscode` import. */

// The code points of names.py's `_CANDIDATE` that its `_hidden` calls hidden (Unicode 14), as one
// class: the same set in Node's ICU, in Python and in the Neovim plugin (Lua has no categories).
const HIDDEN =
  /[\0-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ud800-\uf8ff\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb\ufffe\uffff\u{110bd}\u{110cd}\u{13430}-\u{1343f}\u{1bca0}-\u{1bca3}\u{1d173}-\u{1d17a}\u{e0000}-\u{e00ff}\u{e01f0}-\u{e0fff}\u{f0000}-\u{10ffff}]/gu;

const SHORT: Record<string, string> = { "\n": "\\n", "\t": "\\t", "\r": "\\r" };

function escapeChar(ch: string): string {
  const cp = ch.codePointAt(0)!;
  const hex = cp.toString(16);
  if (SHORT[ch]) return SHORT[ch];
  if (cp < 0x100) return `\\x${hex.padStart(2, "0")}`;
  return cp < 0x10000 ? `\\u${hex.padStart(4, "0")}` : `\\U${hex.padStart(8, "0")}`;
}

/** `text` with every hidden character written as its escape; the characters in `keep` pass. */
export function escape(text: string, keep = "\n\t"): string {
  return text.replace(HIDDEN, (ch) => (keep.includes(ch) ? ch : escapeChar(ch)));
}

/** One line for a person: a path, a rule's reason, a mark (newlines and tabs escaped too). */
export function display(text: string): string {
  return escape(text, "").replace(SPACES, escapeChar);
}

// Spaces that are not U+0020 (names.py `_SPACES`): a name ending in one looks like another name.
const SPACES = /[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]/g;

// `$(name)` and `$(name~spin)` as VS Code's renderLabelWithIcons draws them (ThemeIcon's name and
// modifier expressions); `$(` followed by anything else is drawn as it is.
const ICON = /\$\((?=[A-Za-z0-9-]+(?:~[A-Za-z]+)?\))/g;

/** `text` for a place that draws `$(name)` as an icon (quick-pick label, description and detail,
 * code lens titles, status bar text): each `$(name)` written `\$(name)`, VS Code's own escape, so it
 * is shown as written (an agent's own `\$(name)` becomes `\\$(name)` and shows as `\$(name)`). Not
 * for tree items, tooltips, messages or dialogs: they draw no icons and would show the backslash. */
export function escapeIcons(text: string): string {
  return text.replace(ICON, () => "\\$(");
}

/** `display` for a place that draws icons: one line, hidden characters and `$(name)` escaped. */
export function displayLabel(text: string): string {
  return escapeIcons(display(text));
}

/** Paths (or names) for a message: each escaped, joined by ", ". */
export function displayAll(items: readonly string[]): string {
  return items.map(display).join(", ");
}

/** Whether `text` holds a character `escape` would write as an escape. */
export function hasHidden(text: string, keep = "\n\t"): boolean {
  return [...text.matchAll(HIDDEN)].some((m) => !keep.includes(m[0]));
}

/** A change's marks (airlockd/names.py `marks` and the hidden-text ones), each as "⚠ mark". */
export function markLines(marks: readonly string[] | undefined): string[] {
  return (marks ?? []).map((m) => `⚠ ${display(m)}`);
}

/** A path as a label: escaped, with a "⚠ " in front when its change carries marks. */
export function pathLabel(path: string, marks?: readonly string[]): string {
  return `${marks?.length ? "⚠ " : ""}${display(path)}`;
}

/** `text` as a Markdown code block whose fence no run of backticks in it can close. */
export function fenced(text: string, lang = ""): string {
  const fence = "`".repeat(Math.max(3, ...[...text.matchAll(/`+/g)].map((m) => m[0].length + 1)));
  return `${fence}${lang}\n${text}\n${fence}`;
}
