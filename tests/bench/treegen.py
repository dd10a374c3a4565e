"""Deterministic generator of big workspace trees for benchmarks.

`big_tree(base)` writes (once; later calls reuse it) a tree that looks like a real repository:
tens of thousands of small text files of pseudo source code in nested directories, a few large
binary files (random bytes, like images or archives), some executables. The same seed gives the
same bytes on every machine. Other benchmarks reuse it:

    from treegen import big_tree          # tests/bench is on sys.path under pytest
    tree = big_tree(tmp_path_factory.getbasetemp())
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

_WORDS = [
    "def",
    "class",
    "return",
    "import",
    "from",
    "self",
    "value",
    "for",
    "in",
    "if",
    "else",
    "elif",
    "while",
    "with",
    "data",
    "result",
    "items",
    "key",
    "name",
    "path",
    "size",
    "count",
    "index",
    "node",
    "tree",
    "entry",
    "config",
    "parse",
    "load",
    "save",
    "check",
    "build",
    "render",
    "update",
    "create",
    "delete",
    "apply",
    "policy",
    "manifest",
    "change",
    "state",
    "error",
    "handler",
    "request",
    "response",
    "client",
    "server",
    "token",
    "buffer",
    "stream",
    "reader",
    "writer",
    "options",
    "args",
    "kwargs",
]
_OPS = ["=", "+=", "==", "!=", "<", ">", "+", "-", "*", "and", "or", "is", "not in"]


@dataclass(frozen=True)
class TreeSpec:
    files: int = 20_000
    total_bytes: int = 210 * 1024 * 1024
    large_files: int = 60  # random binary files that make up the bulk of the bytes
    seed: int = 20_240_601


def spec_from_env() -> TreeSpec:
    """The full benchmark tree, or a smaller one of AIRLOCK_BENCH_FILES files (bytes scale with it)."""
    files = int(os.environ.get("AIRLOCK_BENCH_FILES", "0") or 0)
    if not files:
        return TreeSpec()
    full = TreeSpec()
    return TreeSpec(files, full.total_bytes * files // full.files, max(3, full.large_files * files // full.files))


@dataclass(frozen=True)
class Tree:
    root: Path
    files: int
    dirs: int
    bytes: int
    paths: tuple[str, ...]  # relative paths of every regular file, sorted


def _text_pool(rnd: random.Random, size: int) -> bytes:
    """Pseudo source code: indented lines of identifiers, operators, numbers and strings."""
    lines: list[str] = []
    n = 0
    while n < size:
        indent = "    " * rnd.randint(0, 3)
        kind = rnd.random()
        if kind < 0.15:
            line = f"{indent}def {rnd.choice(_WORDS)}_{rnd.choice(_WORDS)}(self, {rnd.choice(_WORDS)}):"
        elif kind < 0.25:
            line = f"{indent}# {' '.join(rnd.choice(_WORDS) for _ in range(rnd.randint(3, 10)))}"
        elif kind < 0.35:
            line = f'{indent}{rnd.choice(_WORDS)} = "{rnd.choice(_WORDS)}-{rnd.randint(0, 9999)}"'
        else:
            terms = [rnd.choice(_WORDS) for _ in range(rnd.randint(2, 6))]
            line = indent + f" {rnd.choice(_OPS)} ".join(terms)
        lines.append(line + "\n")
        n += len(lines[-1])
    return "".join(lines).encode()


def _layout(rnd: random.Random, count: int) -> list[str]:
    """`count` distinct file paths in a nested directory layout (1 to 4 levels deep)."""
    top = [f"pkg{i:02d}" for i in range(20)]
    paths: list[str] = []
    for i in range(count):
        parts = [rnd.choice(top)]
        for depth in range(rnd.randint(0, 3)):
            parts.append(f"{'sub' if depth % 2 else 'mod'}{rnd.randint(0, 6)}")
        ext = rnd.choice([".py", ".py", ".py", ".ts", ".md", ".txt", ".json", ".go"])
        parts.append(f"f{i:05d}{ext}")
        paths.append("/".join(parts))
    return paths


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, mode)


def generate(root: Path, spec: TreeSpec = TreeSpec()) -> Tree:
    """Write the tree of `spec` under `root` (which must not exist). Deterministic."""
    rnd = random.Random(spec.seed)
    pool = _text_pool(rnd, 4 * 1024 * 1024)
    small = spec.files - spec.large_files
    paths = _layout(rnd, small)
    # Small files: mostly a few KB, a long tail up to 256 KB, some empty.
    sizes = [0 if rnd.random() < 0.02 else min(int(rnd.lognormvariate(7.6, 1.1)), 256 * 1024) for _ in paths]
    written = 0
    root.mkdir(parents=True)
    for i, (rel, size) in enumerate(zip(paths, sizes, strict=True)):
        header = f"# {rel}\n".encode()
        off = rnd.randrange(0, len(pool) - size - 1) if size else 0
        data = header + pool[off : off + size] if size else b""
        _write(root / rel, data, 0o755 if i % 50 == 0 else 0o644)
        written += len(data)
    remaining = max(spec.total_bytes - written, spec.large_files)
    for i in range(spec.large_files):
        size = remaining // (spec.large_files - i)
        if i < spec.large_files - 1:
            size = int(size * rnd.uniform(0.5, 1.5))
        size = max(1, min(size, remaining - (spec.large_files - i - 1)))
        rel = f"assets/a{i % 5}/blob{i:03d}.bin"
        _write(root / rel, rnd.randbytes(size), 0o644)
        paths.append(rel)
        written += size
        remaining -= size
    dirs = sum(1 for _, ds, _ in os.walk(root) for _ in ds)
    return Tree(root, len(paths), dirs, written, tuple(sorted(paths)))


def big_tree(base: Path, spec: TreeSpec = TreeSpec()) -> Tree:
    """The tree of `spec` under `base`, generated on first use and reused after (same session
    base dir => generated once, whichever benchmark asks first). Never modify it: copy it."""
    key = f"tree-{spec.files}-{spec.total_bytes}-{spec.large_files}-{spec.seed}"
    root = base / key
    marker = base / f"{key}.json"
    if marker.exists():
        meta = json.loads(marker.read_text())
        return Tree(root, meta["files"], meta["dirs"], meta["bytes"], tuple(meta["paths"]))
    if root.exists():  # a previous attempt died half-way
        import shutil

        shutil.rmtree(root)
    tree = generate(root, spec)
    meta = {**asdict(tree), "root": str(root), "paths": list(tree.paths)}
    marker.write_text(json.dumps(meta))
    return tree
