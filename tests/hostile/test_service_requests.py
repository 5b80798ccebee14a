"""Bad requests neither flood the log nor fool the daemon: JSON nested 2,000
deep, job ids that are not the daemon's own ("0003", "٣", past SQLite's
largest integer), names with control characters, and text chosen to forge a
log line are each a `protocol` error reply or an escaped line, never a
traceback, and the daemon serves on. A `started` naming another user's
process is refused (as nobody, where that can run)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from typing import Any

from support.daemon import read_line, wait_for
from support.hostile import as_nobody

from vgpuctl.core import protocol as P

G = 1 << 30
FORGED = "2099-01-01 00:00:00,000 vgpud[1] ERROR forged"


class Raw:
    """A connection that speaks the protocol line by line, as any client
    may: whatever it sends, it reads the reply as it comes."""

    def __init__(self, path: Any) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")

    def ask(self, line: bytes | str) -> dict[str, Any]:
        if isinstance(line, str):
            line = line.encode()
        self.sock.sendall(line.rstrip(b"\n") + b"\n")
        got = self.file.readline()
        assert got, "the daemon closed the connection instead of replying"
        return json.loads(got)

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        return self.ask(P.encode_request(op, **fields))

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def code(reply: dict[str, Any]) -> str:
    return "ok" if reply.get("ok") else reply["error"]["code"]


def log_lines(d) -> list[str]:
    return d.log.read_text(errors="replace").splitlines()


def test_json_nested_too_deep_is_refused_and_costs_the_log_nothing(daemon):
    before = len(log_lines(daemon))
    deep = [b"[" * 2000, b'{"v":1,"op":"ping","x":' + b"[" * 100_000,
            b'{"a":' * 2000, b'{"v":1,"op":' + b"[" * 990 + b"]" * 990 + b"}"]
    with Raw(daemon.socket) as c:
        for _ in range(25):
            for line in deep:
                reply = c.ask(line)
                assert code(reply) == "protocol", reply
        assert code(c.call("ping")) == "ok"          # the same connection serves on
    with Raw(daemon.socket) as c:
        assert code(c.call("ps")) == "ok"
    lines = log_lines(daemon)
    assert "Traceback" not in "\n".join(lines)
    assert len(lines) - before <= 1, lines[before:]


# Admits a job and starts it on the pid given, then exits: the job's
# launcher is gone (were it the test's own process, the daemon would count
# the test's other children, the daemon among them, as the job's).
START = r"""
import sys
from vgpuctl.client.connection import Client
with Client.connect(sys.argv[1]) as c:
    jid = c.call("run", command=["sleep", "300"], cwd="/", mem=1 << 30)["job"]["id"]
    c.call("started", job=jid, pid=int(sys.argv[2]))
print(jid)
"""


def _running_job(daemon, procs: list[subprocess.Popen[bytes]]) -> str:
    p = subprocess.Popen(["sleep", "300"])
    procs.append(p)
    r = subprocess.run([sys.executable, "-c", START, str(daemon.socket), str(p.pid)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    jid = r.stdout.strip()
    assert daemon.job(jid)["state"] == "running"
    return jid


def test_a_job_id_is_only_the_daemons_own_form(daemon):
    """"0003" or "٣" for running job 3 is a protocol error, never "job
    0003 has ended"; an id past SQLite's largest integer is one too, not an
    OverflowError's traceback in the log."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        jid = _running_job(daemon, procs)
        arabic = jid.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
        wide = jid.translate(str.maketrans("0123456789", "０１２３４５６７８９"))
        bad = ["000" + jid, arabic, wide, "+" + jid, "9" * 19, "9223372036854775808"]
        with Raw(daemon.socket) as c:
            for b in bad:
                for op, fields in (("ps", {}), ("kill", {}), ("set", {"core": 50}),
                                   ("exited", {"code": 0}), ("started", {"pid": 1})):
                    reply = c.call(op, job=b, **fields)
                    assert code(reply) == "protocol", (op, b, reply)
                    assert "has ended" not in reply["error"]["message"]
                for op in ("slurm_attach", "slurm_release"):
                    assert code(c.call(op, slurm_job=b)) == "protocol", (op, b)
            j = c.call("ps", job=jid)["jobs"][0]
        assert j["state"] == "running" and j["core"] == 100
        assert procs[0].poll() is None                 # not killed
        assert "Traceback" not in daemon.log.read_text()
        # The CLI: other digits are a usage error, never sent; ASCII zeros
        # in front are the same id, sent as the daemon writes it.
        r = daemon.cli("kill", arabic)
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("vgpuctl: error: ") and r.stderr.count("\n") == 1
        assert procs[0].poll() is None
        r = daemon.cli("set", "00" + jid, "--core", "40")
        assert r.returncode == 0, r.stderr
        assert daemon.job(jid)["core"] == 40
    finally:
        daemon.cleanup_jobs()
        for p in procs:
            p.kill()
            p.wait()


def test_a_name_with_a_control_character_is_a_protocol_error(daemon):
    with Raw(daemon.socket) as c:
        for bad in ("a\nb", "a\rb", "red\x1b[31m", "a\u2028b", "a\x85b", "a\x7fb"):
            reply = c.call("run", command=["true"], cwd="/", mem=G, name=bad)
            assert code(reply) == "protocol", reply
            assert "control character" in reply["error"]["message"]
        assert daemon.jobs(all_jobs=True) == []
    r = daemon.cli("run", "--mem", "256M", "--name", "two\nlines", "--", "true")
    assert r.returncode == 7, r.stderr
    assert r.stderr.count("\n") == 1 and "control character" in r.stderr


def test_text_a_user_chose_cannot_forge_a_log_line(daemon):
    """A job's command and directory may hold newlines (they are not
    refused): in the daemon's log they are escaped, so every line of the
    log is one the daemon started."""
    argv = [f"x\n{FORGED}\r{FORGED}\x1b[2K", f"y\n{FORGED}"]
    with daemon.client() as c:
        jid = c.call("run", command=argv, cwd=f"/tmp\n{FORGED}", mem=G)["job"]["id"]
        c.call("exited", job=jid, code=0)
    wait_for(lambda: f"job {jid} (" in daemon.log.read_text()
             and "ended" in daemon.log.read_text(), what="the job's lines in the log")
    text = daemon.log.read_text()
    pid = daemon.proc.pid
    ours = re.compile(rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d{{3}} vgpud\[{pid}\] [A-Z]+ ")
    assert all(ours.match(ln) or ln.startswith("  ") for ln in text.splitlines()), text
    assert "\r" not in text and "\x1b" not in text
    assert "x\\n" + FORGED in text                    # written, escaped


# Asks `run` as nobody, then `started` with a pid that is not nobody's (the
# test's own, root's): prints each reply, and waits for a line on stdin
# before it says `started` with its own pid and then `exited`.
STARTED = r"""
import json, os, socket, sys
path, other = sys.argv[1], int(sys.argv[2])
def call(msg):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall((json.dumps(dict(v=1, **msg)) + "\n").encode())
    line = s.makefile("rb").readline()
    s.close()
    return json.loads(line)
run = call({"op": "run", "command": ["sleep", "300"], "cwd": "/", "mem": 1 << 28})
jid = run["job"]["id"]
print(json.dumps({"job": jid, "uid": run["job"]["uid"],
                  "other": call({"op": "started", "job": jid, "pid": other})}), flush=True)
sys.stdin.readline()
print(json.dumps(call({"op": "started", "job": jid, "pid": os.getpid()})), flush=True)
print(json.dumps(call({"op": "exited", "job": jid, "code": 0})), flush=True)
"""


def test_a_started_pid_must_run_as_the_jobs_user(daemon):
    """A user's `started` naming root's process is refused (`permission`):
    the job does not take that pid, and is still the user's to start."""
    me = os.getpid()
    p = as_nobody(STARTED, str(daemon.socket), str(me))
    try:
        got = json.loads(read_line(p.stdout, timeout=60))
        assert got["uid"] == 65534
        assert code(got["other"]) == "permission", got
        assert "does not run as" in got["other"]["error"]["message"]
        j = daemon.job(got["job"])
        assert j["state"] == "starting" and me not in j["pids"], j
        p.stdin.write("\n")
        p.stdin.flush()
        own = json.loads(read_line(p.stdout, timeout=60))
        assert code(own) == "ok", own
        assert own["job"]["pids"] == [p.pid] and me not in own["job"]["pids"]
        assert code(json.loads(read_line(p.stdout, timeout=60))) == "ok"
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(30)
