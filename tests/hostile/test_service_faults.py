"""Nothing is lost and nothing crashes: reservations of jobs that never
start, a user's total, long command lines, a full or read-only state disk,
corrupt tables, file modes, and the one-line errors of `vgpuctl daemon` and
`vgpuctl report`."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support.daemon import needs_native, read_line, vgpuctl_argv, wait_for

from vgpuctl.errors import StateError

G = 1 << 30


@pytest.fixture
def tmpfs(tmp_path):
    """Mount small tmpfs file systems (read-only if asked); skip where
    mounting is not allowed."""
    mounted: list[Path] = []

    def mount(name: str, size: str = "1m", ro: bool = False) -> Path:
        p = tmp_path / name
        p.mkdir()
        opts = f"size={size},mode=0755" + (",ro" if ro else "")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(p)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"can't mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(p)
        return p
    yield mount
    for p in mounted:
        subprocess.run(["umount", "-l", str(p)], capture_output=True)


def one_line(r: subprocess.CompletedProcess[str], code: int, daemon: bool = False) -> str:
    """The one error line of a failed command, checked: its exit status, no
    traceback. `vgpuctl daemon` logs on stderr too: its error is then the
    one `vgpuctl: error:` line, the last."""
    assert r.returncode == code, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    errors = [ln for ln in lines if ln.startswith("vgpuctl: error: ")]
    assert errors == lines[-1:] if daemon else errors == lines, r.stderr
    return errors[0]


def test_a_job_that_never_starts_gives_its_reservation_back(daemon_factory):
    d = daemon_factory(config="start_timeout_s = 2\n")
    with d.client() as hold:        # the launcher stays alive and never says started
        job = hold.call("run", command=["idle"], cwd="/", mem=8 * G)["job"]
        assert d.call("ps")["gpus"][job["gpu"]]["committed"] == 8 * G
        wait_for(lambda: d.job(job["id"])["state"] == "ended", 10,
                 "the reservation to expire")
        assert all(g["committed"] == 0 for g in d.call("ps")["gpus"])
    assert "did not start within 2 s" in d.log.read_text()


def test_a_user_cannot_reserve_more_than_max_total_mem(daemon_factory):
    d = daemon_factory(config='[limits.users.root]\nmax_total_mem = "10G"\n')
    with d.client() as c:
        c.call("run", command=["a"], cwd="/", mem=6 * G)
        c.call("run", command=["b"], cwd="/", mem=4 * G)
    r = d.cli("run", "--mem", "1G", "--", "true")
    assert "may hold at most 10G in all jobs" in one_line(r, 6)


def test_a_long_command_line_is_kept_short(daemon):
    argv = ["python"] + ["x" * 60_000] * 16           # 960,000 characters
    with daemon.client() as c:
        job = c.call("run", command=argv, cwd="/", mem=G)["job"]
    kept = daemon.job(job["id"])["command"]
    assert kept[0] == "python" and sum(map(len, kept)) < 4200, len(kept)
    assert kept[-1].startswith("…(+") and kept[-2].endswith("…")
    assert (daemon.state / "vgpu.db").stat().st_size < 256 << 10


@needs_native
def test_state_files_are_owner_only_whatever_the_umask(daemon_factory):
    d = daemon_factory(start=False)
    d.start(preexec_fn=lambda: os.umask(0o022))
    r = d.cli("run", "--mem", "256M", "--", "true")
    assert r.returncode == 0, r.stderr
    for name in ("vgpu.db", "vgpu.db-wal", "vgpu.db-shm", "vgpud.lock"):
        mode = stat.S_IMODE((d.state / name).stat().st_mode)
        assert mode == 0o600, (name, oct(mode))


def test_a_corrupt_jobs_table_is_one_line_and_exit_8(daemon_factory):
    d = daemon_factory()
    with d.client() as c:
        c.call("run", command=["a"], cwd="/", mem=G)
    d.stop(9)
    with sqlite3.connect(d.state / "vgpu.db") as db:
        db.execute("UPDATE jobs SET command = 'not json', pids = '['")
    r = d.cli("daemon", timeout=60)
    assert "jobs table is corrupt" in one_line(r, 8, daemon=True)


def test_a_corrupt_usage_table_is_set_aside_and_accounting_goes_on(daemon_factory):
    """Before, a usage table that was not vgpuctl's turned accounting off for
    good behind one line ("accounting off: the usage table is not
    vgpuctl's"), and every report failed."""
    d = daemon_factory()
    d.stop()
    with sqlite3.connect(d.state / "vgpu.db") as db:
        db.execute("DROP TABLE usage")
        db.execute("CREATE TABLE usage (id INTEGER PRIMARY KEY, job_id TEXT, t0 REAL)")
        db.execute("INSERT INTO usage (job_id, t0) VALUES ('1', 0)")
    d.start()
    line = wait_for(lambda: next((ln for ln in d.log.read_text().splitlines()
                                  if "accounting starts afresh" in ln), None),
                    what="the log to say what was done")
    assert "is kept as table usage_unreadable_" in line and "accounting off" not in line
    assert d.cli("run", "--mem", "64M", "--", "sleep", "3").returncode == 0
    wait_for(lambda: d.cli("report", "--since", "1970-01-02", "--format", "csv")
             .stdout.count("\n") >= 2, timeout=20, what="the job in a report")
    with sqlite3.connect(d.state / "vgpu.db") as db:
        kept = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"
                                         " AND name LIKE 'usage_unreadable_%'")]
        assert len(kept) == 1
        assert db.execute(f'SELECT job_id FROM "{kept[0]}"').fetchall() == [("1",)]


def test_daemon_on_a_read_only_state_or_socket_dir_is_one_line_and_exit_8(daemon_factory,
                                                                           tmpfs):
    d = daemon_factory(start=False)
    ro = tmpfs("ro", ro=True)
    for env in ({"VGPU_STATE_DIR": str(ro / "state")}, {"VGPU_STATE_DIR": str(ro)},
                {"VGPU_SOCKET": str(ro / "vgpud.sock")}):
        r = d.cli("daemon", env=env, timeout=60)
        one_line(r, 8, daemon=True)


@needs_native
def test_exit_status_survives_a_full_state_disk(daemon_factory, tmpfs):
    d = daemon_factory(start=False)
    d.env["VGPU_STATE_DIR"] = str(tmpfs("state", size="2m"))
    d.state = Path(d.env["VGPU_STATE_DIR"])
    d.start()
    p = d.popen("run", "-q", "--mem", "256M", "--name", "full", "--", sys.executable, "-c",
                "import sys; print('up', flush=True); sys.stdin.readline(); sys.exit(7)",
                stdin=subprocess.PIPE)
    filler = d.state / "filler"
    try:
        assert read_line(p.stdout).strip() == "up"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:                                   # the disk is full from here
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        with d.client() as c:                  # the WAL's free pages too
            for _ in range(500):
                try:
                    c.call("run", command=["x" * 4000], cwd="/", mem=1 << 20)
                except StateError:
                    break
            else:
                pytest.fail("the full disk did not stop a run")
        p.stdin.write("go\n")
        p.stdin.close()
        assert p.wait(30) == 7
        ended = wait_for(lambda: next((j for j in d.jobs(all_jobs=True)
                                       if j["name"] == "full" and j["state"] == "ended"),
                                      None), what="the job's end")
        assert ended["exit_code"] == 7
    finally:
        if p.poll() is None:
            p.kill()
        filler.unlink(missing_ok=True)
    wait_for(lambda: "can't write" in d.log.read_text(), what="the write error logged")
    wait_for(lambda: "writable again" in d.log.read_text(), what="the writes to land")
    d.stop()
    d.start()
    ended = [j for j in d.jobs(all_jobs=True) if j["name"] == "full"]
    assert ended and ended[0]["exit_code"] == 7 and ended[0]["state"] == "ended"
    assert "Traceback" not in d.log.read_text()


def test_report_as_another_user_on_a_private_state_dir_is_exit_5(daemon_factory):
    d = daemon_factory()
    d.state.chmod(0o700)
    argv = vgpuctl_argv()
    try:
        r = subprocess.run([*argv, "report", "--since", "1970-01-02"], capture_output=True,
                           text=True, user=65534, timeout=60, cwd="/",
                           env={**d.env, "HOME": "/"})
    except (PermissionError, OSError) as e:
        pytest.skip(f"can't run vgpuctl as nobody here: {e}")
    if "Permission denied" in r.stderr and "vgpuctl: error" not in r.stderr:
        pytest.skip(f"can't run vgpuctl as nobody here: {r.stderr.strip()[-200:]}")
    one_line(r, 5)


def test_report_reading_a_private_state_dir_is_permission_denied(daemon_factory):
    """The same as nobody through vgpuctl's own code, where the interpreter
    can't be run as nobody: a forked child drops to uid 65534 and reads."""
    from vgpuctl.errors import VgpuError
    from vgpuctl.store import reports

    d = daemon_factory()
    d.state.chmod(0o700)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setgid(65534)
            os.setuid(65534)
            reports.load(d.state / "vgpu.db", 0.0, 1e12)
        except VgpuError as e:
            code = e.exit_code
        except BaseException:
            code = 99
        finally:
            os.write(w, bytes([code]))
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    assert got == bytes([5])
