"""The read-only view of the daemon's database that reports use: the jobs
and the usage rows of a time window, read while the daemon runs or not."""

from __future__ import annotations

import os
import sqlite3
from datetime import tzinfo
from pathlib import Path

from vgpuctl.core.accounting import UsageRow
from vgpuctl.core.job import JobRecord
from vgpuctl.core.usage_report import UsageReport, aggregate
from vgpuctl.errors import PermissionDenied, StateError, UsageError
from vgpuctl.store.database import record_from_row
from vgpuctl.store.usage import read_usage

# The jobs a window's report can name: those alive in [since, until), and
# those with usage rows there (their start or end may be unknown).
_JOBS_ALIVE = ("SELECT * FROM jobs WHERE (COALESCE(started, created) < :until"
               " AND (ended IS NULL OR ended >= :since))")
_OR_WITH_USAGE = (" OR id IN (SELECT CAST(job_id AS INTEGER) FROM usage"
                  " WHERE t1 >= :since AND t0 < :until)")


def read_jobs(conn: sqlite3.Connection, since: float, until: float) -> list[JobRecord]:
    """The jobs of the window [since, until) ([] when there is no table yet)."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "jobs" not in tables:
        return []
    q = _JOBS_ALIVE + (_OR_WITH_USAGE if "usage" in tables else "")
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(q, {"since": since, "until": until}).fetchall()
    finally:
        conn.row_factory = None
    return [record_from_row(r) for r in rows]


def open_readonly(db: Path) -> sqlite3.Connection:
    """Open the daemon's database for reading only; StateError with one line
    when it is missing or unreadable. Works while the daemon is down."""
    try:
        os.stat(db)
    except FileNotFoundError:
        raise StateError(f"{db}: no accounting database (has a daemon run here? "
                          "choose another with --state-dir or VGPU_STATE_DIR)") from None
    except PermissionError:
        raise PermissionDenied(f"{db}: not readable by you (run as root or as the "
                               "daemon's user)") from None
    except OSError as e:
        raise StateError(f"{db}: {e.strerror}") from None
    if not os.access(db, os.R_OK):
        raise PermissionDenied(f"{db}: not readable by you (run as root or as the "
                               "daemon's user)")
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        raise StateError(f"{db}: can't read the accounting database: {e}") from None
    return conn



def _absent(db: Path) -> bool:
    """Whether db surely does not exist (it, or a directory above it, is
    missing); not where it can't be looked for."""
    try:
        os.lstat(db)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def load(db: Path, since: float, until: float, missing_ok: bool = False,
         bad: list[int] | None = None) -> tuple[list[JobRecord], list[UsageRow]]:
    """The jobs and the usage rows of [since, until) from the daemon's
    database. With ``missing_ok``, a database that does not exist (no daemon
    has run yet) reads as empty. Usage rows that can't be read are left out,
    counted in ``bad[0]`` (vgpuctl.store.usage.read_usage)."""
    if missing_ok and _absent(db):
        return [], []
    conn = open_readonly(db)
    try:
        try:
            jobs = read_jobs(conn, since, until)
            usage = read_usage(conn, since, until, bad)
        except sqlite3.Error as e:
            raise StateError(f"{db}: can't read the accounting database: {e}") from None
        except (ValueError, TypeError, KeyError) as e:
            raise StateError(f"{db}: the accounting database holds a corrupt row "
                             f"({type(e).__name__}: {e})") from None
    finally:
        conn.close()
    return jobs, usage


def build(db: Path, by: str, since: float, until: float,
          tz: tzinfo | None = None, missing_ok: bool = False,
          bad: list[int] | None = None) -> UsageReport:
    """The report of [since, until) grouped ``by`` from the database at ``db``."""
    if until <= since:
        raise UsageError("--until must be later than --since")
    jobs, usage = load(db, since, until, missing_ok, bad)
    return aggregate(jobs, usage, by, since, until, tz)
