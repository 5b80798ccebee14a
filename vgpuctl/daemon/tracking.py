"""Which processes belong to a job: pure functions over a process table, and
the one /proc reader that builds that table.

A process is named by (pid, start time), the start time being field 22 of
/proc/<pid>/stat in clock ticks since boot -- the same value the hook writes
into its slot -- so a reused pid is never taken for the original. A job's
processes are the pids it was seen with (its root pid, slot pids, earlier
descendants) that are still alive with the same start time, plus all their
descendants. Remembering every descendant once seen keeps a grandchild whose
parent exited (and which was reparented to init) in the job.
"""

from __future__ import annotations

import os
from collections.abc import Container, Mapping
from dataclasses import dataclass

from vgpuctl.system.procfs import read_stat


@dataclass(frozen=True)
class ProcInfo:
    ppid: int
    start: int      # clock ticks since boot


ProcTable = Mapping[int, ProcInfo]


def start_time(pid: int) -> int | None:
    """The start time of a live (not zombie) process, None when gone."""
    st = read_stat(pid)
    if st is None or st[2] in ("Z", "X"):
        return None
    return st[1]


def proc_uid(pid: int) -> int | None:
    """The (effective) uid a process runs as, None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def scan() -> dict[int, ProcInfo]:
    """Every live process of the machine (zombies excluded)."""
    out: dict[int, ProcInfo] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = read_stat(int(name))
        if st is not None and st[2] not in ("Z", "X"):
            out[int(name)] = ProcInfo(st[0], st[1])
    return out


def children_map(table: ProcTable) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid, info in table.items():
        out.setdefault(info.ppid, []).append(pid)
    return out


def alive(pid: int, start: int | None, table: ProcTable) -> bool:
    info = table.get(pid)
    return info is not None and start is not None and info.start == start


def job_processes(seeds: Mapping[int, int], table: ProcTable,
                  children: Mapping[int, list[int]] | None = None,
                  exclude: Container[int] = ()) -> dict[int, int]:
    """{pid: start} of the job: the seeds still alive (same start time) and
    all their descendants, except the descendants in exclude (the roots of
    other jobs, started from inside this one) and their subtrees."""
    if children is None:
        children = children_map(table)
    skip = exclude
    out = {p: s for p, s in seeds.items() if alive(p, s, table)}
    stack = list(out)
    while stack:
        p = stack.pop()
        for c in children.get(p, ()):
            if c not in out and c not in skip:
                out[c] = table[c].start
                stack.append(c)
    return out
