"""The usage table: what vgpuctl.core.accounting integrates, in SQLite.

Each row is one interval [t0, t1) of one job on one GPU with its
GPU-seconds, GiB-hours and peak bytes. The daemon writes through ``flush``
and ``maybe_flush``; reports read through ``read_usage``; ``prune`` keeps
the table to ``retention_days``. A table that is not what SCHEMA makes (a
corrupt or foreign one) is a StateError at ``create_schema``; the daemon
then keeps it aside under another name (``set_aside``) and accounts afresh
in a new one, rather than not at all. A write that fails (a full disk) is a
StateError too: the accountant keeps the rows and the next flush writes
them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence

from vgpuctl.core.accounting import Accountant, RowWrite, UsageRow
from vgpuctl.errors import StateError

COLUMNS = ("id", "job_id", "gpu_uuid", "t0", "t1", "gpu_seconds", "mem_gib_hours",
           "peak_mem_bytes")

SCHEMA = """
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY,
    job_id TEXT NOT NULL,
    gpu_uuid TEXT NOT NULL,
    t0 REAL NOT NULL,
    t1 REAL NOT NULL,
    gpu_seconds REAL NOT NULL DEFAULT 0,
    mem_gib_hours REAL NOT NULL DEFAULT 0,
    peak_mem_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS usage_job ON usage (job_id);
CREATE INDEX IF NOT EXISTS usage_t1 ON usage (t1);
"""


def create_schema(conn: sqlite3.Connection) -> None:
    """Create the usage table and its indexes if they are missing
    (idempotent); StateError when the table there is not one of ours."""
    try:
        conn.executescript(SCHEMA)
        have = tuple(r[1] for r in conn.execute("PRAGMA table_info(usage)"))
        conn.execute("SELECT COUNT(*) FROM usage").fetchone()
    except sqlite3.Error as e:
        raise StateError(f"the usage table is unusable: {e}") from None
    if have != COLUMNS:
        raise StateError(f"the usage table is not vgpuctl's: columns {', '.join(have)}")


def set_aside(conn: sqlite3.Connection, now: float) -> str:
    """Rename an unusable usage table (and drop its indexes) so that
    create_schema can make a new one; the name it is kept under.
    StateError when even that fails (the database file itself is damaged)."""
    name = f"usage_unreadable_{int(now)}"
    try:
        with conn:
            conn.execute("DROP INDEX IF EXISTS usage_job")
            conn.execute("DROP INDEX IF EXISTS usage_t1")
            conn.execute(f'ALTER TABLE usage RENAME TO "{name}"')
    except sqlite3.Error as e:
        raise StateError(f"the usage table can't be set aside: {e}") from None
    return name


def write_rows(conn: sqlite3.Connection, rows: Sequence[RowWrite]) -> list[int]:
    """Insert or update rows in one transaction; each one's row id, in order."""
    ids: list[int] = []
    with conn:
        if conn.isolation_level is None and not conn.in_transaction:
            conn.execute("BEGIN")  # autocommit connection: one transaction
        for w in rows:
            r = w.row
            if w.row_id is None:
                cur = conn.execute(
                    "INSERT INTO usage (job_id, gpu_uuid, t0, t1, gpu_seconds, mem_gib_hours,"
                    " peak_mem_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (r.job_id, r.gpu_uuid, r.t0, r.t1, r.gpu_seconds, r.mem_gib_hours,
                     r.peak_mem_bytes))
                ids.append(int(cur.lastrowid or 0))
            else:
                conn.execute(
                    "UPDATE usage SET t1 = ?, gpu_seconds = ?, mem_gib_hours = ?,"
                    " peak_mem_bytes = ? WHERE id = ?",
                    (r.t1, r.gpu_seconds, r.mem_gib_hours, r.peak_mem_bytes, w.row_id))
                ids.append(w.row_id)
    return ids


def _writer(conn: sqlite3.Connection) -> Callable[[Sequence[RowWrite]], list[int]]:
    def write(rows: Sequence[RowWrite]) -> list[int]:
        try:
            return write_rows(conn, rows)
        except sqlite3.Error as e:
            raise StateError(f"can't write accounting: {e}") from None
    return write


def flush(conn: sqlite3.Connection, acct: Accountant) -> int:
    """Write what ``acct`` has integrated since its last flush; StateError
    when it can't (the rows stay in ``acct`` for the next flush)."""
    return acct.flush(_writer(conn))


def maybe_flush(conn: sqlite3.Connection, acct: Accountant, now: float) -> bool:
    """``flush`` when the accountant's flush interval has passed."""
    return acct.maybe_flush(_writer(conn), now)


def recorded_gpu_seconds(conn: sqlite3.Connection,
                         job_ids: Iterable[str]) -> dict[tuple[str, str], float]:
    """GPU-seconds recorded so far per (job, GPU) for these jobs."""
    ids = [str(j) for j in job_ids]
    out: dict[tuple[str, str], float] = {}
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        marks = ", ".join("?" * len(chunk))
        try:
            rows = conn.execute(
                f"SELECT job_id, gpu_uuid, SUM(gpu_seconds) FROM usage"
                f" WHERE job_id IN ({marks}) GROUP BY job_id, gpu_uuid", chunk).fetchall()
        except sqlite3.Error as e:
            raise StateError(f"the usage table is unreadable: {e}") from None
        for jid, gpu, total in rows:
            out[(str(jid), str(gpu))] = float(total or 0.0)
    return out


def prune(conn: sqlite3.Connection, before: float, keep: Iterable[str] = (),
          limit: int = 5000) -> int:
    """Delete up to ``limit`` usage rows that ended before ``before`` (epoch
    seconds), except those of the jobs in ``keep`` (still running); returns
    how many (fewer than ``limit``: none are left)."""
    kept = [str(j) for j in keep]
    q = "SELECT id FROM usage WHERE t1 < ?"
    if kept:
        q += f" AND job_id NOT IN ({', '.join('?' * len(kept))})"
    with conn:
        cur = conn.execute(f"DELETE FROM usage WHERE id IN ({q} LIMIT ?)",
                           [before, *kept, limit])
    return int(cur.rowcount or 0)


def read_usage(conn: sqlite3.Connection, since: float | None = None,
               until: float | None = None, bad: list[int] | None = None) -> list[UsageRow]:
    """Usage rows that overlap [since, until) (all when both are None).
    Returns [] when the table does not exist yet. A row that can't be one
    (a damaged database) is left out, and counted in ``bad[0]`` when given
    (a list of one number):
    one bad row does not cost a report every other."""
    q = ("SELECT job_id, gpu_uuid, t0, t1, gpu_seconds, mem_gib_hours, peak_mem_bytes"
         " FROM usage WHERE 1 = 1")
    args: list[float] = []
    if since is not None:
        q += " AND t1 >= ?"
        args.append(since)
    if until is not None:
        q += " AND t0 < ?"
        args.append(until)
    q += " ORDER BY t0, id"
    try:
        rows = conn.execute(q, args).fetchall()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []
        raise
    out = []
    for r in rows:
        try:
            out.append(UsageRow(str(r[0]), str(r[1]), float(r[2]), float(r[3]), float(r[4]),
                                float(r[5]), int(r[6])))
        except (TypeError, ValueError, OverflowError):
            if bad is not None:
                bad[0] += 1
    return out
