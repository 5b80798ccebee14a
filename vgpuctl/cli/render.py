"""Tables for `vgpuctl status`, `ps` and `top` (rich lives here and only here).

Input is the daemon's `ps` reply as a dict (docs/cli.md lists the fields).
"""

from __future__ import annotations

import errno
import shlex
from collections.abc import Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

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
