"""``vgpuctl demo``: a private daemon and three jobs on the simulated GPU."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from vgpuctl.errors import DemoError


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextmanager
def _step(console: Any, text: str) -> Iterator[None]:
    """Progress for one step: a spinner on a terminal, a line otherwise."""
    if console is not None:
        with console.status(text):
            yield
        console.print(f"[green]✓[/] {text.rstrip('.')}", highlight=False)
    else:
        click.echo(f"vgpuctl demo: {text}", err=True)
        yield


@click.command()
@click.option("--seconds", type=click.FloatRange(1, 3600), default=10.0, show_default=True,
              help="How long the jobs run (and the live view shows them).")
def demo(seconds: float) -> None:
    """Watch vgpuctl share a GPU, with no GPU needed.

    Starts a private daemon on the simulated GPU (VGPU_SIM=1x16G unless
    VGPU_SIM is set) in a temporary folder, runs three vgpu-burn jobs through
    `vgpuctl run` (4G at 30 % hard, 2G at 50 % soft, 1G at 20 % hard), shows
    the live view while they run, then their usage report. Everything is
    stopped and removed at the end, on Ctrl-C too.
    """
    from vgpuctl.cli import render
    from vgpuctl.ops import showcase
    tty = sys.stdout.isatty()
    console = render.console() if tty else None
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    with showcase.Demo(seconds=seconds) as d:
        with _step(console, f"starting a private daemon on VGPU_SIM={d.env['VGPU_SIM']}..."):
            d.start_daemon()
        names = ", ".join(f"{j.name} ({j.mem}, {j.core}% {j.policy})" for j in d.jobs)
        with _step(console, f"starting {len(d.jobs)} vgpu-burn jobs: {names}..."):
            d.start_jobs()
        _watch(d, console)
        with _step(console, "waiting for the jobs to end..."):
            codes = d.finish_jobs()
        with _step(console, "stopping the daemon..."):
            d.stop_daemon()
        result = d.report()
        if console is None:
            click.echo()
        render.show(render.summary_lines(result))
        bad = {n: c for n, c in codes.items() if c != 0}
        if bad:
            raise DemoError("demo jobs that failed: " + ", ".join(
                f"{n} (exit {c}, see its log)" for n, c in bad.items()))


def _watch(d: Any, console: Any) -> None:
    from vgpuctl.cli import render

    if console is None:
        # Off a terminal: one view, the one nearest the middle of the run.
        t0 = time.monotonic()
        best: list[Any] = [None, None]

        def keep(data: dict[str, Any]) -> None:
            off = abs(time.monotonic() - t0 - d.seconds / 2)
            if data.get("jobs") and (best[0] is None or off < best[0]):
                best[:] = [off, data]

        click.echo("vgpuctl demo: jobs running...", err=True)
        d.watch(keep)
        if best[1] is not None:
            render.show(render.status_lines(best[1], None))
        return
    from rich.live import Live

    with Live(console=console, refresh_per_second=4, transient=False) as live:
        def show(data: dict[str, Any]) -> None:
            if data.get("jobs"):     # the last view keeps the jobs, not "no jobs"
                live.update(render.status_view(data))
        d.watch(show)
