#!/bin/sh
# Put a launcher for this clone's airlockd on the user's PATH (make setup), or take it away again
# (make unlink / make uninstall).
#
#   scripts/install-launcher.sh [install|uninstall|where]
#
# The launcher is a two-line script that execs <clone>/.venv/bin/airlockd. It goes to
# /usr/local/bin as root and to ~/.local/bin otherwise; AIRLOCK_BIN_DIR chooses another folder and
# AIRLOCK_VENV another virtualenv. A launcher is recognised as ours by its marker line: anything
# else called airlockd is left alone (and we say so) unless AIRLOCK_LAUNCHER_FORCE=1.
set -eu

MARKER='# airlockd-launcher: written by scripts/install-launcher.sh (make setup); make unlink removes it'

clone=$(cd "$(dirname "$0")/.." && pwd -P)
venv=${AIRLOCK_VENV:-$clone/.venv}
case $venv in /*) ;; *) venv=$clone/$venv ;; esac
target=$venv/bin/airlockd

if [ -n "${AIRLOCK_BIN_DIR:-}" ]; then
  bindir=$AIRLOCK_BIN_DIR
elif [ "$(id -u)" = 0 ]; then
  bindir=/usr/local/bin
else
  bindir=${HOME:?HOME is not set}/.local/bin
fi
dest=$bindir/airlockd

say() { echo "airlockd launcher: $*"; }
warn() { echo "airlockd launcher: $*" >&2; }

# Single-quoted for sh: a clone path may hold spaces or quotes.
quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }

launcher() {
  q=$(quote "$target")
  printf '#!/bin/sh\n%s\n' "$MARKER"
  printf '# launches the airlockd of %s\n' "$clone"
  printf 'if [ ! -x %s ]; then\n' "$q"
  printf '  printf "airlockd: %%s is missing: run make setup in %%s\\n" %s %s >&2\n' "$q" "$(quote "$clone")"
  printf '  exit 127\nfi\n'
  printf 'exec %s "$@"\n' "$q"
}

ours() { [ -f "$1" ] && [ ! -L "$1" ] && grep -qxF "$MARKER" "$1"; }

on_path() {
  case ":${PATH:-}:" in *":$bindir:"* | *":$bindir/:"*) return 0 ;; esac
  return 1
}

profile_line() {
  if [ -n "${HOME:-}" ] && [ "$bindir" = "$HOME/.local/bin" ]; then
    # shellcheck disable=SC2016 # the line is printed for the profile, not expanded here
    echo 'export PATH="$HOME/.local/bin:$PATH"'
  else
    echo "export PATH=\"$bindir:\$PATH\""
  fi
}

install() {
  if [ ! -x "$target" ]; then
    warn "$target is missing: create the virtualenv first (make setup)"
    exit 1
  fi
  if [ -e "$dest" ] || [ -L "$dest" ]; then
    if ! ours "$dest"; then
      if [ "${AIRLOCK_LAUNCHER_FORCE:-}" != 1 ]; then
        warn "left alone: $dest exists and is not a launcher of ours"
        warn "  remove it, or replace it with AIRLOCK_LAUNCHER_FORCE=1 make setup,"
        warn "  or use $target directly"
        return 0
      fi
      warn "replacing $dest, which was not ours (AIRLOCK_LAUNCHER_FORCE=1)"
    fi
  fi
  mkdir -p "$bindir"
  if [ ! -w "$bindir" ]; then
    warn "cannot write to $bindir: run as root, or choose a folder of yours (make setup BINDIR=DIR)"
    exit 1
  fi
  tmp=$(mktemp "$bindir/.airlockd.XXXXXX")
  trap 'rm -f "$tmp"' EXIT
  launcher >"$tmp"
  chmod 755 "$tmp"
  if ours "$dest" && cmp -s "$tmp" "$dest"; then
    rm -f "$tmp"
    say "$dest is up to date (it runs $target)"
  else
    previous=$(sed -n 's/^# launches the airlockd of //p' "$dest" 2>/dev/null || true)
    if [ -n "$previous" ] && [ "$previous" != "$clone" ]; then
      say "replacing the launcher of $previous"
    fi
    mv -f "$tmp" "$dest"
    say "installed $dest (it runs $target)"
  fi
  trap - EXIT
  if ! on_path; then
    say "$bindir is not on your PATH; add this line to your shell profile (~/.profile, ~/.bashrc or ~/.zshrc):"
    echo
    echo "    $(profile_line)"
    echo
    say "then open a new terminal (or run that line) and check: airlockd --version"
  fi
}

uninstall() {
  if [ ! -e "$dest" ] && [ ! -L "$dest" ]; then
    say "nothing to remove: no $dest"
  elif ! ours "$dest"; then
    warn "left alone: $dest is not a launcher of ours"
  elif ! grep -qxF "# launches the airlockd of $clone" "$dest"; then
    warn "left alone: $dest launches the airlockd of $(sed -n 's/^# launches the airlockd of //p' "$dest")"
  else
    rm -f "$dest"
    say "removed $dest"
  fi
}

case ${1:-install} in
  install) install ;;
  uninstall | unlink) uninstall ;;
  where) echo "$dest" ;;
  *)
    echo "usage: $0 [install|uninstall|where]" >&2
    exit 2
    ;;
esac
