"""Which engine this process's agents run on, as `DOCKER_HOST` names it: a module of its own, free
of the engine's client, so the doors can compare it with a daemon's at no start-up cost."""

from __future__ import annotations

import os

#: this machine's own engine socket, however it is spelt (no DOCKER_HOST is the same)
LOCAL_SOCKETS = frozenset({"", "unix:///var/run/docker.sock", "unix:///run/docker.sock"})


def engine_host() -> str:
    """`DOCKER_HOST`, with "" for this machine's own socket."""
    host = os.environ.get("DOCKER_HOST", "").strip()
    return "" if host in LOCAL_SOCKETS else host


def describe(host: str) -> str:
    return host or "this machine's engine (no DOCKER_HOST)"
