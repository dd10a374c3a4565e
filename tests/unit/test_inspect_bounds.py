"""Inspection is bounded by the work's real size: a sparse file is judged from its inode (size
against allocated blocks) and never read, however large it claims to be."""

from __future__ import annotations

import os
import time
from pathlib import Path

from airlockd.staging.overlay import scan_upper
from airlockd.staging.readback import scan_tree


def _sparse(path: Path, size: int) -> None:
    with path.open("wb") as fh:
        fh.truncate(size)
        fh.seek(size // 2)
        fh.write(b"x")


def test_a_huge_sparse_file_costs_a_stat_not_a_read(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "sub").mkdir(parents=True)
    _sparse(root / "sub" / "huge.bin", 1 << 40)  # 1 TiB of holes
    (root / "real.txt").write_bytes(b"real\n")
    (root / "holey-but-small.bin").write_bytes(b"\0" * 4096)
    started = time.monotonic()
    got = scan_tree(root)
    upper, _, _ = scan_upper(root)
    assert time.monotonic() - started < 5
    for m in (got, upper):
        huge = m["sub/huge.bin"]
        assert huge.size == 1 << 40 and huge.sha256 is None
        assert m["real.txt"].sha256 is not None and m["holey-but-small.bin"].sha256 is not None
    assert os.stat(root / "sub" / "huge.bin").st_blocks * 512 < 1 << 20


def test_a_sparse_file_is_denied_whatever_the_rules_say(tmp_path: Path) -> None:
    from airlockd.pipeline.classify import classify
    from airlockd.pipeline.manifest import Change, ChangeKind, Entry, Kind
    from airlockd.policy import Decision, load_policy

    (tmp_path / "policies.toml").write_text('[[rules]]\nmatch = ["*"]\naction = "auto"\nreason = "all"\n')
    policy = load_policy(tmp_path).policy
    sparse = Change("data.bin", ChangeKind.CREATED, None, Entry(Kind.FILE, 0o644, 3 << 20, None))
    (c,) = classify([sparse], policy, ())
    assert (c.decision, c.rule) == (Decision.DENY, "invariant:sparse-file")
