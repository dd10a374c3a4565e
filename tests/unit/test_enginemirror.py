"""What travels to a remote engine's mirror (sandbox/enginemirror.py): only what changed, a
changed file unlinked there before it is sent (a hard-link clone's sibling never changes), a
directory that became something else removed whole, and the relay's frames (sandbox/relay.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from airlockd.sandbox import relay
from airlockd.sandbox.enginemirror import plan, scan


def _tree(root: Path) -> Path:
    (root / "src" / "d").mkdir(parents=True)
    (root / "src" / "a.py").write_text("A = 1\n")
    (root / "src" / "d" / "b.py").write_text("B = 1\n")
    (root / "link").symlink_to("src/a.py")
    return root


def test_an_unchanged_tree_sends_nothing_and_a_clone_shares_every_key(tmp_path: Path) -> None:
    g1 = _tree(tmp_path / "g1")
    subprocess.run(["cp", "-al", str(g1), str(tmp_path / "g2")], check=True)
    assert plan(scan(g1), scan(g1)) == ([], [])
    assert plan(scan(g1), scan(tmp_path / "g2")) == ([], [])  # hard links: same inode, same key


def test_a_change_is_sent_and_only_what_went_is_removed(tmp_path: Path) -> None:
    g1 = _tree(tmp_path / "g1")
    have = scan(g1)
    tmp = g1 / "src" / ".new"
    tmp.write_text("A = 2\n")
    os.replace(tmp, g1 / "src" / "a.py")  # as the mirror writes: a new inode
    (g1 / "src" / "c.py").write_text("C = 1\n")
    (g1 / "link").unlink()
    (g1 / "link").symlink_to("src/c.py")
    (g1 / "src" / "gone.py").write_text("")
    have = {**have, "src/gone.py": ["f", 0o100644, 0, 0, 0, 0, 1]}
    (g1 / "src" / "gone.py").unlink()
    remove, send = plan(have, scan(g1))
    assert remove == ["src/gone.py"]  # a changed file or link is replaced by the extraction itself
    assert send == ["link", "src/a.py", "src/c.py"]


def test_a_directory_that_went_goes_whole_and_a_new_one_travels_with_its_parents(tmp_path: Path) -> None:
    g1 = _tree(tmp_path / "g1")
    have = scan(g1)
    shutil.rmtree(g1 / "src" / "d")
    (g1 / "src" / "d").write_text("now a file\n")
    (g1 / "new" / "deep").mkdir(parents=True)
    (g1 / "new" / "deep" / "x").write_text("x\n")
    os.chmod(g1 / "src", 0o750)
    remove, send = plan(have, scan(g1))
    assert remove == ["src/d"]  # its child goes with it, not on its own
    assert send == ["new", "new/deep", "new/deep/x", "src", "src/d"]  # a parent before its children


def test_relay_frames_carry_each_connection_both_ways(tmp_path: Path) -> None:
    """The relay's program, run here with a pipe for the engine's streams, and `Relay`'s own
    framing: an echo server stands for the gateway."""
    target = tmp_path / "gw.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(target))
    srv.listen(4)

    def echo() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            with c:
                while data := c.recv(4096):
                    c.sendall(data.upper())

    threading.Thread(target=echo, daemon=True).start()
    there = tmp_path / "there" / "gw.sock"
    proc = subprocess.Popen(
        ["python3", "-I", "-c", relay.RELAY, str(there), "4", "2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stdout is not None
    r = relay.Relay(None, "holder", str(there), target)
    r._raw = _PipeWriter(proc.stdin)
    frames: list[tuple[int, int, bytes]] = []

    def read() -> None:
        assert proc.stdout is not None
        while head := proc.stdout.read(relay.HEADER.size):
            cid, kind, n = relay.HEADER.unpack(head)
            data = proc.stdout.read(n) if n else b""
            frames.append((cid, kind, data))
            r._frame(cid, kind, data)

    threading.Thread(target=read, daemon=True).start()
    for _ in range(200):
        if there.exists():
            break
        threading.Event().wait(0.05)
    assert oct(there.stat().st_mode & 0o777) == "0o666"
    for word in (b"hello", b"world"):
        c = socket.socket(socket.AF_UNIX)
        c.connect(str(there))
        c.sendall(word)
        c.shutdown(socket.SHUT_WR)
        got = b""
        while data := c.recv(4096):
            got += data
        c.close()
        assert got == word.upper()
    assert frames[0] == (0, relay.LISTENING, b"")
    assert {f[0] for f in frames if f[1] == relay.OPENED} == {1, 2}
    # at most 4 at once (the holder's cap here): a fifth is closed at once, and a connection that
    # ended on both sides frees its place (none is kept: no descriptor leaks)
    idle = []
    for _ in range(4):
        c = socket.socket(socket.AF_UNIX)
        c.connect(str(there))
        idle.append(c)
    threading.Event().wait(0.3)
    extra = socket.socket(socket.AF_UNIX)
    extra.connect(str(there))
    extra.settimeout(5)
    assert extra.recv(10) == b""  # closed by the relay
    for c in idle:
        c.close()
    threading.Event().wait(0.5)
    for _ in range(8):  # more than the cap, one after another
        c = socket.socket(socket.AF_UNIX)
        c.connect(str(there))
        c.sendall(b"again")
        c.shutdown(socket.SHUT_WR)
        c.settimeout(5)
        assert c.recv(100) == b"AGAIN"
        c.close()
    r.close()
    proc.stdin.close()
    assert proc.wait(10) == 0
    srv.close()


class _PipeWriter:
    def __init__(self, pipe: object) -> None:
        self.pipe = pipe

    def sendall(self, data: bytes) -> None:
        self.pipe.write(data)  # type: ignore[attr-defined]
        self.pipe.flush()  # type: ignore[attr-defined]


def test_an_ssh_engine_is_reached_through_this_machines_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the docker CLI does (its config, keys and agent), not through a Python SSH library,
    which airlockd does not install."""
    import docker

    from airlockd.sandbox import enginepaths

    asked: list[dict[str, object]] = []
    monkeypatch.setattr(docker, "from_env", lambda **kw: asked.append(kw) or "client")
    monkeypatch.setenv("DOCKER_HOST", "ssh://builder@agents.example")
    assert enginepaths.connect(10) == "client"
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2376")
    enginepaths.connect()
    assert asked == [{"timeout": 10, "use_ssh_client": True}, {"timeout": 60, "use_ssh_client": False}]


def test_closing_a_relay_wakes_a_send_the_holder_no_longer_reads() -> None:
    """A holder that stopped reading (its agent's socket unread) must not hold the run's end:
    `close` shuts the engine's connection down, and the blocked send fails."""
    ours, theirs = socket.socketpair()
    r = relay.Relay(None, "holder", "/layers/gw/gateway.sock", Path("/nonexistent"))
    r._raw = r._sock = ours
    blocked = threading.Thread(target=lambda: _flood(r), daemon=True)
    blocked.start()
    blocked.join(1)
    assert blocked.is_alive()  # stuck in sendall: nobody reads `theirs`
    t0 = time.monotonic()
    r.close()
    blocked.join(5)
    assert not blocked.is_alive() and time.monotonic() - t0 < 5
    theirs.close()


def _flood(r: relay.Relay) -> None:
    with contextlib.suppress(OSError):
        while True:
            r._send(1, relay.DATA, b"x" * 65536)


def test_a_mirror_is_named_on_the_engine_by_a_random_key_kept_beside_it(tmp_path: Path) -> None:
    """Never by its path: two machines with the same paths on one shared engine must not share a
    volume (one's runs would see the other's files)."""
    from airlockd.sandbox.enginemirror import mirror_key

    a, b = tmp_path / "a" / "mirror", tmp_path / "b" / "mirror"
    key = mirror_key(a)
    assert len(key) == 32 and mirror_key(a) == key  # kept
    assert mirror_key(b) != key
    (a / "engine-mirror.id").write_text("not a key\n")
    assert mirror_key(a) not in (key, "not a key")  # one that is not ours is replaced


def _fresh_scan(tree: Path) -> dict[str, list[object]]:
    from airlockd.sandbox import enginemirror

    enginemirror._scans.pop(str(tree), None)
    return scan(tree)


def test_a_scan_that_trusts_unchanged_directories_sees_every_change_the_mirror_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mirror's ways of changing a generation (a file renamed over another, one removed, a
    link made, a directory made, removed or given another mode, a directory replaced by a file)
    are each seen by a scan that takes unchanged directories from the last one, which reads as
    few entries as there are directories."""
    from airlockd.sandbox import enginemirror

    monkeypatch.setattr(enginemirror, "RACY_NS", 0)  # every directory trusted (a tick apart below)
    g = _tree(tmp_path / "g1")
    for i in range(30):
        (g / "src" / f"m{i}.py").write_text(f"M = {i}\n")
    time.sleep(0.02)
    assert _fresh_scan(g) == scan(g)

    def replace(path: Path, text: str) -> None:
        tmp = path.with_name(".airlockd-tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def remove(path: Path) -> None:
        path.unlink()

    def link(path: Path) -> None:
        path.symlink_to("a.py")

    def mkdir(path: Path) -> None:
        path.mkdir()
        (path / "x").write_text("x\n")

    def chmod(path: Path) -> None:
        path.chmod(0o700)

    def rmtree(path: Path) -> None:
        shutil.rmtree(path)

    def dir_to_file(path: Path) -> None:
        shutil.rmtree(path)
        path.write_text("now a file\n")

    steps = [  # (change, where, text, directories listed again: the changed ones, not the 3 there are)
        (replace, g / "src" / "m3.py", "M = 'changed'\n", 1),
        (remove, g / "src" / "m4.py", None, 1),
        (link, g / "src" / "d" / "l", None, 1),
        (mkdir, g / "src" / "d" / "new", None, 2),
        (chmod, g / "src" / "d", None, 1),
        (rmtree, g / "src" / "d" / "new", None, 1),
        (dir_to_file, g / "src" / "d", None, 1),
    ]
    calls: list[int] = []
    real = os.scandir

    def counted(path: str) -> object:
        calls.append(1)
        return real(path)

    for fn, path, arg, listed in steps:
        before = scan(g)
        time.sleep(0.02)  # a clock tick: the change gives its directory another ctime
        fn(path, arg) if arg is not None else fn(path)  # type: ignore[operator]
        calls.clear()
        monkeypatch.setattr(os, "scandir", counted)
        got = scan(g)
        monkeypatch.setattr(os, "scandir", real)
        assert got == _fresh_scan(g), fn.__name__
        assert got != before, fn.__name__
        assert len(calls) == listed, (fn.__name__, len(calls))


def test_a_directory_changed_just_before_a_scan_is_listed_again_by_the_next(tmp_path: Path) -> None:
    from airlockd.sandbox import enginemirror

    g = _tree(tmp_path / "g1")
    scan(g)
    assert "src" not in enginemirror._scans[str(g)]  # changed within RACY_NS: not trusted
    (g / "src" / "a.py").unlink()
    assert "src/a.py" not in scan(g)


def test_a_sync_cut_short_stays_marked_when_the_next_is_cut_short_too(tmp_path: Path) -> None:
    """Each sync marks the generation it changes, keeping the marks of syncs cut short before it
    (the record says those whole until it is written again)."""
    import json

    from airlockd.sandbox.enginemirror import EngineMirror

    mirror = EngineMirror(None, "image", tmp_path)
    mirror._save({"nonce": "n1", "gens": {"g5": {"nodes": {}}, "g6": {"nodes": {}}, "g7": {"nodes": {}}}})
    mirror._mark("n1", "g5")  # sync A of g5 dies
    mirror._mark("n1", "g6")  # sync B of g6 dies
    state = mirror._load("n1")
    assert {g for g, e in state["gens"].items() if e.get("partial")} == {"g5", "g6"}
    assert not mirror._load("n2")["gens"]  # another volume: nothing of it is known
    mirror._save(state)  # a sync that ends writes the marks into the record
    assert not (tmp_path / "engine-mirror.partial").exists()
    on_disk = json.loads((tmp_path / "engine-mirror.json").read_text())
    assert {g for g, e in on_disk["gens"].items() if e.get("partial")} == {"g5", "g6"}


class _FullSync(Exception):
    pass


class _Engine:
    """Just enough engine for a sync taken at its version: the volume's inspection. Anything else
    (the keeper, a put, an exec) is a full sync."""

    def __init__(self, nonce: str) -> None:
        self.nonce, self.asked = nonce, 0
        self.api = self

    def inspect_volume(self, name: str) -> dict[str, object]:
        from airlockd.sandbox.enginemirror import NONCE_LABEL

        self.asked += 1
        return {"Name": name, "Labels": {NONCE_LABEL: self.nonce}, "Mountpoint": "/engine/volumes/m/_data"}

    @property
    def containers(self) -> object:
        raise _FullSync


def test_a_generation_synced_at_a_version_is_taken_at_its_word_and_nothing_else(tmp_path: Path) -> None:
    """A sync told the version the generation was synced at asks the engine only for the volume
    (still the one synced to); another version, another volume (made again), a sync of the
    generation under way or cut short, or no version at all make a full sync."""
    from airlockd.sandbox.enginemirror import EngineMirror

    g5 = _tree(tmp_path / "g5")
    engine = _Engine("n1")
    mirror = EngineMirror(engine, "image", tmp_path)
    mirror._stamp("n1", "g5", "7:42")
    assert mirror.sync(g5, "7:42") == "/engine/volumes/m/_data/g5"
    assert engine.asked == 1 and mirror.last == (0, 0)
    for version in ("8:42", "7:43", None):
        with pytest.raises(_FullSync):
            mirror.sync(g5, version)
    with pytest.raises(_FullSync):  # the volume was made again since
        EngineMirror(_Engine("n2"), "image", tmp_path).sync(g5, "7:42")
    mirror._mark("n1", "g5")  # a sync of it begins: until one ends, it is not known
    with pytest.raises(_FullSync):
        mirror.sync(g5, "7:42")
    mirror._stamp("n1", "g6", "9:1")
    mirror._stamp("n1", "g5", "7:42", keep={"g5"})  # generations gone there are forgotten
    assert set(mirror._synced()["gens"]) == {"g5"}
