"""The daemon's log lines on stderr, in the form the reader wants.

Under systemd, stderr is a stream into journald (``JOURNAL_STREAM`` names
its device and inode): each line starts with ``<N>``, its syslog priority,
so that ``journalctl -p err`` finds the errors, and carries no timestamp or
pid of its own (the journal records both). Anywhere else (a terminal, the
user daemon's vgpud.log): ``TIME vgpud[PID] LEVEL message``.

A message is one line: the control characters in it (a job's command or
directory, or the name taken from its command, may hold a newline, a
carriage return, an escape) are written as escapes (``\\n``, ``\\x1b``;
protocol.escape_controls), so that no text a user chose can forge a line
of its own. The lines of a traceback that follow a message are indented
by two spaces: no line the daemon writes starts like a message but a
message.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import TextIO

from vgpuctl.core.protocol import escape_controls
from vgpuctl.system import journal

# logging's levels as syslog priorities (sd-daemon(3)).
PRIORITY = {logging.CRITICAL: 2, logging.ERROR: journal.ERR, logging.WARNING: journal.WARNING,
            logging.INFO: journal.INFO, logging.DEBUG: 7}

PLAIN_FORMAT = "%(asctime)s vgpud[%(process)d] %(levelname)s %(message)s"
CONTINUED = "  "        # the start of a traceback's lines after their message


class Formatter(logging.Formatter):
    """logging.Formatter, but a message is one line with its control
    characters escaped, and a traceback's lines are indented."""

    def format(self, record: logging.LogRecord) -> str:
        record.message = escape_controls(record.getMessage())
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        text = self.formatMessage(record)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        more = [record.exc_text] if record.exc_text else []
        if record.stack_info:
            more.append(self.formatStack(record.stack_info))
        for block in more:
            for line in block.split("\n"):
                text += "\n" + CONTINUED + escape_controls(line)
        return text


class JournalFormatter(Formatter):
    """``<N>message``; every line of a multi-line record (a traceback) gets
    the prefix, since journald reads each line as its own entry."""

    def format(self, record: logging.LogRecord) -> str:
        prio = PRIORITY.get(record.levelno)
        if prio is None:
            prio = 3 if record.levelno > logging.WARNING else 6
        text = super().format(record)
        return "\n".join(f"<{prio}>{line}" for line in text.split("\n"))


def setup(level: str, stream: TextIO | None = None,
          env: Mapping[str, str] | None = None) -> None:
    """Send the vgpuctl loggers to stream (default stderr) at level, once;
    asyncio's warnings and errors (a callback that raised) go there too,
    in the same form."""
    root = logging.getLogger("vgpuctl")
    if not root.handlers:
        out = sys.stderr if stream is None else stream
        h = logging.StreamHandler(out)
        h.setFormatter(JournalFormatter("%(message)s") if journal.is_journal(out, env)
                       else Formatter(PLAIN_FORMAT))
        root.addHandler(h)
        root.propagate = False
        aio = logging.getLogger("asyncio")
        if not aio.handlers:
            aio.addHandler(h)
            aio.setLevel(logging.WARNING)
            aio.propagate = False
    root.setLevel(level.upper())
