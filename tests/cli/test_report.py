"""`vgpuctl report` as cron and users run it: the daemon's database in,
CSV, JSON or text out, one-line errors."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vgpuctl.core.accounting import Accountant
from vgpuctl.store.database import ENDED, JobRecord, Store
from vgpuctl.store.usage import create_schema, flush

G = 1 << 30
GPU0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
JOB_HEADERS = ("job_id,name,user,uid,gpus,start,end,exit_status,memory_limit [MiB],"
               "core_limit [%],gpu_time [s],memory_time [GiB*h],peak_memory [MiB],command,"
               "slurm_job,partition,account,priority,start_utc,end_utc")

def vgpuctl(args, env=None, **kw):
    exe = Path(sys.executable).parent / "vgpuctl"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c",
                                           "from vgpuctl.cli import main; main()"]
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd + list(args), capture_output=True, text=True, env=e,
                          stdin=subprocess.DEVNULL, timeout=60, **kw)


@pytest.fixture
def state_dir(tmp_path):
    """A state dir with a vgpu.db as the daemon writes it: jobs (the store's
    schema) and usage (the accountant's)."""
    d = tmp_path / "state"
    store = Store.open(d / "vgpu.db")
    now = time.time()
    rec = JobRecord(name="train", uid=os.getuid(), user="alice",
                    command=["python", "train.py", "--lr", "0.1"], cwd="/",
                    gpus=[{"index": 0, "uuid": GPU0}], mem_limit=4 * G, core_share=30,
                    policy="hard", created=now - 60, started=now - 60, ended=now - 10,
                    state=ENDED, exit_code=None, exit_signal=9)
    store.insert_job(rec)
    store.close()
    c = sqlite3.connect(str(d / "vgpu.db"))
    create_schema(c)
    a = Accountant()
    for t in range(60, 9, -10):           # 50 s at a quarter of the GPU
        a.observe(rec.id, GPU0, now - t, 0.25, G)
    flush(c, a)
    c.close()
    return d


def test_command_csv_from_the_daemon_database(state_dir):
    r = vgpuctl(["report", "--format", "csv", "--state-dir", str(state_dir)])
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 1
    row = rows[0]
    assert row["name"] == "train" and row["user"] == "alice"
    assert row["gpus"] == GPU0
    assert row["command"] == "python train.py --lr 0.1"
    assert row["exit_status"] == str(128 + 9)
    assert float(row["gpu_time [s]"]) == pytest.approx(12.5, abs=1e-3)
    assert row["memory_limit [MiB]"] == "4096" and row["core_limit [%]"] == "30"


def test_a_damaged_usage_row_is_left_out_and_said_not_the_whole_report(state_dir):
    """One usage row that can't be one (a damaged database) cost every
    report (exit 8); now the report has the rest, and stderr says how many
    rows were left out."""
    with sqlite3.connect(str(state_dir / "vgpu.db")) as c:
        c.execute("INSERT INTO usage (job_id, gpu_uuid, t0, t1, gpu_seconds, mem_gib_hours, "
                  "peak_mem_bytes) SELECT job_id, gpu_uuid, t0, t1, 'garbage', mem_gib_hours, "
                  "peak_mem_bytes FROM usage")
    r = vgpuctl(["report", "--format", "csv", "--state-dir", str(state_dir)])
    assert r.returncode == 0, r.stderr
    assert r.stderr == ("vgpuctl: warning: 1 usage row(s) of the window could not be read "
                        "(a damaged database) and are left out of the report\n")
    (row,) = csv.DictReader(io.StringIO(r.stdout))
    assert float(row["gpu_time [s]"]) == pytest.approx(12.5, abs=1e-3)


def test_command_table_off_a_terminal_is_plain(state_dir):
    r = vgpuctl(["report", "--state-dir", str(state_dir)], env={"FORCE_COLOR": "1"})
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout
    assert r.stdout.splitlines()[0].startswith("job_id")


def test_command_output_file_and_json(state_dir, tmp_path):
    out = tmp_path / "r.json"
    r = vgpuctl(["report", "--format", "json", "--by", "user", "--output", str(out),
                 "--state-dir", str(state_dir)])
    assert r.returncode == 0 and r.stdout == ""
    data = json.loads(out.read_text())
    assert data[0]["user"] == "alice" and data[0]["jobs"] == 1


def test_command_empty_window_exits_zero(state_dir):
    r = vgpuctl(["report", "--format", "csv", "--since", "2000-01-01", "--until", "2000-01-02",
                 "--state-dir", str(state_dir)])
    assert r.returncode == 0 and r.stdout == JOB_HEADERS + "\n"
    r = vgpuctl(["report", "--format", "json", "--since", "2000-01-01", "--until",
                 "2000-01-02", "--state-dir", str(state_dir)])
    assert r.returncode == 0 and json.loads(r.stdout) == []


def test_command_no_database_yet_is_an_empty_report(tmp_path):
    r = vgpuctl(["report", "--format", "csv"], env={"VGPU_STATE_DIR": str(tmp_path)})
    assert r.returncode == 0 and r.stdout == JOB_HEADERS + "\n"
    r = vgpuctl(["report"], env={"VGPU_STATE_DIR": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.startswith("no jobs between")


def test_a_user_told_of_a_state_dir_they_cant_read_gets_exit_5(tmp_path):
    """--state-dir of root's (mode 0700), or a directory inside it, is "not
    readable by you" (exit 5, docs/cli.md), not a usage error or a
    traceback; a first report where no daemon has run, not even the user's
    home, is an empty one."""
    from support.hostile import in_child_as_nobody

    import vgpuctl.cli.commands.report  # noqa: F401  (nobody can't read them)
    from vgpuctl.cli import _run

    private = tmp_path / "private"
    private.mkdir(mode=0o700)

    def go():
        import contextlib

        got = []
        for args, env in (([f"--state-dir={private}"], {}),
                          ([f"--state-dir={private}/sub"], {}),
                          ([], {"HOME": "/nonexistent", "VGPU_STATE_DIR": "",
                                "XDG_STATE_HOME": ""})):
            os.environ.update(env)
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = _run(["report", "--format", "csv", *args])
            got.append([code, out.getvalue(), err.getvalue()])
        return got
    (a, b, first) = in_child_as_nobody(go)
    for code, _, err in (a, b):
        assert code == 5 and "not readable by you" in err and len(err.splitlines()) == 1, err
    assert first[0] == 0 and first[1] == JOB_HEADERS + "\n", first


# The exit statuses are the ones docs/cli.md and docs/operations.md give.
@pytest.mark.parametrize("setup,args,code,needle", [
    ("none", ["--state-dir", "{tmp}/nowhere"], 8, "no accounting database"),
    ("corrupt", ["--state-dir", "{tmp}"], 8, "can't read the accounting database"),
    ("none", ["--since", "soon", "--state-dir", "{tmp}"], 2, "--since 'soon'"),
    ("none", ["--since", "1h", "--until", "2h", "--state-dir", "{tmp}"], 2, "later than"),
    ("none", ["--output", "{tmp}/no/such/dir/r.csv", "--state-dir", "{tmp}"], 8, "--output"),
    ("file", ["--state-dir", "{tmp}/vgpu.db"], 8, "not a directory"),
])
def test_command_errors_are_one_line(tmp_path, setup, args, code, needle):
    if setup in ("corrupt", "file"):
        (tmp_path / "vgpu.db").write_bytes(b"this is not a database" * 100)
    r = vgpuctl(["report", *[a.format(tmp=tmp_path) for a in args]])
    assert r.returncode == code, r.stderr
    assert needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_output_dash_is_stdout(state_dir):
    r = vgpuctl(["report", "--format", "csv", "-o", "-", "--state-dir", str(state_dir)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == JOB_HEADERS and len(r.stdout.splitlines()) == 2


def test_output_replaces_a_regular_file_keeping_its_mode(state_dir, tmp_path):
    out = tmp_path / "r.csv"
    out.write_text("old\n")
    out.chmod(0o640)
    r = vgpuctl(["report", "--format", "csv", "-o", str(out), "--state-dir", str(state_dir)])
    assert r.returncode == 0, r.stderr
    assert out.read_text().startswith(JOB_HEADERS) and (out.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_output_follows_a_symlink_and_keeps_it(state_dir, tmp_path):
    target = tmp_path / "reports" / "today.csv"
    target.parent.mkdir()
    link = tmp_path / "latest.csv"
    link.symlink_to(target)
    r = vgpuctl(["report", "--format", "csv", "-o", str(link), "--state-dir", str(state_dir)])
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and target.read_text().startswith(JOB_HEADERS)


def test_output_writes_through_a_fifo(state_dir, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    p = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True)
    r = vgpuctl(["report", "--format", "csv", "-o", str(fifo), "--state-dir", str(state_dir)])
    got, _ = p.communicate(timeout=30)
    assert r.returncode == 0, r.stderr
    assert got.startswith(JOB_HEADERS) and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_output_to_dev_null_leaves_the_device_alone(state_dir):
    """As root a rename would replace the device node itself."""
    before = os.stat("/dev/null")
    r = vgpuctl(["report", "-o", "/dev/null", "--state-dir", str(state_dir)])
    assert r.returncode == 0, r.stderr
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino
    assert after.st_rdev == before.st_rdev
