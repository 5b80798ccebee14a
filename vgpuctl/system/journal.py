"""Whether a stream is systemd's journal: under a unit, systemd connects
stdout/stderr to journald and sets ``JOURNAL_STREAM=DEVICE:INODE`` for that
stream (systemd.exec(5)). A line written there may start with ``<N>``, its
syslog priority (sd-daemon(3)). Imports only os: `vgpuctl run`'s error
path uses it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TextIO

ERR, WARNING, INFO = 3, 4, 6


def is_journal(stream: TextIO, env: Mapping[str, str] | None = None) -> bool:
    """Whether stream is the journal stream JOURNAL_STREAM names (and not,
    say, a file the service's output was redirected to)."""
    value = (os.environ if env is None else env).get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))
