#!/usr/bin/env bash
# A rootful Podman serving the Docker API, for the tests (docs/engines.md, Podman): its own
# storage, run and volume directories under /var/lib/airlockd-engines/NAME, so it shares nothing
# with a Podman the machine may have. Root only.
#
#   podman-engine.sh start NAME [IMAGE...]   start it (idempotent) and load IMAGEs from the Docker engine
#   podman-engine.sh stop NAME               stop it by its pid file and remove its data
#
# Clients reach it at unix:///var/run/airlockd-NAME.sock (group docker may use it, as the
# Docker engine's socket). Podman needs catatonit for `--init` (every run has it).
set -euo pipefail

cmd=${1:?usage: podman-engine.sh start|stop NAME [IMAGE...]}
name=${2:?usage: podman-engine.sh start|stop NAME [IMAGE...]}
shift 2
base=/var/lib/airlockd-engines/$name
sock=/var/run/airlockd-$name.sock
pidfile=$base/podman.pid
log=$base/podman.log

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
answers() { DOCKER_HOST=unix://$sock docker version >/dev/null 2>&1; }

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
  for image in "$@"; do
    DOCKER_HOST=unix://$sock docker image inspect "$image" >/dev/null 2>&1 \
      || docker save "$image" | DOCKER_HOST=unix://$sock docker load -q >/dev/null
  done
  echo "unix://$sock"
  ;;
stop)
  if running; then
    pid=$(cat "$pidfile")
    # its containers first (they outlive the service), then the service
    DOCKER_HOST=unix://$sock docker ps -aq 2>/dev/null | xargs -r env DOCKER_HOST=unix://$sock docker rm -f >/dev/null 2>&1 || true
    kill "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$sock"
  # what its containers and volumes left mounted under its storage, then the storage
  if [ -d "$base" ]; then
    grep -o " $base/[^ ]*" /proc/self/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf "$base"
  fi
  ;;
*)
  echo "podman-engine: unknown command $cmd (start or stop)" >&2
  exit 2
  ;;
esac
