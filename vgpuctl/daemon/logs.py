"""The daemon's log lines on stderr, in the form the reader wants, and
never more of them than a client can be allowed to cause.

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

What a client can make the daemon log (a bad request, a request that
fails, connections over a cap) goes through a Burst: the first line of a
burst, then at most one line per EVERY_S with a count, and the count when
it stops.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO

from vgpuctl.core.protocol import escape_controls
from vgpuctl.system import journal

log = logging.getLogger("vgpuctl.daemon")

# logging's levels as syslog priorities (sd-daemon(3)).
PRIORITY = {logging.CRITICAL: 2, logging.ERROR: journal.ERR, logging.WARNING: journal.WARNING,
            logging.INFO: journal.INFO, logging.DEBUG: 7}

PLAIN_FORMAT = "%(asctime)s vgpud[%(process)d] %(levelname)s %(message)s"
CONTINUED = "  "        # the start of a traceback's lines after their message

QUIET_S = 5.0           # a burst ends after this long without another event
EVERY_S = 60.0          # while a burst goes on, a line with its count this often
MAX_KINDS = 64          # kinds of events a Bursts tells apart; more share one


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


class Burst:
    """One kind of repeated event (a client's bad line, a failing request),
    logged as: the first of a burst in full; while it goes on, at most one
    line per every_s with the count so far and the latest; and, once
    quiet_s pass without another, the count. Where an event loop runs, a
    timer notices the end; elsewhere, the next event does."""

    def __init__(self, what: str, level: int = logging.WARNING,
                 logger: logging.Logger | None = None, quiet_s: float = QUIET_S,
                 every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.level = level
        self.log = logger or log
        self.quiet_s = quiet_s
        self.every_s = every_s
        self.clock = clock
        self.count = 0                      # events in this burst
        self.first = self.last = self.said = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def hit(self, detail: str) -> bool:
        """Count one event; log it if its burst may say more now. Returns
        whether a line was written."""
        now = self.clock()
        if self.count and now - self.last >= self.quiet_s:
            self.end()
        self.last = now
        self.count += 1
        if self.count == 1:
            self.first = self.said = now
            self.log.log(self.level, "%s: %s (more are counted, not logged, until it stops)",
                         self.what, detail)
            self._arm()
            return True
        if now - self.said >= self.every_s:
            self.said = now
            self.log.log(self.level, "%s: %d in %.0f s, still going; the latest: %s",
                         self.what, self.count, now - self.first, detail)
            return True
        return False

    def end(self) -> None:
        """Close the burst: its count, if it had more than its first line."""
        if self.count > 1:
            self.log.log(self.level, "%s: %d in %.1f s, now stopped", self.what, self.count,
                         self.last - self.first)
        self.count = 0
        self.cancel()

    def _arm(self, after: float | None = None) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(self.quiet_s if after is None else after, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.count == 0:
            return
        quiet = self.clock() - self.last
        if quiet < self.quiet_s:
            self._arm(self.quiet_s - quiet)
        else:
            self.end()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Bursts:
    """A Burst per kind of event (say, per request and exception type), so
    that a flood of one does not hide another; at most MAX_KINDS kinds,
    the rest counted together."""

    def __init__(self, what: str, level: int = logging.WARNING,
                 logger: logging.Logger | None = None, quiet_s: float = QUIET_S,
                 every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kinds: dict[str, Burst] = {}
        self._new = lambda: Burst(what, level, logger, quiet_s, every_s, clock)

    def hit(self, kind: str, detail: str) -> bool:
        """Count one event of a kind (Burst.hit)."""
        if kind not in self.kinds and len(self.kinds) >= MAX_KINDS - 1:   # "" is the last
            kind, detail = "", f"({kind}) {detail}"
        b = self.kinds.get(kind)
        if b is None:
            b = self.kinds[kind] = self._new()
        return b.hit(detail)

    def cancel(self) -> None:
        for b in self.kinds.values():
            b.cancel()
