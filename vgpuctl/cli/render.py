"""Showing tables: `vgpuctl status`, `ps`, `top`, `gpus`, `report` and the
demo (rich lives here and only here).

The tables themselves are built and fitted in the core (vgpuctl.core.nodeview,
vgpuctl.core.layout) as lines of (text, style) pieces; this module fits them
to the terminal and prints them, styled on a terminal and as plain text
elsewhere, where nothing is cut and no width is imposed.
"""

from __future__ import annotations

import errno
from datetime import tzinfo
from typing import Any

from rich.console import Console, RenderableType
from rich.text import Text

from vgpuctl.core import layout, nodeview
from vgpuctl.core.usage_report import (
    UsageReport,
    empty_line,
    iso_time,
    summary_table,
    terminal_table,
)


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """stdout's reader has gone (`vgpuctl ps | head`): leave it to
        vgpuctl.cli.main, which exits 0, rather than rich's exit 1."""
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "stdout's reader has gone")


_console: Console | None = None


def console() -> Console:
    global _console
    if _console is None:
        _console = _Console(highlight=False)
    return _console


def is_tty() -> bool:
    """Whether stdout is a terminal: only there are tables fitted to a
    width (and cut, with an ellipsis); elsewhere nothing is shortened."""
    import sys

    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def width() -> int | None:
    """The terminal's width, or None off a terminal (no limit)."""
    return console().width if is_tty() else None


Lines = list[list[tuple[str, str]]]


def table_lines(table: nodeview.Table, width: int | None, header: bool = True) -> Lines:
    cols, rows, plan = table
    return layout.lines(layout.fit(cols, rows, width, plan, header), cols, rows, header)


def note_line(text: str, style: str = "") -> list[tuple[str, str]]:
    return [(text, style)]


def status_lines(data: dict[str, Any], width: int | None, units: str = "human",
                 header: bool = True) -> Lines:
    """The status view: the GPUs, then the jobs (or why there are none)."""
    out = table_lines(nodeview.gpu_table(data.get("gpus", []), units), width, header)
    out.append([])
    jobs = data.get("jobs", [])
    if data.get("daemon") is None:
        out.append(note_line("no daemon running: jobs are not shown (vgpuctl run starts one)",
                             "yellow"))
    elif not jobs:
        out.append(note_line("no jobs"))
    else:
        out += table_lines(nodeview.job_table(jobs, units), width, header)
    return out


def rich_text(lines: Lines) -> Text:
    """The lines as one rich Text (a terminal's view, for Live too), each
    cropped at the terminal's edge rather than wrapped."""
    t = Text(no_wrap=True, overflow="crop", end="")
    for i, ln in enumerate(lines):
        if i:
            t.append("\n")
        for piece, style in ln:
            t.append(piece, style=style or None)
    return t


def show(lines: Lines) -> None:
    """Print lines: styled on a terminal, plain text elsewhere."""
    if is_tty():
        console().print(rich_text(lines), crop=True, overflow="crop")
    else:
        import sys

        sys.stdout.write(layout.plain(lines))


def summary_lines(report: UsageReport) -> Lines:
    """The closing report of `vgpuctl demo`: a title, then each job's limits
    beside what it got (vgpuctl.core.usage_report.summary_table)."""
    if not report.rows:
        return [note_line(empty_line(report).rstrip(), "dim")]
    title = note_line("What each job got (GPU share: its GPU time over its run time):", "bold")
    return [title, *table_lines(summary_table(report), width())]


def status_view(data: dict[str, Any]) -> RenderableType:
    """The status view as a rich renderable, fitted to the terminal."""
    return rich_text(status_lines(data, width()))


# -- reports -------------------------------------------------------------------
def report_lines(report: UsageReport, tz: tzinfo | None = None) -> Lines:
    """`vgpuctl report` on a terminal: a title, then the report fitted to the
    terminal (vgpuctl.core.usage_report.terminal_table), or a line when empty."""
    if not report.rows:
        return [note_line(empty_line(report, tz).rstrip(), "dim")]
    title = (f"GPU usage by {report.by}, {iso_time(report.since, tz)} to "
             f"{iso_time(report.until, tz)}"
             + (f", {report.only_user}'s jobs only" if report.only_user else ""))
    return [note_line(title, "bold"), *table_lines(terminal_table(report, tz), width())]
