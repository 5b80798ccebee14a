"""``vgpuctl status`` (and ``vgpuctl`` alone): the GPUs, then the jobs."""

from __future__ import annotations

from typing import Any

import click


def fetch(socket_path: str | None, all_jobs: bool = False) -> dict[str, Any]:
    """The daemon's ps reply."""
    from vgpuctl.client.connection import connect

    with connect(socket_path) as cl:
        return cl.call("ps", all=all_jobs or None)


@click.command()
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def status(socket_path: str | None) -> None:
    """Show the GPUs (memory, utilization) and the jobs on them.

    With no daemon running, shows the GPUs as NVML sees them.
    """
    from vgpuctl.cli import render
    from vgpuctl.errors import DaemonUnavailable

    try:
        data = fetch(socket_path)
    except DaemonUnavailable as e:
        from vgpuctl.system.nvml import query

        try:
            stats = query()
        except Exception:
            raise e from None
        data = {"daemon": None, "jobs": [], "gpus": [
            {"index": g.index, "uuid": g.uuid, "name": g.name, "memory_total": g.memory_total,
             "memory_used": g.memory_used, "utilization": g.utilization,
             "committed": None, "capacity": None, "jobs": None} for g in stats]}
    render.print_status(data)
