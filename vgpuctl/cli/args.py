"""Checking command-line values: each mistake is a UsageError (one line,
exit 2), raised before anything is sent to the daemon."""

from __future__ import annotations

import signal

from vgpuctl.core.sizes import parse_size
from vgpuctl.errors import UsageError


def mem(text: str | None, option: str = "--mem") -> int | None:
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as e:
        raise UsageError(f"{option}: {e}") from None


def core(text: str | None) -> int | None:
    if text is None:
        return None
    t = text.strip().rstrip("%")
    if not t.isdigit() or not 1 <= int(t) <= 100:
        raise UsageError(f"--core: {text!r} is not a percentage from 1 to 100")
    return int(t)


def gpus(text: str | None, gpu: str | None = None) -> int | None:
    """--gpus N: how many GPUs (1 or more; not with --gpu)."""
    if text is None:
        return None
    t = text.strip()
    if not t.isdigit() or int(t) > 1024:
        raise UsageError(f"--gpus: {text!r} is not a number of GPUs")
    if int(t) < 1:
        raise UsageError(f"--gpus {t}: a job needs at least one GPU")
    if gpu is not None:
        raise UsageError("--gpus and --gpu: give one (--gpus N picks N GPUs, "
                         "--gpu A,B names them)")
    return int(t)


def policy(text: str | None) -> str | None:
    if text is None:
        return None
    t = text.strip().lower()
    if t not in ("hard", "soft"):
        raise UsageError(f"--policy: {text!r} is not hard or soft")
    return t


def priority(text: str | None) -> str | None:
    if text is None:
        return None
    t = text.strip().lower()
    if t not in ("low", "normal", "high"):
        raise UsageError(f"--priority: {text!r} is not low, normal or high")
    return t


def job_id(text: str) -> str:
    t = text.strip()
    if not t.isdigit() or len(t) > 19:
        raise UsageError(f"{text!r} is not a job id (a number, as `vgpuctl ps` shows)")
    return str(int(t))


def signal_number(text: str) -> int:
    t = text.strip().upper()
    if t.isdigit():
        n = int(t)
        if 1 <= n <= 64:
            return n
    else:
        name = t if t.startswith("SIG") else "SIG" + t
        try:
            return int(signal.Signals[name])
        except KeyError:
            pass
    raise UsageError(f"--signal: {text!r} is not a signal (try TERM, KILL, INT or 9)")
