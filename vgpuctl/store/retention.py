"""Retention: ended jobs and usage rows older than ``retention_days`` go.

The daemon runs ``prune_batch`` at start and then hourly, a batch at a
time with the event loop free in between, so a database that grew for
months shrinks without stalling requests.
"""

from __future__ import annotations

from collections.abc import Iterable

from vgpuctl.store import usage
from vgpuctl.store.database import Store

BATCH = 5000
DAY_S = 86400.0


def cutoff(now: float, retention_days: int) -> float:
    """The Unix time before which records go."""
    return now - retention_days * DAY_S


def prune_batch(store: Store, before: float, keep: Iterable[str] = (),
                batch: int = BATCH) -> tuple[int, int]:
    """Delete up to ``batch`` old ended jobs and ``batch`` old usage rows
    (never those of the jobs in ``keep``). Returns (jobs, rows) deleted;
    both below ``batch`` means nothing old is left."""
    jobs = store.prune_ended(before, batch)
    rows = usage.prune(store.conn, before, keep, batch)
    return jobs, rows
