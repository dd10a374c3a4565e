# Shared by second-engine.sh and podman-engine.sh (sourced, not run).

# load_images SOCK IMAGE...: each IMAGE from the first engine into the engine at SOCK, once
load_images() {
  local sock=$1 image
  shift
  for image in "$@"; do
    DOCKER_HOST=unix://$sock docker image inspect "$image" >/dev/null 2>&1 \
      || docker save "$image" | DOCKER_HOST=unix://$sock docker load -q >/dev/null
  done
}

# end_process PID: SIGTERM, up to 30 s to leave, then SIGKILL
end_process() {
  local pid=$1
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
}
