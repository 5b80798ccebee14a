"""What `vgpuctl status`, `ps` and `gpus` share: fetching the node's state,
the output options (--format, --json, --fields, --no-header, --units) and
--loop, which repeats a command every N seconds as ``nvidia-smi -l`` does.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import click

from vgpuctl.core import nodeview, output

TIMESTAMP = "timestamp"     # the --fields name of a frame's time


def fetch(socket_path: str | None, all_jobs: bool = False) -> dict[str, Any]:
    """The daemon's ps reply."""
    from vgpuctl.client.connection import connect

    with connect(socket_path) as cl:
        return cl.call("ps", all=all_jobs or None)


def fetch_or_nvml(socket_path: str | None) -> dict[str, Any]:
    """The daemon's ps reply; with no daemon, the GPUs as NVML sees them
    (``daemon`` null, no jobs). When NVML fails too, its error (exit 9; 2
    for a bad VGPU_SIM), which says that no daemon answers either."""
    from vgpuctl.errors import DaemonUnavailable, NvmlUnavailable, VgpuError

    try:
        return fetch(socket_path)
    except DaemonUnavailable as e:
        from vgpuctl.system.nvml import query

        try:
            stats = query()
        except VgpuError as nv:
            raise type(nv)(f"{nv}; and {e}", exit_code=nv.exit_code) from None
        except Exception as nv:       # pynvml's NVMLError past its start, a failed load
            raise NvmlUnavailable(f"NVML failed ({type(nv).__name__}: {nv}); and {e}") \
                from None
        return {"v": 1, "daemon": None, "jobs": [], "gpus": [
            {"index": g.index, "uuid": g.uuid, "name": g.name, "memory_total": g.memory_total,
             "memory_used": g.memory_used, "utilization": g.utilization,
             "committed": None, "capacity": None, "jobs": None, "parent": g.parent,
             "mig": g.mig} for g in stats]}


class Output(NamedTuple):
    """The output options of one command, checked."""

    fmt: str
    fields: list[str] | None      # None: the command's default view
    header: bool
    units: str
    loop: float | None

    def names(self, known: dict[str, output.Field], default: tuple[str, ...]) -> list[str]:
        """The fields for CSV: --fields, else the default (with the
        frame's timestamp first under --loop)."""
        if self.fields is not None:
            return self.fields
        return [TIMESTAMP, *default] if self.loop else list(default)


def output_options(known: dict[str, output.Field]) -> Callable[[Any], Any]:
    """Add --format, --json, --fields, --no-header, --units and --loop to a
    command; it receives them as one ``out`` argument (an Output). known:
    the fields --fields may name."""
    names = ", ".join([*known, TIMESTAMP])

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(fmt: str, as_json: bool, fields: str | None, no_header: bool,
                    units: str | None, loop_s: float | None = None, **kw: Any) -> Any:
            from vgpuctl.errors import UsageError

            if as_json and fmt not in ("table", "json"):
                raise UsageError(f"--json and --format {fmt}: give one of them")
            fmt = "json" if as_json else fmt
            chosen = nodeview.parse_fields(fields, known, (), extra=(TIMESTAMP,)) \
                if fields is not None else None
            units = units or ("human" if fmt == "table" else "mib")
            return f(out=Output(fmt, chosen, not no_header, units, loop_s), **kw)

        functools.update_wrapper(wrapper, f)     # f's docstring and click options too
        del wrapper.__wrapped__  # type: ignore[attr-defined]  # click reads the wrapper's
        opts = [
            click.option("--format", "fmt", type=click.Choice(nodeview.FORMATS), default="table",
                         show_default=True, help="table (fitted to the terminal; whole "
                         "off a terminal), csv (RFC 4180, units in the headers) or json."),
            click.option("--json", "as_json", is_flag=True, help="Same as --format json."),
            click.option("--fields", metavar="F,F,...",
                         help=f"The fields to show, in order (CSV, JSON, table): {names}."),
            click.option("--no-header", is_flag=True, help="No header line (table, CSV)."),
            click.option("--units", type=click.Choice(output.UNITS), default=None,
                         help="Memory as human sizes (4G), MiB numbers, or bytes (default: "
                              "human in tables, mib in CSV; JSON is always bytes)."),
            click.option(
                "--loop", "-l", "loop_s", type=click.FloatRange(0.1, 86400), metavar="SECONDS",
                help="Repeat every SECONDS until Ctrl-C, each frame after a timestamp line "
                     "(CSV: the timestamp field); keeps going while the daemon restarts."),
        ]
        for opt in reversed(opts):
            wrapper = opt(wrapper)
        return wrapper
    return decorate


def stamp(t: float) -> str:
    return output.iso_time(t)


def frame_extra(t: float | None) -> dict[str, Any]:
    """The values of a frame that are not a record's: its time, under --loop."""
    return {TIMESTAMP: stamp(t)} if t is not None else {}


def echo_csv(records: list[dict[str, Any]], out: Output, known: dict[str, output.Field],
             default: tuple[str, ...], t: float | None, first: bool) -> None:
    """One frame as CSV: the header (unless --no-header) on the first only."""
    click.echo(nodeview.to_csv(records, out.names(known, default), known, out.units,
                               out.header and first, frame_extra(t)), nl=False)


def frame_head(t: float | None, first: bool) -> list[Any]:
    """A table frame's first lines: under --loop a blank line between frames,
    then the frame's timestamp."""
    from vgpuctl.cli import render

    lines: list[Any] = [] if first or t is None else [[]]
    if t is not None:
        lines.append(render.note_line(stamp(t), "dim"))
    return lines


def fields_lines(records: list[dict[str, Any]], out: Output,
                 known: dict[str, output.Field], t: float | None) -> list[Any]:
    """The table of just the --fields asked for."""
    from vgpuctl.cli import render

    return render.table_lines(nodeview.fields_table(records, out.fields or [], known, out.units,
                                                    frame_extra(t)),
                              render.width(), out.header)


def run_loop(out: Output, frame: Callable[[float, bool], None],
             sleep: Callable[[float], None] = time.sleep) -> int:
    """Call frame(time, first) now and then every out.loop seconds until
    Ctrl-C (exit 0). While no daemon answers (nor NVML, for status), say
    so once on stderr and keep trying; say so again when it is back."""
    from vgpuctl.cli import messages
    from vgpuctl.errors import DaemonUnavailable, NvmlUnavailable

    assert out.loop is not None
    down = False
    first = True
    next_at = time.monotonic()
    try:
        while True:
            try:
                frame(time.time(), first)
                first = False
                if down:
                    messages.note("the daemon answers again")
                    down = False
            except (DaemonUnavailable, NvmlUnavailable) as e:
                if not down:
                    messages.warn(f"{e}; retrying every {out.loop:g} s")
                    down = True
            sys.stdout.flush()
            next_at += out.loop
            delay = next_at - time.monotonic()
            if delay < 0:       # a slow frame: start again from now
                next_at, delay = time.monotonic(), 0.0
            sleep(delay)
    except KeyboardInterrupt:
        return 0
