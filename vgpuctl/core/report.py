"""Usage reports: what each job, user, GPU or day used over a time window.

Pure arithmetic over ``JobInfo`` and ``UsageRow`` values (``aggregate``) and
renderers to CSV, JSON and plain text (strings). Reading the daemon's
database is vgpuctl.store.reports's job; the rich table for terminals is in
vgpuctl.cli.render.

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
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, tzinfo
from typing import Any

from vgpuctl.core import layout
from vgpuctl.core.accounting import UsageRow
from vgpuctl.core.nodeview import short_command, short_uuids
from vgpuctl.core.sizes import format_size
from vgpuctl.errors import UsageError

MIB = 1 << 20
GROUPINGS = ("job", "user", "gpu", "day", "slurm-job")
NOT_SLURM = "-"     # the --by slurm-job key of jobs run outside Slurm
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
    slurm_job: str | None = None    # the Slurm job id, for a job its Prolog registered
    partition: str | None = None    # its Slurm partition and account
    account: str | None = None


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
        if by == "slurm-job":
            rec = records.get(job_id)
            return [rec.slurm_job if rec and rec.slurm_job else NOT_SLURM]
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


def iso_time(t: float | None, tz: tzinfo | None) -> str:
    return "" if t is None else _to_datetime(t, tz).isoformat(timespec="seconds")


def row_job(r: ReportRow) -> JobInfo:
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
            Column("name", "name", lambda r: row_job(r).name, lambda r: row_job(r).name),
            Column("user", "user", lambda r: row_job(r).user, lambda r: row_job(r).user),
            Column("uid", "uid",
                   lambda r: "" if row_job(r).uid is None else str(row_job(r).uid),
                   lambda r: row_job(r).uid, True),
            Column("gpus", "gpus", lambda r: " ".join(row_job(r).gpus),
                   lambda r: list(row_job(r).gpus)),
            Column("start", "start", lambda r: iso_time(row_job(r).start, tz),
                   lambda r: iso_time(row_job(r).start, tz) or None),
            Column("end", "end", lambda r: iso_time(row_job(r).end, tz),
                   lambda r: iso_time(row_job(r).end, tz) or None),
            Column("exit_status", "exit_status",
                   lambda r: "" if row_job(r).exit_status is None else str(row_job(r).exit_status),
                   lambda r: row_job(r).exit_status, True),
            Column("memory_limit [MiB]", "memory_limit_bytes",
                   lambda r: _mib(row_job(r).mem_limit), lambda r: row_job(r).mem_limit, True),
            Column("core_limit [%]", "core_limit_percent",
                   lambda r: "" if row_job(r).core is None else str(row_job(r).core),
                   lambda r: row_job(r).core, True),
            *_common(by),
            Column("command", "command", lambda r: row_job(r).command,
                   lambda r: row_job(r).command),
            Column("slurm_job", "slurm_job", lambda r: row_job(r).slurm_job or "",
                   lambda r: row_job(r).slurm_job),
            Column("partition", "partition", lambda r: row_job(r).partition or "",
                   lambda r: row_job(r).partition),
            Column("account", "account", lambda r: row_job(r).account or "",
                   lambda r: row_job(r).account),
        ]
    first = {"user": Column("user", "user", lambda r: r.key, lambda r: r.key),
             "gpu": Column("gpu_uuid", "gpu_uuid", lambda r: r.key, lambda r: r.key),
             "day": Column("day", "day", lambda r: r.key, lambda r: r.key),
             "slurm-job": Column("slurm_job", "slurm_job", lambda r: r.key,
                                 lambda r: None if r.key == NOT_SLURM else r.key)}
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
    return (f"no jobs between {iso_time(report.since, tz)} and {iso_time(report.until, tz)}\n")


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
        for i, (c, cell) in enumerate(zip(cols, row, strict=True)):
            last = i == len(cols) - 1
            if c.numeric:
                parts.append(cell.rjust(widths[i]))
            else:
                parts.append(cell if last else cell.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines) + "\n"


def short_time(t: float | None, tz: tzinfo | None) -> str:
    return "" if t is None else _to_datetime(t, tz).strftime("%m-%d %H:%M")


def summary_table(report: Report) -> tuple[list[layout.Column], list[list[layout.Cell]],
                                        list[layout.Step]]:
    """A narrow table of a --by job report (the demo's closing one): each
    job's limits beside the GPU time it got and the share of the GPU that
    makes over its run, so a limit's effect shows at a glance. Fits 80
    columns; the name is cut first when it must (vgpuctl.core.layout)."""
    right = {"right": True}
    cols = [layout.Column("job", "Job", **right), layout.Column("name", "Name"),
            layout.Column("mem", "Mem limit", **right),
            layout.Column("core", "Core limit", **right),
            layout.Column("gpu_time", "GPU time", **right),
            layout.Column("share", "GPU share", **right),
            layout.Column("peak", "Peak mem", **right), layout.Column("exit", "Exit", **right)]
    rows = []
    for r in report.rows:
        j = row_job(r)
        start = j.start if j.start is not None else report.since
        end = j.end if j.end is not None else report.until
        ran = max(0.0, min(end, report.until) - max(start, report.since))
        core = "" if j.core is None else f"{j.core}% {j.policy}".rstrip()
        rows.append([
            layout.Cell(r.key), layout.Cell(j.name),
            layout.Cell("" if j.mem_limit is None else format_size(j.mem_limit)),
            layout.Cell(core), layout.Cell(f"{r.gpu_seconds:.1f}s"),
            layout.Cell(f"{100 * r.gpu_seconds / ran:.0f}%" if ran > 0 else ""),
            layout.Cell(format_size(r.peak_mem_bytes)),
            layout.Cell("" if j.exit_status is None else str(j.exit_status)),
        ])
    return cols, rows, [layout.Cut("name", 8)]


def terminal_table(report: Report, tz: tzinfo | None = None) -> tuple[
        list[layout.Column], list[list[layout.Cell]], list[layout.Step]]:
    """The report for a terminal (`vgpuctl report` on a tty): sizes and
    times in short human forms, GPUs by short UUID, fitted by
    vgpuctl.core.layout: a job's id, its GPU time and peak memory stay
    whole; the command, the end, the user, the memory time, the start and
    the GPUs give way first, the name last."""
    right = {"right": True}
    numbers = [layout.Column("gpu_time", "GPU time", **right),
               layout.Column("mem_time", "Mem GiB*h", **right),
               layout.Column("peak", "Peak mem", **right)]

    def sums(r: ReportRow) -> list[layout.Cell]:
        return [layout.Cell(f"{r.gpu_seconds:.1f}s"), layout.Cell(f"{r.mem_gib_hours:.4f}"),
                layout.Cell(format_size(r.peak_mem_bytes))]
    if report.by != "job":
        keys = short_uuids([r.key for r in report.rows]) if report.by == "gpu" else {}
        head = {"user": "User", "gpu": "GPU", "day": "Day"}[report.by]
        cols = [layout.Column("key", head), layout.Column("jobs", "Jobs", **right), *numbers]
        rows = [[layout.Cell(r.key, short=keys.get(r.key)), layout.Cell(str(len(r.jobs))),
                 *sums(r)] for r in report.rows]
        return cols, rows, [layout.Short("key")]
    uuids = short_uuids([g for r in report.rows for g in row_job(r).gpus])
    cols = [layout.Column("job", "Job", **right), layout.Column("name", "Name"),
            layout.Column("user", "User"), layout.Column("gpus", "GPU"),
            layout.Column("start", "Start"), layout.Column("end", "End"),
            layout.Column("exit", "Exit", **right),
            layout.Column("limit", "Limits", **right), *numbers,
            layout.Column("command", "Command")]
    rows = []
    for r in report.rows:
        j = row_job(r)
        limit = " ".join(x for x in ("" if j.mem_limit is None else format_size(j.mem_limit),
                                     "" if j.core is None else f"{j.core}%") if x)
        rows.append([
            layout.Cell(r.key), layout.Cell(j.name), layout.Cell(j.user),
            layout.Cell(" ".join(j.gpus), short=" ".join(uuids.get(g, g) for g in j.gpus)),
            layout.Cell(short_time(j.start, tz)), layout.Cell(short_time(j.end, tz)),
            layout.Cell("" if j.exit_status is None else str(j.exit_status)),
            layout.Cell(limit), *sums(r),
            layout.Cell(j.command, short=short_command(j.command)),
        ])
    plan: list[layout.Step] = [
        layout.Short("gpus"), layout.Short("command"), layout.Cut("command", 12),
        layout.Drop("command"), layout.Drop("end"), layout.Drop("user"),
        layout.Drop("mem_time"), layout.Drop("start"), layout.Drop("gpus"),
        layout.Cut("name", 8)]
    return cols, rows, plan


def render(report: Report, fmt: str, tz: tzinfo | None = None) -> str:
    """The report as text in ``fmt`` (table = plain aligned text)."""
    if fmt == "csv":
        return to_csv(report, tz)
    if fmt == "json":
        return to_json(report, tz)
    if fmt == "table":
        return to_text(report, tz)
    raise UsageError(f"--format {fmt!r}: must be one of {', '.join(FORMATS)}")


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
        slurm_job=_opt_str(_first(row, "slurm_job")),
        partition=_opt_str(_first(row, "slurm_partition", "partition")),
        account=_opt_str(_first(row, "slurm_account", "account")),
    )


def _opt_str(v: Any) -> str | None:
    return None if v is None or v == "" else str(v)


def _exit_status(row: Mapping[str, Any]) -> int | None:
    """The exit code as a shell shows it: the code, or 128+N for signal N."""
    sig = _opt_int(_first(row, "exit_signal"))
    if sig:
        return 128 + sig
    return _opt_int(_first(row, "exit_status", "exit_code", "returncode"))
