"""A command on a terminal of a given size, for tests of what users see
there: a pseudo-terminal (pty) with its window set to COLS x ROWS, the
command's output read back with its escape sequences removed."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import termios
import time
from collections.abc import Sequence

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]|\x1b[=>]")


def plain(text: str) -> str:
    """text without terminal escape sequences or carriage returns."""
    return _ESCAPES.sub("", text).replace("\r", "")


class Terminal:
    """argv running with a pty as stdin, stdout and stderr."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], cols: int = 80,
                 rows: int = 30) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
        env["TERM"] = "xterm-256color"
        self.proc = subprocess.Popen(list(argv), env=env, stdin=slave, stdout=slave,
                                     stderr=slave, start_new_session=True)
        os.close(slave)
        self.raw = b""

    def read(self, timeout: float = 0.1) -> str:
        """What has been written so far (everything, as plain text)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.master], [], [], max(0.0, left))
            if not ready:
                break
            try:
                chunk = os.read(self.master, 65536)
            except OSError:     # the command exited and closed the pty
                break
            if not chunk:
                break
            self.raw += chunk
        return plain(self.raw.decode(errors="replace"))

    def wait_for(self, needle: str, timeout: float = 20.0, after: int = 0) -> str:
        """Read until needle shows (past the first ``after`` characters);
        fail the test at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.read(0.05)
            if needle in out[after:]:
                return out
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} on the terminal within {timeout} s:\n"
                                     + out[-2000:])

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def finish(self, timeout: float = 20.0) -> tuple[int, str]:
        """Wait for the command to exit; (exit status, all it wrote)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read(0.05)
        if self.proc.poll() is None:
            self.close()
            raise AssertionError(f"still running after {timeout} s:\n" + self.read()[-2000:])
        out = self.read(0.2)
        self.close()
        return self.proc.returncode, out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        try:
            os.close(self.master)
        except OSError:
            pass


def run(argv: Sequence[str], env: dict[str, str], cols: int = 80, rows: int = 30,
        timeout: float = 30.0) -> tuple[int, str]:
    """Run argv to its end on a COLS x ROWS terminal; (exit status, output)."""
    return Terminal(argv, env, cols, rows).finish(timeout)
