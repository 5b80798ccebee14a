"""Usage reports: what each job, user, GPU or day used over a time window.

Pure arithmetic over ``JobInfo`` and ``UsageRow`` values (``aggregate``),
renderers to CSV, JSON and plain text (strings), a rich table for terminals,
and the read-only loader that reads the daemon's SQLite file (``load``).

Window: [since, until). A usage row that straddles an edge counts for the
part inside the window (its sums are taken as spread evenly over the row,
which is at most a few minutes long); peak memory can't be split, so a row
that touches the window counts with its whole peak. ``--by day`` splits rows
at local midnight the same way.

CSV headers carry units in brackets as ``nvidia-smi --format=csv`` does, and
never change meaning: new columns are only ever appended.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import sqlite3
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Any, Callable

from vgpuctl.core.accounting import UsageRow, read_usage
from vgpuctl.errors import StateError, UsageError

MIB = 1 << 20
GROUPINGS = ("job", "user", "gpu", "day")
FORMATS = ("table", "csv", "json")


@dataclass(frozen=True)
class JobInfo:
    """What the daemon recorded about a job (the jobs table)."""

    job_id: str
    name: str = ""
    user: str = ""
    uid: int | None = None
    command: str = ""
    gpus: tuple[str, ...] = ()      # GPU UUIDs
    mem_limit: int | None = None    # bytes per GPU
    core: int | None = None         # percent
    policy: str = ""
    start: float | None = None      # epoch seconds
    end: float | None = None        # None while running
    exit_status: int | None = None  # exit code, 128+N for signal N; None: unknown


# -- time arguments ------------------------------------------------------------
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)\s*$", re.I)
_UNIT_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def _local_midnight(d: date, tz: tzinfo | None) -> float:
    if tz is None:
        return datetime(d.year, d.month, d.day).timestamp()
    return datetime(d.year, d.month, d.day, tzinfo=tz).timestamp()


def _to_datetime(t: float, tz: tzinfo | None) -> datetime:
    if tz is None:
        return datetime.fromtimestamp(t).astimezone()
    return datetime.fromtimestamp(t, tz)


def parse_when(text: str, now: float, tz: tzinfo | None = None, option: str = "--since") -> float:
    """Epoch seconds for a report bound: a duration back from now (``24h``,
    ``7d``, ``30m``, ``2w``), ``now``, ``today``, ``yesterday``, a date
    (``2024-05-01``, local midnight) or a date and time (``2024-05-01 13:00``,
    ``2024-05-01T13:00:00+02:00``; local time unless an offset is given)."""
    s = text.strip()
    low = s.lower()
    m = _DURATION.match(s)
    if m:
        return now - float(m.group(1)) * _UNIT_SECONDS[m.group(2).lower()]
    today = _to_datetime(now, tz).date()
    if low == "now":
        return now
    if low == "today":
        return _local_midnight(today, tz)
    if low == "yesterday":
        return _local_midnight(today - timedelta(days=1), tz)
    iso = s[:-1] + "+00:00" if s.endswith(("Z", "z")) else s
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", iso):
            return _local_midnight(date.fromisoformat(iso), tz)
        dt = datetime.fromisoformat(iso)
    except ValueError:
        raise UsageError(
            f"{option} {text!r}: expected a duration (24h, 7d), today, yesterday, "
            "a date (2024-05-01) or a date and time (2024-05-01T13:00)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=tz) if tz is not None else dt.astimezone()
    return dt.timestamp()


# -- aggregation ---------------------------------------------------------------
@dataclass
class ReportRow:
    """One line of a report: a job, a user, a GPU or a day."""

    key: str
    jobs: set[str] = field(default_factory=set)
    gpu_seconds: float = 0.0
    mem_gib_hours: float = 0.0
    peak_mem_bytes: int = 0
    job: JobInfo | None = None  # --by job only


@dataclass
class Report:
    by: str
    since: float
    until: float
    rows: list[ReportRow]


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _row_part(r: UsageRow, lo: float, hi: float) -> float | None:
    """The fraction of row r's sums inside [lo, hi); None when it doesn't
    touch that span at all."""
    if r.t1 <= r.t0:
        return 1.0 if lo <= r.t0 < hi else None
    if r.t1 < lo or r.t0 >= hi:
        return None
    return _overlap(r.t0, r.t1, lo, hi) / (r.t1 - r.t0)


def _days(lo: float, hi: float, tz: tzinfo | None) -> list[tuple[str, float, float]]:
    """The local days that [lo, hi) covers: (YYYY-MM-DD, start, end), clipped."""
    out = []
    d = _to_datetime(lo, tz).date()
    while True:
        start = _local_midnight(d, tz)
        nd = d + timedelta(days=1)
        end = _local_midnight(nd, tz)
        if start >= hi:
            break
        out.append((d.isoformat(), max(start, lo), min(end, hi)))
        d = nd
        if len(out) > 100_000:  # a bound for absurd windows
            break
    return out


def aggregate(jobs: Iterable[JobInfo], usage: Iterable[UsageRow], by: str,
              since: float, until: float, tz: tzinfo | None = None) -> Report:
    """Sum usage inside [since, until) per job, user, GPU or local day.

    A job is in the report when it has usage in the window or was alive in it
    (started before ``until`` and not ended before ``since``), so a job that
    ran but never touched its GPU still shows, with zeros."""
    if by not in GROUPINGS:
        raise UsageError(f"--by {by!r}: must be one of {', '.join(GROUPINGS)}")
    if until <= since:
        raise UsageError("--until must be later than --since")
    records = {j.job_id: j for j in jobs}
    rows: dict[str, ReportRow] = {}

    def row(key: str) -> ReportRow:
        r = rows.get(key)
        if r is None:
            r = rows[key] = ReportRow(key=key)
        return r

    def keys_for(job_id: str, gpu: str) -> list[str]:
        if by == "job":
            return [job_id]
        if by == "user":
            rec = records.get(job_id)
            return [rec.user if rec and rec.user else "?"]
        if by == "gpu":
            return [gpu]
        return []

    for u in usage:
        if by == "day":
            for day, lo, hi in _days(max(since, u.t0), min(until, max(u.t1, u.t0 + 1e-9)), tz):
                part = _row_part(u, lo, hi)
                if part is None:
                    continue
                r = row(day)
                r.jobs.add(u.job_id)
                r.gpu_seconds += u.gpu_seconds * part
                r.mem_gib_hours += u.mem_gib_hours * part
                r.peak_mem_bytes = max(r.peak_mem_bytes, u.peak_mem_bytes)
            continue
        part = _row_part(u, since, until)
        if part is None:
            continue
        for key in keys_for(u.job_id, u.gpu_uuid):
            r = row(key)
            r.jobs.add(u.job_id)
            r.gpu_seconds += u.gpu_seconds * part
            r.mem_gib_hours += u.mem_gib_hours * part
            r.peak_mem_bytes = max(r.peak_mem_bytes, u.peak_mem_bytes)

    # Jobs alive in the window with no usage there still count.
    for j in records.values():
        start = j.start if j.start is not None else -math.inf
        end = j.end if j.end is not None else math.inf
        if start >= until or end < since:
            continue
        if by == "day":
            lo = max(since, start)
            hi = min(until, end if end > lo else lo + 1e-9)
            for day, _, _ in _days(lo, hi, tz):
                row(day).jobs.add(j.job_id)
        elif by == "gpu":
            for g in j.gpus:
                row(g).jobs.add(j.job_id)
        else:
            for key in keys_for(j.job_id, ""):
                row(key).jobs.add(j.job_id)

    if by == "job":
        for key, r in rows.items():
            r.job = records.get(key) or JobInfo(job_id=key)
        ordered = sorted(rows.values(), key=lambda r: (
            r.job.start if r.job and r.job.start is not None else math.inf, r.key))
    else:
        ordered = sorted(rows.values(), key=lambda r: r.key)
    return Report(by=by, since=since, until=until, rows=ordered)


# -- columns -------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    header: str                       # CSV and table header, with the unit
    json_key: str
    text: Callable[[ReportRow], str]  # CSV / table cell
    value: Callable[[ReportRow], Any]  # JSON value
    numeric: bool = False             # right-aligned in tables


def _iso(t: float | None, tz: tzinfo | None) -> str:
    return "" if t is None else _to_datetime(t, tz).isoformat(timespec="seconds")


def _job(r: ReportRow) -> JobInfo:
    return r.job or JobInfo(job_id=r.key)


def _mib(n: int | None) -> str:
    return "" if n is None else str(round(n / MIB))


def _common(by: str) -> list[Column]:
    return [
        Column("gpu_time [s]", "gpu_seconds",
               lambda r: f"{r.gpu_seconds:.3f}", lambda r: round(r.gpu_seconds, 6), True),
        Column("memory_time [GiB*h]", "memory_gib_hours",
               lambda r: f"{r.mem_gib_hours:.6f}", lambda r: round(r.mem_gib_hours, 9), True),
        Column("peak_memory [MiB]", "peak_memory_bytes",
               lambda r: _mib(r.peak_mem_bytes), lambda r: r.peak_mem_bytes, True),
    ]


def columns(by: str, tz: tzinfo | None = None) -> list[Column]:
    """The columns of a report grouped ``by``, in their stable order."""
    jobs_col = Column("jobs", "jobs", lambda r: str(len(r.jobs)), lambda r: len(r.jobs), True)
    if by == "job":
        return [
            Column("job_id", "job_id", lambda r: r.key, lambda r: r.key),
            Column("name", "name", lambda r: _job(r).name, lambda r: _job(r).name),
            Column("user", "user", lambda r: _job(r).user, lambda r: _job(r).user),
            Column("uid", "uid",
                   lambda r: "" if _job(r).uid is None else str(_job(r).uid),
                   lambda r: _job(r).uid, True),
            Column("gpus", "gpus", lambda r: " ".join(_job(r).gpus), lambda r: list(_job(r).gpus)),
            Column("start", "start", lambda r: _iso(_job(r).start, tz),
                   lambda r: _iso(_job(r).start, tz) or None),
            Column("end", "end", lambda r: _iso(_job(r).end, tz),
                   lambda r: _iso(_job(r).end, tz) or None),
            Column("exit_status", "exit_status",
                   lambda r: "" if _job(r).exit_status is None else str(_job(r).exit_status),
                   lambda r: _job(r).exit_status, True),
            Column("memory_limit [MiB]", "memory_limit_bytes",
                   lambda r: _mib(_job(r).mem_limit), lambda r: _job(r).mem_limit, True),
            Column("core_limit [%]", "core_limit_percent",
                   lambda r: "" if _job(r).core is None else str(_job(r).core),
                   lambda r: _job(r).core, True),
            *_common(by),
            Column("command", "command", lambda r: _job(r).command, lambda r: _job(r).command),
        ]
    first = {"user": Column("user", "user", lambda r: r.key, lambda r: r.key),
             "gpu": Column("gpu_uuid", "gpu_uuid", lambda r: r.key, lambda r: r.key),
             "day": Column("day", "day", lambda r: r.key, lambda r: r.key)}
    if by not in first:
        raise UsageError(f"--by {by!r}: must be one of {', '.join(GROUPINGS)}")
    return [first[by], jobs_col, *_common(by)]


# -- rendering -----------------------------------------------------------------
def to_csv(report: Report, tz: tzinfo | None = None) -> str:
    cols = columns(report.by, tz)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.header for c in cols])
    for r in report.rows:
        w.writerow([c.text(r) for c in cols])
    return buf.getvalue()


def to_json(report: Report, tz: tzinfo | None = None) -> str:
    cols = columns(report.by, tz)
    data = [{c.json_key: c.value(r) for c in cols} for r in report.rows]
    return json.dumps(data, indent=2) + "\n"


def empty_line(report: Report, tz: tzinfo | None = None) -> str:
    return (f"no jobs between {_iso(report.since, tz)} and {_iso(report.until, tz)}\n")


def to_text(report: Report, tz: tzinfo | None = None) -> str:
    """Plain aligned columns, no colour: for pipes, files and cron mail."""
    if not report.rows:
        return empty_line(report, tz)
    cols = columns(report.by, tz)
    cells = [[c.header for c in cols]] + [[c.text(r) for c in cols] for r in report.rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = []
    for row in cells:
        parts = []
        for i, (c, cell) in enumerate(zip(cols, row)):
            last = i == len(cols) - 1
            if c.numeric:
                parts.append(cell.rjust(widths[i]))
            else:
                parts.append(cell if last else cell.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines) + "\n"


_SHORT_HEADERS = {"job_id": "job", "exit_status": "exit", "memory_limit": "mem limit",
                  "core_limit": "core", "gpu_time": "GPU time", "memory_time": "mem time",
                  "peak_memory": "peak mem", "gpu_uuid": "GPU"}


def _short_time(t: float | None, tz: tzinfo | None) -> str:
    return "" if t is None else _to_datetime(t, tz).strftime("%m-%d %H:%M")


def to_rich(report: Report, tz: tzinfo | None = None) -> Any:
    """A rich Table (for terminals) or a Text line when the report is empty.
    Compacter than the plain text: short GPU ids and times, no uid, the
    command cut to fit."""
    from rich.table import Table
    from rich.text import Text

    if not report.rows:
        return Text(empty_line(report, tz).rstrip(), style="dim")
    title = (f"GPU usage by {report.by}, {_iso(report.since, tz)} to "
             f"{_iso(report.until, tz)}")
    t = Table(title=title, title_justify="left", header_style="bold", box=None,
              pad_edge=False)
    compact: dict[str, Callable[[ReportRow], str]] = {
        "gpus": lambda r: " ".join(g[:12] for g in _job(r).gpus),
        "start": lambda r: _short_time(_job(r).start, tz),
        "end": lambda r: _short_time(_job(r).end, tz),
    }
    cols = [c for c in columns(report.by, tz) if c.json_key != "uid"]
    for c in cols:
        last = c.json_key == "command"
        name, _, unit = c.header.partition(" ")
        name = _SHORT_HEADERS.get(name, name.replace("_", " "))
        t.add_column(Text(f"{name}\n{unit}" if unit else name),
                     justify="right" if c.numeric else "left",
                     no_wrap=True, overflow="ellipsis", max_width=24 if last else None)
    for r in report.rows:
        t.add_row(*[Text(compact.get(c.json_key, c.text)(r)) for c in cols])
    return t


def render(report: Report, fmt: str, tz: tzinfo | None = None) -> str:
    """The report as text in ``fmt`` (table = plain aligned text)."""
    if fmt == "csv":
        return to_csv(report, tz)
    if fmt == "json":
        return to_json(report, tz)
    if fmt == "table":
        return to_text(report, tz)
    raise UsageError(f"--format {fmt!r}: must be one of {', '.join(FORMATS)}")


def write_atomic(path: Path | str, text: str) -> None:
    """Write text to path so that readers see the old file or the new one,
    never a half-written one (temporary file in the same folder, fsync,
    rename). The file gets mode 0644 less the umask."""
    p = Path(path)
    d = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=d)
    except OSError as e:
        raise StateError(f"--output {p}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o644 & ~umask)
        os.replace(tmp, p)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StateError(f"--output {p}: {e.strerror}") from None


# -- reading the daemon's database ---------------------------------------------
def _first(row: Mapping[str, Any], *names: str) -> Any:
    for n in names:
        if n in row and row[n] is not None:
            return row[n]
    return None


def _gpus(v: Any) -> tuple[str, ...]:
    if v is None or v == "":
        return ()
    if isinstance(v, str):
        try:
            parsed = json.loads(v)
        except ValueError:
            parsed = [s for s in re.split(r"[,\s]+", v) if s]
        v = parsed if isinstance(parsed, list) else [parsed]
    if not isinstance(v, (list, tuple)):
        v = [v]
    # The daemon stores [{"index": 0, "uuid": "GPU-..."}]; plain UUIDs work too.
    return tuple(str(x.get("uuid") or x.get("index")) if isinstance(x, dict) else str(x)
                 for x in v)


def _command(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        try:
            parsed = json.loads(v)
        except ValueError:
            return v
        if isinstance(parsed, list):
            import shlex
            return " ".join(shlex.quote(str(x)) for x in parsed)
        return v
    return str(v)


def _opt_int(v: Any) -> int | None:
    try:
        return None if v is None or v == "" else int(v)
    except (TypeError, ValueError):
        return None


def _opt_float(v: Any) -> float | None:
    try:
        return None if v is None or v == "" else float(v)
    except (TypeError, ValueError):
        return None


def job_from_row(row: Mapping[str, Any]) -> JobInfo:
    """A JobInfo from a row of the daemon's jobs table (by column name)."""
    core = _first(row, "core", "core_share", "core_limit")
    return JobInfo(
        job_id=str(_first(row, "job_id", "id")),
        name=str(_first(row, "name") or ""),
        user=str(_first(row, "user", "username", "user_name") or ""),
        uid=_opt_int(_first(row, "uid", "owner_uid")),
        command=_command(_first(row, "command", "cmd", "argv")),
        gpus=_gpus(_first(row, "gpus", "gpu_uuids", "gpu_uuid", "gpu")),
        mem_limit=_opt_int(_first(row, "mem_limit", "mem", "memory_limit")),
        core=_opt_int(core),
        policy=str(_first(row, "policy") or ""),
        start=_opt_float(_first(row, "start", "started", "start_time", "started_at",
                                "created")),
        end=_opt_float(_first(row, "end", "ended", "end_time", "ended_at")),
        exit_status=_exit_status(row),
    )


def _exit_status(row: Mapping[str, Any]) -> int | None:
    """The exit code as a shell shows it: the code, or 128+N for signal N."""
    sig = _opt_int(_first(row, "exit_signal"))
    if sig:
        return 128 + sig
    return _opt_int(_first(row, "exit_status", "exit_code", "returncode"))


def read_jobs(conn: sqlite3.Connection) -> list[JobInfo]:
    """Every job of the jobs table ([] when there is none yet)."""
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute("SELECT * FROM jobs").fetchall()
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []
        raise
    finally:
        conn.row_factory = None
    return [job_from_row({k: r[k] for k in r.keys()}) for r in rows]


def open_readonly(db: Path) -> sqlite3.Connection:
    """Open the daemon's database for reading only; StateError with one line
    when it is missing or unreadable. Works while the daemon is down."""
    if not db.exists():
        raise StateError(f"{db}: no accounting database (has a daemon run here? "
                          "choose another with --state-dir or VGPU_STATE_DIR)")
    if not os.access(db, os.R_OK):
        raise StateError(f"{db}: not readable by you (run as root or as the daemon's user)")
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        raise StateError(f"{db}: can't read the accounting database: {e}") from None
    return conn


def load(db: Path, since: float, until: float,
         missing_ok: bool = False) -> tuple[list[JobInfo], list[UsageRow]]:
    """The jobs and the usage rows that overlap [since, until) from the
    daemon's database. With ``missing_ok``, a database that does not exist
    (no daemon has run yet) reads as empty."""
    if missing_ok and not db.exists():
        return [], []
    conn = open_readonly(db)
    try:
        try:
            jobs = read_jobs(conn)
            usage = read_usage(conn, since, until)
        except sqlite3.Error as e:
            raise StateError(f"{db}: can't read the accounting database: {e}") from None
    finally:
        conn.close()
    return jobs, usage


def default_db(env: Mapping[str, str] | None = None) -> Path:
    """The database ``vgpuctl report`` reads: $VGPU_STATE_DIR's, else the
    system daemon's when it exists, else the user daemon's."""
    from vgpuctl.system import paths

    e = os.environ if env is None else env
    if e.get("VGPU_STATE_DIR"):
        return Path(e["VGPU_STATE_DIR"]) / paths.DB_NAME
    system = paths.SYSTEM_STATE_DIR / paths.DB_NAME
    if system.exists():
        return system
    return paths.user_state_dir(env) / paths.DB_NAME


def build(db: Path, by: str, since: float, until: float,
          tz: tzinfo | None = None, missing_ok: bool = False) -> Report:
    if until <= since:
        raise UsageError("--until must be later than --since")
    jobs, usage = load(db, since, until, missing_ok)
    return aggregate(jobs, usage, by, since, until, tz)


__all__: Sequence[str] = (
    "JobInfo", "Report", "ReportRow", "StateError", "aggregate", "columns", "parse_when",
    "render", "to_csv", "to_json", "to_text", "to_rich", "write_atomic", "load", "default_db",
    "build", "UsageRow",
)
