"""A child process talked to in lines: commands to its stdin, one JSON
object a line back on its stdout, read without blocking the test past a
deadline (the suspend and checkpoint tests' jobs)."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import time
from typing import Any


class Talker:
    """Subclasses start ``proc`` (stdin and stdout pipes) and call
    `listen`; ``what`` names the child in failures, ``reply_s`` is how long
    `reply` waits by default."""

    what = "the child"
    reply_s = 60.0
    proc: subprocess.Popen[Any]

    def listen(self, proc: subprocess.Popen[Any]) -> None:
        self.proc = proc
        self.sel = selectors.DefaultSelector()
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.sel.register(self.fd, selectors.EVENT_READ)
        self.buf = b""

    def send(self, cmd: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float | None = None) -> Any:
        """The next line; fails the test after timeout seconds."""
        timeout = self.reply_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sel.select(left):
                raise AssertionError(f"{self.what} said nothing within {timeout} s")
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise AssertionError(f"{self.what} ended: {self.proc.stderr.read()}")  # type: ignore
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def pending(self) -> bool:
        """Whether a line is waiting (without blocking)."""
        if b"\n" in self.buf:
            return True
        if self.sel.select(0):
            self.buf += os.read(self.fd, 65536)
        return b"\n" in self.buf

    def talk(self, cmd: str) -> Any:
        self.send(cmd)
        return self.reply()
