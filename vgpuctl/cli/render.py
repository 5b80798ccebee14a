"""Tables for `vgpuctl status`, `ps`, `top` and `report` (rich lives here and
only here).

Input is the daemon's `ps` reply as a dict (docs/cli.md lists the fields).
"""

from __future__ import annotations

import errno
import shlex
from collections.abc import Callable, Sequence
from datetime import tzinfo
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from vgpuctl.core.report import (
    Report,
    ReportRow,
    columns,
    empty_line,
    iso_time,
    row_job,
    short_time,
)
from vgpuctl.core.sizes import format_size


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
        import os
        import sys

        width = None
        if not sys.stdout.isatty() and not os.environ.get("COLUMNS"):
            width = 160          # a pipe or a file: keep rows on one line
        _console = _Console(highlight=False, width=width)
    return _console


def _size(n: int | None) -> str:
    return "-" if n is None else format_size(n)


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _pids(pids: Sequence[int], most: int = 3) -> str:
    if not pids:
        return "-"
    shown = ",".join(str(p) for p in pids[:most])
    return shown + (f" +{len(pids) - most}" if len(pids) > most else "")


def _command(cmd: Sequence[str], width: int = 40) -> str:
    text = " ".join(shlex.quote(a) for a in cmd)
    return text if len(text) <= width else text[:width - 1] + "…"


def _percent(part: int | None, whole: int | None) -> str:
    if part is None or not whole:
        return ""
    return f" ({100 * part / whole:.0f}%)"


def gpu_table(gpus: Sequence[dict[str, Any]]) -> Table:
    t = Table(title=None, box=None, header_style="bold", pad_edge=False)
    t.add_column("GPU", justify="right", no_wrap=True)
    t.add_column("Name", no_wrap=True, overflow="ellipsis", max_width=24)
    t.add_column("Memory used/total", justify="right", no_wrap=True)
    t.add_column("Util", justify="right", no_wrap=True)
    t.add_column("Limits/capacity", justify="right", no_wrap=True)
    t.add_column("Jobs", justify="right", no_wrap=True)
    t.add_column("UUID", style="dim", no_wrap=True, overflow="ellipsis", min_width=8)
    for g in gpus:
        util = g.get("utilization")
        committed = g.get("committed")
        t.add_row(
            str(g["index"]), g["name"],
            f"{_size(g.get('memory_used'))} / {_size(g['memory_total'])}"
            + _percent(g.get("memory_used"), g["memory_total"]),
            "-" if util is None else f"{util}%",
            "-" if committed is None else f"{_size(committed)} / {_size(g.get('capacity'))}",
            "-" if g.get("jobs") is None else str(g["jobs"]),
            g["uuid"])
    return t


def job_table(jobs: Sequence[dict[str, Any]]) -> Table:
    t = Table(box=None, header_style="bold", pad_edge=False)
    t.add_column("Job", justify="right", no_wrap=True)
    t.add_column("Name", no_wrap=True, max_width=16, overflow="ellipsis")
    t.add_column("User", no_wrap=True, max_width=12, overflow="ellipsis")
    t.add_column("PIDs", no_wrap=True)
    t.add_column("GPU", justify="right", no_wrap=True)
    t.add_column("Mem used/limit", justify="right", no_wrap=True)
    t.add_column("Core target/meas.", justify="right", no_wrap=True)
    t.add_column("Time", justify="right", no_wrap=True)
    t.add_column("Command", overflow="ellipsis", no_wrap=True, ratio=1, min_width=8)
    for j in jobs:
        measured = j.get("core_measured")
        core = f"{j['core']}% / " + ("-" if measured is None else f"{100 * measured:.0f}%")
        if j.get("policy") == "soft":
            core += " soft"
        mem = f"{_size(j.get('mem_used'))} / {_size(j['mem_limit'])}"
        mem_text = Text(mem, style="bold red" if j.get("over_limit") else "")
        state = j.get("state")
        time_text = _duration(j.get("runtime_s"))
        if state == "ended":
            code = j.get("exit_code")
            sig = j.get("exit_signal")
            time_text += " ended" + (f" sig {sig}" if sig else f" ({code})" if code is not None
                                     else "")
        elif state == "starting":
            time_text = "starting"
        t.add_row(str(j["id"]), j["name"], j["user"], _pids(j.get("pids", [])),
                  "-" if j.get("gpu") is None else str(j["gpu"]), mem_text, core, time_text,
                  _command(j.get("command", [])))
    return t


def status_view(data: dict[str, Any]) -> RenderableType:
    parts: list[RenderableType] = [gpu_table(data.get("gpus", [])), Text("")]
    daemon = data.get("daemon")
    jobs = data.get("jobs", [])
    if daemon is None:
        parts.append(Text("no daemon running: jobs are not shown (vgpuctl run starts one)",
                          style="yellow"))
    elif not jobs:
        parts.append(Text("no jobs"))
    else:
        parts.append(job_table(jobs))
    return Group(*parts)


def print_status(data: dict[str, Any]) -> None:
    console().print(status_view(data))


def print_jobs(jobs: Sequence[dict[str, Any]]) -> None:
    if not jobs:
        console().print("no jobs")
        return
    console().print(job_table(jobs))


# -- reports -------------------------------------------------------------------
_SHORT_HEADERS = {"job_id": "job", "exit_status": "exit", "memory_limit": "mem limit",
                  "core_limit": "core", "gpu_time": "GPU time", "memory_time": "mem time",
                  "peak_memory": "peak mem", "gpu_uuid": "GPU"}


def report_table(report: Report, tz: tzinfo | None = None) -> RenderableType:
    """A rich Table (for terminals) or a Text line when the report is empty.
    Compacter than the plain text: short GPU ids and times, no uid, the
    command cut to fit."""
    if not report.rows:
        return Text(empty_line(report, tz).rstrip(), style="dim")
    title = (f"GPU usage by {report.by}, {iso_time(report.since, tz)} to "
             f"{iso_time(report.until, tz)}")
    t = Table(title=title, title_justify="left", header_style="bold", box=None,
              pad_edge=False)
    compact: dict[str, Callable[[ReportRow], str]] = {
        "gpus": lambda r: " ".join(g[:12] for g in row_job(r).gpus),
        "start": lambda r: short_time(row_job(r).start, tz),
        "end": lambda r: short_time(row_job(r).end, tz),
    }
    cols = [c for c in columns(report.by, tz) if c.json_key != "uid"]
    for c in cols:
        last = c.json_key == "command"
        name, _, unit = c.header.partition(" ")
        name = _SHORT_HEADERS.get(name, name.replace("_", " "))
        t.add_column(Text(f"{name}\n{unit}" if unit else name),
                     justify="right" if c.numeric else "left",
                     no_wrap=True, overflow="ellipsis", max_width=24 if last else None)
    for r in report.rows:
        t.add_row(*[Text(compact.get(c.json_key, c.text)(r)) for c in cols])
    return t
