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
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

ENV = "NOTIFY_SOCKET"


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
    return notify("READY=1", *_status_field(status_text), env=env)


def reloading(status_text: str | None = None, env: Mapping[str, str] | None = None) -> bool:
    usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    return notify("RELOADING=1", f"MONOTONIC_USEC={usec}", *_status_field(status_text),
                  env=env)


def stopping(status_text: str | None = None, env: Mapping[str, str] | None = None) -> bool:
    return notify("STOPPING=1", *_status_field(status_text), env=env)
