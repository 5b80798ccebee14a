"""The daemon's log lines on stderr, in the form the reader wants.

Under systemd, stderr is a stream into journald (``JOURNAL_STREAM`` names
its device and inode): each line starts with ``<N>``, its syslog priority,
so that ``journalctl -p err`` finds the errors, and carries no timestamp or
pid of its own (the journal records both). Anywhere else (a terminal, the
user daemon's vgpud.log): ``TIME vgpud[PID] LEVEL message``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import TextIO

from vgpuctl.system import journal

# logging's levels as syslog priorities (sd-daemon(3)).
PRIORITY = {logging.CRITICAL: 2, logging.ERROR: journal.ERR, logging.WARNING: journal.WARNING,
            logging.INFO: journal.INFO, logging.DEBUG: 7}

PLAIN_FORMAT = "%(asctime)s vgpud[%(process)d] %(levelname)s %(message)s"


class JournalFormatter(logging.Formatter):
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
    """Send the vgpuctl loggers to stream (default stderr) at level, once."""
    root = logging.getLogger("vgpuctl")
    if not root.handlers:
        out = sys.stderr if stream is None else stream
        h = logging.StreamHandler(out)
        h.setFormatter(JournalFormatter("%(message)s") if journal.is_journal(out, env)
                       else logging.Formatter(PLAIN_FORMAT))
        root.addHandler(h)
        root.propagate = False
    root.setLevel(level.upper())
