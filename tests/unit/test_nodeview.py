"""The node view's pure parts: fitting tables to a width (core.layout), the
jobs and GPU tables, fields, units, CSV, filters and JOB arguments
(core.nodeview), and the demo's summary (core.usage_report.summary_table)."""

from __future__ import annotations

import csv
import io
from datetime import timezone

import pytest
from support.store import record

from vgpuctl.core import layout, nodeview, output
from vgpuctl.core.output import Field
from vgpuctl.core.usage_report import ReportRow, UsageReport, summary_table, terminal_table
from vgpuctl.errors import NotFound, UsageError

G = 1 << 30
UUID0 = "GPU-d1d7f5c3-0b3e-4b3c-b29b-94600f3fb95e"
UUID1 = "GPU-76682147-0124-4c8f-bda4-39a9c11f6e86"
COMMAND = ["/opt/conda/envs/train/bin/python", "train.py", "--config", "configs/big.yaml"]


def job(i, name=None, **kw):
    j = {"id": str(i), "name": name or f"long-training-job-name-{i}", "user": "alice",
         "uid": 1000, "state": "running", "pids": [41000 + i, 41100 + i], "gpu": i % 2,
         "gpu_uuid": (UUID0, UUID1)[i % 2], "mem_used": 300 << 20, "mem_limit": 4 * G,
         "core": 30, "core_measured": 0.31, "policy": "hard", "runtime_s": 3725.0,
         "command": COMMAND}
    j.update(kw)
    return j


GPUS = [{"index": 0, "uuid": UUID0, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * G,
         "memory_used": 600 << 20, "utilization": 61, "committed": 8 * G,
         "capacity": 79 * G, "jobs": 2},
        {"index": 1, "uuid": UUID1, "name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 * G,
         "memory_used": 300 << 20, "utilization": 30, "committed": 4 * G,
         "capacity": 79 * G, "jobs": 1}]


def text(table, width, header=True):
    cols, rows, plan = table
    return layout.plain(layout.lines(layout.fit(cols, rows, width, plan, header), cols, rows,
                                     header)).splitlines()


# -- layout ----------------------------------------------------------------------
def test_fit_takes_the_plan_in_order_and_only_as_far_as_needed():
    cols = [layout.Column("id", "Id"), layout.Column("cmd", "Command"),
            layout.Column("uuid", "UUID")]
    rows = [[layout.Cell("1"), layout.Cell("x" * 30), layout.Cell(UUID0, short=UUID0[:12])]]
    plan = [layout.Short("uuid"), layout.Cut("cmd", 10), layout.Drop("cmd")]
    assert layout.fit(cols, rows, None, plan).widths == (2, 30, 40)     # no width: whole
    assert layout.fit(cols, rows, 200, plan).short == frozenset()
    assert layout.fit(cols, rows, 50, plan).widths == (2, 30, 12)      # short UUID: enough
    fitted = layout.fit(cols, rows, 40, plan)
    assert fitted.short == {"uuid"} and fitted.widths == (2, 22, 12) and fitted.width == 40
    assert [c.key for c in layout.fit(cols, rows, 20, plan).columns] == ["id", "uuid"]
    # What no step names is never shortened, even when that overflows.
    assert layout.fit(cols, rows, 5, plan).widths == (2, 12)


def test_control_characters_from_a_job_show_as_question_marks():
    lines = text(nodeview.job_table([job(1, name="x\x1b]0;owned\x07\ny")]), None)
    assert len(lines) == 2 and "x?]0;owned??y" in lines[1]


def test_clip_marks_a_cut_with_an_ellipsis():
    assert layout.clip("abcdef", 6) == "abcdef"
    assert layout.clip("abcdef", 4) == "abc…"


# -- the default tables --------------------------------------------------------
def test_job_table_at_80_columns_keeps_id_name_gpu_and_memory_whole():
    jobs = [job(1), job(2), job(3)]
    lines = text(nodeview.job_table(jobs), 80)
    assert all(len(ln) <= 80 for ln in lines)
    assert lines[0].split()[:2] == ["Job", "Name"] and "GPU" in lines[0]
    for ln, j in zip(lines[1:], jobs, strict=True):
        cells = ln.split()
        assert cells[:2] == [j["id"], j["name"]]
        assert "300M / 4G" in ln and f"  {j['gpu']}  " in ln
    assert "train.py" not in "\n".join(lines)        # the command gave way first


@pytest.mark.parametrize("width", [100, 120])
def test_job_table_wider_shows_the_command_by_its_program_name(width):
    lines = text(nodeview.job_table([job(1)]), width)
    assert all(len(ln) <= width for ln in lines)
    assert "python train.py" in lines[1] and "/opt/conda" not in lines[1]


def test_job_table_names_are_cut_last_and_ids_never():
    jobs = [job(12345, name="n" * 40, user="a-very-long-user-name")]
    lines = text(nodeview.job_table(jobs), 60)
    assert lines[1].split()[0] == "12345" and "4G" in lines[1]
    assert "…" in lines[1] and len(lines[1]) <= 60


def test_gpu_table_shortens_the_uuid_first():
    lines = text(nodeview.gpu_table(GPUS), 100)
    assert all(len(ln) <= 100 for ln in lines)
    assert "GPU-d1d7f5c3" in lines[1] and UUID0 not in lines[1]
    assert "NVIDIA A100-SXM4-80GB" in lines[1]                       # the name whole
    assert UUID0 in text(nodeview.gpu_table(GPUS), None)[1]          # off a terminal


def test_short_uuids_stay_unique_prefixes():
    twins = ["GPU-aaaaaaaa-1111", "GPU-aaaaaaaa-2222", UUID0]
    short = nodeview.short_uuids(twins)
    assert short[UUID0] == "GPU-d1d7f5c3"
    assert short[twins[0]] == "GPU-aaaaaaaa-1" and short[twins[1]] == "GPU-aaaaaaaa-2"


def test_units_change_the_memory_cells_and_headers():
    assert "4096" in text(nodeview.job_table([job(1)], "mib"), None)[1]
    assert "[MiB]" in text(nodeview.job_table([job(1)], "mib"), None)[0]
    assert str(4 * G) in text(nodeview.job_table([job(1)], "bytes"), None)[1]


def test_no_header():
    lines = text(nodeview.job_table([job(1)]), None, header=False)
    assert len(lines) == 1 and lines[0].split()[0] == "1"


# -- fields and CSV --------------------------------------------------------------
def test_unknown_field_is_a_usage_error_naming_the_valid_ones():
    with pytest.raises(UsageError) as e:
        nodeview.parse_fields("id,memory", nodeview.JOB_FIELDS, nodeview.JOB_DEFAULT)
    assert "unknown field 'memory'" in str(e.value) and "mem_limit" in str(e.value)
    assert nodeview.parse_fields(" id, name ", nodeview.JOB_FIELDS, ()) == ["id", "name"]
    assert "id" in nodeview.JOB_FIELDS and "id" in nodeview.JOB_DEFAULT


def test_csv_is_rfc_4180_with_units_in_the_headers():
    tricky = job(1, name='a,b "c" d')
    out = nodeview.to_csv([tricky, job(2)], ["id", "name", "mem_limit", "pids", "command"],
                          nodeview.JOB_FIELDS, "mib")
    assert out.startswith("id,name,mem_limit [MiB],pids,command\n")
    assert '"a,b ""c"" d"' in out
    rows = list(csv.reader(io.StringIO(out, newline="")))
    assert rows[1] == ["1", 'a,b "c" d', "4096", "41001 41101",
                       "/opt/conda/envs/train/bin/python train.py --config configs/big.yaml"]
    assert nodeview.to_csv([job(1)], ["mem_used"], nodeview.JOB_FIELDS, "bytes",
                           header_row=False) == f"{300 << 20}\n"
    assert nodeview.to_csv([job(1, mem_used=None)], ["mem_used"], nodeview.JOB_FIELDS, "mib",
                           header_row=False) == '""\n'


def test_csv_gives_a_share_and_its_measure_both_in_percent():
    """core (a percent) beside core_measured (0..1 in JSON): in CSV both are
    percent, and their headers say so."""
    out = nodeview.to_csv([job(1)], ["core", "core_measured"], nodeview.JOB_FIELDS, "mib")
    assert out.splitlines() == ["core [%],core_measured [%]", "30,31.0"]


def test_csv_writes_control_characters_as_escapes():
    """A command line is the job's user's to choose: in CSV (shown on a
    terminal as often as not) no escape sequence, carriage return or line
    break of it acts; each is written as the daemon's log writes it."""
    evil = job(1, command=["sh", "-c", "\x1b]0;pwned\x07\x1b[2J\rok\nfake,row\u2028"],
               cwd="/tmp/\x1b[31mred")
    out = nodeview.to_csv([evil], ["id", "command", "cwd"], nodeview.JOB_FIELDS, "mib")
    assert not any(ord(c) < 0x20 and c != "\n" or 0x7f <= ord(c) < 0xa0 or c == "\u2028"
                   for c in out)
    assert out.count("\n") == 2            # the header and one row
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\rok\\nfake,row\\u2028" in out
    assert "/tmp/\\x1b[31mred" in out


@pytest.mark.parametrize("value,field,cell", [
    (None, Field("mem", "bytes"), ""),
    (3 << 20, Field("mem", "bytes"), "3"),
    (True, Field("mem", "bytes"), ""),
    (0, Field("ok", "bool"), "false"),
    ("x", Field("ok", "bool"), "true"),
    ([1, 2], Field("pids", "list"), "1 2"),
    (("a", "b"), Field("who", "names"), "a b"),
    ("a", Field("who", "names"), "a"),
    (["sh", "-c", "a b"], Field("command", "argv"), "sh -c 'a b'"),
    ([{"kind": "mem", "pid": 7}, "x", {"kind": "ipc", "pid": 8}],
     Field("violations", "violations"), "mem:7 ipc:8"),
    ("none", Field("violations", "violations"), "none"),
    ([{"index": 0, "mem_used": 3 << 20, "mem_limit": 4 << 20, "core_measured": 0.3}, 1,
      {"index": 1}], Field("per_gpu", "per_gpu"), "0:3/4:30% 1:-/-:-"),
    ({"index": 0}, Field("per_gpu", "per_gpu"), "{'index': 0}"),
    (0, Field("start", "time"), "1970-01-01T00:00:00+00:00"),
    (True, Field("start", "time"), "1970-01-01T00:00:01+00:00"),
    ("soon", Field("start", "time", digits=1), "soon"),
    (0.305, Field("core", "share"), "30.5"),
    (True, Field("core", "share"), "True"),
    (1.25, Field("runtime", "seconds"), "1.2"),
    (1.25, Field("runtime", "seconds", digits=3), "1.250"),
    (2, Field("gib_hours", "number"), "2.000"),
    (3, Field("n", "int", digits=2), "3.00"),
    (3, Field("n", "int"), "3"),
    (True, Field("t", "text", digits=1), "True"),
    ("x", Field("t", "seconds"), "x"),
])
def test_each_kind_of_field_is_its_cell(value, field, cell):
    """A value's CSV cell by its field's kind; a value not of its kind's
    form is written as it is."""
    assert output.cell(value, field, "mib", timezone.utc) == cell


# -- filters and JOB arguments ---------------------------------------------------
def test_filters():
    jobs = [job(1, name="train-a"), job(2, name="serve", user="bob", uid=1001),
            job(3, name="train-b")]

    def ids(**kw):
        return [j["id"] for j in nodeview.filter_jobs(jobs, **kw)]
    assert ids(user="bob") == ["2"] and ids(user="1001") == ["2"]
    assert ids(name="train-*") == ["1", "3"] and ids(name="train") == []
    assert ids(gpu_uuid=UUID1) == ["1", "3"]
    assert ids(name="train-*", gpu_uuid=UUID0) == []


def test_job_arguments():
    jobs = [job(1, name="twin"), job(2, name="twin"), job(3, name="twin", uid=0)]

    def mine(j):
        return j["uid"] == 1000
    assert nodeview.resolve_jobs(jobs, ["7", "twin", "t*n"], mine) == [
        ("7", ["7"]), ("twin", ["1", "2"]), ("t*n", ["1", "2"])]
    with pytest.raises(NotFound):
        nodeview.resolve_jobs(jobs, ["nobody"], mine)
    for bad in ("", "x" * 65, "1" * 20):
        with pytest.raises(UsageError):
            nodeview.check_job_args([bad])


# -- the demo's summary ----------------------------------------------------------
def test_summary_fits_80_columns_and_shows_the_share_got():
    rows = [ReportRow(key=str(i), gpu_seconds=3.0, peak_mem_bytes=300 << 20,
                      job=record(str(i), name=n, mem_limit=4 * G, core=30,
                                 policy="hard", start=100.0, end=110.0, exit_code=0))
            for i, n in ((1, "train"), (2, "a-rather-long-job-name-for-a-demo"))]
    lines = text(summary_table(UsageReport(by="job", since=0.0, until=200.0, rows=rows)), 80)
    assert all(len(ln) <= 80 for ln in lines)
    assert lines[1].split() == ["1", "train", "4G", "30%", "hard", "3.0s", "30%", "300M", "0"]


def test_report_on_a_terminal_keeps_the_job_id_and_user_at_80_columns():
    rows = [ReportRow(key=str(i), gpu_seconds=179.8, mem_gib_hours=0.05,
                      peak_mem_bytes=300 << 20,
                      job=record(str(i), name=f"long-training-job-name-{i}",
                                 user="alice", gpus=(UUID0,), mem_limit=4 * G, core=30,
                                 start=100.0, end=700.0, exit_code=0,
                                 command=" ".join(COMMAND)))
            for i in (1, 2, 3)]
    report = UsageReport(by="job", since=0.0, until=1000.0, rows=rows)
    lines = text(terminal_table(report), 80)
    assert all(len(ln) <= 80 for ln in lines)
    # on a node of many users, who ran it outlasts the GPU and the start
    for ln, i in zip(lines[1:], (1, 2, 3), strict=True):
        assert ln.split()[:3] == [str(i), f"long-training-job-name-{i}", "alice"]
        assert "179.8s" in ln and "300M" in ln
    assert lines[0].split()[:3] == ["Job", "Name", "User"] and "GPU-d1d7f5c3" in (
        text(terminal_table(report), 100)[1])
    assert UUID0 in text(terminal_table(report), None)[1]
