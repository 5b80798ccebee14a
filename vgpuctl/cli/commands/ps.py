"""``vgpuctl ps``: the jobs, as a table or as JSON for scripts."""

from __future__ import annotations

import click


@click.command()
@click.option("--json", "as_json", is_flag=True, help="JSON (fields: `vgpuctl help cli`).")
@click.option("-a", "--all", "all_jobs", is_flag=True, help="Recently ended jobs too.")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def ps(as_json: bool, all_jobs: bool, socket_path: str | None) -> None:
    """List the jobs: id, name, user, pids, GPU, memory, compute share."""
    from vgpuctl.cli.commands.status import fetch

    data = fetch(socket_path, all_jobs)
    if as_json:     # scripts call this often: no rich on this path
        import json

        out = {"v": data.get("v", 1), "daemon": data.get("daemon"),
               "gpus": data.get("gpus", []), "jobs": data.get("jobs", [])}
        click.echo(json.dumps(out, indent=1))
        return
    from vgpuctl.cli import render

    render.print_jobs(data.get("jobs", []))
