"""``vgpuctl report``: GPU time and memory per job, user, GPU or day."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from vgpuctl.core import report as rep
from vgpuctl.store import reports
from vgpuctl.system import paths
from vgpuctl.system.files import write_output


@click.command()
@click.option("--since", default="24h", show_default=True, metavar="WHEN",
              help="Start of the window: 24h, 7d, today, yesterday, 2024-05-01, "
                   "2024-05-01T13:00.")
@click.option("--until", default="now", show_default=True, metavar="WHEN",
              help="End of the window (not included), same forms as --since.")
@click.option("--by", "by", type=click.Choice(rep.GROUPINGS), default="job",
              show_default=True, help="One line per job, user, GPU, local day or Slurm job.")
@click.option("--format", "fmt", type=click.Choice(rep.FORMATS), default="table",
              show_default=True, help="table (rich on a terminal, plain text otherwise), "
                                      "csv (units in the headers) or json.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
              metavar="FILE", help="Write to FILE: a regular file is replaced atomically "
              "(readers never see half a report), a FIFO or device is written through, "
              "a symlink followed; - is stdout.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
              help="The daemon's state directory holding vgpu.db "
                   "(default: $VGPU_STATE_DIR, else the system daemon's, else yours).")
def report(since: str, until: str, by: str, fmt: str, output: Path | None,
           state_dir: Path | None) -> None:
    """Usage accounting: GPU-seconds, memory GiB-hours and peak memory.

    Reads the daemon's database directly (read-only), so it works while the
    daemon is down, from cron too. An empty window is not an error: CSV gets
    its headers only, JSON an empty list.
    """
    now = time.time()
    t0 = rep.parse_when(since, now, option="--since")
    t1 = rep.parse_when(until, now, option="--until")
    db = state_dir / paths.DB_NAME if state_dir else paths.report_db()
    # Nothing has run yet (no database where one would be) is an empty
    # report; a --state-dir that does not exist is a mistake.
    missing_ok = state_dir is None or state_dir.is_dir()
    result = reports.build(db, by, t0, t1, missing_ok=missing_ok)
    if output is not None and str(output) != "-":
        write_output(output, rep.render(result, fmt))
        return
    if fmt == "table" and sys.stdout.isatty():
        from vgpuctl.cli import render

        render.show(render.report_lines(result))
        return
    click.echo(rep.render(result, fmt), nl=False)
