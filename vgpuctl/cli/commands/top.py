"""``vgpuctl top``: the status view, refreshed live."""

from __future__ import annotations

import os
import select
import sys
import time
from typing import Any

import click

QUIT_KEYS = ("q", "Q")


class Stopped(Exception):
    """SIGTERM or SIGHUP arrived (`timeout 3 vgpuctl top`, a closed
    terminal): raised in the main thread so that the view and the keys
    unwind as on q, leaving the alternate screen and the cursor shown."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop_on_signals() -> None:
    import signal

    def stop(signum: int, _frame: Any) -> None:
        raise Stopped(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


class Keys:
    """The keys typed while top runs: on a terminal, stdin is put in cbreak
    mode without echo (a keypress neither waits for Enter nor prints into
    the view) and restored on the way out; elsewhere there are none."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.fd: int | None = None
        self._saved: Any = None

    def __enter__(self) -> Keys:
        try:
            if self.enabled and sys.stdin.isatty():
                import termios
                import tty

                fd = sys.stdin.fileno()
                self._saved = termios.tcgetattr(fd)
                tty.setcbreak(fd)
                self.fd = fd
        except (AttributeError, OSError, ValueError):
            self.fd = None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def wait(self, seconds: float) -> str:
        """Wait up to seconds for a keypress; the keys typed ("" for none)."""
        if self.fd is None:
            time.sleep(seconds)
            return ""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, seconds))
        if not ready:
            return ""
        try:
            return os.read(self.fd, 64).decode(errors="ignore")
        except OSError:
            return ""


@click.command()
@click.option("-i", "--interval", default=1.0, show_default=True, metavar="SECONDS",
              type=click.FloatRange(0.1, 3600), help="Time between refreshes.")
@click.option("-n", "--iterations", type=click.IntRange(1), metavar="N",
              help="Stop after N refreshes (default: until q or Ctrl-C).")
@click.option("--socket", "socket_path", metavar="PATH", help="The daemon's socket.")
def top(interval: float, iterations: int | None, socket_path: str | None) -> int | None:
    """Show the GPUs and jobs, refreshed every INTERVAL seconds; q or Ctrl-C quits.

    On a terminal the view is redrawn in place (on the alternate screen, as
    top does, unless -n is given); otherwise each refresh is printed after the last, like `top
    -b`. When the daemon stops answering (a restart), top says so and keeps
    trying.
    """
    from vgpuctl.cli import render
    from vgpuctl.cli.view import fetch, stamp

    data: dict[str, Any] | None = fetch(socket_path)   # no daemon at the start: exit 3
    console = render.console()
    _stop_on_signals()
    try:
        with Keys(enabled=render.is_tty()) as keys:
            if render.is_tty():
                from rich.live import Live

                # The alternate screen, as top uses, unless -n asks for a
                # last view that stays on the terminal.
                with Live(_frame(data, interval), console=console, auto_refresh=False,
                          screen=iterations is None, transient=False) as live:
                    n = 1
                    while iterations is None or n < iterations:
                        if any(k in QUIT_KEYS for k in keys.wait(interval)):
                            break
                        live.update(_frame(_poll(socket_path), interval), refresh=True)
                        n += 1
            else:
                n = 0
                while iterations is None or n < iterations:
                    if n:
                        if any(k in QUIT_KEYS for k in keys.wait(interval)):
                            break
                        data = _poll(socket_path)
                        sys.stdout.write("\n")
                    sys.stdout.write(stamp(time.time()) + "\n")
                    if data is None:
                        sys.stdout.write("daemon not answering, retrying\n")
                    else:
                        render.show(render.status_lines(data, None))
                    sys.stdout.flush()
                    n += 1
    except KeyboardInterrupt:
        pass
    except Stopped as e:
        return 128 + e.signum           # as a shell reports a command ended by it
    return None


def _poll(socket_path: str | None) -> dict[str, Any] | None:
    """The daemon's state, or None while it does not answer."""
    from vgpuctl.cli.view import fetch
    from vgpuctl.errors import DaemonUnavailable

    try:
        return fetch(socket_path)
    except DaemonUnavailable:
        return None


def _frame(data: dict[str, Any] | None, interval: float) -> Any:
    """One screen of top on a terminal: a title line, then the view."""
    from vgpuctl.cli import render
    from vgpuctl.cli.view import stamp

    title = render.note_line(f"vgpuctl top  {stamp(time.time())}  every {interval:g} s, "
                             "q to quit", "dim")
    if data is None:
        body = [render.note_line("daemon not answering, retrying", "yellow")]
    else:
        body = render.status_lines(data, render.width())
    return render.rich_text([title, [], *body])
