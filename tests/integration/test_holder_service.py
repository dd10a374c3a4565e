"""A holder's standing service (sandbox/holdservice.py): the capped filesystem's figures and the
upper layer's dump come from one exec kept open, byte for byte what an exec each gives; a reader
that stops half way, a service that died and a path that is not there each end as the exec path
would; a spare's service goes on under the run's name. On every engine."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from airlockd.errors import EngineError
from airlockd.sandbox import holdservice, layers
from airlockd.sandbox.image import image_tag
from airlockd.staging import upperdump

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("_image")]

#: what an agent leaves: directories (one made opaque), text, 3 MB of noise, a sparse file, a
#: hard link, a link out, a name with an escape and a newline
LEAVE = r"""
set -e
cd /layers/upper
mkdir -p d/e opaque && echo hi > d/e/f
python3 -c "import os; os.setxattr('opaque', 'user.overlay.opaque', b'y')"
head -c 3000000 /dev/urandom > big
truncate -s 1G sparse
echo same > one && ln one two
ln -s /etc/passwd out
printf x > "$(printf 'esc\033[31m\nname')"
"""


def _holder(client: Any, run_id: str, ws: str) -> layers.HeldLayers:
    held = layers.hold(
        client, run_id, image=image_tag(), size_bytes=16 << 20, inodes=1000, owner=(0, 0), mode=0o755,
        labels={layers.WORKSPACE_LABEL: ws},
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while holdservice.get(client, layers.holder_name(run_id)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert holdservice.get(client, layers.holder_name(run_id)) is not None, "the service did not start"
    return held


def _by_exec(client: Any, run_id: str, name: str = "upper") -> bytes:
    argv = ["python3", "-I", "-c", upperdump.DUMP, f"{layers.MOUNT}/{name}", layers.OPAQUE]
    return b"".join(layers._exec(client, layers.holder_name(run_id), argv))


def test_the_service_answers_as_an_exec_each_would(engine: str, tmp_path: Path) -> None:
    client = docker.from_env()
    run_id = f"hs{os.getpid() % 10000}a"
    holder = layers.holder_name(run_id)
    try:
        held = _holder(client, run_id, str(tmp_path))
        b"".join(layers._exec(client, holder, ["sh", "-c", LEAVE]))
        t0 = time.perf_counter()
        served = b"".join(layers.dump(client, held))
        served_s = time.perf_counter() - t0
        assert holdservice.get(client, holder) is not None  # it answered: still there
        t0 = time.perf_counter()
        execd = _by_exec(client, run_id)
        exec_s = time.perf_counter() - t0
        assert served == execd and len(served) > 3_000_000
        figures = layers._statvfs(client, holder)
        holdservice.drop(client, holder)
        assert layers._statvfs(client, holder) == figures  # by an exec of stat -f: the same
        print(f"\n{engine}: dump by the service {served_s:.3f} s, by an exec {exec_s:.3f} s")
    finally:
        layers.release(client, run_id)
    assert holdservice.get(client, holder) is None


def test_a_reader_that_stops_a_service_that_died_and_a_missing_path(engine: str, tmp_path: Path) -> None:
    client = docker.from_env()
    run_id = f"hs{os.getpid() % 10000}b"
    holder = layers.holder_name(run_id)
    try:
        held = _holder(client, run_id, str(tmp_path))
        b"".join(layers._exec(client, holder, ["sh", "-c", LEAVE]))
        whole = _by_exec(client, run_id)

        stream = layers.dump(client, held)
        next(stream)
        stream.close()  # a bound was met: what was still coming is not read
        assert holdservice.get(client, holder) is None
        assert b"".join(layers.dump(client, held)) == whole  # by an exec from then on

        holdservice.open_for(client, holder, layers.MOUNT)
        service = holdservice.get(client, holder)
        assert service is not None
        service._raw.shutdown(2)  # its connection broke under it: not known here until asked
        assert b"".join(layers.dump(client, held)) == whole
        assert layers.used(client, held)[0] > 3_000_000

        holdservice.open_for(client, holder, layers.MOUNT)
        with pytest.raises(EngineError, match="nothing"):
            b"".join(layers.dump(client, held, "nothing"))
    finally:
        layers.release(client, run_id)


def test_a_spares_service_goes_on_under_the_runs_name(engine: str, tmp_path: Path) -> None:
    client = docker.from_env()
    ws = str(tmp_path / "ws")
    ids = [f"hs{os.getpid() % 10000}c{i}" for i in range(2)]
    me = (os.getuid(), os.getgid())
    try:
        for run_id in ids:
            layers.hold(
                client, run_id, image=image_tag(), size_bytes=8 << 20, inodes=1000, owner=me, mode=0o755,
                labels={layers.WORKSPACE_LABEL: ws}, spare=True,
            )  # fmt: skip
            if run_id == ids[0]:
                layers.release(client, run_id)  # the spare is made now
                layers._spares.settle()
        taken = layers.holder_name(ids[1])
        assert client.api.inspect_container(taken)["Config"]["Labels"].get(layers.SPARE_LABEL)
        service = holdservice.get(client, taken)
        assert service is not None, "the spare's service did not follow it"
        assert layers.used(client, layers.HeldLayers(ids[1], layers.PurePosixPath("/"))) == (0, 3)
        assert not service.closed
    finally:
        for run_id in ids:
            layers.release(client, run_id)
        layers.drop_spares(client, ws)


def test_the_agents_standard_input_is_put_through_the_service_or_as_a_tar(engine: str, tmp_path: Path) -> None:
    """A small file (a run's standard input on a remote engine) is written by the service: root's,
    read-only, every byte; with no service (or one that refuses: the name taken, a name that is a
    path) it goes as a tar, with the same result."""
    client = docker.from_env()
    run_id = f"hs{os.getpid() % 10000}d"
    holder = layers.holder_name(run_id)
    data = bytes(range(256)) * 40 + "é\n".encode()

    def seen(name: str) -> str:
        prog = f"stat -c '%u %g %a %s' /layers/{name} && sha256sum < /layers/{name}"
        return b"".join(layers._exec(client, holder, ["sh", "-c", prog])).decode()

    want = f"0 0 444 {len(data)}\n{hashlib.sha256(data).hexdigest()}  -\n"
    try:
        held = _holder(client, run_id, str(tmp_path))
        layers.put_file(client, held, "stdin", data)
        assert seen("stdin") == want
        with pytest.raises(holdservice.Broken):  # the service never writes over a file, nor a path
            holdservice.get(client, holder).write("stdin", b"x")  # type: ignore[union-attr]
        with pytest.raises(holdservice.Broken):
            holdservice.get(client, holder).write("upper/x", b"x")  # type: ignore[union-attr]
        holdservice.drop(client, holder)
        layers.put_file(client, held, "again", data)  # by a tar
        assert seen("again") == want
    finally:
        layers.release(client, run_id)


def test_a_file_written_into_a_spare_set_aside_is_the_runs_and_another_replaces_it(engine: str, tmp_path: Path) -> None:
    """The daemon writes a run's standard input into the spare it sets aside (`reserve_spare`
    with files: runs/ahead.py), through its own service; the run's process that takes that spare
    finds it there, root's and read-only; one it would write otherwise (another prompt) replaces
    it (the service never writes over a file: a tar does)."""
    client = docker.from_env()
    ws = str(tmp_path / "ws")
    first, run_id = (f"hs{os.getpid() % 10000}e{engine[0]}{i}" for i in range(2))  # (one process: every engine)
    holder = layers.holder_name(run_id)
    me = (os.getuid(), os.getgid())
    cap = {"image": image_tag(), "size_bytes": 8 << 20, "inodes": 1000, "owner": me, "mode": 0o755}

    def seen(name: str) -> str:
        prog = f"stat -c '%u %g %a %s' /layers/{name} && sha256sum < /layers/{name}"
        return b"".join(layers._exec(client, holder, ["sh", "-c", prog])).decode()

    try:
        layers.hold(client, first, labels={layers.WORKSPACE_LABEL: ws}, spare=True, **cap)  # type: ignore[arg-type]
        layers.release(client, first)  # the spare is made now
        layers._spares.settle()
        cid = layers.reserve_spare(client, run_id, ws, {"stdin": b"the prompt, ahead"})
        assert cid is not None
        upper = layers.EngineUpper(client, image_tag(), {layers.WORKSPACE_LABEL: ws})
        assert not upper.took_claim(run_id)
        upper.hold(run_id, 8 << 20, 1000, me, 0o755, claimed=cid)
        assert upper.took_claim(run_id)
        assert client.api.inspect_container(holder)["Id"] == cid
        assert seen("stdin") == f"0 0 444 17\n{hashlib.sha256(b'the prompt, ahead').hexdigest()}  -\n"
        upper.put_file(run_id, "stdin", b"another")
        assert seen("stdin") == f"0 0 444 7\n{hashlib.sha256(b'another').hexdigest()}  -\n"
    finally:
        for r in (first, run_id):
            layers.release(client, r)
        layers.drop_spares(client, ws)
