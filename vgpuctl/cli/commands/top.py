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
    """Show the GPUs and jobs, refreshed every INTERVAL seconds; Ctrl-C quits.

    On a terminal the view is redrawn in place; otherwise each refresh is
    printed after the last, like `top -b`.
    """
    import time

    from vgpuctl.cli import render
    from vgpuctl.client.connection import connect

    cl = connect(socket_path)
    console = render.console()
    try:
        if console.is_terminal:
            from rich.live import Live

            with Live(render.status_view(cl.call("ps")), console=console,
                      auto_refresh=False, transient=False) as live:
                n = 1
                while iterations is None or n < iterations:
                    time.sleep(interval)
                    live.update(render.status_view(cl.call("ps")), refresh=True)
                    n += 1
        else:
            n = 0
            while iterations is None or n < iterations:
                if n:
                    time.sleep(interval)
                    console.print()
                console.print(render.status_view(cl.call("ps")))
                console.file.flush()
                n += 1
    except KeyboardInterrupt:
        pass
    finally:
        cl.close()
