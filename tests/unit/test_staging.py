"""Staging: withheld files are absent, links never lead out, modes and hostile names survive,
races never crash, and the base manifest is exactly the copy."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from merged import MOUNTED, inspect_merged, stage_merged, unmount_merged

from airlockd.pipeline.manifest import ChangeKind, Kind, scan
from airlockd.policy import Level, Policy, load_policy
from airlockd.redact import DETECTORS, Redactor
from airlockd.staging import copy as staging
from airlockd.staging.copy import stage
from airlockd.staging.readback import inspect, scan_tree
from airlockd.staging.records import StageResult, StagingError, link_escapes
from airlockd.staging.secretscan import SecretScanner

# Assembled at run time so this file never carries a whole secret for scanners to flag.
PRIVATE_KEY = "-----BEGIN OPENSSH " + "PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
SAMPLES = {
    "private-key": PRIVATE_KEY,
    "aws-access-key": "key = AKIA" + "IOSFODNN7EXAMPLE\n",
    "github-token": "token: ghp_" + "a" * 36 + "\n",
    "gitlab-token": "glpat-" + "x1y2z3" * 4 + "\n",
    "slack-token": "xoxb-" + "1234567890-abcdef" + "\n",
    "openai-key": "OPENAI=sk-" + "proj-" + "A" * 40 + "\n",
    "anthropic-key": "k: sk-ant-" + "api03-" + "B" * 30 + "\n",
    "google-api-key": "AIza" + "S" * 35 + "\n",
    "stripe-key": "sk_" + "live_" + "4" * 24 + "\n",
}


@pytest.fixture(autouse=True)
def _stager_under_test(stager: str | None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Under the overlay stager, `stage` refreshes a mirror and mounts it with a fresh upper layer
    at the destination, and `inspect` reads the upper layer only: the same tests, the other way."""
    if stager == "overlay":
        monkeypatch.setitem(globals(), "stage", stage_merged)
        monkeypatch.setitem(globals(), "inspect", inspect_merged)
    yield
    for dest in list(MOUNTED):
        unmount_merged(Path(dest))


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    return load_policy(tmp_path / "no-workspace").policy


def write(root: Path, rel: str, data: str | bytes = "x\n", mode: int | None = None) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        os.chmod(p, mode)
    return p


def run(ws: Path, tmp_path: Path, policy: Policy, clearance: Level = Level.INTERNAL, **kw: object) -> StageResult:
    return stage(ws, tmp_path / "copy", policy, clearance, **kw)  # type: ignore[arg-type]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    write(root, "src/app.py", "print('hi')\n")
    return root


# -- withheld by name ----------------------------------------------------------------------------

NAMED = [".env", ".env.local", "x.pem", "x.key", "id_rsa", ".npmrc", ".pypirc", ".netrc", "sub/deep/.env"]


@pytest.mark.parametrize("rel", NAMED)
def test_withheld_by_name_is_absent(ws: Path, tmp_path: Path, policy: Policy, rel: str) -> None:
    write(ws, rel, "TOKEN=abcdefghijkl\n")
    res = run(ws, tmp_path, policy)
    assert not (tmp_path / "copy" / rel).exists()
    assert rel not in res.base
    (hit,) = [w for w in res.withheld if w.path == rel]
    assert hit.rule.startswith("withhold:")
    assert "src/app.py" in res.base


@pytest.mark.parametrize(("rel", "pruned"), [(".aws/credentials", ".aws"), (".ssh/id_ed25519", ".ssh")])
def test_withheld_directory_is_pruned_whole(ws: Path, tmp_path: Path, policy: Policy, rel: str, pruned: str) -> None:
    write(ws, rel, "secret-material-123\n")
    write(ws, f"{pruned}/harmless.txt", "nothing here\n")
    res = run(ws, tmp_path, policy)
    assert not (tmp_path / "copy" / pruned).exists()
    assert not any(p == pruned or p.startswith(pruned + "/") for p in res.base)
    assert [w.rule for w in res.withheld if w.path == pruned] == [f"withhold:{pruned}/"]


def test_git_entries_never_enter_the_copy_and_are_never_read(ws: Path, tmp_path: Path, policy: Policy) -> None:
    write(ws, ".git/HEAD", "ref: refs/heads/main\n")
    write(ws, ".git/objects/ab/cdef", b"\x78\x9c\x00binary")
    write(ws, ".git/config", "[remote]\n url = https://x:ghp_" + "b" * 36 + "@github.com/o/r\n")
    write(ws, "vendor/lib/.git", "gitdir: ../../.git/modules/lib\n")  # a submodule's .git file
    write(ws, "vendor/lib/lib.py", "X = 1\n")
    write(ws, "policies.toml", "# workspace policy\n")
    redactor = Redactor()
    res = run(ws, tmp_path, policy, redactor=redactor)
    copy = tmp_path / "copy"
    assert not (copy / "vendor/lib/.git").exists() and not (copy / ".git/objects/ab/cdef").exists()
    if (copy / ".git").exists():  # overlay: the mirror's fresh repository (staging/gitcopy.py)
        assert "ghp_" not in (copy / ".git/config").read_text()
    assert not any(p == ".git" or p.startswith(".git/") or p.endswith("/.git") for p in res.base)
    assert {w.path: w.rule for w in res.withheld} == {".git": "git-history", "vendor/lib/.git": "git-history"}
    assert not redactor.known_in("https://x:ghp_" + "b" * 36)  # withheld unread: nothing learnt from it
    assert (copy / "vendor/lib/lib.py").read_text() == "X = 1\n"
    assert (copy / "policies.toml").read_text() == "# workspace policy\n"


# -- withheld by content -------------------------------------------------------------------------


@pytest.mark.parametrize("detector", sorted(SAMPLES))
def test_withheld_by_content_under_an_innocent_name(ws: Path, tmp_path: Path, policy: Policy, detector: str) -> None:
    write(ws, "notes/readme.txt", "hello\n" * 50 + SAMPLES[detector] + "bye\n")
    res = run(ws, tmp_path, policy)
    assert not (tmp_path / "copy/notes/readme.txt").exists()
    first = next(n for n in policy.withhold.detectors if n in DETECTORS and DETECTORS[n].search(SAMPLES[detector]))
    assert [(w.path, w.rule) for w in res.withheld] == [("notes/readme.txt", f"detector:{first}")]


def test_every_default_detector_has_a_sample_and_a_live_anchor(policy: Policy) -> None:
    assert set(SAMPLES) <= set(policy.withhold.detectors)  # every one: tests/unit/test_detector_corpus.py
    scanner = SecretScanner(policy.withhold.detectors)
    # An anchor whose pattern digest no longer matches redact.DETECTORS falls back to running the
    # full regex on every file: still correct, but slow. Update secretscan._ANCHORS when this fails.
    assert scanner.unanchored == []
    for name, text in SAMPLES.items():
        assert DETECTORS[name].search(text), name
        assert SecretScanner([name]).first_hit(text.encode()) == name
        assert scanner.first_hit(text.encode()) is not None


def test_scanner_falls_back_to_the_full_regex_without_an_anchor() -> None:
    scanner = SecretScanner(["bearer"])
    assert scanner.unanchored == ["bearer"]
    assert scanner.first_hit(b"Authorization: Bearer abcdefghijklmnop1234") == "bearer"
    assert scanner.first_hit(b"nothing to see") is None


def test_scanner_on_a_buffer_full_of_false_anchors() -> None:
    noisy = b"task-list disk-usage " * 2000
    scanner = SecretScanner(["openai-key"])
    assert scanner.first_hit(noisy) is None
    assert scanner.first_hit(noisy + b" sk-" + b"Z" * 30) == "openai-key"


def test_binary_content_is_scanned_too(ws: Path, tmp_path: Path, policy: Policy) -> None:
    write(ws, "db.sqlite", b"\x00\x01\xff" * 1000 + SAMPLES["github-token"].encode() + b"\x00" * 100)
    res = run(ws, tmp_path, policy)
    assert [w.rule for w in res.withheld] == ["detector:github-token"]


@pytest.mark.parametrize("at", [0, 1, 2])
def test_large_files_stream_and_a_secret_across_a_chunk_boundary_is_found(
    ws: Path, tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch, at: int
) -> None:
    monkeypatch.setattr(staging, "READ_WHOLE", 1000)
    monkeypatch.setattr(staging, "CHUNK", 4096)
    token = SAMPLES["github-token"].encode()
    data = bytearray(b"." * 20_000)
    start = 4096 * (at + 1) - len(token) // 2  # straddles the boundary between two chunks
    data[start : start + len(token)] = token
    write(ws, "big.log", bytes(data))
    write(ws, "big-clean.log", b"-" * 20_000, mode=0o640)
    res = run(ws, tmp_path, policy)
    assert [(w.path, w.rule) for w in res.withheld] == [("big.log", "detector:github-token")]
    assert not (tmp_path / "copy/big.log").exists()
    assert (tmp_path / "copy/big-clean.log").read_bytes() == b"-" * 20_000
    assert res.base["big-clean.log"] == scan(tmp_path / "copy")["big-clean.log"]
    assert res.base["big-clean.log"].mode == 0o640


def test_withheld_by_content_written_in_utf16(ws: Path, tmp_path: Path, policy: Policy) -> None:
    """A PowerShell script or a .reg export: UTF-16 in either byte order, with or without a
    byte-order mark; a clean one, and a binary with NULs, are staged as they are."""
    encodings = {"bom": "utf-16", "le": "utf-16-le", "be": "utf-16-be"}
    samples = {d: t for d, t in SAMPLES.items() if d != "private-key"}  # that one: private-key-utf16
    for detector, sample in samples.items():
        for tag, codec in encodings.items():
            write(ws, f"scripts/{detector}.{tag}.ps1", f"# setup\r\n$t = '{sample.strip()}'\r\n".encode(codec))
    write(ws, "clean.reg", "Windows Registry Editor Version 5.00\r\n[HKEY_CURRENT_USER\\X]\r\n".encode("utf-16"))
    write(ws, "lib.so", b"\x7fELF\x02\x01\x01" + b"\x00\x00\x00\x00\x01\x02\x03\x04" * 500)
    res = run(ws, tmp_path, policy)
    rules = {w.path: w.rule for w in res.withheld}
    first = {
        d: next(n for n in policy.withhold.detectors if n in DETECTORS and DETECTORS[n].search(t))
        for d, t in samples.items()
    }
    assert rules == {f"scripts/{d}.{tag}.ps1": f"detector:{first[d]}" for d in samples for tag in encodings}
    for rel in ("clean.reg", "lib.so"):
        assert (tmp_path / "copy" / rel).read_bytes() == (ws / rel).read_bytes()


@pytest.mark.parametrize(("codec", "odd"), [("utf-16-le", False), ("utf-16-le", True), ("utf-16-be", True)])
def test_a_utf16_secret_across_a_chunk_boundary_is_found(
    ws: Path, tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch, codec: str, odd: bool
) -> None:
    """The windows of a streamed file start at either byte of a UTF-16 character."""
    monkeypatch.setattr(staging, "READ_WHOLE", 1000)
    monkeypatch.setattr(staging, "CHUNK", 4096)
    monkeypatch.setattr(SecretScanner, "overlap", 512)  # windows that start inside the file
    token = SAMPLES["github-token"].encode(codec)
    data = bytearray(b"." * odd + ("-" * 15_000).encode(codec))
    start = 4096 * 2 - len(token) // 2 + odd  # straddles the boundary between two chunks
    data[start : start + len(token)] = token
    write(ws, "big.log", bytes(data))
    res = run(ws, tmp_path, policy)
    assert [(w.path, w.rule) for w in res.withheld] == [("big.log", "detector:github-token")]
    assert not (tmp_path / "copy/big.log").exists()


def test_redactor_learns_withheld_values_and_nothing_is_stored(ws: Path, tmp_path: Path, policy: Policy) -> None:
    write(ws, ".env", "DB_PASSWORD=correct-horse-battery\n# comment\nAPI=zzz-top-secret-42\n")
    write(ws, ".aws/credentials", "[default]\naws_secret_access_key = wJalrXUtnFEMIK7MDENG\n")
    write(ws, "notes.txt", PRIVATE_KEY)
    redactor = Redactor()
    res = run(ws, tmp_path, policy, redactor=redactor)
    said = redactor.text("pw correct-horse-battery, zzz-top-secret-42 and wJalrXUtnFEMIK7MDENG")
    assert "correct-horse" not in said and "zzz-top" not in said and "wJalr" not in said
    assert "correct-horse" not in repr(res)


# -- labels --------------------------------------------------------------------------------------


def test_labels_above_clearance_are_absent(ws: Path, tmp_path: Path, policy: Policy) -> None:
    write(ws, "secrets/plan.txt", "the plan\n")
    write(ws, "docs/board.secret", "minutes\n")
    write(ws, "confidential/q3.txt", "numbers\n")
    res = run(ws, tmp_path, policy, Level.INTERNAL)
    assert {w.path: w.rule for w in res.withheld} == {
        "secrets": "label:secret>internal",
        "docs/board.secret": "label:secret>internal",
        "confidential": "label:confidential>internal",
    }
    assert not (tmp_path / "copy/secrets").exists() and (tmp_path / "copy/docs").is_dir()

    res = stage(ws, tmp_path / "copy2", policy, Level.CONFIDENTIAL)
    assert (tmp_path / "copy2/confidential/q3.txt").exists() and not (tmp_path / "copy2/secrets").exists()
    res = stage(ws, tmp_path / "copy3", policy, Level.SECRET)
    assert res.withheld == [] and (tmp_path / "copy3/secrets/plan.txt").exists()


# -- links and special files ---------------------------------------------------------------------


def test_symlinks_copied_as_links_and_escaping_ones_withheld(ws: Path, tmp_path: Path, policy: Policy) -> None:
    (ws / "src/inside").symlink_to("app.py")
    (ws / "src/up").symlink_to("..")
    (ws / "abs").symlink_to("/etc/passwd")
    (ws / "src/climb").symlink_to("../../outside")
    (ws / "src/via").symlink_to("up/..")  # lexically inside, but `up` is the root: escapes
    (ws / "loop1").symlink_to("loop2")
    (ws / "loop2").symlink_to("loop1")
    (ws / "dangling").symlink_to("missing/file")
    (ws / "to-env").symlink_to(".env")
    write(ws, ".env", "A=1\n")
    res = run(ws, tmp_path, policy)
    copy = tmp_path / "copy"
    assert os.readlink(copy / "src/inside") == "app.py"
    assert os.readlink(copy / "src/up") == ".."
    assert os.readlink(copy / "dangling") == "missing/file"
    assert os.readlink(copy / "to-env") == ".env" and not (copy / ".env").exists()
    escaped = {w.path for w in res.withheld if w.rule == "symlink-escape"}
    assert escaped == {"abs", "src/climb", "src/via", "loop1", "loop2"}
    for rel in escaped:
        assert not os.path.lexists(copy / rel) and rel not in res.base
    assert res.base["src/inside"].kind is Kind.SYMLINK and res.base["src/inside"].target == "app.py"


def test_link_escapes_is_pure_and_conservative() -> None:
    tree = {"a": staging.Entry(Kind.DIR, 0o755), "a/self": staging.Entry(Kind.SYMLINK, 0o777, target=".")}
    assert not link_escapes("a/l", "../a/self/self/x", tree)
    assert link_escapes("a/l", "../..", tree)
    assert link_escapes("l", "/abs", tree)
    assert link_escapes("l", "", tree)
    assert not link_escapes("l", "nope/../x", tree)
    assert link_escapes("l", "nope/../../x", tree)


def test_fifos_and_sockets_are_skipped(
    ws: Path, tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.mkfifo(ws / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    try:
        monkeypatch.chdir(ws)  # a relative bind keeps the path under the 108-byte limit
        sock.bind("sock")
        res = run(ws, tmp_path, policy)
    finally:
        sock.close()
    assert {(w.path, w.rule) for w in res.skipped} == {("pipe", "special-file:fifo"), ("sock", "special-file:socket")}
    assert not os.path.lexists(tmp_path / "copy/pipe") and "pipe" not in res.base


# -- modes, owner, names, races ------------------------------------------------------------------


def test_modes_and_times_are_kept(ws: Path, tmp_path: Path, policy: Policy) -> None:
    write(ws, "run.sh", "#!/bin/sh\n", mode=0o755)
    write(ws, "private.txt", "p\n", mode=0o600)
    write(ws, "suid", "x\n", mode=0o4755)
    write(ws, "ro/inner.txt", "r\n", mode=0o444)
    os.chmod(ws / "ro", 0o555)
    os.utime(ws / "run.sh", ns=(1_000_000_000, 1_500_000_000_123))
    try:
        res = run(ws, tmp_path, policy)
    finally:
        os.chmod(ws / "ro", 0o755)
    copy = tmp_path / "copy"
    for rel, mode in [
        ("run.sh", 0o755),
        ("private.txt", 0o600),
        ("suid", 0o4755),
        ("ro", 0o555),
        ("ro/inner.txt", 0o444),
    ]:
        assert stat.S_IMODE(os.lstat(copy / rel).st_mode) == mode, rel
        assert res.base[rel].mode == mode, rel
    assert os.stat(copy / "run.sh").st_mtime_ns == 1_500_000_000_123
    os.chmod(copy / "ro", 0o755)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_owner_is_applied_to_every_node(ws: Path, tmp_path: Path, policy: Policy) -> None:
    write(ws, "a/b/c.txt", "c\n", mode=0o4755)
    (ws / "a/link").symlink_to("b/c.txt")
    run(ws, tmp_path, policy, owner=(4321, 8765))
    copy = tmp_path / "copy"
    nodes = [copy, *copy.rglob("*")]
    assert len(nodes) == 7
    for p in nodes:
        st_ = os.lstat(p)
        assert (st_.st_uid, st_.st_gid) == (4321, 8765), p
    assert stat.S_IMODE(os.stat(copy / "a/b/c.txt").st_mode) == 0o4755  # chown did not eat it


HOSTILE = [
    "with space.txt",
    "new\nline.txt",
    "tab\tand\x1besc",
    "ünïcödé-名前.md",
    "-rf",
    "--help",
    "x" * 255,
    " leading and trailing ",
]


def test_hostile_names_round_trip(ws: Path, tmp_path: Path, policy: Policy) -> None:
    for i, name in enumerate(HOSTILE):
        write(ws, f"d{i}/{name}", name)
    raw = os.fsencode(ws) + b"/bad\xff\xfename"
    with open(raw, "wb") as fh:
        fh.write(b"undecodable")
    res = run(ws, tmp_path, policy)
    copy = tmp_path / "copy"
    for i, name in enumerate(HOSTILE):
        assert (copy / f"d{i}" / name).read_text() == name
    bad = os.fsdecode(b"bad\xff\xfename")
    assert bad in res.base
    with open(os.fsencode(copy) + b"/bad\xff\xfename", "rb") as fh:
        assert fh.read() == b"undecodable"
    assert res.base == scan(copy)
    assert len(inspect(copy, res.base)) == 0


def test_paths_longer_than_path_max(ws: Path, tmp_path: Path, policy: Policy) -> None:
    rel = "/".join(["d" * 200] * 25)  # ~5 KB, over PATH_MAX: only *at() calls reach it
    fd = os.open(ws, os.O_RDONLY)
    try:
        for part in rel.split("/"):
            os.mkdir(part, dir_fd=fd)
            nxt = os.open(part, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        out = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, b"deep")
        os.close(out)
    finally:
        os.close(fd)
    res = run(ws, tmp_path, policy)
    assert res.base[rel + "/leaf.txt"].size == 4
    assert scan_tree(tmp_path / "copy") == res.base


def test_files_vanishing_mid_walk_are_skipped(
    ws: Path, tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(ws, "gone.txt", "g\n")
    write(ws, "gonedir/f.txt", "f\n")
    write(ws, "stays.txt", "s\n")
    real = os.scandir

    class Listing:
        def __init__(self, entries: list[os.DirEntry[str]]) -> None:
            self.entries = entries

        def __enter__(self) -> Iterator[os.DirEntry[str]]:
            return iter(self.entries)

        def __exit__(self, *exc: object) -> None:
            return None

    def racing_scandir(path: int) -> Listing:
        with real(path) as it:
            entries = list(it)
        if any(e.name == "gone.txt" for e in entries):  # listed, then removed before it is read
            (ws / "gone.txt").unlink()
            (ws / "gonedir/f.txt").unlink()
            (ws / "gonedir").rmdir()
        return Listing(entries)

    monkeypatch.setattr(os, "scandir", racing_scandir)
    res = run(ws, tmp_path, policy)
    monkeypatch.undo()
    assert {(w.path, w.rule) for w in res.skipped} == {("gone.txt", "vanished"), ("gonedir", "vanished")}
    assert "stays.txt" in res.base and "gone.txt" not in res.base


def test_file_replaced_by_a_fifo_mid_walk_never_blocks(
    ws: Path, tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(ws, "swap.txt", "s\n")
    real_open = os.open

    def swapping_open(path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == "swap.txt" and not flags & os.O_WRONLY:
            (ws / "swap.txt").unlink()
            os.mkfifo(ws / "swap.txt")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", swapping_open)
    res = run(ws, tmp_path, policy)
    monkeypatch.undo()
    assert ("swap.txt", "special-file:fifo") in {(w.path, w.rule) for w in res.skipped}


def test_destination_must_be_new_or_empty_and_outside(ws: Path, tmp_path: Path, policy: Policy) -> None:
    (tmp_path / "empty").mkdir()
    stage(ws, tmp_path / "empty", policy, Level.INTERNAL)
    write(tmp_path, "full/x", "x")
    with pytest.raises(StagingError, match="not an empty directory"):
        stage(ws, tmp_path / "full", policy, Level.INTERNAL)
    with pytest.raises(StagingError, match="inside the workspace"):
        stage(ws, ws / ".staging", policy, Level.INTERNAL)


def test_progress_reports_the_totals(ws: Path, tmp_path: Path, policy: Policy) -> None:
    for i in range(600):
        write(ws, f"many/{i}.txt", "0123456789")
    seen: list[tuple[int, int]] = []
    res = run(ws, tmp_path, policy, progress=lambda f, b: seen.append((f, b)))
    assert res.files == 601 and seen[-1] == (res.files, res.bytes) and len(seen) >= 2


# -- inspect -------------------------------------------------------------------------------------


def test_inspect_sees_every_kind_of_change_from_the_disk_alone(ws: Path, tmp_path: Path, policy: Policy) -> None:
    write(ws, "same-size.txt", "aaaa")
    write(ws, "mode.sh", "m", mode=0o644)
    write(ws, "doomed.txt", "d")
    res = run(ws, tmp_path, policy)
    copy = tmp_path / "copy"
    before = os.stat(copy / "same-size.txt")
    (copy / "same-size.txt").write_text("bbbb")
    os.utime(copy / "same-size.txt", ns=(before.st_atime_ns, before.st_mtime_ns))  # hide it
    os.chmod(copy / "mode.sh", 0o755)
    (copy / "doomed.txt").unlink()
    write(copy, "new/file.py", "n")
    (copy / "link").symlink_to("/etc/shadow")
    os.mkfifo(copy / "fifo")
    got = {c.path: c.change for c in inspect(copy, res.base)}
    assert got == {
        "same-size.txt": ChangeKind.MODIFIED,
        "mode.sh": ChangeKind.MODE_CHANGED,
        "doomed.txt": ChangeKind.DELETED,
        "new": ChangeKind.CREATED,
        "new/file.py": ChangeKind.CREATED,
        "link": ChangeKind.CREATED,
        "fifo": ChangeKind.CREATED,
    }


def test_inspect_refuses_an_unreadable_corner(
    ws: Path, tmp_path: Path, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = run(ws, tmp_path, policy)

    def denied(path: int) -> object:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "scandir", denied)
    with pytest.raises(StagingError, match="in the staging copy"):
        inspect(tmp_path / "copy", res.base)


names = st.text(
    st.characters(blacklist_characters="/\x00", blacklist_categories=["Cs"]), min_size=1, max_size=12
).filter(lambda n: n not in (".", "..") and len(n.encode()) < 200)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=st.dictionaries(st.lists(names, min_size=1, max_size=3).map(tuple), st.binary(max_size=64), max_size=12))
def test_base_is_exactly_the_copy(tmp_path_factory: pytest.TempPathFactory, tree: dict[tuple[str, ...], bytes]) -> None:
    root = tmp_path_factory.mktemp("h")
    ws = root / "ws"
    ws.mkdir()
    for parts, data in tree.items():
        try:
            write(ws, "/".join(parts), data)
        except (IsADirectoryError, NotADirectoryError, FileExistsError):
            continue  # a name used both as a file and as a directory
    res = stage(ws, root / "copy", load_policy(root / "none").policy, Level.INTERNAL)
    assert res.base == scan(root / "copy")
    assert len(inspect(root / "copy", res.base)) == 0
    for p in scan(ws):  # every node is copied or withheld (itself or a directory above it)
        assert p in res.base or any(p == w.path or p.startswith(w.path + "/") for w in res.withheld)


def test_a_workspace_cannot_unwithhold_a_default(ws: Path, tmp_path: Path) -> None:
    from airlockd.errors import PolicyError

    (ws / "policies.toml").write_text('[withhold]\npatterns = ["!.env", "*.dump"]\n')
    with pytest.raises(PolicyError, match="never subtract"):  # refused outright at load
        load_policy(ws)
    (ws / "policies.toml").write_text('[withhold]\npatterns = ["*.dump"]\n')
    write(ws, ".env", "A=1\n")
    write(ws, ".env.example", "A=\n")
    write(ws, "db.dump", "rows\n")
    res = stage(ws, tmp_path / "copy", load_policy(ws).policy, Level.INTERNAL)
    assert {w.path: w.rule for w in res.withheld} == {
        ".env": "withhold:.env",
        ".env.example": "withhold:.env.*",
        "db.dump": "withhold:*.dump",
    }


PATTERNS = [
    *load_policy(Path("/nonexistent")).policy.withhold.patterns,
    "secrets/",
    "*.secret",
    "**/build/",
    "/rooted.txt",
    "a/**/b",
    "[abc].txt",
    "\\!literal",
    "docs/*.md",
]
segments = st.sampled_from(
    [
        *[".env", ".env.x", "a", "b", "build", "secrets", "x.pem", "id_rsa2", ".aws", "c.txt", "rooted.txt"],
        *["!literal", ".docker", "config.json", "docs", "x.md", ".kube", "config"],
    ]
)


def _anywhere(pattern: str) -> str:
    inner = "/" in pattern.rstrip("/")
    return f"**/{pattern}" if inner and not pattern.startswith(("/", "**/")) else pattern


@given(st.lists(segments, min_size=1, max_size=4), st.booleans(), st.lists(st.booleans(), min_size=40, max_size=40))
def test_the_fast_pattern_matcher_agrees_with_pathspec(parts: list[str], is_dir: bool, upper: list[bool]) -> None:
    """The one matcher is gitignore's pathspec, but in any case; for withholding, at any depth
    (pathspec itself, given `**/` in front of each inner-slash pattern)."""
    import pathspec

    from airlockd.pathmatch import AnyPattern, withhold_matcher

    path = "/".join(parts) + ("/" if is_dir else "")
    path = "".join(ch.upper() if up else ch for ch, up in zip(path, upper * 4, strict=False))
    plain = pathspec.PathSpec.from_lines("gitignore", PATTERNS, backend="simple")
    assert AnyPattern(PATTERNS)(path) == plain.match_file(path.lower())
    deep = pathspec.PathSpec.from_lines("gitignore", [_anywhere(p) for p in PATTERNS], backend="simple")
    assert withhold_matcher(PATTERNS)(path) == deep.match_file(path.lower())
