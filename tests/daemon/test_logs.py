"""The daemon's log: a message is one line whatever text a user chose (in
the plain form and journald's), what a client can make the daemon log is
rate-limited, and a request that fails on a bug gets an `internal` reply of
one line and costs the log at most one line per burst."""

from __future__ import annotations

import io
import logging
import os
import re
from pathlib import Path

import pytest
from support.daemon import ask

from vgpuctl.core import protocol as P
from vgpuctl.core.config import Config
from vgpuctl.daemon import logs, requests
from vgpuctl.daemon.supervisor import Peer, Supervisor
from vgpuctl.store.database import Store
from vgpuctl.system.nvml import GpuStats
from vgpuctl.system.paths import DaemonPaths

FORGED = "2099-01-01 00:00:00,000 vgpud[1] ERROR forged"
PLAIN_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} vgpud\[\d+\] [A-Z]+ ")


def record(msg: str, *args: object, exc: BaseException | None = None,
           level: int = logging.WARNING) -> logging.LogRecord:
    info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("vgpuctl.daemon", level, __file__, 1, msg, args, info)


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as e:
        return e


def test_a_message_is_one_line_whatever_its_text():
    """A job name, command or directory with a newline, a carriage return
    or an escape sequence can't start a line of its own in the log."""
    evil = f"x\n{FORGED}\r{FORGED}\x1b[2K\u2028{FORGED}\x85"
    plain = logs.Formatter(logs.PLAIN_FORMAT).format(record("job 3 (%s) admitted", evil))
    assert len(plain.splitlines()) == 1 and PLAIN_LINE.match(plain), plain
    assert "\\n" + FORGED in plain and "\x1b" not in plain and "\r" not in plain
    journal = logs.JournalFormatter("%(message)s").format(record("job (%s)", evil))
    assert journal.startswith("<4>job (x\\n2099") and len(journal.splitlines()) == 1
    assert journal.isprintable()


def test_a_traceback_is_indented_under_its_message():
    """The lines of a traceback follow their message, indented: no line of
    it starts like a message, even when the exception's text is forged."""
    exc = raised(KeyError(f"k\n{FORGED}"))
    for fmt, first in ((logs.Formatter(logs.PLAIN_FORMAT), PLAIN_LINE),
                       (logs.JournalFormatter("%(message)s"), re.compile(r"<3>failed$"))):
        lines = fmt.format(record("failed", exc=exc, level=logging.ERROR)).split("\n")
        assert first.match(lines[0]), lines
        assert len(lines) > 3
        rest = [ln.removeprefix("<3>") for ln in lines[1:]]
        assert all(ln.startswith(logs.CONTINUED) for ln in rest), lines
        assert any("Traceback" in ln for ln in rest)
        assert not any(PLAIN_LINE.match(ln) for ln in rest)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def logged():
    """The lines the vgpuctl.daemon logger writes (at INFO, the daemon's
    default level), in the daemon's plain form."""
    out = io.StringIO()
    h = logging.StreamHandler(out)
    h.setFormatter(logs.Formatter(logs.PLAIN_FORMAT))
    root = logging.getLogger("vgpuctl")
    old = root.level
    root.addHandler(h)
    root.setLevel(logging.INFO)
    yield lambda: out.getvalue().splitlines()
    root.removeHandler(h)
    root.setLevel(old)


def test_a_burst_is_its_first_line_then_counts(logged):
    clock = Clock()
    b = logs.Burst("bad lines", clock=clock)
    assert b.hit("pid 1")
    for _ in range(1000):
        clock.t += 1 / 64
        assert not b.hit("pid 1")
    assert len(logged()) == 1 and "bad lines: pid 1" in logged()[0]
    said = []
    for _ in range(130):             # a burst that goes on says so, once a minute at most
        clock.t += 1
        said.append(b.hit("pid 2"))
    assert said.count(True) == 2 and len(logged()) == 3
    assert "bad lines: 1046 in 61 s, still going; the latest: pid 2" in logged()[1]
    clock.t += logs.QUIET_S          # it stopped: the next event says so, and starts anew
    assert b.hit("pid 3")
    assert "bad lines: 1131 in 145.6 s, now stopped" in logged()[3]
    assert "bad lines: pid 3" in logged()[4]
    assert len(logged()) == 5


def test_each_kind_has_its_own_burst(logged):
    bs = logs.Bursts("request failed", clock=Clock())
    for _ in range(50):
        bs.hit("ps/KeyError", "a")
        bs.hit("kill/OSError", "b")
    assert len(logged()) == 2
    for i in range(200):            # the kinds are bounded
        bs.hit(f"k{i}", "c")
    assert len(bs.kinds) <= logs.MAX_KINDS and len(logged()) <= logs.MAX_KINDS + 2


# -- a request that fails on a bug ------------------------------------------------------
G = 1 << 30
ME = Peer(os.getpid(), os.getuid(), os.getgid())


def boom(self, peer, req):
    raise RuntimeError(f"boom\n{FORGED}")


@pytest.fixture
def failing(tmp_path: Path, monkeypatch):
    """A Supervisor in-process whose `ping` handler fails as a bug would."""
    monkeypatch.setitem(requests.ROUTES, P.Ping, requests.Route(boom))
    dp = DaemonPaths(socket=tmp_path / "s.sock", runtime_dir=tmp_path / "run",
                     state_dir=tmp_path / "state", config=None, system=False)
    dp.jobs_dir.mkdir(parents=True, exist_ok=True)
    store = Store.open(dp.db)
    sup = Supervisor(Config(), dp, store,
                     [GpuStats(0, "GPU-00000000-aaaa", "Sim GPU", 16 * G)],
                     hook_library=lambda: tmp_path / "libvgpu.so")
    yield sup
    store.close()


def test_a_request_failing_on_a_bug_is_an_internal_error_and_the_daemon_serves_on(failing):
    reply = ask(failing, ME, P.encode_request("ping"))
    assert reply["ok"] is False and reply["error"]["code"] == "internal"
    assert "RuntimeError: boom" in reply["error"]["message"]
    assert isinstance(P.reply_exception(reply), Exception)
    after = ask(failing, ME, P.encode_request("ps"))
    assert after["ok"] is True and after["jobs"] == []


def test_a_flood_of_failing_requests_is_one_log_line(failing, logged):
    """200 requests that fail on the same bug: each is answered with one
    line of text; the log gets one line (the exception, no traceback at
    the daemon's default level) for the burst."""
    for _ in range(200):
        reply = ask(failing, ME, P.encode_request("ping"))
        assert reply["error"]["code"] == "internal"
        assert len(reply["error"]["message"].splitlines()) == 1, reply
    lines = logged()
    assert len(lines) == 1, lines
    assert "RuntimeError: boom" in lines[0] and "Traceback" not in lines[0]
