"""``vgpuctl status`` (and ``vgpuctl`` alone): the GPUs, then the jobs."""

from __future__ import annotations

from typing import Any

import click

from vgpuctl.cli import view
from vgpuctl.core import nodeview, output


@click.command()
@view.output_options(nodeview.GPU_FIELDS)
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def status(out: view.Output, socket_path: str | None) -> int | None:
    """Show the GPUs (memory, utilization) and the jobs on them.

    With no daemon running, shows the GPUs as NVML sees them. CSV and
    --fields give one line per GPU (as nvidia-smi --query-gpu); JSON the
    whole state (daemon, GPUs, jobs), as `vgpuctl ps --json`.
    """
    if out.loop is not None:
        return view.run_loop(out, lambda t, first: show(view.fetch_or_nvml(socket_path), out,
                                                        t, first))
    show(view.fetch_or_nvml(socket_path), out)
    return None


def show(data: dict[str, Any], out: view.Output, t: float | None = None,
         first: bool = True) -> None:
    """One frame of status in out's format (t: the frame's time, under --loop)."""
    from vgpuctl.cli import render

    gpus = data.get("gpus", [])
    if out.fmt == "json":
        obj = {"v": data.get("v", 1), **view.frame_extra(t), "daemon": data.get("daemon"),
               "gpus": nodeview.select(gpus, out.fields), "jobs": data.get("jobs", [])}
        click.echo(output.json_text(obj, compact=t is not None), nl=False)
        return
    if out.fmt == "csv":
        view.echo_csv(gpus, out, nodeview.GPU_FIELDS, nodeview.GPU_DEFAULT, t, first)
        return
    lines = view.frame_head(t, first)
    if out.fields is None:
        lines += render.status_lines(data, render.width(), out.units, out.header)
    else:
        lines += view.fields_lines(gpus, out, nodeview.GPU_FIELDS, t)
    render.show(lines)
