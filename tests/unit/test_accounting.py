"""Accounting: GPU-seconds, GiB-hours and peak memory integrated from the
daemon's samples, flushed to SQLite so a crash loses only seconds and a
restart continues the same job's records."""

from __future__ import annotations

import itertools
import sqlite3

import pytest

from vgpuctl.core.accounting import Accountant
from vgpuctl.errors import StateError
from vgpuctl.store.usage import (
    create_schema,
    flush,
    maybe_flush,
    read_usage,
    recorded_gpu_seconds,
)

G = 1 << 30
GPU = "GPU-00000000-0000-0000-0000-000000000000"


@pytest.fixture
def conn(tmp_path):
    c = sqlite3.connect(str(tmp_path / "vgpu.db"))
    c.execute("PRAGMA journal_mode=WAL")
    create_schema(c)
    yield c
    c.close()


def totals(conn, job="1"):
    rows = [r for r in read_usage(conn) if r.job_id == job]
    return (sum(r.gpu_seconds for r in rows), sum(r.mem_gib_hours for r in rows),
            max((r.peak_mem_bytes for r in rows), default=0), rows)


def test_integrates_share_and_memory(conn):
    a = Accountant()
    a.observe("1", GPU, 100.0, 0.0, 1 * G)      # baseline
    a.observe("1", GPU, 101.0, 0.5, 1 * G)      # 0.5 GPU-s; 1 GiB for 1 s
    a.observe("1", GPU, 103.0, 1.0, 3 * G)      # 2 GPU-s; 1 -> 3 GiB over 2 s
    flush(conn, a)
    gs, gh, peak, rows = totals(conn)
    assert gs == pytest.approx(2.5)
    assert gh == pytest.approx((1 * 1 + 2 * 2) / 3600)
    assert peak == 3 * G
    assert len(rows) == 1 and rows[0].t0 == 100.0 and rows[0].t1 == 103.0


def test_share_is_clamped_and_hook_peak_counts(conn):
    a = Accountant()
    a.observe("1", GPU, 0.0, 0.0, 0)
    a.observe("1", GPU, 1.0, 7.0, G, peak_bytes=5 * G)   # share > 1 is 1
    a.observe("1", GPU, 2.0, -1.0, G)                    # share < 0 is 0
    flush(conn, a)
    gs, _, peak, _ = totals(conn)
    assert gs == pytest.approx(1.0)
    assert peak == 5 * G


def test_schema_is_idempotent(conn):
    create_schema(conn)
    create_schema(conn)
    a = Accountant()
    a.observe("1", GPU, 0.0, 1.0, 0)
    a.observe("1", GPU, 1.0, 1.0, 0)
    flush(conn, a)
    create_schema(conn)
    assert totals(conn)[0] == pytest.approx(1.0)


def test_flushes_update_one_row_then_roll(conn):
    a = Accountant(row_seconds=10.0)
    a.observe("1", GPU, 0.0, 1.0, G)
    for t in range(1, 31):
        a.observe("1", GPU, float(t), 1.0, G)
        flush(conn, a)
    gs, gh, _, rows = totals(conn)
    assert gs == pytest.approx(30.0)
    assert gh == pytest.approx(30 / 3600)
    # 30 s in rows of at most ~10 s, contiguous, not one row per flush.
    assert 3 <= len(rows) <= 4
    for r0, r1 in itertools.pairwise(rows):
        assert r1.t0 == pytest.approx(r0.t1)


def test_gap_is_not_invented(conn):
    a = Accountant(max_gap=5.0)
    a.observe("1", GPU, 0.0, 1.0, G)
    a.observe("1", GPU, 1.0, 1.0, G)      # 1 s
    a.observe("1", GPU, 100.0, 1.0, G)    # the daemon was away 99 s: not counted
    a.observe("1", GPU, 101.0, 1.0, G)    # 1 s
    a.observe("1", GPU, 50.0, 1.0, G)     # the clock stepped back: not counted
    a.observe("1", GPU, 51.0, 1.0, G)     # 1 s
    flush(conn, a)
    assert totals(conn)[0] == pytest.approx(3.0)


def test_crash_loses_at_most_the_flush_interval(tmp_path):
    db = tmp_path / "vgpu.db"
    c = sqlite3.connect(str(db))
    create_schema(c)
    a = Accountant(flush_seconds=2.0)
    t = 1000.0
    a.observe("1", GPU, t, 1.0, G)
    for _ in range(95):               # 9.5 s of ticks at 100 ms, share 1
        t += 0.1
        a.observe("1", GPU, t, 1.0, G)
        maybe_flush(c, a, t)
    c.close()                         # crash: no final flush
    c = sqlite3.connect(str(db))
    gs = totals(c)[0]
    assert 9.5 - 2.0 - 1e-6 <= gs <= 9.5 + 1e-6


def test_restart_continues_the_same_job(conn):
    a = Accountant()
    a.observe("7", GPU, 0.0, 0.5, G)
    a.observe("7", GPU, 10.0, 0.5, G)
    flush(conn, a)
    b = Accountant()                  # a restarted daemon
    b.observe("7", GPU, 20.0, 0.5, G)
    b.observe("7", GPU, 30.0, 0.5, 2 * G)
    flush(conn, b)
    gs, _, peak, _ = totals(conn, "7")
    assert gs == pytest.approx(10.0)
    assert peak == 2 * G


def test_failed_flush_is_retried(tmp_path):
    c = sqlite3.connect(str(tmp_path / "vgpu.db"))
    create_schema(c)
    a = Accountant()
    a.observe("1", GPU, 0.0, 1.0, G)
    a.observe("1", GPU, 2.0, 1.0, G)
    c.execute("DROP TABLE usage")
    with pytest.raises(StateError, match="can't write accounting"):
        flush(c, a)
    create_schema(c)
    flush(c, a)
    assert totals(c)[0] == pytest.approx(2.0)


def test_autocommit_connection(tmp_path):
    """The daemon's store opens SQLite in autocommit mode; a flush is still
    one transaction and lands."""
    c = sqlite3.connect(str(tmp_path / "vgpu.db"), isolation_level=None)
    create_schema(c)
    a = Accountant()
    a.observe("1", GPU, 0.0, 1.0, G)
    a.observe("1", GPU, 1.0, 1.0, G)
    flush(c, a)
    assert not c.in_transaction
    other = sqlite3.connect(str(tmp_path / "vgpu.db"))
    assert totals(other)[0] == pytest.approx(1.0)


def test_ended_jobs_are_forgotten_after_flush(conn):
    a = Accountant()
    for gpu in (GPU, "GPU-other"):
        a.observe("1", gpu, 0.0, 1.0, G)
        a.observe("1", gpu, 1.0, 1.0, G)
    a.observe("2", GPU, 0.0, 1.0, G)
    a.end_job("1")
    assert a.totals("1")[0] == pytest.approx(2.0)     # ended, not yet written
    flush(conn, a)
    assert a.totals("1") == (0.0, 0.0, 0)             # written, then forgotten
    assert a.totals("2")[2] == G
    rows = read_usage(conn)
    assert {r.gpu_uuid for r in rows if r.job_id == "1"} == {GPU, "GPU-other"}


def test_read_usage_window_and_missing_table(tmp_path):
    c = sqlite3.connect(str(tmp_path / "empty.db"))
    assert read_usage(c) == []
    create_schema(c)
    a = Accountant()
    a.observe("1", GPU, 0.0, 1.0, 0)
    a.observe("1", GPU, 10.0, 1.0, 0)
    flush(c, a)
    assert len(read_usage(c, 5.0, 6.0)) == 1
    assert read_usage(c, 11.0, 20.0) == []
    assert read_usage(c, -5.0, 0.0) == []


def test_counter_continues_across_a_restart(conn):
    a = Accountant()
    a.observe("7", GPU, 0.0, 1.0, 0)
    a.observe("7", GPU, 4.0, 0.5, 0)
    assert a.totals("7")[0] == pytest.approx(2.0)
    flush(conn, a)
    b = Accountant()
    b.seed(recorded_gpu_seconds(conn, ["7", "8"]))
    b.observe("7", GPU, 10.0, 1.0, 0)
    b.observe("7", GPU, 11.0, 1.0, 0)
    assert b.totals("7")[0] == pytest.approx(3.0)
    assert b.totals("8")[0] == 0.0


def test_prune_keeps_recent_and_running(conn):
    from vgpuctl.store.usage import prune

    a = Accountant()
    for job, t in (("old", 0.0), ("running", 0.0), ("new", 1000.0)):
        a.observe(job, GPU, t, 1.0, 0)
        a.observe(job, GPU, t + 1, 1.0, 0)
    flush(conn, a)
    assert prune(conn, 500.0, keep=["running"]) == 1
    assert {r.job_id for r in read_usage(conn)} == {"running", "new"}


def test_end_counts_the_unmeasured_tail(conn):
    """Shares arrive one sample period late: at the end, the last share
    stands for the time since the last sample plus that lag."""
    a = Accountant()
    a.observe("1", GPU, 0.0, 0.0, G)
    a.observe("1", GPU, 10.0, 0.5, G)         # 5 GPU-s measured
    a.end_job("1", now=10.2, lag_s=0.2)       # + 0.5 x (0.2 + 0.2)
    flush(conn, a)
    gs, gh, _, rows = totals(conn)
    assert gs == pytest.approx(5.2)
    assert gh == pytest.approx(10.2 / 3600)
    assert rows[-1].t1 == pytest.approx(10.2)
    assert a.totals("1") == (0.0, 0.0, 0)


def test_end_without_samples_adds_nothing(conn):
    a = Accountant()
    a.observe("1", GPU, 0.0, 1.0, 0)          # baseline only
    a.end_job("1", now=0.05, lag_s=0.2)
    flush(conn, a)
    assert totals(conn)[0] == 0.0


def test_a_suspended_job_is_billed_up_to_its_suspension_and_not_after(conn):
    """pause(): its rows are integrated to the moment it was suspended and
    closed; the first sample after it resumes only sets a baseline, so the
    time in between is billed neither as GPU time nor as memory time."""
    a = Accountant()
    a.observe("1", GPU, 100.0, 0.0, 2 * G)
    a.observe("1", GPU, 101.0, 1.0, 2 * G)       # 1 GPU-s, 2 GiB for 1 s
    a.pause("1", 101.5)                           # suspended: 0.5 s more at those figures
    a.observe("1", GPU, 120.0, 1.0, 2 * G)       # resumed 18.5 s later: a baseline
    a.observe("1", GPU, 121.0, 1.0, 2 * G)       # 1 GPU-s, 2 GiB for 1 s
    flush(conn, a)
    gs, gh, _, rows = totals(conn)
    assert gs == pytest.approx(2.5)
    assert gh == pytest.approx(2 * 2.5 / 3600)
    assert [(r.t0, r.t1) for r in sorted(rows, key=lambda r: r.t0)] == [(100.0, 101.5),
                                                                         (120.0, 121.0)]
    assert a.totals("1")[0] == pytest.approx(2.5)   # the job's total runs on
