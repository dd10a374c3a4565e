"""The stream of an upper layer read where it lives (staging/upperdump.py): the same entries as a
local scan, and nothing of a malformed or hostile stream taken on trust."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airlockd.staging import overlay
from airlockd.staging.bounds import ChangeBounds, ChangeSetTooLarge, Tally
from airlockd.staging.records import StagingError
from airlockd.staging.upperdump import DUMP, read_dump


def dumped(root: Path) -> bytes:
    proc = subprocess.run(
        [sys.executable, "-I", "-c", DUMP, str(root), "user.overlay.opaque"], capture_output=True, check=True
    )
    return proc.stdout


def tree(root: Path) -> Path:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.txt").write_bytes(b"x" * 70_000)
    (root / "exe").write_text("#!/bin/sh\n")
    (root / "exe").chmod(0o755)
    (root / "link").symlink_to("../../etc/passwd")
    weird = os.fsencode(root) + b"/esc\x1b[2J\nname\xff"
    with open(weird, "wb") as fh:
        fh.write(b"w")
    with open(root / "sparse", "wb") as fh:
        fh.truncate(1 << 30)
    os.mkfifo(root / "fifo")
    return root


def test_the_stream_gives_what_a_local_scan_gives_and_the_content(tmp_path: Path) -> None:
    root = tree(tmp_path / "upper")
    local, _, _ = overlay.scan_upper(root)
    chunks = [dumped(root)[i : i + 997] for i in range(0, len(dumped(root)), 997)]  # any chunking
    after, whiteouts, opaque = read_dump(chunks, tmp_path / "dest")
    assert after == local and whiteouts == [] and opaque == []
    dest = tmp_path / "dest"
    assert (dest / "a/b/f.txt").read_bytes() == b"x" * 70_000
    assert os.readlink(dest / "link") == "../../etc/passwd"
    assert Path(os.fsdecode(os.fsencode(dest) + b"/esc\x1b[2J\nname\xff")).read_bytes() == b"w"
    assert not (dest / "sparse").exists() and not (dest / "fifo").exists()  # no content to take


def test_bounds_stop_the_reading_before_the_node_over_them(tmp_path: Path) -> None:
    root = tree(tmp_path / "upper")
    tally = Tally(ChangeBounds(entries=100, depth=100, bytes=10_000), lambda rel: False)
    with pytest.raises(ChangeSetTooLarge) as err:
        read_dump([dumped(root)], tmp_path / "dest", tally)
    assert err.value.limit == "changed_mb"
    assert not (tmp_path / "dest/a/b/f.txt").exists()  # stopped before it was written


def line(path: bytes, mode: int = 0o100644, size: int = 0, **extra: object) -> bytes:
    h = {"p": path.hex(), "m": mode, "s": size, "r": 0, "t": "", "q": False, "sp": False, **extra}
    return json.dumps(h).encode() + b"\n"


@pytest.mark.parametrize(
    ("stream", "says"),
    [
        (line(b"../escape"), "unclean path"),
        (line(b"/abs"), "unclean path"),
        (line(b"a//b"), "unclean path"),
        (line(b"nodir/f"), "out of order"),
        (line(b"f", size=3) + b"ab", "ends inside a file"),
        (line(b"f", size=2) + b"ab!", "changed while"),
        (line(b"f") + b"." + line(b"f") + b".", "out of order or twice"),
        (b'{"p": "zz"}\n', "malformed header"),
        (b"x" * (2 << 20), "header over"),
        (line(b"f")[:-1], "ends inside a header"),
    ],
)
def test_a_malformed_stream_is_an_error_naming_what_is_wrong(tmp_path: Path, stream: bytes, says: str) -> None:
    with pytest.raises(StagingError, match=says):
        read_dump([stream], tmp_path / "dest")


def test_a_link_in_the_stream_is_never_followed_by_what_comes_after(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    stream = line(b"l", mode=0o120777, t=os.fsencode(outside).hex()) + line(b"l/f", size=1) + b"x."
    with pytest.raises(StagingError, match="out of order"):
        read_dump([stream], tmp_path / "dest")
    assert list(outside.iterdir()) == []


def test_whiteouts_and_opaque_directories_are_read_from_the_stream(tmp_path: Path) -> None:
    stream = line(b"gone", mode=0o020000) + line(b"d", mode=0o040755, q=True) + line(b"d/n", size=1) + b"n."
    after, whiteouts, opaque = read_dump([stream], tmp_path / "dest")
    assert whiteouts == ["gone"] and opaque == ["d"] and set(after) == {"d", "d/n"}
    assert not (tmp_path / "dest/gone").exists()


def test_hard_links_are_sent_once_and_written_as_links(tmp_path: Path) -> None:
    """A 1 MB file with 50 more names costs 1 MB of stream and of disk here, not 51 (an agent's
    hard links must not multiply what the host writes)."""
    root = tmp_path / "upper"
    root.mkdir()
    (root / "big").write_bytes(os.urandom(1 << 20))
    for i in range(50):
        os.link(root / "big", root / f"link{i}")
    stream = dumped(root)
    assert len(stream) < (1 << 20) + 50_000
    local, _, _ = overlay.scan_upper(root)
    after, _, _ = read_dump([stream], tmp_path / "dest")
    assert after == local
    dest = tmp_path / "dest"
    assert os.stat(dest / "link7").st_ino == os.stat(dest / "big").st_ino
    bounds = ChangeBounds(entries=100, depth=10, bytes=2 << 20)
    read_dump([stream], tmp_path / "again", Tally(bounds, lambda rel: False), links_once=True)  # a home
    # a change set counts each name: landing it writes a file per name (third attack review)
    with pytest.raises(ChangeSetTooLarge) as err:
        read_dump([stream], tmp_path / "once-more", Tally(bounds, lambda rel: False))
    assert err.value.limit == "changed_mb"


def test_a_hard_link_to_what_the_stream_never_gave_is_an_error(tmp_path: Path) -> None:
    stream = line(b"f", h=b"ghost".hex())
    with pytest.raises(StagingError, match="links"):
        read_dump([stream], tmp_path / "dest")
