#!/usr/bin/env bash
# Install what the VS Code end-to-end test needs: Node 24 (npm's `node` package), code-server (VS
# Code served on loopback) and Debian's chromium for Playwright. Everything npm installs goes to a
# cache outside the repository, keyed by version, so a second run skips it. Idempotent.
#
#   scripts/ensure-code-server.sh          install if missing; the last line printed is the
#                                          path of the code-server executable
# Environment: AIRLOCK_EDITORS_CACHE (default: $XDG_CACHE_HOME/airlockd/editors, or ~/.cache/...),
#              CODE_SERVER_VERSION, NODE_VERSION_RANGE.
set -euo pipefail

code_server_version=${CODE_SERVER_VERSION:-4.139.1}
node_range=${NODE_VERSION_RANGE:-24}
cache=${AIRLOCK_EDITORS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airlockd/editors}
node_dir=$cache/node-$node_range
cs_dir=$cache/code-server-$code_server_version

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
say() { echo "ensure-code-server: $*" >&2; }

if [ ! -x /usr/bin/chromium ]; then
  say "installing Debian's chromium"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq chromium >/dev/null
fi

if [ ! -f "$node_dir/.installed" ]; then
  say "installing node@$node_range into $node_dir"
  rm -rf "$node_dir" && mkdir -p "$node_dir"
  echo '{"private": true}' >"$node_dir/package.json"
  (cd "$node_dir" && npm install --no-fund --no-audit --loglevel=error "node@$node_range" >&2)
  "$node_dir/node_modules/.bin/node" --version >/dev/null
  touch "$node_dir/.installed"
fi
node_bin=$node_dir/node_modules/.bin

if [ ! -f "$cs_dir/.installed" ] || [ ! -d "$cs_dir/node_modules/code-server/lib/vscode/node_modules" ]; then
  say "installing code-server@$code_server_version into $cs_dir (under $("$node_bin/node" --version))"
  rm -rf "$cs_dir" && mkdir -p "$cs_dir"
  echo '{"private": true}' >"$cs_dir/package.json"
  # npm itself runs under Node 24 here: code-server's engines field asks for it.
  # --ignore-scripts: code-server's postinstall runs `npm install --omit=dev` in lib/vscode and
  # lib/vscode/extensions, which also compiles native modules (kerberos, node-pty, spdlog) that
  # need compilers and -dev headers and that serving the workbench does not need. Do the same
  # installs here without the native builds.
  npm_quiet=(--no-fund --no-audit --loglevel=error --ignore-scripts)
  (cd "$cs_dir" && PATH="$node_bin:$PATH" npm install "${npm_quiet[@]}" "code-server@$code_server_version" >&2)
  vscode_dir=$cs_dir/node_modules/code-server/lib/vscode
  (cd "$vscode_dir" && PATH="$node_bin:$PATH" npm install --omit=dev "${npm_quiet[@]}" >&2)
  (cd "$vscode_dir/extensions" && PATH="$node_bin:$PATH" npm install --omit=dev "${npm_quiet[@]}" >&2)
  touch "$cs_dir/.installed"
fi

# a launcher that runs code-server under Node 24 whatever node is first on PATH
launcher=$cs_dir/code-server
cat >"$launcher" <<SH
#!/bin/sh
exec "$node_bin/node" "$cs_dir/node_modules/code-server/out/node/entry.js" "\$@"
SH
chmod +x "$launcher"
echo "$launcher"
