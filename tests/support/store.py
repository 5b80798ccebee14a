"""Databases as the daemon writes them, for tests of the store and of
retention: jobs with a minute of usage each."""

from __future__ import annotations

import os
import sqlite3

from vgpuctl.core.accounting import Accountant
from vgpuctl.store.database import ENDED, JobRecord, Store
from vgpuctl.store.usage import create_schema, flush

GPU = "GPU-00000000-0000-0000-0000-000000000000"
DAY = 86400.0


def _job(name: str, state: str, t: float) -> JobRecord:
    return JobRecord(name=name, uid=os.getuid(), user="alice", command=[name], cwd="/",
                     gpus=[{"index": 0, "uuid": GPU}], mem_limit=1 << 30, core_share=50,
                     policy="hard", created=t - 60, started=t - 60,
                     ended=t if state == ENDED else None, state=state)


def fill_db(db, jobs: list[tuple[str, str, float]]) -> dict[str, str]:
    """Jobs (name, state, end time) with a minute of usage each; name -> id."""
    store = Store.open(db)
    ids = {name: store.insert_job(_job(name, state, t)) for name, state, t in jobs}
    create_schema(store.conn)
    a = Accountant()
    for name, _, t in jobs:
        for dt in range(60, -1, -10):      # one sample every 10 s: one row a job
            a.observe(ids[name], GPU, t - dt, 0.5, 1 << 30)
    flush(store.conn, a)
    store.close()
    return ids


def job_names(db) -> set[str]:
    c = sqlite3.connect(str(db))
    try:
        return {r[0] for r in c.execute("SELECT name FROM jobs")}
    finally:
        c.close()


def usage_rows(db, job_id: str) -> list:
    """The usage rows of one job in a daemon's database, as it wrote them."""
    from vgpuctl.store.usage import read_usage

    c = sqlite3.connect(str(db))
    try:
        return [r for r in read_usage(c) if r.job_id == job_id]
    finally:
        c.close()


def record(job_id: str, *, name: str = "", user: str = "", uid: int = 0,
           command: str = "", gpus: tuple[str, ...] = (), mem_limit: int = 1 << 30,
           core: int = 100, policy: str = "hard", start: float = 0.0,
           end: float | None = None, exit_code: int | None = None,
           exit_signal: int | None = None, **more) -> JobRecord:
    """A job's record as the daemon keeps it, from what a report shows of it
    (the command as one shell word list, GPUs by UUID)."""
    import shlex

    return JobRecord(name=name, uid=uid, user=user, command=shlex.split(command), cwd="/",
                     gpus=[{"index": i, "uuid": g} for i, g in enumerate(gpus)],
                     mem_limit=mem_limit, core_share=core, policy=policy, created=start,
                     started=start, ended=end, state=ENDED if end is not None else "running",
                     id=job_id, exit_code=exit_code, exit_signal=exit_signal, **more)
