"""The supervisor daemon (vgpud): `vgpuctl daemon` runs it in the foreground.

    supervisor.py  the state and the answer to each request (no asyncio)
    tracking.py    which processes belong to a job (/proc, pure functions)
    server.py      the Unix socket: JSON lines, SO_PEERCRED
    lifecycle.py   start, loops, signals, stop

See docs/daemon.md.
"""

from __future__ import annotations

from vgpuctl.daemon.lifecycle import Options, run

__all__ = ["Options", "run"]
