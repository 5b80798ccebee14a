"""``vgpuctl top``: the status view, refreshed live."""

from __future__ import annotations

import click


@click.command()
@click.option("-i", "--interval", default=1.0, show_default=True, metavar="SECONDS",
              type=click.FloatRange(0.1, 3600), help="Time between refreshes.")
@click.option("-n", "--iterations", type=click.IntRange(1), metavar="N",
              help="Stop after N refreshes (default: until Ctrl-C).")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def top(interval: float, iterations: int | None, socket_path: str | None) -> None:
    """Show the GPUs and jobs, refreshed every INTERVAL seconds; Ctrl-C quits."""
    import time

    from rich.live import Live

    from .. import render
    from ..client import connect

    cl = connect(socket_path)
    try:
        with Live(render.status_view(cl.call("ps")), console=render.console(),
                  auto_refresh=False, transient=False) as live:
            n = 1
            while iterations is None or n < iterations:
                time.sleep(interval)
                live.update(render.status_view(cl.call("ps")), refresh=True)
                n += 1
    except KeyboardInterrupt:
        pass
    finally:
        cl.close()
