"""Retention in the store: ended jobs and usage rows older than
retention_days go, a bounded batch at a time; what is recent or still
running stays; a report of a recent window reads only what it needs."""

from __future__ import annotations

import time

from support.store import DAY, fill_db, job_names

from vgpuctl.store import retention
from vgpuctl.store.database import ENDED, RUNNING, Store
from vgpuctl.store.reports import load
from vgpuctl.store.usage import read_usage


def test_prune_batch_takes_old_ended_jobs_and_their_usage(tmp_path):
    now = time.time()
    db = tmp_path / "vgpu.db"
    ids = fill_db(db, [("old", ENDED, now - 100 * DAY), ("recent", ENDED, now - DAY),
                     ("running", RUNNING, now - 100 * DAY)])
    store = Store.open(db)
    before = retention.cutoff(now, 90)
    assert retention.prune_batch(store, before, keep=[ids["running"]]) == (1, 1)
    assert retention.prune_batch(store, before, keep=[ids["running"]]) == (0, 0)
    assert {r.job_id for r in read_usage(store.conn)} == {ids["recent"], ids["running"]}
    store.close()
    assert job_names(db) == {"recent", "running"}


def test_prune_batch_is_bounded(tmp_path):
    now = time.time()
    db = tmp_path / "vgpu.db"
    fill_db(db, [(f"old{i}", ENDED, now - 100 * DAY) for i in range(5)])
    store = Store.open(db)
    before = retention.cutoff(now, 90)
    assert retention.prune_batch(store, before, batch=2) == (2, 2)
    assert retention.prune_batch(store, before, batch=2) == (2, 2)
    assert retention.prune_batch(store, before, batch=2) == (1, 1)
    store.close()
    assert job_names(db) == set()


def test_report_reads_only_the_window(tmp_path):
    now = time.time()
    db = tmp_path / "vgpu.db"
    fill_db(db, [("old", ENDED, now - 10 * DAY), ("today", ENDED, now - 3600),
               ("running", RUNNING, now - 10 * DAY)])
    jobs, usage = load(db, now - DAY, now)
    # "running" has no usage in the window but was alive in it.
    assert sorted(j.name for j in jobs) == ["running", "today"]
    assert {u.job_id for u in usage} == {j.id for j in jobs if j.name == "today"}
