"""``vgpuctl ps``: the jobs, as a table, CSV or JSON."""

from __future__ import annotations

from typing import Any

import click

from vgpuctl.cli import view
from vgpuctl.core import nodeview, output


@click.command()
@view.output_options(nodeview.JOB_FIELDS)
@click.option("-a", "--all", "all_jobs", is_flag=True, help="Include the last 100 ended jobs.")
@click.option("-u", "--user", metavar="USER", help="Only USER's jobs (a name or a uid).")
@click.option("--gpu", metavar="GPU", help="Only the jobs on GPU: index, UUID or UUID prefix "
              "(as run --gpu).")
@click.option("--name", metavar="NAME", help="Only the jobs named NAME (a shell pattern such "
              "as 'train-*' matches several).")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def ps(out: view.Output, all_jobs: bool, user: str | None, gpu: str | None, name: str | None,
       socket_path: str | None) -> int | None:
    """List the jobs: id, name, user, pids, GPU, memory, compute share.

    The table keeps each job's id, GPU and memory whole and gives up the
    command first when the terminal is narrow; off a terminal nothing is cut.
    """
    def frame(t: float | None, first: bool) -> None:
        data = view.fetch(socket_path, all_jobs)
        show(data, filtered(data, user, gpu, name), out, t, first)

    if out.loop is not None:
        return view.run_loop(out, frame)
    frame(None, True)
    return None


def filtered(data: dict[str, Any], user: str | None, gpu: str | None,
             name: str | None) -> list[dict[str, Any]]:
    """The reply's jobs that pass --user, --gpu and --name."""
    uuid = None
    if gpu is not None:
        from vgpuctl.core.placement import Gpu, resolve_gpu

        gpus = [Gpu(g["index"], g["uuid"], g.get("name", ""), g.get("memory_total", 0))
                for g in data.get("gpus", [])]
        uuid = resolve_gpu(gpus, gpu).uuid
    return nodeview.filter_jobs(data.get("jobs", []), user=user, gpu_uuid=uuid, name=name)


def show(data: dict[str, Any], jobs: list[dict[str, Any]], out: view.Output,
         t: float | None = None, first: bool = True) -> None:
    """One frame of ps in out's format (t: the frame's time, under --loop)."""
    if out.fmt == "json":    # scripts call this often: no rich on this path
        obj = {"v": data.get("v", 1), **view.frame_extra(t), "daemon": data.get("daemon"),
               "gpus": data.get("gpus", []), "jobs": nodeview.select(jobs, out.fields),
               "violations": data.get("violations", [])}
        click.echo(output.json_text(obj, compact=t is not None), nl=False)
        return
    if out.fmt == "csv":
        view.echo_csv(jobs, out, nodeview.JOB_FIELDS, nodeview.JOB_DEFAULT, t, first)
        return
    from vgpuctl.cli import render

    lines = view.frame_head(t, first)
    if not jobs:
        lines.append(render.note_line("no jobs"))
    elif out.fields is None:
        lines += render.table_lines(nodeview.job_table(jobs, out.units), render.width(),
                                    out.header)
    else:
        lines += view.fields_lines(jobs, out, nodeview.JOB_FIELDS, t)
    render.show(lines)
