"""The Merkle tree digest: incremental updates equal a digest from scratch, the encoding is
unambiguous, and an update recomputes only the directories on the changed paths."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airlockd.pipeline.manifest import Entry, Kind
from airlockd.staging import treedigest
from airlockd.staging.treedigest import SCHEME, TreeDigest


def file(content: bytes = b"x", mode: int = 0o644) -> Entry:
    return Entry(Kind.FILE, mode, len(content), hashlib.sha256(content).hexdigest())


def dir_(mode: int = 0o755) -> Entry:
    return Entry(Kind.DIR, mode)


def link(target: str) -> Entry:
    return Entry(Kind.SYMLINK, 0o777, 0, None, target)


def reference(nodes: Mapping[str, Entry]) -> str:
    """The scheme written out directly from the full node set (quadratic, for small trees)."""
    members: set[str] = set()
    for p in nodes:
        parts = p.split("/")
        members.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))

    def u64(n: int) -> bytes:
        return n.to_bytes(8, "big")

    def digest(d: str) -> bytes | None:
        names = sorted(m.rpartition("/")[2] for m in members if m.rpartition("/")[0] == d)
        if not names and d:
            return None
        h = hashlib.sha256()
        for name in names:
            path = f"{d}/{name}" if d else name
            enc = name.encode("utf-8", "surrogatepass")
            h.update(b"N" + u64(len(enc)) + enc)
            if path in nodes:
                js = json.dumps(nodes[path].to_json(), sort_keys=True, separators=(",", ":")).encode()
                h.update(b"E" + u64(len(js)) + js)
            else:
                h.update(b"-")
            sub = digest(path)
            h.update(b"-" if sub is None else b"T" + sub)
        return h.digest()

    root = digest("")
    assert root is not None
    return root.hex()


def apply(model: dict[str, Entry], changed: Mapping[str, Entry | None]) -> None:
    """`TreeDigest.update`'s documented meaning, on a plain dict."""
    for path in sorted(changed):
        entry = changed[path]
        if entry is None or entry.kind is not Kind.DIR:
            for p in [p for p in model if p.startswith(path + "/")]:
                del model[p]
        if entry is None:
            model.pop(path, None)
        else:
            model[path] = entry


# -- equivalence ------------------------------------------------------------------------------

NAMES = st.sampled_from(["a", "b", "a\n", "\nb", "é", "\udcff", "a b", "ab"])
PATHS = st.lists(NAMES, min_size=1, max_size=4).map("/".join)
ENTRIES = st.sampled_from(
    [file(b"1"), file(b"2"), file(b"1", 0o755), dir_(), dir_(0o700), link("a"), link("../b"), Entry(Kind.FIFO, 0o644)]
)
BATCHES = st.lists(st.dictionaries(PATHS, st.one_of(st.none(), ENTRIES), max_size=5), max_size=12)


@settings(max_examples=300, deadline=None)
@given(start=st.dictionaries(PATHS, ENTRIES, max_size=12), batches=BATCHES, data=st.data())
def test_updates_equal_a_digest_from_scratch(
    start: dict[str, Entry], batches: list[dict[str, Entry | None]], data: st.DataObject
) -> None:
    digest = TreeDigest.of(start)
    assert digest.hexdigest() == reference(start)
    model = dict(start)
    kept: list[tuple[TreeDigest, str]] = []
    for batch in batches:
        if data.draw(st.booleans(), label="copy"):  # a run keeps the digest of its generation
            kept.append((digest.copy(), reference(model)))
        digest.update(batch)
        apply(model, batch)
        assert len(digest) == len(model)
        if data.draw(st.booleans(), label="digest now"):  # dirty state carried across several updates
            assert digest.hexdigest() == TreeDigest.of(model).hexdigest() == reference(model)
    assert digest.hexdigest() == TreeDigest.of(model).hexdigest() == reference(model)
    for copy, want in kept:
        assert copy.hexdigest() == want


@settings(max_examples=100, deadline=None)
@given(nodes=st.dictionaries(PATHS, ENTRIES, max_size=20), shuffled=st.randoms(use_true_random=False))
def test_order_independent(nodes: dict[str, Entry], shuffled: random.Random) -> None:
    items = list(nodes.items())
    shuffled.shuffle(items)
    want = reference(nodes)
    assert TreeDigest.of(dict(items)).hexdigest() == TreeDigest.of(nodes).hexdigest() == want
    one_by_one = TreeDigest()
    for path in sorted(nodes):  # one call per node, a directory before what is below it
        one_by_one.update({path: nodes[path]})
    assert one_by_one.hexdigest() == want


# -- the encoding -----------------------------------------------------------------------------


def test_known_value_pins_the_scheme() -> None:
    # a stored "before" is compared with an "after" computed later, maybe by a newer airlockd:
    # the bytes of the scheme must not drift without a new SCHEME name
    assert SCHEME == "merkle-sha256-v1"
    nodes = {"src": dir_(), "src/a.py": file(b"print(1)\n"), "link": link("src/a.py"), "empty": dir_()}
    assert TreeDigest.of(nodes).hexdigest() == reference(nodes)
    assert TreeDigest.of({}).hexdigest() == hashlib.sha256(b"").hexdigest()
    assert TreeDigest.of(nodes).hexdigest() == "6d1e5013c84caea30af3ca3b36b74702c572cddd7b6c514991ebf69f786e391a"


def test_different_trees_give_different_digests() -> None:
    f, d = file(b"abc"), dir_()
    trees: list[dict[str, Entry]] = [
        {},
        {"a": f},
        {"a\n": f},
        {"a\nb": f},
        {"a": f, "b": f},
        {"a\nb": f, "c": f},  # a newline in a name is not a record separator
        {"a": d, "a/b": f},  # dir "a" holding "b" ...
        {"a/b": f},  # ... is not "b" under an implicit "a" (no entry of its own)
        {"a": f, "a/b": f},  # nor a file "a" with something below it
        {"ab": f},
        {"a": d, "a/b": d},
        {"a": d, "a/b": d, "a/b/c": f},
        {"a": d, "a/b": d, "a/c": f},  # "c" beside "b", not inside it
        {"a": d},
        {"a": dir_(0o700)},  # mode of a directory
        {"a": file(b"abc", 0o755)},  # mode of a file
        {"a": link("abc")},  # a symlink whose target is the file's bytes
        {"a": file(b"abd")},
        {"a": Entry(Kind.FIFO, 0o644)},
        {"a": Entry(Kind.SOCKET, 0o644)},
        {"é": f},
        {"\udcc3\udca9": f},  # the surrogate-escaped bytes of "é" are another name than "é"
    ]
    digests = [TreeDigest.of(t).hexdigest() for t in trees]
    assert len(set(digests)) == len(trees)
    assert digests == [reference(t) for t in trees]


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(list(Kind)),
    mode=st.integers(0, 0o7777),
    size=st.integers(0, 1 << 40),
    sha=st.one_of(st.none(), st.text(max_size=70), st.from_regex(r"[0-9a-f]{64}", fullmatch=True)),
    target=st.one_of(st.none(), st.text(max_size=20), st.just('a"\\\n\udcff\u00e9')),
)
def test_entry_encoding_is_the_canonical_json(
    kind: Kind, mode: int, size: int, sha: str | None, target: str | None
) -> None:
    entry = Entry(kind, mode, size, sha, target)
    want = json.dumps(entry.to_json(), sort_keys=True, separators=(",", ":")).encode("ascii")
    assert treedigest._entry_json(entry) == want


def test_bad_paths_are_refused() -> None:
    for bad in ["", "/a", "a/", "a//b", "a\0b"]:
        with pytest.raises(ValueError):
            TreeDigest.of({bad: file()})


# -- changes ----------------------------------------------------------------------------------


def test_removing_a_subtree() -> None:
    nodes = {"keep": file(), "src": dir_(), "src/a": file(), "src/d": dir_(), "src/d/e": file(), "src2": file()}
    digest = TreeDigest.of(nodes)
    digest.hexdigest()
    digest.update({"src": None})
    rest = {"keep": file(), "src2": file()}
    assert len(digest) == 2 and "src/d/e" not in digest and digest.get("src") is None
    assert digest.hexdigest() == TreeDigest.of(rest).hexdigest()
    digest.update({"gone/never/was": None})  # nothing there: no change
    assert digest.hexdigest() == TreeDigest.of(rest).hexdigest()


def test_implicit_directories_come_and_go() -> None:
    digest = TreeDigest.of({"a/b/c": file()})
    assert len(digest) == 1
    digest.update({"a/b/c": None})
    assert len(digest) == 0 and digest.hexdigest() == TreeDigest.of({}).hexdigest()
    digest.update({"a/b/c": file(), "a/x": file()})
    digest.update({"a/b": None})  # an implicit directory removed with what is below it
    assert digest.hexdigest() == TreeDigest.of({"a/x": file()}).hexdigest()
    digest.update({"a": dir_()})  # made explicit, then emptied: the directory stays
    digest.update({"a/x": None})
    assert digest.hexdigest() == TreeDigest.of({"a": dir_()}).hexdigest()


def test_a_directory_replaced_by_a_file_and_back() -> None:
    digest = TreeDigest.of({"a": dir_(), "a/b": file(), "a/c": dir_(), "a/c/d": file()})
    digest.update({"a": file(b"now a file")})  # a file has nothing below it
    assert len(digest) == 1
    assert digest.hexdigest() == TreeDigest.of({"a": file(b"now a file")}).hexdigest()
    digest.update({"a": dir_(), "a/b": link("x")})
    assert digest.hexdigest() == TreeDigest.of({"a": dir_(), "a/b": link("x")}).hexdigest()


def test_mode_change_changes_the_digest() -> None:
    digest = TreeDigest.of({"d": dir_(), "d/f": file()})
    before = digest.hexdigest()
    digest.update({"d/f": file(mode=0o600)})
    assert digest.hexdigest() != before
    digest.update({"d/f": file()})
    assert digest.hexdigest() == before


def test_copy_is_independent() -> None:
    digest = TreeDigest.of({"d": dir_(), "d/f": file()})
    kept = digest.copy()
    want = kept.hexdigest()
    digest.update({"d/g": file(), "d/f": None})
    assert kept.hexdigest() == want and len(kept) == 2
    kept.update({"e": file()})
    assert digest.hexdigest() == TreeDigest.of({"d": dir_(), "d/g": file()}).hexdigest()


# -- cost -------------------------------------------------------------------------------------


def _big() -> dict[str, Entry]:
    nodes: dict[str, Entry] = {}
    for i in range(10):
        nodes[f"d{i}"] = dir_()
        for j in range(10):
            nodes[f"d{i}/s{j}"] = dir_()
            for k in range(10):
                nodes[f"d{i}/s{j}/f{k}"] = file(f"{i}{j}{k}".encode())
    return nodes


def test_an_update_recomputes_only_the_directories_on_its_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = _big()
    digest = TreeDigest.of(nodes)
    digest.hexdigest()
    assert digest.recomputed == 1 + 10 + 100  # root, d*, d*/s*: once each

    encoded = 0
    real = treedigest._entry_json

    def counting(entry: Entry) -> bytes:
        nonlocal encoded
        encoded += 1
        return real(entry)

    monkeypatch.setattr(treedigest, "_entry_json", counting)

    def cost(changed: Mapping[str, Entry | None]) -> tuple[int, int]:
        nonlocal encoded
        r0, encoded = digest.recomputed, 0
        digest.update(changed)
        apply(nodes, changed)
        digest.hexdigest()
        return digest.recomputed - r0, encoded

    assert cost({}) == (0, 0)
    assert cost({"d3/s4/f5": file(b"new")}) == (3, 1)  # d3/s4, d3, root; one entry re-encoded
    assert cost({"d3/s4/f5": file(b"newer"), "d7/s1/f0": file(mode=0o600)}) == (5, 2)
    assert cost({"d3/s4/new": file()}) == (3, 1)
    assert cost({"d2/s2": None}) == (2, 0)  # d2, root: a removal encodes nothing
    assert cost({"d5": file()}) == (1, 1)  # 111 nodes dropped, only the root recomputed
    assert cost({"x/y/z": file()}) == (3, 1)  # implicit x/y and x created
    monkeypatch.undo()
    assert digest.hexdigest() == TreeDigest.of(nodes).hexdigest()
