"""The daemon's persistent state: one SQLite database (WAL) in its state dir.

Every change of a job is written (and committed) when it happens, so a daemon
killed at any moment, SIGKILL included, restarts from what was true. Job ids
come from an AUTOINCREMENT key: an id is never given twice, even after the
rows are pruned.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from vgpuctl.errors import StateError

SCHEMA_VERSION = 2

STARTING = "starting"   # admitted, the command not yet started
RUNNING = "running"     # the command runs (root pid known)
ENDED = "ended"         # every process of the job is gone

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
    state         TEXT    NOT NULL,     -- starting | running | ended
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
    slurm_shards  INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_ended ON jobs(ended);
"""

# Columns added since schema 1, added to an older database when it opens.
_ADDED = {"slurm_job": "TEXT", "slurm_partition": "TEXT", "slurm_account": "TEXT",
          "slurm_shards": "INTEGER"}


@dataclass
class JobRecord:
    """A job as persisted. id is "" until inserted."""
    name: str
    uid: int
    user: str
    command: list[str]
    cwd: str
    gpus: list[dict[str, Any]]
    mem_limit: int
    core_share: int
    policy: str
    created: float
    state: str = STARTING
    id: str = ""
    started: float | None = None
    ended: float | None = None
    launcher_pid: int | None = None
    launcher_start: int | None = None
    root_pid: int | None = None
    root_start: int | None = None
    pids: dict[int, int] = field(default_factory=dict)
    exit_code: int | None = None
    exit_signal: int | None = None
    region: str | None = None
    slurm_job: str | None = None
    slurm_partition: str | None = None
    slurm_account: str | None = None
    slurm_shards: int | None = None

    @property
    def active(self) -> bool:
        return self.state != ENDED


_COLUMNS = [f.name for f in fields(JobRecord)]
_JSON_COLUMNS = {"command", "gpus", "pids"}


def _to_row(rec: JobRecord) -> dict[str, Any]:
    row = asdict(rec)
    for k in _JSON_COLUMNS:
        v = row[k]
        if k == "pids":
            v = {str(p): s for p, s in v.items()}
        row[k] = json.dumps(v, separators=(",", ":"))
    return row


def _from_row(row: sqlite3.Row) -> JobRecord:
    d = {k: row[k] for k in row.keys()}
    for k in _JSON_COLUMNS:
        d[k] = json.loads(d[k])
    d["pids"] = {int(p): int(s) for p, s in d["pids"].items()}
    d["id"] = str(d["id"])
    return JobRecord(**d)


class Store:
    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    @classmethod
    def open(cls, path: Path | str) -> Store:
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
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
        try:
            os.chmod(path, 0o600)
        except OSError:
            pass
        return cls(conn, path)

    @property
    def conn(self) -> sqlite3.Connection:
        """The connection (for the accounting tables that share the file)."""
        return self._conn

    def close(self) -> None:
        self._conn.close()

    # -- jobs ------------------------------------------------------------------
    def insert_job(self, rec: JobRecord) -> str:
        """Insert a new job; sets and returns its id."""
        row = _to_row(rec)
        del row["id"]
        cols = ", ".join(row)
        marks = ", ".join(f":{k}" for k in row)
        cur = self._conn.execute(f"INSERT INTO jobs ({cols}) VALUES ({marks})", row)
        rec.id = str(cur.lastrowid)
        return rec.id

    def update_job(self, rec: JobRecord, columns: Iterable[str] | None = None) -> None:
        """Write rec (all columns, or just those named)."""
        row = _to_row(rec)
        cols = [c for c in (columns or _COLUMNS) if c != "id"]
        sets = ", ".join(f"{c} = :{c}" for c in cols)
        self._conn.execute(f"UPDATE jobs SET {sets} WHERE id = :id",
                           {**{c: row[c] for c in cols}, "id": int(rec.id)})

    def get_job(self, job_id: str) -> JobRecord | None:
        row = self._conn.execute("SELECT * FROM jobs WHERE id = ?", (int(job_id),)).fetchone()
        return _from_row(row) if row else None

    def active_jobs(self) -> list[JobRecord]:
        rows = self._conn.execute("SELECT * FROM jobs WHERE state != ? ORDER BY id", (ENDED,))
        return [_from_row(r) for r in rows]

    def ended_jobs(self, limit: int = 100) -> list[JobRecord]:
        """The most recently ended jobs, newest last."""
        rows = self._conn.execute(
            "SELECT * FROM jobs WHERE state = ? ORDER BY ended DESC, id DESC LIMIT ?",
            (ENDED, limit)).fetchall()
        return [_from_row(r) for r in reversed(rows)]

    def prune_ended(self, before: float, limit: int = 5000) -> int:
        """Delete up to ``limit`` jobs that ended before a Unix time; returns
        how many (fewer than ``limit``: none are left)."""
        cur = self._conn.execute(
            "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE state = ? AND ended < ?"
            " LIMIT ?)", (ENDED, before, limit))
        return int(cur.rowcount or 0)
