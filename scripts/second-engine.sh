#!/usr/bin/env bash
# A second Docker engine that plays a remote host (docs/engines.md): its own mount and network
# namespaces, an empty tmpfs over every directory where clients keep their files (so no client
# path is visible to it, as on another machine), its own data root, no bridge. Root only.
#
#   second-engine.sh start NAME [IMAGE...]   start it (idempotent) and load IMAGEs from the first engine
#   second-engine.sh stop NAME               stop it by its pid file and remove its data
#
# Clients reach it at unix:///var/run/airlockd-NAME.sock (group docker may use it).
set -euo pipefail
# shellcheck source=engine-common.sh
. "$(dirname "$0")/engine-common.sh"

cmd=${1:?usage: second-engine.sh start|stop NAME [IMAGE...]}
name=${2:?usage: second-engine.sh start|stop NAME [IMAGE...]}
shift 2
[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9_-]{0,40}$ && $name != podman ]] || { echo "second-engine: bad NAME $name" >&2; exit 2; }
base=/var/lib/airlockd-engines/$name
sock=/var/run/airlockd-$name.sock
pidfile=$base/dockerd.pid
log=$base/dockerd.log

# the pid file's process, if it is still this engine's dockerd (a pid is reused)
running() {
  local pid
  pid=$(cat "$pidfile" 2>/dev/null) || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--data-root $base/data "
}

case $cmd in
start)
  mkdir -p "$base/data" "$base/exec"
  if ! running; then
    rm -f "$sock"
    # Every directory a client may name: covered by an empty tmpfs in the engine's namespace.
    hide=""
    for d in /home /root /tmp /work /srv /mnt /opt /var/tmp; do
      [ -d "$d" ] && hide="$hide mount -t tmpfs -o size=64m,mode=1777 tmpfs $d;"
    done
    setsid unshare --mount --net --propagation private sh -c "
      ip link set lo up 2>/dev/null || true
      $hide
      exec dockerd --data-root $base/data --exec-root $base/exec --pidfile $pidfile \
        -H unix://$sock --group docker --bridge=none --iptables=false --ip-masq=false \
        --storage-driver overlay2
    " >"$log" 2>&1 </dev/null &
    for _ in $(seq 1 120); do
      DOCKER_HOST=unix://$sock docker info >/dev/null 2>&1 && break
      sleep 0.5
    done
    DOCKER_HOST=unix://$sock docker info >/dev/null 2>&1 || {
      echo "second-engine: $name did not answer within 60 s; see $log" >&2
      tail -n 20 "$log" >&2
      exit 1
    }
  fi
  load_images "$sock" "$@"
  echo "unix://$sock"
  ;;
stop)
  if running; then
    pid=$(cat "$pidfile")
    end_process "$pid"
  fi
  rm -f "$sock"
  # the engine's mounts lived in its own namespace: nothing of it is mounted here
  rm -rf --one-file-system "$base"
  ;;
*)
  echo "second-engine: unknown command $cmd (start or stop)" >&2
  exit 2
  ;;
esac
