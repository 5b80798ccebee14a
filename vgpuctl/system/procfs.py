"""/proc/<pid>/stat, read the one way both the daemon (which processes are a
job's) and `vgpuctl run` (what its command left behind) need. Light on
purpose: `vgpuctl run` imports it."""

from __future__ import annotations


def read_stat(pid: int | str) -> tuple[int, int, str] | None:
    """(ppid, start time in clock ticks since boot, state) of a process;
    None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return int(rest[1]), int(rest[19]), rest[0].decode()
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int | None:
    """The start time of a live (not zombie) process, None when gone."""
    st = read_stat(pid)
    if st is None or st[2] in ("Z", "X"):
        return None
    return st[1]


def thread_count(pid: int) -> int:
    """The threads of a process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return 0
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return int(rest[17])
    except (IndexError, ValueError):
        return 0
