"""Usage reports: window clipping, grouping, stable CSV headers with units,
JSON, plain text off a terminal, atomic --output, and one-line errors."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from datetime import datetime, timedelta, timezone

import pytest
from support.store import record

from vgpuctl.core import usage_report
from vgpuctl.core.accounting import UsageRow
from vgpuctl.core.usage_report import aggregate, parse_when
from vgpuctl.errors import UsageError
from vgpuctl.system.files import write_atomic

UTC = timezone.utc
G = 1 << 30
MIB = 1 << 20
GPU0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU1 = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
T = datetime(2024, 5, 1, 12, 0, tzinfo=UTC).timestamp()

JOB_HEADERS = ("job_id,name,user,uid,gpus,start,end,exit_status,memory_limit [MiB],"
               "core_limit [%],gpu_time [s],memory_time [GiB*h],peak_memory [MiB],command,"
               "slurm_job,partition,account,priority,start_utc,end_utc")


def u(job, gpu, t0, t1, gs, gh=0.0, peak=0):
    return UsageRow(job, gpu, t0, t1, gs, gh, peak)


JOBS = [
    record("1", name="train", user="alice", uid=1000, command="python train.py",
           gpus=(GPU0,), mem_limit=4 * G, core=30, start=T, end=T + 100, exit_code=0),
    record("2", name="eval", user="bob", uid=1001, command="python eval.py",
           gpus=(GPU1,), mem_limit=2 * G, core=50, start=T + 50, end=None),
    record("3", name="idle", user="alice", uid=1000, command="sleep 100",
           gpus=(GPU0,), mem_limit=G, core=20, start=T + 10, end=T + 20, exit_signal=9),
]
USAGE = [
    u("1", GPU0, T, T + 100, 50.0, 0.1, 3 * G),
    u("2", GPU1, T + 50, T + 150, 20.0, 0.2, G),
]


def test_by_job_clips_to_the_window():
    r = aggregate(JOBS, USAGE, "job", T + 50, T + 200, UTC)
    by = {row.key: row for row in r.rows}
    # Job 1's row is half inside the window; job 2's wholly; job 3 ended before.
    assert set(by) == {"1", "2"}
    assert by["1"].gpu_seconds == pytest.approx(25.0)
    assert by["1"].mem_gib_hours == pytest.approx(0.05)
    assert by["1"].peak_mem_bytes == 3 * G
    assert by["2"].gpu_seconds == pytest.approx(20.0)


def test_jobs_alive_without_usage_show_with_zeros():
    r = aggregate(JOBS, USAGE, "job", T, T + 1000, UTC)
    by = {row.key: row for row in r.rows}
    assert by["3"].gpu_seconds == 0 and by["3"].job.exit_status == 137
    assert [row.key for row in r.rows] == ["1", "3", "2"]  # by start time


def test_by_user_and_gpu():
    r = aggregate(JOBS, USAGE, "user", T, T + 1000, UTC)
    by = {row.key: row for row in r.rows}
    assert by["alice"].gpu_seconds == pytest.approx(50.0)
    assert by["alice"].jobs == {"1", "3"}
    assert by["bob"].gpu_seconds == pytest.approx(20.0)
    r = aggregate(JOBS, USAGE, "gpu", T, T + 1000, UTC)
    by = {row.key: row for row in r.rows}
    assert by[GPU0].gpu_seconds == pytest.approx(50.0) and by[GPU0].jobs == {"1", "3"}
    assert by[GPU1].gpu_seconds == pytest.approx(20.0)


def test_by_day_splits_at_midnight():
    midnight = datetime(2024, 5, 2, tzinfo=UTC).timestamp()
    usage = [u("1", GPU0, midnight - 3600, midnight + 1800, 90.0, 1.5, G)]
    jobs = [record("1", user="alice", start=midnight - 3600, end=midnight + 1800)]
    r = aggregate(jobs, usage, "day", midnight - 86400, midnight + 86400, UTC)
    by = {row.key: row for row in r.rows}
    assert by["2024-05-01"].gpu_seconds == pytest.approx(60.0)
    assert by["2024-05-02"].gpu_seconds == pytest.approx(30.0)
    assert by["2024-05-02"].mem_gib_hours == pytest.approx(0.5)
    assert by["2024-05-01"].jobs == by["2024-05-02"].jobs == {"1"}


def test_usage_outside_the_window_counts_for_nothing():
    """Job 2's usage row ends before the window (the same day): its job,
    alive in the window, shows with zeros."""
    for by, key in (("user", "bob"), ("day", "2024-05-01")):
        r = aggregate(JOBS, USAGE, by, T + 200, T + 1000, UTC)
        assert [(row.key, row.jobs, row.gpu_seconds) for row in r.rows] == [(key, {"2"}, 0.0)]


def test_csv_headers_are_stable_and_carry_units():
    r = aggregate(JOBS, USAGE, "job", T, T + 1000, UTC)
    text = usage_report.to_csv(r, UTC)
    lines = text.splitlines()
    assert lines[0] == JOB_HEADERS
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows[0]["job_id"] == "1"
    assert rows[0]["gpu_time [s]"] == "50.000"
    assert rows[0]["peak_memory [MiB]"] == "3072"
    assert rows[0]["memory_limit [MiB]"] == "4096"
    assert rows[0]["start"] == "2024-05-01T12:00:00+00:00"
    assert rows[2]["end"] == ""          # still running
    # a spreadsheet reads "2024-05-01 12:00:00" as a date and time, not an
    # ISO 8601 offset: start_utc and end_utc, whatever the local zone
    plus2 = timezone(timedelta(hours=2))
    again = list(csv.DictReader(io.StringIO(usage_report.to_csv(
        aggregate(JOBS, USAGE, "job", T, T + 1000, plus2), plus2))))
    assert again[0]["start"] == "2024-05-01T14:00:00+02:00"
    assert again[0]["start_utc"] == "2024-05-01 12:00:00" and again[2]["end_utc"] == ""
    for by, first, last in (("user", "user", ""), ("gpu", "gpu_uuid", ",gpu_index"),
                            ("day", "day", "")):
        head = usage_report.to_csv(aggregate(JOBS, USAGE, by, T, T + 1000, UTC),
                                   UTC).splitlines()[0]
        assert head == f"{first},jobs,gpu_time [s],memory_time [GiB*h],peak_memory [MiB]{last}"


def test_a_moved_job_lists_every_gpu_it_used_and_by_gpu_names_the_index():
    """A job moved from GPU 0 to GPU 1 mid-window (its record names GPU 1
    only): the report lists both, in the order it used them; --by gpu
    gives each GPU's index beside its UUID."""
    moved = record("4", name="moved", user="carol", uid=1002, gpus=(GPU1,), start=T,
                   end=T + 200)
    moved.gpus = [dataclasses.replace(moved.gpus[0], index=1)]
    usage = [u("4", GPU0, T, T + 100, 10.0), u("4", GPU1, T + 100, T + 200, 10.0)]
    r = aggregate([moved], usage, "job", T, T + 1000, UTC)
    assert r.rows[0].gpus == [GPU0, GPU1]
    row = next(csv.DictReader(io.StringIO(usage_report.to_csv(r, UTC))))
    assert row["gpus"] == f"{GPU0} {GPU1}"
    assert json.loads(usage_report.to_json(r, UTC))[0]["gpus"] == [GPU0, GPU1]
    r = aggregate([*JOBS, moved], [*USAGE, *usage], "gpu", T, T + 1000, UTC)
    got = {(row["gpu_index"], row["gpu_uuid"]) for row in json.loads(usage_report.to_json(r, UTC))}
    assert got == {(0, GPU0), (1, GPU1)}


def test_json_values_in_base_units():
    r = aggregate(JOBS, USAGE, "job", T, T + 1000, UTC)
    data = json.loads(usage_report.to_json(r, UTC))
    assert data[0]["job_id"] == "1" and data[0]["gpus"] == [GPU0]
    assert data[0]["gpu_seconds"] == pytest.approx(50.0)
    assert data[0]["peak_memory_bytes"] == 3 * G
    assert data[2]["end"] is None


def test_empty_reports():
    r = aggregate([], [], "job", T, T + 10, UTC)
    assert usage_report.to_csv(r, UTC) == JOB_HEADERS + "\n"
    assert json.loads(usage_report.to_json(r, UTC)) == []
    assert usage_report.to_text(r, UTC).startswith("no jobs between 2024-05-01T12:00:00+00:00")


def test_plain_text_is_aligned_without_escapes():
    r = aggregate(JOBS, USAGE, "user", T, T + 1000, UTC)
    text = usage_report.to_text(r, UTC)
    assert "\x1b" not in text
    lines = text.splitlines()
    assert lines[0].split() == ["user", "jobs", "gpu_time", "[s]", "memory_time", "[GiB*h]",
                                "peak_memory", "[MiB]"]
    assert lines[1].split()[:3] == ["alice", "2", "50.000"]
    assert len({len(line) for line in lines}) == 1  # right-aligned numbers end together


def test_bad_window_and_grouping():
    with pytest.raises(UsageError):
        aggregate(JOBS, USAGE, "job", T, T, UTC)
    with pytest.raises(UsageError):
        aggregate(JOBS, USAGE, "team", T, T + 1, UTC)


@pytest.mark.parametrize("text,expected", [
    ("24h", T - 86400),
    ("7d", T - 7 * 86400),
    ("90m", T - 5400),
    ("now", T),
    ("today", datetime(2024, 5, 1, tzinfo=UTC).timestamp()),
    ("yesterday", datetime(2024, 4, 30, tzinfo=UTC).timestamp()),
    ("2024-04-01", datetime(2024, 4, 1, tzinfo=UTC).timestamp()),
    ("2024-04-01T06:30", datetime(2024, 4, 1, 6, 30, tzinfo=UTC).timestamp()),
    ("2024-04-01 06:30:00+02:00", datetime(2024, 4, 1, 4, 30, tzinfo=UTC).timestamp()),
    ("2024-04-01T06:30:00Z", datetime(2024, 4, 1, 6, 30, tzinfo=UTC).timestamp()),
])
def test_parse_when(text, expected):
    assert parse_when(text, T, UTC) == pytest.approx(expected)


def test_parse_when_rejects_garbage():
    with pytest.raises(UsageError, match="--until 'soon'"):
        parse_when("soon", T, UTC, option="--until")


def test_parse_when_uses_the_given_zone():
    tz = timezone(timedelta(hours=-5))
    assert parse_when("2024-04-01", T, tz) == datetime(2024, 4, 1, 5, tzinfo=UTC).timestamp()


def test_write_atomic_replaces_whole_file(tmp_path):
    out = tmp_path / "r.csv"
    out.write_text("old")
    write_atomic(out, "new\n")
    assert out.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.csv"]  # no temporary left


# -- the command, on a database the daemon's store wrote ---------------------------


def test_by_slurm_job_sums_a_slurm_jobs_vgpu_jobs_and_keeps_the_others_apart():
    from dataclasses import replace

    jobs = [replace(JOBS[0], slurm_job="900", slurm_partition="gpu", slurm_account="physics"),
            replace(JOBS[1], slurm_job="900"),      # requeued: registered again
            JOBS[2]]
    r = aggregate(jobs, USAGE, "slurm-job", T, T + 200, UTC)
    by = {row.key: row for row in r.rows}
    assert set(by) == {"900", usage_report.NOT_SLURM}
    assert by["900"].jobs == {"1", "2"} and by["900"].gpu_seconds == pytest.approx(70.0)
    assert json.loads(usage_report.to_json(r, UTC))[0]["slurm_job"] is None      # "-" sorts first
    (row,) = [row for row in csv.DictReader(io.StringIO(
        usage_report.to_csv(aggregate(jobs, USAGE, "job", T, T + 200, UTC), UTC)))
        if row["job_id"] == "1"]
    assert (row["slurm_job"], row["partition"], row["account"]) == ("900", "gpu", "physics")
