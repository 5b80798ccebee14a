"""``vgpuctl report``: GPU time and memory per job, user, GPU or day."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import click

from vgpuctl.core import usage_report
from vgpuctl.errors import PermissionDenied, ProtocolError, StateError
from vgpuctl.store import reports
from vgpuctl.system import paths
from vgpuctl.system.files import write_output

REPLY_S = 120.0     # the daemon reads a window's rows of its database


@click.command()
@click.option("--since", default="24h", show_default=True, metavar="WHEN",
              help="Start of the window: 24h, 7d, today, yesterday, 2024-05-01, "
                   "2024-05-01T13:00.")
@click.option("--until", default="now", show_default=True, metavar="WHEN",
              help="End of the window (not included), same forms as --since.")
@click.option("--by", "by", type=click.Choice(usage_report.GROUPINGS), default="job",
              show_default=True, help="One line per job, user, GPU, local day or Slurm job.")
@click.option("--format", "fmt", type=click.Choice(usage_report.FORMATS), default="table",
              show_default=True, help="table (rich on a terminal, plain text otherwise), "
                                      "csv (units in the headers) or json.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
              metavar="FILE", help="Write to FILE: a regular file is replaced atomically "
              "(readers never see half a report), a FIFO or device is written through, "
              "a symlink followed; - is stdout.")
@click.option("--state-dir", type=click.Path(path_type=Path),
              help="The daemon's state directory holding vgpu.db "
                   "(default: $VGPU_STATE_DIR, else the system daemon's, else yours).")
def report(since: str, until: str, by: str, fmt: str, output: Path | None,
           state_dir: Path | None) -> None:
    """Usage accounting: GPU-seconds, memory GiB-hours and peak memory.

    Reads the daemon's database directly (read-only), so it works while the
    daemon is down, from cron too. Where the database is not yours to read
    (the system daemon's is root's), the daemon answers with your own jobs,
    as sacct does. An empty window is not an error: CSV gets its headers
    only, JSON an empty list.
    """
    now = time.time()
    t0 = usage_report.parse_when(since, now, option="--since")
    t1 = usage_report.parse_when(until, now, option="--until")
    db = state_dir / paths.DB_NAME if state_dir else paths.report_db()
    # Nothing has run yet (no database where one would be) is an empty
    # report; a --state-dir that does not exist is a mistake.
    missing_ok = state_dir is None or _is_dir(state_dir)
    bad = [0]
    try:
        result = reports.build(db, by, t0, t1, missing_ok=missing_ok, bad=bad)
    except PermissionDenied as e:
        if state_dir is not None:
            raise
        result = _own_jobs(db, by, t0, t1, e, bad)
    if bad[0]:
        from vgpuctl.cli import messages

        messages.warn(f"{bad[0]} usage row(s) of the window could not be read (a damaged "
                      "database) and are left out of the report")
    if output is not None and str(output) != "-":
        write_output(output, usage_report.render(result, fmt))
        return
    if fmt == "table" and sys.stdout.isatty():
        from vgpuctl.cli import render

        render.show(render.report_lines(result))
        return
    click.echo(usage_report.render(result, fmt), nl=False)


def _is_dir(path: Path) -> bool:
    """Whether --state-dir is a directory; PermissionDenied (exit 5) where
    it can't be looked into, StateError (8) where it is something else."""
    try:
        mode = os.stat(path).st_mode
    except PermissionError:
        raise PermissionDenied(f"{path}: not readable by you (run as root or as the "
                               "daemon's user)") from None
    except FileNotFoundError:
        return False
    except OSError as e:
        raise StateError(f"{path}: {e.strerror}") from None
    if not stat.S_ISDIR(mode):
        raise StateError(f"{path}: not a directory (--state-dir names the daemon's state "
                         "directory, which holds vgpu.db)")
    return True


def _own_jobs(db: Path, by: str, since: float, until: float,
              denied: PermissionDenied, bad: list[int]) -> usage_report.UsageReport:
    """The report of the caller's own jobs, from the daemon that keeps db,
    for a user who may not read it (as sacct shows a user their jobs);
    denied again when no daemon answers or it keeps another database."""
    from vgpuctl.client.connection import connect
    from vgpuctl.core.accounting import UsageRow
    from vgpuctl.core.job import record_from_wire
    from vgpuctl.errors import DaemonUnavailable

    try:
        with connect(timeout=REPLY_S) as cl:
            reply = cl.call("report", since=since, until=until)
    except DaemonUnavailable:
        raise PermissionDenied(f"{denied} and no daemon answers to report your own "
                               "jobs") from None
    if reply.get("db") != str(db):
        raise denied
    try:
        jobs = [record_from_wire(d) for d in reply["jobs"]]
        usage = [UsageRow(**u) for u in reply["usage"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"the daemon's report is not one ({type(e).__name__}: "
                            f"{e})") from None
    bad[0] += int(reply.get("bad_rows") or 0)
    out = usage_report.aggregate(jobs, usage, by, since, until)
    if not reply.get("everyone"):
        out.only_user = jobs[0].user if jobs else _me()
    return out


def _me() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
