"""Connections a hostile user opens can't make the daemon unusable: under
1,100 idle connections at 1,024 descriptors and under connect/close churn,
the operator's `ps` answers within 2 s and `run` goes through the daemon."""

from __future__ import annotations

import json
import resource
import time

from support.daemon import needs_native, read_line
from support.hostile import CHURN, HOLD, as_nobody, in_child_as_nobody


def _nofile_1024() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))


def _timed_ps(daemon) -> float:
    """Seconds from connecting to the operator's `ps` reply (what the daemon
    answers for; a `vgpuctl ps` adds its own start-up, which the churn's
    processes slow down on a small machine)."""
    t0 = time.monotonic()
    with daemon.client() as c:
        c.call("ps")
    return time.monotonic() - t0


def _cli_ps(daemon) -> None:
    r = daemon.cli("ps", "--json", timeout=30)
    assert r.returncode == 0, r.stderr


def _run_goes_through(daemon) -> None:
    r = daemon.cli("run", "--mem", "256M", "--name", "through", "--", "true", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "user daemon" not in r.stderr
    assert any(j["name"] == "through" for j in daemon.jobs(all_jobs=True))


@needs_native
def test_1100_idle_connections_at_1024_descriptors(daemon_factory):
    d = daemon_factory(start=False)
    d.start(preexec_fn=_nofile_1024)
    hog = as_nobody(HOLD, str(d.socket), "1100")
    try:
        got = json.loads(read_line(hog.stdout, timeout=120))
        # One user holds at most its cap; the rest were told why and closed.
        assert got["open"] <= 64, got
        assert got["closed"] + got["failed"] >= 1100 - 64, got
        assert any("holds its most connections" in m for m in got["lines"]), got
        assert max(_timed_ps(d) for _ in range(5)) < 2.0
        _cli_ps(d)
        _run_goes_through(d)
    finally:
        hog.stdin.close()
        hog.wait(30)
    log = d.log.read_text()
    assert "Traceback" not in log
    assert log.count("connections refused") <= 2, log[-2000:]


@needs_native
def test_connect_close_churn(daemon_factory):
    d = daemon_factory(start=False)
    d.start(preexec_fn=_nofile_1024)
    churn = [as_nobody(CHURN, str(d.socket), "5") for _ in range(2)]
    try:
        end = time.monotonic() + 4
        times = []
        while time.monotonic() < end:
            times.append(_timed_ps(d))
        _cli_ps(d)
        _run_goes_through(d)
    finally:
        counts = [int(p.communicate(timeout=60)[0]) for p in churn]
    assert sum(counts) > 1000, counts       # the churn really ran
    assert max(times) < 2.0, times
    assert "Traceback" not in d.log.read_text()


@needs_native
def test_run_waits_for_a_system_daemon_and_never_starts_its_own(daemon_factory):
    d = daemon_factory()
    d.stop(9)          # SIGKILL: its shared socket is left behind, nobody listens
    assert d.socket.is_socket()
    t0 = time.monotonic()
    r = d.cli("run", "--mem", "256M", "--", "true", env={"VGPU_DAEMON_WAIT": "2"})
    took = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    lines = r.stderr.splitlines()
    assert "waiting up to 2 s" in lines[0] and len(lines) == 2, r.stderr
    assert lines[1].startswith("vgpuctl: error: ") and "private daemon" in lines[1]
    assert 2.0 <= took < 30
    assert "user daemon" not in r.stderr
    # The daemon restarts while run waits: the job goes through it.
    p = d.popen("run", "--mem", "256M", "--name", "after-restart", "--", "true",
                env={"VGPU_DAEMON_WAIT": "60"})
    try:
        assert "waiting up to 60 s" in read_line(p.stderr)
        d.start()
        assert p.wait(60) == 0, p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
    assert any(j["name"] == "after-restart" for j in d.jobs(all_jobs=True))


def test_a_daemon_socket_refuses_a_busy_listener_as_a_conflict(daemon):
    """A second daemon on a live, busy socket is a conflict (exit 10), not a
    private daemon taking the socket over."""
    r = daemon.cli("daemon", timeout=60)
    assert r.returncode == 10, r.stderr
    assert r.stderr.count("\n") == 1


@needs_native
def test_a_socket_path_too_long_for_sun_path_is_served(daemon_factory):
    """A socket path longer than a Unix address holds (108 bytes) is bound
    and reached through /proc/self/fd/<dir fd>/<name>: `ps` and `run` work."""
    import socket

    d = daemon_factory(start=False)
    long_dir = d.base / ("d" * 60) / ("e" * 60)
    long_dir.mkdir(parents=True)
    d.socket = long_dir / "vgpud.sock"
    d.env["VGPU_SOCKET"] = str(d.socket)
    assert len(str(d.socket).encode()) > 108
    d.start()
    assert d.socket.is_socket()
    with socket.socket(socket.AF_UNIX) as s:    # too long to connect by its name
        try:
            s.connect(str(d.socket))
            raise AssertionError("a path over 108 bytes connected by its name")
        except OSError:
            pass
    r = d.cli("ps", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["daemon"]["socket"] == str(d.socket)
    _run_goes_through(d)


def _nofile_168() -> None:
    # 40 connections in all (168 less the daemon's 128), 30 of them for users
    resource.setrlimit(resource.RLIMIT_NOFILE, (168, 168))


def _ping_as(uid: int, socket_path) -> bool:
    """A ping from a forked child of this process become uid."""
    from vgpuctl.client.connection import Client

    def go() -> bool:
        with Client.connect(socket_path, timeout=10) as cl:
            return bool(cl.call("ping"))
    return in_child_as_nobody(go, uid=uid)


def test_a_user_holding_every_connection_gives_one_up_to_another(daemon_factory):
    """One user (nobody) holds every connection users may hold, as sixteen
    users with keep-alive pings did: another user (uid 1) who holds none is
    not shut out: the holder gives up the connection that asked least
    lately."""
    d = daemon_factory(start=False)
    d.start(preexec_fn=_nofile_168)
    hog = as_nobody(HOLD, str(d.socket), "40")
    try:
        got = json.loads(read_line(hog.stdout, timeout=60))
        assert got["open"] == 30, got              # every connection users may hold
        assert _ping_as(1, d.socket)
        assert _ping_as(1, d.socket)               # (and again: its first one closed)
    finally:
        hog.stdin.close()
        hog.wait(30)


def test_who_gives_a_connection_up():
    """The rule, row by row: a user holding fewer than FAIR_MIN gets one from
    the user holding the most, if that one holds two more; root never gives
    one up, and a user holding FAIR_MIN asks no one."""
    from collections import Counter

    from vgpuctl.daemon.server import FAIR_MIN, ConnectionLimits

    pick = ConnectionLimits.fair_victim
    assert pick(7, Counter({5: 30})) == 5
    assert pick(7, Counter({5: 10, 6: 20})) == 6                 # the one holding the most
    assert pick(7, Counter({5: 20, 6: 20})) == 5                 # (a tie: the lower uid)
    assert pick(7, Counter({7: 1, 5: 2})) is None                # not two more
    assert pick(7, Counter({7: FAIR_MIN, 5: 30})) is None        # holds enough already
    assert pick(7, Counter({0: 40})) is None                     # root keeps its own
    assert pick(0, Counter({5: 30})) is None                     # root has its reserve
