"""The socket server itself, in a process of its own with a fake
supervisor: a connection over a cap is told why and closed, an idle one is
closed (blank lines are not requests), and running out of descriptors
(EMFILE) or a flood of over-long lines is logged once per burst without
stopping the service."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from support.daemon import read_line

from vgpuctl.client.connection import Client
from vgpuctl.core import protocol as P

# argv: socket path, descriptor limit, total cap, idle seconds.
SERVER = r"""
import asyncio, logging, resource, sys
from pathlib import Path
nofile = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
from vgpuctl.core import protocol as P
from vgpuctl.daemon import server as S
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")

class Supervisor:
    async def reply(self, peer, line):
        try:
            req = P.parse_request(line)
        except P.errors.RequestInvalid as e:
            return P.error("protocol", str(e))
        if isinstance(req, P.Reload):       # a bug, as the server must expect one
            raise RuntimeError("a bug")
        return P.ok(pong=True)

async def main():
    sock = S.listen(Path(sys.argv[1]), 0o600)
    total = int(sys.argv[3])
    srv = S.Server(Supervisor(), S.ConnectionLimits(total, total, total),
                   idle_s=float(sys.argv[4]))
    await srv.start(sock)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await srv.close()

asyncio.run(main())
"""


def _server(path: Path, nofile: int, total: int, idle_s: float) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", SERVER, str(path), str(nofile), str(total),
                          str(idle_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert read_line(p.stdout).strip() == "ready"
    return p


def _stop(p: subprocess.Popen[str]) -> str:
    return p.communicate("\n", timeout=30)[1]


def _connect(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(path))
    return s


def test_over_the_cap_is_told_why_and_may_retry(tmp_path: Path):
    path = tmp_path / "s.sock"
    p = _server(path, 1024, 2, 60)
    held = [_connect(path), _connect(path)]
    try:
        extra = _connect(path)
        extra.settimeout(5)
        line = extra.recv(4096)
        assert b'"retry":true' in line and b"most connections (2)" in line
        assert extra.recv(4096) == b""            # and closed
    finally:
        for s in held:
            s.close()
    with Client.connect(path, timeout=10) as c:  # a slot is free again: served
        assert c.call("ping")["pong"] is True
    assert _stop(p).count("connections refused") == 1


def test_an_idle_connection_is_closed(tmp_path: Path):
    path = tmp_path / "s.sock"
    p = _server(path, 1024, 100, 0.5)
    try:
        s = _connect(path)
        s.settimeout(10)
        t0 = time.monotonic()
        assert s.recv(4096) == b""
        assert 0.4 < time.monotonic() - t0 < 5
    finally:
        _stop(p)


def test_out_of_descriptors_is_logged_once_and_the_service_recovers(tmp_path: Path):
    path = tmp_path / "s.sock"
    p = _server(path, 64, 1000, 60)              # caps above what the descriptors allow
    held = []
    try:
        for _ in range(150):
            held.append(_connect(path))
        # Some are told the daemon is out of descriptors; the rest wait.
        told = 0
        for s in held[-40:]:
            s.settimeout(0.2)
            try:
                told += b"out of file descriptors" in s.recv(4096)
            except TimeoutError:
                pass
        assert told > 0
    finally:
        for s in held:
            s.close()
    with Client.connect(path, timeout=10) as c:
        assert c.call("ping")["pong"] is True
    err = _stop(p)
    assert err.count("accept failed: Too many open files") == 1, err
    assert "Traceback" not in err


def test_blank_lines_do_not_hold_a_connection_open(tmp_path: Path):
    """Only a request resets the idle clock: a connection that sends blank
    or whitespace lines, however often, is closed after idle_s like one
    that sends nothing; one that sends requests is not."""
    import select

    path = tmp_path / "s.sock"
    p = _server(path, 1024, 100, 0.5)
    try:
        blank, busy = _connect(path), _connect(path)
        busy_file = busy.makefile("rb")
        t0 = time.monotonic()
        closed_after = None
        while time.monotonic() - t0 < 5 and closed_after is None:
            for filler in (b"\n", b"  \t\r\n"):
                try:
                    blank.sendall(filler)
                except OSError:
                    closed_after = time.monotonic() - t0
                    break
            busy.sendall(P.encode_request("ping"))
            assert json.loads(busy_file.readline())["pong"] is True
            if select.select([blank], [], [], 0.05)[0]:
                assert blank.recv(4096) == b""
                closed_after = time.monotonic() - t0
        assert closed_after is not None, "blank lines kept the connection open for 5 s"
        assert closed_after >= 0.4
        busy.sendall(P.encode_request("ping"))      # requests kept this one open
        assert json.loads(busy_file.readline())["pong"] is True
    finally:
        _stop(p)


def test_lines_over_the_limit_are_logged_once_per_burst(tmp_path: Path):
    path = tmp_path / "s.sock"
    p = _server(path, 1024, 100, 60)
    try:
        for _ in range(20):
            s = _connect(path)
            s.settimeout(10)
            try:
                s.sendall(b"x" * (P.MAX_LINE + 16))
            except OSError:
                pass
            got = s.makefile("rb").readline()
            assert b"request longer than" in got
            s.close()
        with Client.connect(path, timeout=10) as c:
            assert c.call("ping")["pong"] is True
    finally:
        err = _stop(p)
    assert err.count(f"over {P.MAX_LINE} bytes") == 1, err


def test_a_connection_failing_on_a_bug_is_told_and_logged_once_per_burst(tmp_path: Path):
    """Whatever goes wrong in serving one connection, its client gets an
    `internal` error line, the log one line per burst (no traceback), and
    the other connections don't notice."""
    path = tmp_path / "s.sock"
    p = _server(path, 1024, 100, 60)
    try:
        with Client.connect(path, timeout=10) as other:
            for _ in range(20):
                s = _connect(path)
                s.settimeout(10)
                s.sendall(P.encode_request("reload"))
                reply = json.loads(s.makefile("rb").readline())
                assert reply["error"]["code"] == "internal", reply
                assert len(reply["error"]["message"].splitlines()) == 1, reply
                s.close()
                assert other.call("ping")["pong"] is True
    finally:
        err = _stop(p)
    assert err.count("connection failed") == 1, err
    assert "Traceback" not in err, err
