"""sd_notify(3) without a dependency: tell systemd how the daemon is doing.

Under ``Type=notify`` systemd passes ``NOTIFY_SOCKET`` (a path, or an abstract
socket name starting with ``@``) and waits for ``READY=1`` before it counts the
service as started. Every function here is a no-op returning False when
``NOTIFY_SOCKET`` is unset, so the daemon calls them unconditionally.

    ready()        READY=1, once the socket listens
    reloading()    RELOADING=1 with MONOTONIC_USEC (systemd >= 253 wants it)
                   on SIGHUP; call ready() again when the reload is done
    stopping()     STOPPING=1 on SIGTERM

Each takes an optional status text, sent as STATUS=... (shown by
`systemctl status`).

The process that started the daemon may hear the same news on a pipe
(``vgpuctl daemon --ready-fd N``, set_ready_fd): one JSON line in the wire
protocol's reply form (vgpuctl.core.protocol), written once, then the pipe
is closed. ready() writes ``{"v": 1, "ok": true, "pid": PID}``;
start_failed(exc), when the start fails before that, the error's wire code,
message and exit status (``{"v": 1, "ok": false, "error": {"code": ...,
"message": ...}, "exit": N}``), from which `vgpuctl run` raises the same
error.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from vgpuctl.core import protocol as P
from vgpuctl.errors import UsageError, VgpuError

ENV = "NOTIFY_SOCKET"

_ready_fd: int | None = None     # the starter's pipe, until the start's news is written


def set_ready_fd(fd: int) -> None:
    """Write the start's news (ready, or the error that stopped it) to fd,
    a pipe's write end the starter passed; UsageError when fd is not open."""
    global _ready_fd
    try:
        os.fstat(fd)
        os.set_inheritable(fd, False)     # not for the daemon's own children
    except (OSError, OverflowError):
        raise UsageError(f"--ready-fd {fd}: not an open file descriptor") from None
    _ready_fd = fd


def _tell_starter(msg: dict[str, Any]) -> bool:
    """Write msg to the ready fd, once, and close it."""
    global _ready_fd
    fd, _ready_fd = _ready_fd, None
    if fd is None:
        return False
    try:
        os.write(fd, P.encode(msg))
        return True
    except OSError:
        return False        # the starter is gone: nobody to tell
    finally:
        os.close(fd)


def start_failed(exc: BaseException) -> bool:
    """Tell the starter that the start failed with exc (a no-op once ready()
    has told it the daemon listens, or without a ready fd)."""
    if isinstance(exc, VgpuError):
        msg = P.error(P.error_code(exc), str(exc))
        msg["exit"] = exc.exit_code
    else:
        text = " ".join(str(exc).split())
        msg = P.error("internal", f"internal error: {type(exc).__name__}"
                      + (f": {text}" if text else ""))
        msg["exit"] = 1
    return _tell_starter(msg)


def _address(env: Mapping[str, str]) -> str | None:
    addr = env.get(ENV, "")
    if not addr:
        return None
    if addr.startswith("@"):
        return "\0" + addr[1:]  # abstract namespace
    if addr.startswith("/"):
        return addr
    return None  # vsock: and other forms are not for a local daemon


def notify(*fields: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``KEY=VALUE`` fields, one datagram, newline separated. Returns
    True when sent; False when NOTIFY_SOCKET is unset or the send failed (a
    daemon does not stop for a notification it could not deliver)."""
    addr = _address(os.environ if env is None else env)
    if addr is None or not fields:
        return False
    for f in fields:
        if "=" not in f or "\n" in f:
            raise ValueError(f"not a notify field: {f!r}")
    msg = "\n".join(fields).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(msg)
    except OSError:
        return False
    return True


def _status_field(text: str | None) -> list[str]:
    return [] if text is None else ["STATUS=" + " ".join(text.splitlines())]


def ready(status_text: str | None = None, env: Mapping[str, str] | None = None) -> bool:
    _tell_starter(P.ok(pid=os.getpid()))
    return notify("READY=1", *_status_field(status_text), env=env)


def reloading(status_text: str | None = None, env: Mapping[str, str] | None = None) -> bool:
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify("RELOADING=1", f"MONOTONIC_USEC={usec}", *_status_field(status_text),
                  env=env)


def stopping(status_text: str | None = None, env: Mapping[str, str] | None = None) -> bool:
    return notify("STOPPING=1", *_status_field(status_text), env=env)
