"""The lines vgpuctl's programs write about themselves on stderr, in one form:

    vgpuctl: error: MESSAGE
    vgpuctl: warning: MESSAGE
    vgpuctl: MESSAGE                (a notice: what was done on the user's behalf)

each one line. The programs' edges (vgpuctl.cli.main, and vgpu-burn's
vgpuctl.cli.burn.main) write the error lines; commands write warnings and
notices through here too. Imports nothing but os and sys (both loaded by
the interpreter's start-up): `vgpuctl run` and vgpu-burn load it on their
way to exec. Under systemd, errors and warnings carry their syslog
priority for the journal (vgpuctl.system.journal).
"""

from __future__ import annotations

import os
import sys

PROG = "vgpuctl"


def one_line(text: str) -> str:
    """text's lines joined by spaces: a message takes one line on stderr."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def error_line(message: str, prog: str = PROG) -> str:
    return f"{prog}: error: {one_line(message)}"


def internal_error_line(exc: BaseException, traceback_shown: bool, prog: str = PROG) -> str:
    """The line for an exception nobody expected (a bug): its type and message,
    and how to see its traceback when it was not shown."""
    text = one_line(str(exc))
    line = f"{prog}: internal error: {type(exc).__name__}" + (f": {text}" if text else "")
    return line if traceback_shown else line + " (rerun with VGPU_DEBUG=1 for the traceback)"


def write(line: str, priority: int | None = None) -> None:
    """line on stderr; under systemd (stderr is the journal), with its
    syslog priority in front, so `journalctl -p err` finds a unit's errors
    (a bad config at `vgpuctl daemon`'s start, a failed ExecReload)."""
    if priority is not None and "JOURNAL_STREAM" in os.environ:
        from vgpuctl.system import journal

        if journal.is_journal(sys.stderr):
            line = f"<{priority}>{line}"
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def error(message: str, prog: str = PROG) -> None:
    write(error_line(message, prog), priority=3)


def warn(message: str, prog: str = PROG) -> None:
    write(f"{prog}: warning: {one_line(message)}", priority=4)


def note(message: str, prog: str = PROG) -> None:
    write(f"{prog}: {one_line(message)}")
