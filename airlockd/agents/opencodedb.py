"""The session ids in opencode's database (agents/opencode.py), read in a process of its own.

The database is the agent's writing, and SQLite runs what a database file says (its schema, its
views), so the read is kept from costing the daemon anything it could not afford: this process is
started for it alone, with a wall clock (the caller's timeout), CPU-time and address-space limits
of its own, and SQLite's own limits on lengths and a budget of steps. Before SQLite sees it, the
file is found one directory at a time without following a link, opened without blocking (a fifo
left in its place never hangs the read), must be a regular file not over DB_BYTES nor sparse (a
hole of a file costs the home nothing and the copy all of it), and is copied to a private folder
with its write-ahead log. `session` must be a table. It prints a JSON list of the ids found.
"""

from __future__ import annotations

import json
import os
import re
import resource
import sqlite3
import stat
import sys
import tempfile

DB_BYTES = 256 * 2**20
STEPS = 2_000_000  # SQLite virtual machine steps the read may take
ROWS = 10_000
CPU_S = 5
MEMORY = 1 << 30
_SESSION = re.compile(r"ses_[A-Za-z0-9]{8,64}")


def _open_file(home: str, parts: list[str]) -> int | None:
    """`home/parts...` opened for reading, each directory without following a link; None when
    absent or not a plain regular file of at most DB_BYTES that is not sparse."""
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        f = os.open(parts[-1], flags, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    st = os.fstat(f)
    if not stat.S_ISREG(st.st_mode) or st.st_size > DB_BYTES or st.st_size > st.st_blocks * 512 + (1 << 20):
        os.close(f)
        return None
    return f


def _copy(src: int, dst: str) -> None:
    with os.fdopen(src, "rb") as fh, open(dst, "wb") as out:
        left = DB_BYTES
        while left > 0 and (chunk := fh.read(min(left, 1 << 20))):
            out.write(chunk)
            left -= len(chunk)


def session_ids(home: str) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="airlockd-opencode-") as tmp:
        db = _open_file(home, ["opencode", "opencode.db"])
        if db is None:
            return []
        _copy(db, os.path.join(tmp, "opencode.db"))
        wal = _open_file(home, ["opencode", "opencode.db-wal"])
        if wal is not None:
            _copy(wal, os.path.join(tmp, "opencode.db-wal"))
        steps = 0

        def budget() -> int:
            nonlocal steps
            steps += 1000
            return 1 if steps > STEPS else 0

        con = sqlite3.connect(os.path.join(tmp, "opencode.db"), isolation_level=None)
        try:
            con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1 << 20)
            con.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 1 << 16)
            con.set_progress_handler(budget, 1000)
            con.execute("PRAGMA trusted_schema = OFF")
            con.execute("PRAGMA cell_size_check = ON")
            kind = con.execute("SELECT type FROM sqlite_master WHERE name = 'session'").fetchall()
            if kind != [("table",)]:
                return []
            cur = con.execute("SELECT id FROM session")
            ids: list[str] = []
            while len(ids) < ROWS and (rows := cur.fetchmany(500)):
                ids += [r[0] for r in rows if isinstance(r[0], str) and _SESSION.fullmatch(r[0])]
            return ids[:ROWS]
        except sqlite3.Error:
            return []
        finally:
            con.close()


def main() -> int:
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_S, CPU_S))
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
    resource.setrlimit(resource.RLIMIT_FSIZE, (DB_BYTES, DB_BYTES))
    print(json.dumps(session_ids(sys.argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
