"""Retention: ended jobs and usage rows older than retention_days are pruned
by the daemon, at start and then hourly; what is recent or still running
stays, and reports of a recent window read only what they need."""

from __future__ import annotations

import os
import sqlite3
import time

from daemon_fixture import needs_native, wait_for

from vgpuctl.core.accounting import Accountant
from vgpuctl.store import retention
from vgpuctl.store.jobs import ENDED, RUNNING, JobRecord, Store
from vgpuctl.store.reports import load
from vgpuctl.store.usage import create_schema, flush, read_usage

GPU = "GPU-00000000-0000-0000-0000-000000000000"
DAY = 86400.0


def _job(name: str, state: str, t: float) -> JobRecord:
    return JobRecord(name=name, uid=os.getuid(), user="alice", command=[name], cwd="/",
                     gpus=[{"index": 0, "uuid": GPU}], mem_limit=1 << 30, core_share=50,
                     policy="hard", created=t - 60, started=t - 60,
                     ended=t if state == ENDED else None, state=state)


def _fill(db, jobs: list[tuple[str, str, float]]) -> dict[str, str]:
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


def _names(db) -> set[str]:
    c = sqlite3.connect(str(db))
    try:
        return {r[0] for r in c.execute("SELECT name FROM jobs")}
    finally:
        c.close()


def test_prune_batch_takes_old_ended_jobs_and_their_usage(tmp_path):
    now = time.time()
    db = tmp_path / "vgpu.db"
    ids = _fill(db, [("old", ENDED, now - 100 * DAY), ("recent", ENDED, now - DAY),
                     ("running", RUNNING, now - 100 * DAY)])
    store = Store.open(db)
    before = retention.cutoff(now, 90)
    assert retention.prune_batch(store, before, keep=[ids["running"]]) == (1, 1)
    assert retention.prune_batch(store, before, keep=[ids["running"]]) == (0, 0)
    assert {r.job_id for r in read_usage(store.conn)} == {ids["recent"], ids["running"]}
    store.close()
    assert _names(db) == {"recent", "running"}


def test_prune_batch_is_bounded(tmp_path):
    now = time.time()
    db = tmp_path / "vgpu.db"
    _fill(db, [(f"old{i}", ENDED, now - 100 * DAY) for i in range(5)])
    store = Store.open(db)
    before = retention.cutoff(now, 90)
    assert retention.prune_batch(store, before, batch=2) == (2, 2)
    assert retention.prune_batch(store, before, batch=2) == (2, 2)
    assert retention.prune_batch(store, before, batch=2) == (1, 1)
    store.close()
    assert _names(db) == set()


def test_report_reads_only_the_window(tmp_path):
    now = time.time()
    db = tmp_path / "vgpu.db"
    _fill(db, [("old", ENDED, now - 10 * DAY), ("today", ENDED, now - 3600),
               ("running", RUNNING, now - 10 * DAY)])
    jobs, usage = load(db, now - DAY, now)
    # "running" has no usage in the window but was alive in it.
    assert sorted(j.name for j in jobs) == ["running", "today"]
    assert {u.job_id for u in usage} == {j.job_id for j in jobs if j.name == "today"}


@needs_native
def test_the_daemon_applies_retention_at_start(daemon_factory):
    d = daemon_factory(config="retention_days = 30\n", start=False)
    now = time.time()
    db = d.state / "vgpu.db"
    _fill(db, [("old", ENDED, now - 31 * DAY), ("recent", ENDED, now - 29 * DAY)])
    d.start()
    wait_for(lambda: _names(db) == {"recent"}, what="the old job to be pruned")
    assert "retention: removed 1 jobs and 1 usage rows" in d.log.read_text()
