#!/usr/bin/env bash
# A rootful Podman serving the Docker API, for the tests (docs/engines.md, Podman): its own
# storage, run and volume directories under /var/lib/airlockd-engines/podman/NAME, apart from a
# Podman the machine may have (all rootful Podmans share one lock file in /dev/shm: `stop`
# removes containers and volumes through the engine so that none keeps a lock). Root only.
#
#   podman-engine.sh start NAME [IMAGE...]   start it (idempotent) and load IMAGEs from the Docker engine
#   podman-engine.sh stop NAME               stop it by its pid file and remove its data
#
# Clients reach it at unix:///var/run/airlockd-podman-NAME.sock (group docker may use it, as the
# Docker engine's socket). Podman needs catatonit for `--init` (every run has it).
set -euo pipefail
# shellcheck source=engine-common.sh
. "$(dirname "$0")/engine-common.sh"

cmd=${1:?usage: podman-engine.sh start|stop NAME [IMAGE...]}
name=${2:?usage: podman-engine.sh start|stop NAME [IMAGE...]}
shift 2
[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9_-]{0,40}$ ]] || { echo "podman-engine: bad NAME $name" >&2; exit 2; }
base=/var/lib/airlockd-engines/podman/$name
sock=/var/run/airlockd-podman-$name.sock
pidfile=/run/airlockd-podman-$name.pid  # gone at a reboot, with the process it names
log=$base/podman.log
api() { DOCKER_HOST=unix://$sock docker "$@"; }

# the pid file's process, if it is still this engine's service (a pid is reused)
service_pid() {
  local pid
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--root $base/storage .*system service" || return 1
  echo "$pid"
}
running() { service_pid >/dev/null; }
answers() { api version >/dev/null 2>&1; }
# the processes that name this engine's storage: the service, conmon (whose exit command, run up
# to minutes after an exec ends, would make the storage again) and those cleanup commands
users() { pgrep -f -- "$base/storage" || true; }

case $cmd in
start)
  if ! command -v podman >/dev/null 2>&1 || ! [ -x /usr/bin/catatonit ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman catatonit >/dev/null
  fi
  mkdir -p "$base/storage" "$base/run" "$base/tmp"
  if ! running; then
    rm -f "$sock"
    # no systemd or journald here: cgroupfs and a file for events
    setsid podman --root "$base/storage" --runroot "$base/run" --tmpdir "$base/tmp" \
      --cgroup-manager cgroupfs --events-backend file \
      system service --time=0 "unix://$sock" >"$log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    sleep 0.2
    for _ in $(seq 1 120); do
      answers && break
      sleep 0.5
    done
    answers || {
      echo "podman-engine: $name did not answer within 60 s; see $log" >&2
      tail -n 20 "$log" >&2
      exit 1
    }
    chgrp docker "$sock" 2>/dev/null && chmod 0660 "$sock"
  fi
  load_images "$sock" "$@"
  echo "unix://$sock"
  ;;
stop)
  if pid=$(service_pid); then
    # its containers and volumes through the engine first (they outlive the service, and a
    # volume left behind keeps a lock in the lock file every Podman here shares), then the service
    api ps -aq 2>/dev/null | xargs -r env DOCKER_HOST="unix://$sock" docker rm -f >/dev/null \
      || echo "podman-engine: some containers of $name were not removed" >&2
    api volume ls -q 2>/dev/null | xargs -r env DOCKER_HOST="unix://$sock" docker volume rm -f >/dev/null \
      || echo "podman-engine: some volumes of $name were not removed" >&2
    end_process "$pid"
  fi
  rm -f "$sock" "$pidfile"
  # conmon and the cleanup commands it starts may still be at work on the storage: wait a little,
  # then end them (conmon of an exec session waits minutes before its cleanup)
  for _ in $(seq 1 10); do [ -z "$(users)" ] && break; sleep 0.5; done
  users | xargs -r kill -9 2>/dev/null || true
  for _ in $(seq 1 10); do [ -z "$(users)" ] && break; sleep 0.2; done
  # what its containers and volumes left mounted under its storage (deepest first), then the storage
  if [ -d "$base" ]; then
    awk -v base="$base/" 'index($2, base) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r point; do
      umount -l "$point" 2>/dev/null || true
    done
    rm -rf --one-file-system "$base"
  fi
  ;;
*)
  echo "podman-engine: unknown command $cmd (start or stop)" >&2
  exit 2
  ;;
esac
