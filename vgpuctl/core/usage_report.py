"""Usage reports: what each job, user, GPU or day used over a time window.

Pure arithmetic over the jobs' records (vgpuctl.core.job's ``JobRecord``, as
the daemon keeps them) and ``UsageRow`` values (``aggregate``), and the
report's columns as output fields, written to CSV, JSON and plain text by
vgpuctl.core.output (the same stack as `ps`). Reading the daemon's database
is vgpuctl.store.reports's job; the rich table for terminals is in
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

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, tzinfo
from typing import Any, NamedTuple

from vgpuctl.core import layout, output
from vgpuctl.core.accounting import UsageRow
from vgpuctl.core.job import JobRecord
from vgpuctl.core.output import Field, iso_time, short_command, short_uuids
from vgpuctl.core.sizes import format_size
from vgpuctl.errors import UsageError

GROUPINGS = ("job", "user", "gpu", "day", "slurm-job")
NOT_SLURM = "-"     # the --by slurm-job key of jobs run outside Slurm
FORMATS = ("table", "csv", "json")


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
    job: JobRecord | None = None  # --by job only
    gpus: list[str] = field(default_factory=list)   # --by job: the GPUs it used in the
                                                    # window (a moved job's every one)
    index: int | None = None      # --by gpu: the GPU's NVML index


@dataclass
class UsageReport:
    by: str
    since: float
    until: float
    rows: list[ReportRow]
    only_user: str | None = None    # the jobs of this user only (the daemon's answer
                                    # to a user who may not read its database)


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


def aggregate(jobs: Iterable[JobRecord], usage: Iterable[UsageRow], by: str,
              since: float, until: float, tz: tzinfo | None = None) -> UsageReport:
    """Sum usage inside [since, until) per job, user, GPU or local day.

    A job is in the report when it has usage in the window or was alive in it
    (started before ``until`` and not ended before ``since``), so a job that
    ran but never touched its GPU still shows, with zeros."""
    if by not in GROUPINGS:
        raise UsageError(f"--by {by!r}: must be one of {', '.join(GROUPINGS)}")
    if until <= since:
        raise UsageError("--until must be later than --since")
    records = {j.id: j for j in jobs}
    rows: dict[str, ReportRow] = {}
    # in time order: a job's row lists its GPUs in the order it used them
    for u in sorted(usage, key=lambda u: u.t0):
        for key, part in _usage_parts(u, by, records, since, until, tz):
            _add(_row(rows, key), u, part, by)
    # Jobs alive in the window with no usage there still count.
    for j in records.values():
        for key in _alive_keys(j, by, since, until, tz):
            _row(rows, key).jobs.add(j.id)
    if by == "job":
        ordered = _job_rows(rows, records)
    else:
        ordered = sorted(rows.values(), key=lambda r: r.key)
    if by == "gpu":
        _set_indices(ordered, records)
    return UsageReport(by=by, since=since, until=until, rows=ordered)


# A usage row's (or an alive job's) key in a report by job, user, GPU or Slurm
# job: from its job's id, its job's record (None: unknown) and its GPU.
_KEYS: dict[str, Callable[[str, JobRecord | None, str], str]] = {
    "job": lambda job_id, rec, gpu: job_id,
    "user": lambda job_id, rec, gpu: rec.user if rec and rec.user else "?",
    "gpu": lambda job_id, rec, gpu: gpu,
    "slurm-job": lambda job_id, rec, gpu: rec.slurm_job if rec and rec.slurm_job else NOT_SLURM,
}


def _row(rows: dict[str, ReportRow], key: str) -> ReportRow:
    """The report's row of key, new (zeros) if it has none yet."""
    r = rows.get(key)
    if r is None:
        r = rows[key] = ReportRow(key=key)
    return r


def _usage_parts(u: UsageRow, by: str, records: dict[str, JobRecord], since: float,
                 until: float, tz: tzinfo | None) -> list[tuple[str, float]]:
    """The rows usage row u counts for, each with the fraction of its sums
    that falls there: inside the window, and by day inside each day."""
    if by == "day":
        spans = _days(max(since, u.t0), min(until, max(u.t1, u.t0 + 1e-9)), tz)
        parts = [(day, _row_part(u, lo, hi)) for day, lo, hi in spans]
        return [(day, part) for day, part in parts if part is not None]
    part = _row_part(u, since, until)
    if part is None:
        return []
    return [(_KEYS[by](u.job_id, records.get(u.job_id), u.gpu_uuid), part)]


def _add(r: ReportRow, u: UsageRow, part: float, by: str) -> None:
    """Add part of usage row u's sums (and its peak) to report row r."""
    if by == "job" and u.gpu_uuid not in r.gpus:
        r.gpus.append(u.gpu_uuid)
    r.jobs.add(u.job_id)
    r.gpu_seconds += u.gpu_seconds * part
    r.mem_gib_hours += u.mem_gib_hours * part
    r.peak_mem_bytes = max(r.peak_mem_bytes, u.peak_mem_bytes)


def _alive_keys(j: JobRecord, by: str, since: float, until: float,
                tz: tzinfo | None) -> list[str]:
    """The rows job j counts in for being alive in the window, usage or
    not: its days there, its GPUs, or its one key; none when it was not."""
    start = j.start
    end = j.ended if j.ended is not None else math.inf
    if start >= until or end < since:
        return []
    if by == "day":
        lo = max(since, start)
        hi = min(until, end if end > lo else lo + 1e-9)
        return [day for day, _, _ in _days(lo, hi, tz)]
    if by == "gpu":
        return list(j.uuids)
    return [_KEYS[by](j.id, j, "")]


def _job_rows(rows: dict[str, ReportRow], records: dict[str, JobRecord]) -> list[ReportRow]:
    """The rows of a report by job, each with its job's record and every
    GPU the job holds, in the order the jobs started."""
    for key, r in rows.items():
        r.job = records.get(key)
        # then those it holds that it did not use in the window
        r.gpus += [g for g in (r.job.uuids if r.job else []) if g not in r.gpus]
    return sorted(rows.values(), key=lambda r: (
        r.job.start if r.job is not None else math.inf, r.key))


def _set_indices(rows: list[ReportRow], records: dict[str, JobRecord]) -> None:
    """Give each row of a report by GPU its GPU's NVML index, as the jobs'
    records name it."""
    index = {g.uuid: g.index for j in records.values() for g in j.gpus
             if g.index is not None}
    for r in rows:
        r.index = index.get(r.key)


def row_gpus(r: ReportRow) -> list[str]:
    """A --by job row's GPUs: those aggregate found, else its job's."""
    return r.gpus or (r.job.uuids if r.job is not None else [])


# -- columns -------------------------------------------------------------------
class ReportColumn(NamedTuple):
    """A report column: an output field (its JSON key, kind, unit and CSV
    header) and its value in a row; ``json`` its JSON form where that is
    not the value itself."""
    field: Field
    value: Callable[[ReportRow], Any]
    json: Callable[[Any], Any] | None = None

    @property
    def numeric(self) -> bool:                 # right-aligned in tables
        return self.field.kind in ("int", "bytes", "seconds", "number")


def _job(attr: str, default: Any = None) -> Callable[[ReportRow], Any]:
    """A column's value from the row's job record (``default`` without one)."""
    return lambda r: default if r.job is None else getattr(r.job, attr)


def _common() -> list[ReportColumn]:
    return [
        ReportColumn(Field("gpu_seconds", "seconds", unit="s", digits=3, header="gpu_time"),
               lambda r: r.gpu_seconds, lambda v: round(v, 6)),
        ReportColumn(Field("memory_gib_hours", "number", unit="GiB*h", digits=6,
                     header="memory_time"),
               lambda r: r.mem_gib_hours, lambda v: round(v, 9)),
        ReportColumn(Field("peak_memory_bytes", "bytes", header="peak_memory"),
               lambda r: r.peak_mem_bytes),
    ]


def columns(by: str, tz: tzinfo | None = None) -> list[ReportColumn]:
    """The columns of a report grouped ``by``, in their stable order."""
    def when(v: Any) -> Any:
        return iso_time(v, tz) or None
    if by == "job":
        return [
            ReportColumn(Field("job_id"), lambda r: r.key),
            ReportColumn(Field("name"), _job("name", "")),
            ReportColumn(Field("user"), _job("user", "")),
            ReportColumn(Field("uid", "int"), _job("uid")),
            ReportColumn(Field("gpus", "list"), row_gpus),
            ReportColumn(Field("start", "time"), _job("start"), when),
            ReportColumn(Field("end", "time"), _job("ended"), when),
            ReportColumn(Field("exit_status", "int"), _job("exit_status")),
            ReportColumn(Field("memory_limit_bytes", "bytes", header="memory_limit"),
                   _job("mem_limit")),
            ReportColumn(Field("core_limit_percent", "int", unit="%", header="core_limit"),
                   _job("core_share")),
            *_common(),
            ReportColumn(Field("command"), _job("command_line", "")),
            ReportColumn(Field("slurm_job"), _job("slurm_job")),
            ReportColumn(Field("partition"), _job("slurm_partition")),
            ReportColumn(Field("account"), _job("slurm_account")),
            ReportColumn(Field("priority"), _job("priority", "")),
            ReportColumn(Field("start_utc"), lambda r: utc_text(None if r.job is None
                                                          else r.job.start)),
            ReportColumn(Field("end_utc"), lambda r: utc_text(None if r.job is None
                                                        else r.job.ended)),
        ]
    first = {"user": ReportColumn(Field("user"), lambda r: r.key),
             "gpu": ReportColumn(Field("gpu_uuid"), lambda r: r.key),
             "day": ReportColumn(Field("day"), lambda r: r.key),
             "slurm-job": ReportColumn(Field("slurm_job"),
                                 lambda r: None if r.key == NOT_SLURM else r.key)}
    if by not in first:
        raise UsageError(f"--by {by!r}: must be one of {', '.join(GROUPINGS)}")
    # columns are only ever appended (docs/operations.md)
    index = [ReportColumn(Field("gpu_index", "int"), lambda r: r.index)] if by == "gpu" else []
    return [first[by], ReportColumn(Field("jobs", "int"), lambda r: len(r.jobs)), *_common(),
            *index]


# -- rendering -----------------------------------------------------------------
def _cells(report: UsageReport, cols: list[ReportColumn], tz: tzinfo | None) -> list[list[str]]:
    return [[output.cell(c.value(r), c.field, "mib", tz) for c in cols] for r in report.rows]


def _heads(cols: list[ReportColumn]) -> list[str]:
    return [output.header(c.field, "mib") for c in cols]


def utc_text(t: Any) -> str | None:
    """A time as UTC "2026-12-02 13:05:00", which spreadsheets read as a
    date and time (one with an ISO 8601 offset, "+01:00", they take for
    text); None for none."""
    if not isinstance(t, (int, float)) or isinstance(t, bool):
        return None
    from datetime import timezone

    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def to_csv(report: UsageReport, tz: tzinfo | None = None) -> str:
    cols = columns(report.by, tz)
    return output.csv_text(_heads(cols), _cells(report, cols, tz))


def to_json(report: UsageReport, tz: tzinfo | None = None) -> str:
    cols = columns(report.by, tz)
    data = []
    for r in report.rows:
        item = {}
        for c in cols:
            v = c.value(r)
            item[c.field.name] = c.json(v) if c.json is not None and v is not None else v
        data.append(item)
    return output.json_text(data, indent=2)


def empty_line(report: UsageReport, tz: tzinfo | None = None) -> str:
    return (f"no jobs between {iso_time(report.since, tz)} and {iso_time(report.until, tz)}\n")


def to_text(report: UsageReport, tz: tzinfo | None = None) -> str:
    """Plain aligned columns, no colour: for pipes, files and cron mail."""
    if not report.rows:
        return empty_line(report, tz)
    cols = columns(report.by, tz)
    return output.plain_table(_heads(cols), _cells(report, cols, tz),
                              [c.numeric for c in cols])


def short_time(t: float | None, tz: tzinfo | None) -> str:
    return "" if t is None else _to_datetime(t, tz).strftime("%m-%d %H:%M")


def summary_table(report: UsageReport) -> tuple[list[layout.Column], list[list[layout.Cell]],
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
        j = r.job
        start = j.start if j is not None else report.since
        end = j.ended if j is not None and j.ended is not None else report.until
        ran = max(0.0, min(end, report.until) - max(start, report.since))
        rows.append([
            layout.Cell(r.key), layout.Cell("" if j is None else j.name),
            layout.Cell("" if j is None else format_size(j.mem_limit)),
            layout.Cell("" if j is None else (
                f"{j.core_share}% {j.policy}"
                + (f" {j.priority}" if j.priority in ("low", "high") else "")).rstrip()),
            layout.Cell(f"{r.gpu_seconds:.1f}s"),
            layout.Cell(f"{100 * r.gpu_seconds / ran:.0f}%" if ran > 0 else ""),
            layout.Cell(format_size(r.peak_mem_bytes)),
            layout.Cell("" if j is None or j.exit_status is None else str(j.exit_status)),
        ])
    return cols, rows, [layout.Cut("name", 8)]


def terminal_table(report: UsageReport, tz: tzinfo | None = None) -> tuple[
        list[layout.Column], list[list[layout.Cell]], list[layout.Step]]:
    """The report for a terminal (`vgpuctl report` on a tty): sizes and
    times in short human forms, GPUs by short UUID, fitted by
    vgpuctl.core.layout: a job's id, its GPU time and peak memory stay
    whole; the command, the end, the user, the memory time, the start and
    the GPUs give way first, then the user, the name last."""
    right = {"right": True}
    numbers = [layout.Column("gpu_time", "GPU time", **right),
               layout.Column("mem_time", "Mem GiB*h", **right),
               layout.Column("peak", "Peak mem", **right)]

    def sums(r: ReportRow) -> list[layout.Cell]:
        return [layout.Cell(f"{r.gpu_seconds:.1f}s"), layout.Cell(f"{r.mem_gib_hours:.4f}"),
                layout.Cell(format_size(r.peak_mem_bytes))]
    if report.by == "gpu":
        keys = short_uuids([r.key for r in report.rows])
        cols = [layout.Column("index", "GPU", **right), layout.Column("key", "UUID"),
                layout.Column("jobs", "Jobs", **right), *numbers]
        rows = [[layout.Cell("-" if r.index is None else str(r.index)),
                 layout.Cell(r.key, short=keys.get(r.key), style="dim"),
                 layout.Cell(str(len(r.jobs))), *sums(r)] for r in report.rows]
        return cols, rows, [layout.Short("key")]
    if report.by != "job":
        head = {"user": "User", "day": "Day", "slurm-job": "Slurm job"}[report.by]
        cols = [layout.Column("key", head), layout.Column("jobs", "Jobs", **right), *numbers]
        rows = [[layout.Cell(r.key), layout.Cell(str(len(r.jobs))), *sums(r)]
                for r in report.rows]
        return cols, rows, []
    uuids = short_uuids([g for r in report.rows for g in row_gpus(r)])
    cols = [layout.Column("job", "Job", **right), layout.Column("name", "Name"),
            layout.Column("user", "User"), layout.Column("gpus", "GPU"),
            layout.Column("start", "Start"), layout.Column("end", "End"),
            layout.Column("exit", "Exit", **right),
            layout.Column("limit", "Limits", **right), *numbers,
            layout.Column("command", "Command")]
    rows = []
    for r in report.rows:
        j = r.job
        if j is None:           # usage rows of a job whose record is gone
            rows.append([layout.Cell(r.key), *(layout.Cell("") for _ in range(7)), *sums(r),
                         layout.Cell("")])
            continue
        gpus = row_gpus(r)
        rows.append([
            layout.Cell(r.key), layout.Cell(j.name), layout.Cell(j.user),
            layout.Cell(" ".join(gpus), short=" ".join(uuids.get(g, g) for g in gpus)),
            layout.Cell(short_time(j.start, tz)), layout.Cell(short_time(j.ended, tz)),
            layout.Cell("" if j.exit_status is None else str(j.exit_status)),
            layout.Cell(f"{format_size(j.mem_limit)} {j.core_share}%"), *sums(r),
            layout.Cell(j.command_line, short=short_command(j.command_line)),
        ])
    # On a node of many users the user outlasts the GPUs and the start.
    plan: list[layout.Step] = [
        layout.Short("gpus"), layout.Short("command"), layout.Cut("command", 12),
        layout.Drop("command"), layout.Drop("end"), layout.Drop("mem_time"),
        layout.Drop("start"), layout.Drop("gpus"), layout.Cut("user", 8),
        layout.Cut("name", 8), layout.Drop("user")]
    return cols, rows, plan


def render(report: UsageReport, fmt: str, tz: tzinfo | None = None) -> str:
    """The report as text in ``fmt`` (table = plain aligned text)."""
    if fmt == "csv":
        return to_csv(report, tz)
    if fmt == "json":
        return to_json(report, tz)
    if fmt == "table":
        return to_text(report, tz)
    raise UsageError(f"--format {fmt!r}: must be one of {', '.join(FORMATS)}")
