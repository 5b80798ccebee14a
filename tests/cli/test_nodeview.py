"""The node view as operators use it: `vgpuctl ps`, `status`, `top` and
`gpus` on 80-column terminals and in pipes, their CSV and JSON, filters,
`--loop` across a daemon restart, and `kill`/`set` by several ids or a name."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import signal
import subprocess

import psutil
import pytest
from support import term
from support.daemon import kill_and_reap, read_line, vgpuctl_argv, wait_for

LONG = [f"long-training-job-name-{n}" for n in (1, 2, 3)]
# A command longer than any fixed width (the old one was 160 columns).
LONG_ARG = "x" * 170


@pytest.fixture
def start_jobs(daemon):
    """start_jobs(names, gpu=None) runs one sleeping job per name through
    `vgpuctl run`, each once the last runs; returns their ids."""
    procs: list[subprocess.Popen[str]] = []

    def start(names, gpu=None, cmd=("sleep", "120")):
        ids: list[str] = []
        for name in names:         # one at a time: ids in the names' order
            seen = {j["id"] for j in daemon.jobs()}
            extra = ["--gpu", str(gpu)] if gpu is not None else []
            procs.append(daemon.popen("run", "--mem", "1G", "--core", "30", "--name", name,
                                      *extra, "--", *cmd, stdin=subprocess.DEVNULL))

            def new_one(name=name, seen=seen):
                return next((j["id"] for j in daemon.jobs() if j["id"] not in seen
                             and j["name"] == name and j["state"] == "running"), None)
            ids.append(wait_for(new_one, 30, f"job {name} to run"))
        return ids
    yield start
    # Whatever each `vgpuctl run` started (the daemon may not have tracked a
    # command's child yet): the launcher then reaps it and ends at once.
    for p in procs:
        try:
            for child in psutil.Process(p.pid).children(recursive=True):
                child.kill()
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def csv_rows(text):
    return list(csv.reader(io.StringIO(text)))


# -- tables --------------------------------------------------------------------
def test_ps_at_80_columns_keeps_every_job_id_whole(daemon, start_jobs):
    ids = start_jobs(LONG, cmd=("sh", "-c", "sleep 120", LONG_ARG))
    code, out = term.run([*vgpuctl_argv(), "ps"], daemon.env, cols=80)
    assert code == 0, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert all(len(ln) <= 80 for ln in lines), out
    header, rows = lines[0], lines[1:]
    assert header.split()[:2] == ["Job", "Name"], out
    assert "GPU" in header and "Mem used/limit" in header, out
    # Every id whole, beside its whole name (the command gave way) and memory.
    assert {r.split()[0]: r.split()[1] for r in rows} == dict(zip(ids, LONG, strict=True)), out
    assert all("/ 1G" in r for r in rows), out
    assert LONG_ARG[:10] not in out


@pytest.mark.parametrize("cols", [80, 100, 120])
def test_status_fits_the_terminal_with_short_uuids(daemon, start_jobs, cols):
    start_jobs(LONG, cmd=("sh", "-c", "sleep 120", LONG_ARG))
    uuid = daemon.call("ps")["gpus"][0]["uuid"]
    code, out = term.run([*vgpuctl_argv(), "status"], daemon.env, cols=cols)
    assert code == 0, out
    assert all(len(ln) <= cols for ln in out.splitlines()), out
    assert uuid[:12] in out                          # GPU-xxxxxxxx at least
    if cols < 120:
        assert uuid not in out                       # the UUID gave way first


def test_off_a_terminal_nothing_is_cut(daemon, start_jobs):
    start_jobs(LONG[:1], cmd=("sh", "-c", "sleep 120", LONG_ARG))
    r = daemon.cli("ps", env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout and "\x1b" not in r.stdout
    row = r.stdout.splitlines()[1]
    assert LONG[0] in row and row.endswith(LONG_ARG) and len(row) > 200
    r = daemon.cli("status")
    uuid = daemon.call("ps")["gpus"][0]["uuid"]
    assert uuid in r.stdout and "…" not in r.stdout


def test_top_quits_on_q_and_keys_leave_no_stray_headers(daemon, start_jobs):
    start_jobs(LONG)
    t = term.Terminal([*vgpuctl_argv(), "top", "-i", "0.2"], daemon.env, cols=80)
    try:
        t.wait_for(LONG[2])
        t.type("xyz\n")
        seen = len(t.wait_for("q to quit"))
        t.wait_for("q to quit", after=seen)        # a refresh after the keys
        out = t.read()
        assert "xyz" not in out                    # keys are not echoed into the view
        t.type("q")
        code, out = t.finish(10)
    finally:
        t.close()
    assert code == 0, out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_top_ended_by_a_signal_gives_the_terminal_back(daemon, start_jobs, sig):
    """`timeout 3 vgpuctl top` or a closed terminal: the alternate screen is
    left and the cursor shown again, as on q."""
    start_jobs(LONG[:1])
    t = term.Terminal([*vgpuctl_argv(), "top", "-i", "0.2"], daemon.env, cols=100)
    try:
        t.wait_for("q to quit")
        assert b"\x1b[?1049h" in t.raw and b"\x1b[?25l" in t.raw   # the view's screen
        t.proc.send_signal(sig)
        code, _ = t.finish(10)
    finally:
        t.close()
    assert code == 128 + sig
    tail = t.raw[t.raw.rindex(b"\x1b[?1049h"):]
    assert b"\x1b[?1049l" in tail and b"\x1b[?25h" in tail


def test_top_rides_out_a_daemon_restart(daemon, start_jobs):
    start_jobs(LONG[:1])
    t = term.Terminal([*vgpuctl_argv(), "top", "-i", "0.2"], daemon.env, cols=100)
    try:
        t.wait_for(LONG[0])
        daemon.stop()
        seen = len(t.wait_for("daemon not answering, retrying"))
        daemon.start()
        t.wait_for(LONG[0], after=seen)
        assert t.proc.poll() is None
        t.type("q")
        code, out = t.finish(10)
    finally:
        t.close()
    assert code == 0, out


# -- machine output ------------------------------------------------------------
def test_ps_csv_has_a_header_and_a_row_per_job(daemon, start_jobs):
    ids = start_jobs(["a,b \"quoted\"", "plain"])
    raw = subprocess.run([*vgpuctl_argv(), "ps", "--format", "csv"], env=daemon.env,
                         capture_output=True, timeout=60).stdout
    assert raw.count(b"\n") == 3 and b"\r" not in raw  # LF, as report and nvidia-smi
    r = daemon.cli("ps", "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = csv_rows(r.stdout)
    assert "id" in rows[0] and "mem_limit [MiB]" in rows[0]
    by_id = {row[0]: dict(zip(rows[0], row, strict=True)) for row in rows[1:]}
    assert list(by_id) == sorted(ids, key=int)
    assert by_id[ids[0]]["name"] == "a,b \"quoted\""  # quoted, and read back whole
    assert by_id[ids[1]]["mem_limit [MiB]"] == "1024"
    r = daemon.cli("ps", "--format", "csv", "--no-header")
    assert [row[0] for row in csv_rows(r.stdout)] == sorted(ids, key=int)


def test_fields_units_and_unknown_fields(daemon, start_jobs):
    ids = start_jobs(["one"])
    r = daemon.cli("ps", "--format", "csv", "--fields", "id,mem_limit,name", "--units", "bytes")
    assert csv_rows(r.stdout) == [["id", "mem_limit [B]", "name"], [ids[0], str(1 << 30), "one"]]
    r = daemon.cli("ps", "--fields", "id,mem_limit", "--no-header")
    assert r.stdout.split() == [ids[0], "1G"]
    r = daemon.cli("ps", "--fields", "id,memory")
    assert r.returncode == 2 and r.stdout == ""
    line, = r.stderr.splitlines()
    assert "unknown field 'memory'" in line and "mem_limit" in line and "runtime_s" in line
    r = daemon.cli("ps", "--format", "json", "--fields", "id,name")
    assert json.loads(r.stdout)["jobs"] == [{"id": ids[0], "name": "one"}]


def test_status_json_and_csv(daemon, start_jobs):
    ids = start_jobs(["one"])
    for args in (["--json"], ["--format", "json"]):
        data = json.loads(daemon.cli("status", *args).stdout)
        assert [j["id"] for j in data["jobs"]] == ids and len(data["gpus"]) == 2
        assert data["daemon"]["pid"] == daemon.proc.pid
    rows = csv_rows(daemon.cli("status", "--format", "csv", "--units", "mib").stdout)
    assert rows[0][:3] == ["index", "uuid", "name"] and "memory_total [MiB]" in rows[0]
    assert [row[0] for row in rows[1:]] == ["0", "1"]
    assert rows[1][rows[0].index("memory_total [MiB]")] == "16384"


def test_gpus_lists_each_gpu_as_nvidia_smi_L(daemon):
    gpus = daemon.call("ps")["gpus"]
    r = daemon.cli("gpus")
    assert r.stdout.splitlines() == [f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})"
                                     for g in gpus]
    rows = csv_rows(daemon.cli("gpus", "--format", "csv").stdout)
    assert rows == [["index", "name", "uuid", "drained"]] + [
        [str(g["index"]), g["name"], g["uuid"], "false"] for g in gpus]
    assert json.loads(daemon.cli("gpus", "--format", "json").stdout)[1]["uuid"] == gpus[1]["uuid"]


def test_every_key_of_a_ps_json_job_is_a_field(daemon, start_jobs):
    from vgpuctl.core import nodeview

    start_jobs(["keys"])
    job = daemon.call("ps")["jobs"][0]
    assert set(job) <= set(nodeview.JOB_FIELDS), set(job) - set(nodeview.JOB_FIELDS)
    r = daemon.cli("ps", "--format", "csv", "--fields", "id,slurm_job,region_error")
    assert r.returncode == 0 and r.stdout.splitlines()[0] == "id,slurm_job,region_error", r


# -- filters, kill and set -----------------------------------------------------
def test_ps_filters(daemon, start_jobs):
    gpus = daemon.call("ps")["gpus"]
    a, b = start_jobs(["train-a"], gpu=0) + start_jobs(["serve-b"], gpu=1)

    def ids(*args):
        r = daemon.cli("ps", "--format", "csv", "--no-header", "--fields", "id", *args)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()
    assert ids("--gpu", "1") == [b]
    assert ids("--gpu", gpus[0]["uuid"][:12]) == [a]
    assert ids("--name", "train-*") == [a]
    assert ids("--name", "serve-b", "--gpu", "0") == []
    assert ids("-u", str(os.getuid())) == sorted([a, b], key=int)
    assert ids("--user", "nobody-at-all") == []
    # a number that is neither an index nor a UUID prefix (a number that is
    # not an index is taken as a prefix, as run --gpu does)
    absent = next(str(n) for n in range(2, 100)
                  if not any(g["uuid"].removeprefix("GPU-").startswith(str(n)) for g in gpus))
    r = daemon.cli("ps", "--gpu", absent)
    assert r.returncode == 4 and f"no GPU {absent}" in r.stderr, r.stderr
    assert ids("--gpu", gpus[1]["uuid"].removeprefix("GPU-")[:4]) == [b]


def test_kill_by_name_signals_every_job_of_that_name(daemon, start_jobs):
    ids = start_jobs(["batch", "batch", "other"])
    r = daemon.cli("kill", "batch", "--signal", "KILL")
    assert r.returncode == 0, r.stderr
    assert sorted(ln.split(":")[0] for ln in r.stdout.splitlines()) == \
        sorted(f"job {i}" for i in ids[:2])
    wait_for(lambda: [j["id"] for j in daemon.jobs()] == ids[2:], what="the two to end")
    r = daemon.cli("kill", "batch")
    assert r.returncode == 4 and "no job of yours named 'batch'" in r.stderr


def test_set_by_name_refuses_several_unless_all(daemon, start_jobs):
    ids = start_jobs(["twin", "twin", "solo"])
    r = daemon.cli("set", "twin", "--core", "50")
    assert r.returncode == 2 and r.stdout == ""
    assert "names 2 jobs (" in r.stderr and "--all" in r.stderr
    assert {daemon.job(i)["core"] for i in ids} == {30}
    r = daemon.cli("set", "twin", "--core", "50", "--all")
    assert r.returncode == 0, r.stderr
    r = daemon.cli("set", "solo", ids[0], "--core", "40")       # a name and an id
    assert r.returncode == 0, r.stderr
    assert [daemon.job(i)["core"] for i in ids] == [40, 50, 40]
    r = daemon.cli("set", ids[1], "999", "--core", "20")       # one of them is no job
    assert r.returncode == 4
    assert r.stderr.strip() == "vgpuctl: error: job 999: no job 999"
    assert daemon.job(ids[1])["core"] == 20


# -- --loop ----------------------------------------------------------------------
def test_loop_prints_frames_and_survives_a_daemon_restart(daemon, start_jobs, tmp_path):
    ids = start_jobs(["looped"])
    out = open(tmp_path / "loop.csv", "w+")
    p = daemon.popen("ps", "--format", "csv", "--loop", "0.2", stdout=out)
    try:
        def frames():
            return [r for r in csv_rows((tmp_path / "loop.csv").read_text())[1:] if r]
        wait_for(lambda: len(frames()) >= 2, what="two frames")
        daemon.stop()
        assert "retrying" in read_line(p.stderr, 20)       # once, on stderr
        seen = len(frames())
        daemon.start()
        wait_for(lambda: len(frames()) > seen + 1, what="frames again")
        assert p.poll() is None
        p.send_signal(signal.SIGINT)
        assert p.wait(10) == 0
    finally:
        out.close()
        kill_and_reap(p)
    rows = csv_rows((tmp_path / "loop.csv").read_text())
    assert rows[0][:2] == ["timestamp", "id"]        # one header, timestamp first
    assert all(r[0] != "timestamp" for r in rows[1:])
    assert all(r[1] == ids[0] and re.match(r"\d{4}-\d\d-\d\dT", r[0]) for r in rows[1:])
    assert "answers again" in p.stderr.read()


def test_loop_table_has_a_timestamp_line_per_frame(daemon, start_jobs):
    start_jobs(["looped"])
    t = term.Terminal([*vgpuctl_argv(), "status", "--loop", "0.2"], daemon.env, cols=80)
    try:
        wait_for(lambda: len(re.findall(r"^\d{4}-\d\d-\d\dT\S+$", t.read(), re.M)) >= 2,
                 what="two timestamped frames")
        os.killpg(t.proc.pid, signal.SIGINT)
        code, out = t.finish(10)
    finally:
        t.close()
    assert code == 0, out
    assert "Traceback" not in out
