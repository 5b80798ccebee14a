"""The daemon's persistent state: one SQLite database (WAL) in its state dir.

Every change of a job is written (and committed) when it happens, so a daemon
killed at any moment, SIGKILL included, restarts from what was true. Job ids
come from an AUTOINCREMENT key: an id is never given twice, even after the
rows are pruned.

When a write fails (the disk is full, an I/O error, the file locked for
longer than the timeout), the change is kept in memory (``pending``) and
written by ``retry_pending``, which the daemon calls every second: an exit
status is never lost to a full disk while the daemon runs. A new job can't
be admitted without its row (its id comes from it): ``insert_job`` raises a
StateError. The database file, its ``-wal`` and ``-shm`` are created
owner-only (0600), whatever the umask: they hold every job's command line
and directory. A row that can't be read (a corrupt table) is a StateError
naming the file, never a traceback.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from collections.abc import Iterable
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from vgpuctl.core.job import ENDED, RUNNING, STARTING, JobRecord
from vgpuctl.errors import StateError

__all__ = ["ENDED", "RUNNING", "STARTING", "JobRecord", "Store"]

SCHEMA_VERSION = 4

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT    NOT NULL,
    uid           INTEGER NOT NULL,
    user          TEXT    NOT NULL,
    command       TEXT    NOT NULL,     -- JSON list of strings
    cwd           TEXT    NOT NULL,
    gpus          TEXT    NOT NULL,     -- JSON list of {"index": int, "uuid": str}
    mem_limit     INTEGER NOT NULL,     -- bytes, per GPU
    core_share    INTEGER NOT NULL,     -- percent
    policy        TEXT    NOT NULL,     -- hard | soft
    state         TEXT    NOT NULL,     -- starting | running | suspended | ended
    created       REAL    NOT NULL,     -- Unix time
    started       REAL,
    ended         REAL,
    launcher_pid  INTEGER,              -- the `vgpuctl run` process
    launcher_start INTEGER,             -- its /proc starttime (clock ticks)
    root_pid      INTEGER,              -- the command's process
    root_start    INTEGER,
    pids          TEXT    NOT NULL DEFAULT '{}',  -- JSON {pid: starttime} seen
    exit_code     INTEGER,
    exit_signal   INTEGER,
    region        TEXT,                 -- the job's region directory
    slurm_job     TEXT,                 -- the Slurm job id (a job the Prolog registered)
    slurm_partition TEXT,
    slurm_account TEXT,
    slurm_shards  INTEGER,
    region_error  TEXT,                 -- why its usage region was found tampered with
    priority      TEXT    NOT NULL DEFAULT 'normal',  -- low | normal | high
    core_promised INTEGER NOT NULL DEFAULT 0,         -- its share counts in its GPU's compute
    suspended_s   REAL    NOT NULL DEFAULT 0, -- seconds suspended (ended suspensions)
    suspended_at  REAL,                 -- when the current suspension began
    suspend_reason TEXT,                -- asked | preempted | drained
    suspensions   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_ended ON jobs(ended);
"""

# Columns added since schema 1, added to an older database when it opens.
_ADDED = {"slurm_job": "TEXT", "slurm_partition": "TEXT", "slurm_account": "TEXT",
          "slurm_shards": "INTEGER", "region_error": "TEXT",
          # schema 3: priority classes; jobs from before were normal, and
          # had no promised share (they counted nowhere)
          "priority": "TEXT NOT NULL DEFAULT 'normal'",
          "core_promised": "INTEGER NOT NULL DEFAULT 0",
          # schema 4: suspend; jobs from before were never suspended
          "suspended_s": "REAL NOT NULL DEFAULT 0", "suspended_at": "REAL",
          "suspend_reason": "TEXT", "suspensions": "INTEGER NOT NULL DEFAULT 0"}


_COLUMNS = [f.name for f in fields(JobRecord)]
_KNOWN = set(_COLUMNS)
_JSON_COLUMNS = {"command", "gpus", "pids"}


def _to_row(rec: JobRecord) -> dict[str, Any]:
    row = asdict(rec)
    for k in _JSON_COLUMNS:
        v = row[k]
        if k == "pids":
            v = {str(p): s for p, s in v.items()}
        elif k == "gpus":
            v = [g.stored() for g in rec.gpus]
        row[k] = json.dumps(v, separators=(",", ":"))
    return row


def record_from_row(row: sqlite3.Row) -> JobRecord:
    """A JobRecord from a row of the jobs table (of this schema or an older
    one: a column it lacks takes the record's default). ValueError,
    TypeError or KeyError for a row that can't be one."""
    d = {k: row[k] for k in row.keys() if k in _KNOWN}
    for k in _JSON_COLUMNS:
        d[k] = json.loads(d[k]) if k in d else {"pids": {}, "gpus": [], "command": []}[k]
    d["pids"] = {int(p): int(s) for p, s in d["pids"].items()}
    d["id"] = str(d["id"])
    if "core_promised" in d:
        d["core_promised"] = bool(d["core_promised"])
    return JobRecord(**d)


def owner_only(db: Path) -> None:
    """Make the database and its -wal and -shm files 0600 (those that exist)."""
    for p in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        try:
            if stat.S_IMODE(os.lstat(p).st_mode) & 0o077:
                os.chmod(p, 0o600)
        except FileNotFoundError:
            pass


def _create_private(path: Path) -> None:
    """Create the database file empty and 0600 when it does not exist:
    SQLite gives -wal and -shm the mode of the database file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    os.close(fd)


class Store:
    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path
        # Changes not yet written: job id -> (its record, the columns).
        self.pending: dict[str, tuple[JobRecord, set[str]]] = {}
        self.write_error: str | None = None     # why the last write failed

    @classmethod
    def open(cls, path: Path | str) -> Store:
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _create_private(path)
            owner_only(path)
        except OSError as e:
            raise StateError(f"{path}: {e.strerror}") from None
        try:
            conn = sqlite3.connect(str(path), isolation_level=None, timeout=10.0)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StateError(f"{path}: written by a newer vgpuctl (schema {version}); "
                                "upgrade vgpuctl")
            conn.executescript(_SCHEMA)
            have = {r[1] for r in conn.execute("PRAGMA table_info(jobs)")}
            for col, typ in _ADDED.items():
                if col not in have:
                    conn.execute(f"ALTER TABLE jobs ADD COLUMN {col} {typ}")
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.Error as e:
            raise StateError(f"{path}: {e}") from None
        owner_only(path)
        return cls(conn, path)

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection (for the accounting tables that share the file)."""
        return self._conn

    def close(self) -> None:
        self._conn.close()

    # -- jobs ------------------------------------------------------------------
    def insert_job(self, rec: JobRecord) -> str:
        """Insert a new job; sets and returns its id. StateError when it
        can't be written (the job is then not admitted)."""
        row = _to_row(rec)
        del row["id"]
        cols = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        try:
            cur = self._conn.execute(f"INSERT INTO jobs ({cols}) VALUES ({marks})", row)
        except sqlite3.Error as e:
            self.write_error = str(e)
            raise StateError(f"can't record the job in {self.path}: {e}") from None
        rec.id = str(cur.lastrowid)
        return rec.id

    def update_job(self, rec: JobRecord, columns: Iterable[str] | None = None) -> None:
        """Write rec (all columns, or just those named). Never raises: a
        change that can't be written now is kept for ``retry_pending``."""
        cols = {c for c in (columns or _COLUMNS) if c != "id"}
        old = self.pending.pop(rec.id, None)
        if old is not None:
            cols |= old[1]
        try:
            self._write(rec, cols)
        except sqlite3.Error as e:
            self.write_error = str(e)
            self.pending[rec.id] = (rec, cols)

    def _write(self, rec: JobRecord, cols: Iterable[str]) -> None:
        row = _to_row(rec)
        names = sorted(cols)
        sets = ", ".join(f"{c} = :{c}" for c in names)
        self._conn.execute(f"UPDATE jobs SET {sets} WHERE id = :id",
                           {**{c: row[c] for c in names}, "id": int(rec.id)})

    def retry_pending(self) -> int:
        """Write the changes kept after failed writes; returns how many were
        written (the others stay, ``write_error`` says why)."""
        done = 0
        for job_id, (rec, cols) in list(self.pending.items()):
            try:
                self._write(rec, cols)
            except sqlite3.Error as e:
                self.write_error = str(e)
                return done
            del self.pending[job_id]
            done += 1
        self.write_error = None
        return done

    def _read(self, query: str, args: tuple[Any, ...]) -> list[JobRecord]:
        try:
            rows = self._conn.execute(query, args).fetchall()
            return [record_from_row(r) for r in rows]
        except sqlite3.Error as e:
            raise StateError(f"{self.path}: can't read the jobs table: {e}") from None
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise StateError(f"{self.path}: the jobs table is corrupt ({type(e).__name__}: "
                             f"{e}); move the file away to start with an empty one") from None

    def get_job(self, job_id: str) -> JobRecord | None:
        pending = self.pending.get(job_id)
        if pending is not None:
            return pending[0]
        rows = self._read("SELECT * FROM jobs WHERE id = ?", (int(job_id),))
        return rows[0] if rows else None

    def active_jobs(self) -> list[JobRecord]:
        return self._read("SELECT * FROM jobs WHERE state != ? ORDER BY id", (ENDED,))

    def ended_jobs(self, limit: int = 100) -> list[JobRecord]:
        """The most recently ended jobs, newest last."""
        rows = self._read(
            "SELECT * FROM jobs WHERE state = ? ORDER BY ended DESC, id DESC LIMIT ?",
            (ENDED, limit))
        # What is not written yet is newer than what is.
        mine = {r.id: r for r, _ in self.pending.values() if r.state == ENDED}
        rows = [mine.pop(r.id, r) for r in reversed(rows)] + list(mine.values())
        return rows[-limit:]

    def prune_ended(self, before: float, limit: int = 5000) -> int:
        """Delete up to ``limit`` jobs that ended before a Unix time; returns
        how many (fewer than ``limit``: none are left)."""
        try:
            cur = self._conn.execute(
                "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE state = ? AND "
                "ended < ? LIMIT ?)", (ENDED, before, limit))
        except sqlite3.Error as e:
            raise StateError(f"{self.path}: {e}") from None
        return int(cur.rowcount or 0)
