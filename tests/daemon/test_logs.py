"""The daemon's log: a message is one line whatever text a user chose, in
the plain form and journald's, and a traceback's lines can't pass for
messages."""

from __future__ import annotations

import logging
import re

from vgpuctl.daemon import logs

FORGED = "2099-01-01 00:00:00,000 vgpud[1] ERROR forged"
PLAIN_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} vgpud\[\d+\] [A-Z]+ ")


def record(msg: str, *args: object, exc: BaseException | None = None,
           level: int = logging.WARNING) -> logging.LogRecord:
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("vgpuctl.daemon", level, __file__, 1, msg, args, info)


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:
        return e


def test_a_message_is_one_line_whatever_its_text():
    """A job name, command or directory with a newline, a carriage return
    or an escape sequence can't start a line of its own in the log."""
    evil = f"x\n{FORGED}\r{FORGED}\x1b[2K\u2028{FORGED}\x85"
    plain = logs.Formatter(logs.PLAIN_FORMAT).format(record("job 3 (%s) admitted", evil))
    assert len(plain.splitlines()) == 1 and PLAIN_LINE.match(plain), plain
    assert "\\n" + FORGED in plain and "\x1b" not in plain and "\r" not in plain
    journal = logs.JournalFormatter("%(message)s").format(record("job (%s)", evil))
    assert journal.startswith("<4>job (x\\n2099") and len(journal.splitlines()) == 1
    assert journal.isprintable()


def test_a_traceback_is_indented_under_its_message():
    """The lines of a traceback follow their message, indented: no line of
    it starts like a message, even when the exception's text is forged."""
    exc = raised(KeyError(f"k\n{FORGED}"))
    for fmt, first in ((logs.Formatter(logs.PLAIN_FORMAT), PLAIN_LINE),
                       (logs.JournalFormatter("%(message)s"), re.compile(r"<3>failed$"))):
        lines = fmt.format(record("failed", exc=exc, level=logging.ERROR)).split("\n")
        assert first.match(lines[0]), lines
        assert len(lines) > 3
        rest = [ln.removeprefix("<3>") for ln in lines[1:]]
        assert all(ln.startswith(logs.CONTINUED) for ln in rest), lines
        assert any("Traceback" in ln for ln in rest)
        assert not any(PLAIN_LINE.match(ln) for ln in rest)

