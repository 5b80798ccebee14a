"""``vgpuctl ps``: the jobs, as a table or as JSON for scripts."""

from __future__ import annotations

import click


@click.command()
@click.option("--json", "as_json", is_flag=True, help="JSON (fields in docs/cli.md).")
@click.option("-a", "--all", "all_jobs", is_flag=True, help="Recently ended jobs too.")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def ps(as_json: bool, all_jobs: bool, socket_path: str | None) -> None:
    """List the jobs: id, name, user, pids, GPU, memory, compute share."""
    from vgpuctl.cli.commands.status import fetch

    if as_json:   # the same as `vgpuctl ps --json` without click
        from vgpuctl.__main__ import ps_json

        ps_json(["--json", *(["--all"] if all_jobs else []),
                 *(["--socket", socket_path] if socket_path else [])])
        return
    data = fetch(socket_path, all_jobs)
    from vgpuctl.cli import render

    render.print_jobs(data.get("jobs", []))
