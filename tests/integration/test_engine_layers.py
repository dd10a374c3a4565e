"""The growth cap and the upper layer without host root (sandbox/layers.py, staging/upperdump.py),
as a person runs them: a user who is not root, in the `docker` group. The engine holds the capped
filesystem, lays out the whiteouts of withheld paths, and the upper layer comes back as a stream
that is inspected by the same code as a local one; a hostile agent's leftovers (a file and a
directory it made unreadable, a sparse terabyte, a deep chain, names with escapes and newlines, a
link out, a directory deleted and made again, writing until the cap) come back bounded and exact.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import docker
import pytest
from nonroot import as_user, ensure_tester, home_for, interpreter_for

pytestmark = pytest.mark.docker

AGENT = r"""
cd /workspace
cat sub/secret.env > /dev/null 2>&1 && echo SAW-SECRET || echo secret-absent
echo new > new.txt; echo changed > a.txt; rm b.txt
rm -r d; mkdir d; echo fresh > d/fresh.txt
echo locked > locked; chmod 000 locked; mkdir hidden; echo in > hidden/f; chmod 000 hidden
ln -s /etc/passwd link
printf x > "$(printf 'esc\033[31m\nname')"
truncate -s 1T sparse
p=deep; for i in $(seq 1 60); do p=$p/d; done; mkdir -p $p; echo bottom > $p/f
dd if=/dev/zero of=fill bs=1M count=64 2>&1 | grep -o 'No space left' || echo no-enospc
"""

SCENARIO = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import docker
    from airlockd.sandbox import layers
    from airlockd.staging import overlay
    from airlockd.staging.bounds import ChangeBounds
    from airlockd.staging.runbase import LowerBase

    image, lower, dest, run_id, agent, depth = sys.argv[1:7]
    client = docker.from_env()
    me = (os.getuid(), os.getgid())
    held = layers.hold(client, run_id, image=image, size_bytes=8 << 20, inodes=4096, owner=me, mode=0o755)
    out = {"mountpoint": str(held.mountpoint)}
    try:
        layers.place(client, held, [("sub", me, 0o755)], ["sub/secret.env"])
        vol = client.volumes.create(
            f"airlockd-test-ws-{run_id}", driver="local",
            driver_opts={"type": "overlay", "device": "overlay", "o": held.options(lower)},
        )
        try:
            log = client.containers.run(
                image, ["bash", "-c", agent], user=f"{me[0]}:{me[1]}", network_mode="none", cap_drop=["ALL"],
                security_opt=["no-new-privileges"], volumes={vol.name: {"bind": "/workspace", "mode": "rw"}},
                remove=True,
            )
        finally:
            vol.remove(force=True)
        out["log"] = log.decode()
        out["used"] = layers.used(client, held)
        bounds = ChangeBounds(entries=10_000, depth=int(depth), bytes=64 << 20)
        try:
            base = LowerBase(Path(lower), ["sub/secret.env"])
            cs = overlay.inspect_stream(layers.dump(client, held), Path(dest), base, bounds)
            out["changes"] = [c.to_json() for c in cs]
        except Exception as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        layers.release(client, run_id)
    print(json.dumps(out))
    """
)


def scenario(uid: int, prefix: Path, home: Path, image: str, depth: int) -> dict[str, Any]:
    lower, dest = home / "lower", home / "dest"
    shutil.rmtree(dest, ignore_errors=True)
    run_id = f"t{os.getpid()}-{depth}"
    proc = subprocess.run(
        as_user(
            uid,
            [
                str(prefix / "bin" / "python"),
                "-P",
                "-c",
                SCENARIO,
                image,
                str(lower),
                str(dest),
                run_id,
                AGENT,
                str(depth),
            ],
        ),
        capture_output=True,
        text=True,
        env={
            "HOME": str(home),
            "PATH": "/usr/bin:/bin",
            **({"DOCKER_HOST": os.environ["DOCKER_HOST"]} if "DOCKER_HOST" in os.environ else {}),
        },
        cwd="/",
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout)
    client = docker.from_env()
    assert not client.containers.list(all=True, filters={"name": f"airlockd-hold-{run_id}"})
    assert not client.volumes.list(filters={"name": f"airlockd-up-{run_id}"})
    return out


@pytest.fixture
def user_home(_image: None) -> Any:
    uid = ensure_tester()
    home = home_for(uid)
    gid = pwd.getpwuid(uid).pw_gid
    lower = home / "lower"
    for rel, text in (("a.txt", "a\n"), ("b.txt", "b\n"), ("d/old.txt", "old\n"), ("sub/secret.env", "TOKEN=x\n")):
        (lower / rel).parent.mkdir(parents=True, exist_ok=True)
        (lower / rel).write_text(text)
    for p in [lower, *lower.rglob("*")]:
        os.chown(p, uid, gid)
    try:
        with interpreter_for(uid) as prefix:
            yield uid, prefix, home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_user_who_is_not_root_gets_the_cap_the_whiteouts_and_the_exact_upper_layer(user_home: Any) -> None:
    from airlockd.sandbox.image import ensure_image

    uid, prefix, home = user_home
    image = ensure_image(docker.from_env())
    out = scenario(uid, prefix, home, image, depth=100)
    assert "error" not in out, out.get("error")
    log = out["log"]
    assert "secret-absent" in log and "SAW" not in log  # the whiteout the engine laid hides it
    assert "No space left" in log, log  # the cap holds: 64 MB written into 8 MB
    used_bytes, _ = out["used"]
    assert used_bytes <= 8 << 20
    assert not os.access(out["mountpoint"], os.F_OK) or os.geteuid() == 0  # the user could never read it
    got = {c["path"]: c for c in out["changes"]}
    assert got["new.txt"]["change"] == "created" and got["new.txt"]["after"]["size"] == 4
    assert got["a.txt"]["change"] == "modified" and got["b.txt"]["change"] == "deleted"
    assert got["d/old.txt"]["change"] == "deleted"  # below the directory made again (opaque)
    assert got["d/fresh.txt"]["change"] == "created"
    assert got["locked"]["after"]["mode"] == 0 and got["locked"]["after"]["sha256"]  # read all the same
    assert got["hidden"]["after"]["mode"] == 0 and got["hidden/f"]["change"] == "created"
    assert got["link"]["after"] == {"kind": "symlink", "mode": 0o777, "size": 0, "target": "/etc/passwd"}
    assert got["esc\x1b[31m\nname"]["after"]["size"] == 1
    assert got["sparse"]["after"]["size"] == 1 << 40 and "sha256" not in got["sparse"]["after"]  # never read
    deep = "deep" + "/d" * 60 + "/f"
    assert got[deep]["change"] == "created"
    assert "sub/secret.env" not in got and not any(p.startswith("sub/") for p in got)  # hidden is no change
    assert "fill" in got and got["fill"]["after"]["size"] < 8 << 20
    # what streamed past is where a proposal reads it, owned by the user
    dest = home / "dest"
    assert (dest / "new.txt").read_text() == "new\n" and (dest / "new.txt").stat().st_uid == uid
    assert (dest / deep).read_text() == "bottom\n"
    assert os.readlink(dest / "link") == "/etc/passwd"
    assert not (dest / "sparse").exists()


def test_a_chain_deeper_than_the_bound_stops_the_reading_there(user_home: Any) -> None:
    from airlockd.sandbox.image import ensure_image

    uid, prefix, home = user_home
    out = scenario(uid, prefix, home, ensure_image(docker.from_env()), depth=20)
    assert out.get("error", "").startswith("ChangeSetTooLarge"), out.get("error")
    assert "change_depth" in out["error"]
