#!/usr/bin/env bash
# Make sure a Docker engine is installed and answering: installs docker.io (and gVisor's runsc)
# when missing and starts dockerd in the background when no daemon answers, with gVisor registered
# as the runtime "runsc" (scripts/dockerd.json; docs/containment.md). Idempotent; safe from make.
set -euo pipefail

sock=/var/run/docker.sock
log=${AIRLOCK_DOCKERD_LOG:-/tmp/airlockd-dockerd.log}
config="$(cd "$(dirname "$0")" && pwd)/dockerd.json"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v dockerd >/dev/null 2>&1; then
  echo "ensure-docker: installing the Docker engine (docker.io) and debootstrap"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq docker.io debootstrap >/dev/null
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq debootstrap >/dev/null
fi

if ! command -v runsc >/dev/null 2>&1; then
  echo "ensure-docker: installing gVisor (runsc)"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq runsc >/dev/null
fi

if docker info >/dev/null 2>&1; then
  # An engine this script did not start keeps its own configuration: say how to add gVisor.
  runtimes=$(docker info --format '{{json .Runtimes}}' 2>/dev/null || true)
  if ! grep -q '"runsc"' <<<"$runtimes"; then
    echo "ensure-docker: the running engine has no runsc runtime; agents with runtime = \"runsc\" are" \
      "refused until it is registered: add the runtimes of $config to its daemon.json and kill -HUP dockerd" >&2
  elif ! grep -q 'oci-seccomp' <<<"$runtimes"; then
    echo "ensure-docker: the running engine's runsc lacks --oci-seccomp; agents with runtime = \"runsc\" are" \
      "refused until it has it: use the runtimeArgs of $config in its daemon.json and kill -HUP dockerd" >&2
  fi
  exit 0
fi

echo "ensure-docker: starting dockerd with gVisor registered (log: $log)"
# setsid: the engine must outlive the make process that started it.
as_root setsid dockerd --config-file "$config" >"$log" 2>&1 < /dev/null &
for _ in $(seq 1 120); do
  if [ -S "$sock" ] && docker info >/dev/null 2>&1; then
    echo "ensure-docker: engine ready"
    exit 0
  fi
  sleep 0.5
done
echo "ensure-docker: dockerd did not answer within 60 s; see $log" >&2
tail -n 20 "$log" >&2 || true
exit 1
