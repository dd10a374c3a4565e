"""The object store of the fresh repository (staging/gitcopy.py): object ids, stored zlib streams
and packfiles.

Every object is written into a packfile (a file and its index), never one file per object: on a
loaded disk a file's creation costs a third of a millisecond, a 20,000-file tree has 25,000
objects, and even a refresh's 30 (10 edited files and the trees above them) cost more as loose
files than the rest of the refresh. A cold build writes one pack; each refresh that changes
something, one small pack. Objects are stored, never deltified nor compressed (zlib *stored*
blocks: writing one costs a copy). The store knows what it holds (`have`); `remove` marks an
object dead; `purge` rewrites the packs without their dead objects (a copy of the live objects'
bytes as they are, nothing decompressed) and joins the small packs into one. A file is never
written in place: new files are new names, renamed into place, so a hard-link clone of the
repository never changes under a run that mounts it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import mmap
import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from airlockd.pipeline.manifest import Entry, Kind
from airlockd.staging.fdtree import read_all, write_all

_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_O_RW_NEW = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TYPES = {b"commit": 1, b"tree": 2, b"blob": 3}
_IDX_MAGIC = b"\xfftOc"
_BIG = 1 << 31  # offsets from here on go to the idx's 8-byte table
_WRITEV = 512  # buffers per writev
_IN_MEMORY = 4 << 20  # a pack up to this size is written once, from memory
PACK_BYTES = 32 << 20  # a cold build's packs are cut at this size: a purge rewrites only those
# holding dead objects, so it costs what changed (a few packs), never the whole tree
SMALL = 4 << 20  # packs below this (a refresh's) are joined by purges (`to_join`)


def object_id(kind: bytes, data: bytes) -> bytes:
    """The git (SHA-1) id of an object, 20 bytes."""
    h = hashlib.sha1(b"%s %d\0" % (kind, len(data)))
    h.update(data)
    return h.digest()


def blob_id(data: bytes) -> str:
    """The git blob id (hex) of `data`, as `git hash-object` gives it."""
    return object_id(b"blob", data).hex()


def stored_zlib(header: bytes, data: bytes) -> list[bytes | memoryview]:
    """`header + data` as a zlib stream of stored (uncompressed) deflate blocks, in pieces."""
    out: list[bytes | memoryview] = [b"\x78\x01"]
    if header:
        out += [struct.pack("<BHH", 0, len(header), len(header) ^ 0xFFFF), header]
    view = memoryview(data)
    n = len(data)
    if n == 0:
        out.append(b"\x01\x00\x00\xff\xff")
    for i in range(0, n, 0xFFFF):
        chunk = view[i : i + 0xFFFF]
        out.append(struct.pack("<BHH", 1 if i + 0xFFFF >= n else 0, len(chunk), len(chunk) ^ 0xFFFF))
        out.append(chunk)
    out.append(struct.pack(">I", zlib.adler32(data, zlib.adler32(header))))
    return out


def _pack_header(kind: bytes, size: int) -> bytes:
    """A packed object's type and size (git's variable-length header)."""
    byte = (_TYPES[kind] << 4) | (size & 0x0F)
    size >>= 4
    out = bytearray()
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


@dataclass
class Pack:
    """One packfile of the store: its name (`pack-<hex>`) and where each object lies in it (never
    changed once the pack is written)."""

    name: str
    objects: dict[bytes, tuple[int, int, int]] = field(default_factory=dict)  # oid -> offset, length, crc32
    end: int = 0  # where its objects end (its size but the trailer), when the writer or reader knew it

    @functools.cached_property
    def size(self) -> int:
        return self.end or max((off + length for off, length, _ in self.objects.values()), default=12)


def small_packs(packs: Iterable[Pack]) -> list[Pack]:
    """The packs below SMALL (a refresh's, or a join of them), smallest first."""
    return sorted((p for p in packs if p.size < SMALL), key=lambda p: (p.size, p.name))


def to_join(packs: Iterable[Pack]) -> list[Pack]:
    """The small packs a join rewrites into one: the two smallest, then each next one while it is
    less than twice what is joined so far. So the packs left form a geometric progression and
    an object is rewritten a logarithmic number of times, never at every join: one pack much
    bigger than the refreshes' (a cold build's trees) waits until they add up to half of it."""
    chosen: list[Pack] = []
    total = 0
    for p in small_packs(packs):
        if len(chosen) >= 2 and p.size >= 2 * total:
            break
        chosen.append(p)
        total += p.size
    return chosen


class PackWriter:
    """A new packfile, objects appended as they come; `finish` gives it its checksum and index
    and renames both into `pack/` (the index last: git sees a pack only by its index). A small
    pack (a refresh's) is kept in memory and written once; a big one (a cold build's) is
    streamed to its file, and its checksum read back."""

    def __init__(self, pack_dir: Path, owner: tuple[int, int] | None) -> None:
        self.dir = pack_dir
        self.owner = owner
        self.tmp = pack_dir / "tmp_pack_airlockd"
        self.fd = -1  # the file, once the pack outgrows memory
        self.offset = 12
        self.objects: dict[bytes, tuple[int, int, int]] = {}
        self._queue: list[bytes | memoryview] = []
        self._queued = 0

    def add(self, oid: bytes, kind: bytes, data: bytes) -> None:
        pieces = [_pack_header(kind, len(data)), *stored_zlib(b"", data)]
        crc = 0
        length = 0
        for p in pieces:
            crc = zlib.crc32(p, crc)
            length += len(p)
        self._put(oid, pieces, length, crc)

    def add_raw(self, oid: bytes, raw: bytes, crc: int) -> None:
        """An object as another pack holds it (header and zlib stream, with its crc32)."""
        self._put(oid, [raw], len(raw), crc)

    def _put(self, oid: bytes, pieces: list[bytes | memoryview], length: int, crc: int) -> None:
        self.objects[oid] = (self.offset, length, crc)
        self.offset += length
        self._queue.extend(pieces)
        self._queued += length
        if len(self._queue) >= _WRITEV or self._queued >= _IN_MEMORY:
            if self.fd < 0:
                self.fd = self._create(self.tmp)
                os.write(self.fd, b"PACK" + struct.pack(">II", 2, 0))  # the count is set by `finish`
            self._flush()

    def _flush(self) -> None:
        queue, self._queue, self._queued = self._queue, [], 0
        _writev_all(self.fd, queue)

    @staticmethod
    def _create(path: Path) -> int:
        try:
            return os.open(path, _O_RW_NEW, 0o444)
        except FileExistsError:  # left by a process that died writing
            path.unlink(missing_ok=True)
            return os.open(path, _O_RW_NEW, 0o444)

    def abandon(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.tmp.unlink(missing_ok=True)
        self.fd = -1

    def finish(self, digests: dict[str, Entry] | None) -> Pack:
        """The pack's checksum and index written, both renamed into place; with `digests`, the
        two files' entries added to it (paths under `objects/`)."""
        sha = hashlib.sha1()
        whole = hashlib.sha256() if digests is not None else None
        if self.fd < 0:  # all in memory: the count is known, one write
            header = b"PACK" + struct.pack(">II", 2, len(self.objects))
            for piece in [header, *self._queue]:
                sha.update(piece)
                if whole is not None:
                    whole.update(piece)
            trailer = sha.digest()
            self.fd = self._create(self.tmp)
            try:
                _writev_all(self.fd, [header, *self._queue, trailer])
                if self.owner is not None:
                    os.fchown(self.fd, *self.owner)
            finally:
                os.close(self.fd)
            self._queue = []
        else:
            try:
                self._flush()
                os.pwrite(self.fd, struct.pack(">I", len(self.objects)), 8)
                with mmap.mmap(self.fd, self.offset, access=mmap.ACCESS_READ) as mm:
                    sha.update(mm)
                    if whole is not None:
                        whole.update(mm)
                trailer = sha.digest()
                os.pwrite(self.fd, trailer, self.offset)
                if self.owner is not None:
                    os.fchown(self.fd, *self.owner)
            finally:
                os.close(self.fd)
        name = f"pack-{trailer.hex()}"
        idx = _idx(self.objects, trailer)
        os.replace(self.tmp, self.dir / f"{name}.pack")
        tmp_idx = self.dir / "tmp_idx_airlockd"
        fd = self._create(tmp_idx)
        try:
            write_all(fd, idx)
            if self.owner is not None:
                os.fchown(fd, *self.owner)
        finally:
            os.close(fd)
        os.replace(tmp_idx, self.dir / f"{name}.idx")
        if digests is not None and whole is not None:
            whole.update(trailer)
            digests[f"objects/pack/{name}.pack"] = Entry(Kind.FILE, 0o444, self.offset + 20, whole.hexdigest())
            digests[f"objects/pack/{name}.idx"] = Entry(Kind.FILE, 0o444, len(idx), hashlib.sha256(idx).hexdigest())
        return Pack(name, self.objects, self.offset)


def _writev_all(fd: int, pieces: list[bytes | memoryview]) -> None:
    queue = list(pieces)
    at = 0
    while at < len(queue):
        done = os.writev(fd, queue[at : at + _WRITEV])
        while at < len(queue) and done >= len(queue[at]):
            done -= len(queue[at])
            at += 1
        if done:
            queue[at] = memoryview(queue[at])[done:]


def _idx(objects: dict[bytes, tuple[int, int, int]], pack_sha: bytes) -> bytes:
    """A version 2 pack index of `objects`."""
    oids = sorted(objects)
    counts = [0] * 256
    for oid in oids:
        counts[oid[0]] += 1
    fanout = []
    total = 0
    for c in counts:
        total += c
        fanout.append(total)
    big: list[int] = []
    offsets = []
    for oid in oids:
        off = objects[oid][0]
        if off >= _BIG:
            offsets.append(_BIG | len(big))
            big.append(off)
        else:
            offsets.append(off)
    n = len(oids)
    body = b"".join(
        [
            _IDX_MAGIC,
            struct.pack(">I", 2),
            struct.pack(">256I", *fanout),
            *oids,
            struct.pack(f">{n}I", *(objects[o][2] for o in oids)),
            struct.pack(f">{n}I", *offsets),
            struct.pack(f">{len(big)}Q", *big),
            pack_sha,
        ]
    )
    return body + hashlib.sha1(body).digest()


def read_pack(pack_dir: Path, name: str) -> Pack | None:
    """A pack of this store as its index describes it; None when it is not one this store can
    read (it is then ignored, and its objects written again)."""
    try:
        idx = (pack_dir / f"{name}.idx").read_bytes()
        size = os.lstat(pack_dir / f"{name}.pack").st_size
    except OSError:
        return None
    if len(idx) < 8 + 1024 + 40 or idx[:4] != _IDX_MAGIC or idx[4:8] != b"\0\0\0\x02":
        return None
    n = struct.unpack(">I", idx[8 + 255 * 4 : 8 + 256 * 4])[0]
    names_at = 8 + 1024
    crc_at = names_at + 20 * n
    off_at = crc_at + 4 * n
    big_at = off_at + 4 * n
    if len(idx) < big_at + 40:
        return None
    oids = [idx[names_at + 20 * i : names_at + 20 * i + 20] for i in range(n)]
    crcs = struct.unpack(f">{n}I", idx[crc_at:off_at])
    offs = []
    for raw in struct.unpack(f">{n}I", idx[off_at:big_at]):
        if raw & _BIG:
            at = big_at + 8 * (raw & ~_BIG)
            offs.append(struct.unpack(">Q", idx[at : at + 8])[0])
        else:
            offs.append(raw)
    ends = [*sorted(offs), size - 20]
    after = {off: ends[i + 1] for i, off in enumerate(sorted(offs))}
    objects = {oid: (off, after[off] - off, crc) for oid, off, crc in zip(oids, offs, crcs, strict=True)}
    return Pack(name, objects, size - 20 if objects else 12)


class ObjectStore:
    """The objects of one repository, each written once into a pack (`put` between
    `begin_pack` and `end_pack`, or a pack begun by the first `put`); loose objects are only
    read (another version's store) and removed. An object no longer reachable is marked dead;
    `purge` removes the dead."""

    def __init__(self, dotgit: Path, owner: tuple[int, int] | None, digests: dict[str, Entry] | None) -> None:
        self.dir = dotgit / "objects"
        self.owner = owner
        self.digests = digests  # with a manifest to fill: each written file's entry (copy stager)
        self.have: set[bytes] | None = None  # every object on disk, loose or packed (None: not listed)
        self.loose: set[bytes] = set()
        self.packs: dict[str, Pack] = {}
        self.dead: set[bytes] = set()  # objects no longer reachable (gone at `purge`)
        self.writer: PackWriter | None = None

    def adopt(self, have: set[bytes], loose: set[bytes], packs: dict[str, Pack], dead: set[bytes]) -> None:
        """Take what this process knew of the store (it wrote it last)."""
        self.have, self.loose, self.packs, self.dead = have, loose, packs, dead

    def listing(self) -> set[bytes]:
        if self.have is None:
            loose: set[bytes] = set()
            try:
                with os.scandir(self.dir) as it:
                    fans = [de.name for de in it if len(de.name) == 2 and de.is_dir(follow_symlinks=False)]
            except FileNotFoundError:
                fans = []
            for fan in fans:
                with os.scandir(self.dir / fan) as it:
                    for de in it:
                        if len(de.name) == 38:
                            try:
                                loose.add(bytes.fromhex(fan + de.name))
                            except ValueError:
                                continue
            self.packs = {}
            have = set(loose)
            for name in self._pack_names():
                pack = read_pack(self.dir / "pack", name)
                if pack is None:
                    self._unlink_pack(name)
                    continue
                self.packs[name] = pack
                have.update(pack.objects)
            self.have, self.loose = have, loose
        return self.have

    def _pack_names(self) -> list[str]:
        try:
            with os.scandir(self.dir / "pack") as it:
                return sorted(de.name[:-4] for de in it if de.name.startswith("pack-") and de.name.endswith(".idx"))
        except (FileNotFoundError, NotADirectoryError):
            return []

    # -- writing --------------------------------------------------------------------------------

    def begin_pack(self) -> None:
        """Objects put from here to `end_pack` go into one new packfile."""
        self.listing()
        if self.writer is None:
            self._mkdir(self.dir / "pack")
            self.writer = PackWriter(self.dir / "pack", self.owner)

    def end_pack(self) -> None:
        writer, self.writer = self.writer, None
        if writer is None:
            return
        if not writer.objects:
            writer.abandon()
            return
        pack = writer.finish(self.digests)
        self.packs[pack.name] = pack

    def abandon(self) -> None:
        """The pack being written dropped (its objects were never on disk)."""
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.abandon()
            if self.have is not None:
                self.have.difference_update(writer.objects)

    def put(self, kind: bytes, data: bytes, oid: bytes | None = None) -> bytes:
        oid = oid or object_id(kind, data)
        have = self.listing()
        if oid in have:
            self.dead.discard(oid)  # reachable again
            return oid
        if self.writer is not None and self.writer.offset >= PACK_BYTES:
            self.end_pack()
        self.begin_pack()
        assert self.writer is not None
        self.writer.add(oid, kind, data)
        have.add(oid)
        return oid

    # -- removing -------------------------------------------------------------------------------

    def remove(self, oids: Iterable[bytes]) -> None:
        """Objects no longer reachable: marked dead, removed at the next `purge`."""
        have = self.listing()
        self.dead.update(oid for oid in oids if oid in have)

    def keep_only(self, reachable: set[bytes]) -> None:
        """Every object not in `reachable` marked dead."""
        self.remove(self.listing() - reachable)

    def purge(self, *, small_only: bool = False) -> int:
        """Remove the dead: loose ones unlinked, the packs holding any rewritten without them,
        the small packs joined into one. With `small_only`, only the small packs are joined
        (dead objects elsewhere stay). How many objects went."""
        have = self.listing()
        gone = 0
        if not small_only:
            for oid in self.dead & self.loose:
                hx = oid.hex()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.dir / hx[:2] / hx[2:])
                self.loose.discard(oid)
                if not any(oid in p.objects for p in self.packs.values()):
                    have.discard(oid)
                    gone += 1
        joined = to_join(self.packs.values())
        groups = [joined] if len(joined) > 1 or (joined and self.dead.intersection(joined[0].objects)) else []
        if not small_only:  # each other pack holding dead objects on its own: a purge costs those packs
            chosen = {p.name for p in joined}
            groups += [[p] for p in self.packs.values() if p.name not in chosen and self.dead.intersection(p.objects)]
        for group in groups:
            gone += self._rewrite(group, have)
        self.dead &= have
        if not small_only:
            self.dead -= self.loose
        return gone

    def _rewrite(self, old: list[Pack], have: set[bytes]) -> int:
        """`old` packs replaced by one pack of their live objects; how many objects went."""
        writer = PackWriter(self.dir / "pack", self.owner)
        kept: set[bytes] = set()
        try:
            for pack in old:
                fd = os.open(self.dir / "pack" / f"{pack.name}.pack", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    whole = read_all(fd, pack.size) if pack.size < SMALL else None  # one read, not one per object
                    for oid, (off, length, crc) in sorted(pack.objects.items(), key=lambda kv: kv[1][0]):
                        if oid in self.dead or oid in kept:
                            continue
                        raw = whole[off : off + length] if whole is not None else os.pread(fd, length, off)
                        if len(raw) != length:
                            raise OSError(f"the pack {pack.name} is shorter than its index says")
                        writer.add_raw(oid, raw, crc)
                        kept.add(oid)
                finally:
                    os.close(fd)
        except BaseException:
            writer.abandon()
            raise
        new = writer.finish(self.digests) if writer.objects else None
        if new is None:
            writer.abandon()
        gone = 0
        for name in {p.name for p in old}:
            del self.packs[name]
            if new is None or name != new.name:  # the same objects in the same order: the same pack
                self._unlink_pack(name)
        for pack in old:
            for oid in pack.objects:
                if oid in kept or oid in self.loose or oid not in have:
                    continue
                if any(oid in p.objects for p in self.packs.values()):
                    continue
                have.discard(oid)
                self.dead.discard(oid)
                gone += 1
        if new is not None:
            self.packs[new.name] = new
        return gone

    def _unlink_pack(self, name: str) -> None:
        for ext in (".idx", ".pack", ".rev", ".bitmap", ".keep", ".promisor"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.dir / "pack" / f"{name}{ext}")
            if self.digests is not None:
                self.digests.pop(f"objects/pack/{name}{ext}", None)

    def _mkdir(self, path: Path) -> None:
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            return
        if self.owner is not None:
            os.chown(path, *self.owner, follow_symlinks=False)
