"""A hostile user's side for the hostile tier: a small program run by a
plain system Python as nobody (uid 65534), so that the daemon sees a uid
other than root's. `as_nobody` starts it, or skips the test where that
can't run here."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from typing import Any

import pytest

NOBODY = 65534


def _drop() -> None:
    """In the child: room for many descriptors, then become nobody."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def as_nobody(code: str, *args: str, **kw: Any) -> subprocess.Popen[str]:
    """Start `python3 -c code args...` as nobody (stdin, stdout piped, text);
    skip the test when no Python runs as nobody here."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as nobody")
    py = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
    if py is None:
        pytest.skip("no system python3 to run as nobody")
    probe = subprocess.run([py, "-c", "pass"], preexec_fn=_drop, capture_output=True,
                           text=True, timeout=60, cwd="/")
    if probe.returncode != 0:
        pytest.skip(f"can't run {py} as nobody: {probe.stderr.strip()[-200:]}")
    kw.setdefault("stdin", subprocess.PIPE)
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.Popen([py, "-c", code, *args], preexec_fn=_drop, text=True,
                            cwd="/", **kw)
