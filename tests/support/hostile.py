"""A hostile user's side for the hostile tier: a small program run by a
plain system Python as nobody (uid 65534), so that the daemon sees a uid
other than root's. `as_nobody` starts it, or skips the test where that
can't run here."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from typing import Any

import pytest

NOBODY = 65534

# Opens N connections to SOCKET and holds them; then says, as JSON, how many
# the daemon closed at once (with the error line it sent) and how many it
# keeps open; holds them until its stdin closes.
HOLD = r"""
import json, select, socket, sys, time
path, n = sys.argv[1], int(sys.argv[2])
socks, failed = [], 0
for _ in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        socks.append(s)
    except OSError:
        failed += 1
        s.close()
time.sleep(1.0)
poll = select.poll()
for s in socks:
    poll.register(s, select.POLLIN)
byfd = {s.fileno(): s for s in socks}
closed, lines = 0, set()
for fd, _ in poll.poll(0):
    s = byfd[fd]
    data = s.recv(4096)
    closed += 1
    if data:
        lines.add(json.loads(data)["error"]["message"])
print(json.dumps({"open": len(socks) - closed, "closed": closed, "failed": failed,
                  "lines": sorted(lines)}), flush=True)
sys.stdin.read()
"""

# Connects and closes as fast as it can for SECONDS; prints how many times.
CHURN = r"""
import socket, sys, time
path, secs = sys.argv[1], float(sys.argv[2])
end, n = time.monotonic() + secs, 0
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        pass
    s.close()
    n += 1
print(n, flush=True)
"""


def _drop() -> None:
    """In the child: room for many descriptors, then become nobody."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (8192, 8192))
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def as_nobody(code: str, *args: str, **kw: Any) -> subprocess.Popen[str]:
    """Start `python3 -c code args...` as nobody (stdin, stdout piped, text);
    skip the test when no Python runs as nobody here."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as nobody")
    py = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")
    if py is None:
        pytest.skip("no system python3 to run as nobody")
    probe = subprocess.run([py, "-c", "pass"], preexec_fn=_drop, capture_output=True,
                           text=True, timeout=60, cwd="/")
    if probe.returncode != 0:
        pytest.skip(f"can't run {py} as nobody: {probe.stderr.strip()[-200:]}")
    kw.setdefault("stdin", subprocess.PIPE)
    kw.setdefault("stdout", subprocess.PIPE)
    return subprocess.Popen([py, "-c", code, *args], preexec_fn=_drop, text=True,
                            cwd="/", **kw)


def in_child_as_nobody(fn: Any, timeout: float = 60, uid: int = NOBODY) -> Any:
    """fn() run in a forked child of this process as nobody (uid 65534, or
    the uid given), its result (anything JSON can carry) returned; the
    exception it raised as an AssertionError. The child uses only what this process has already
    imported (nobody may not read this interpreter's files); skip where
    this process can't become nobody."""
    import json
    import select

    if os.geteuid() != 0:
        pytest.skip("needs root to act as nobody")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = {"ok": fn()}
        except BaseException as e:
            out = {"error": f"{type(e).__name__}: {e}"}
        try:
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    try:
        while select.select([r], [], [], timeout)[0]:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    got = json.loads(data or b'{"error": "no answer"}')
    if "error" in got:
        raise AssertionError(f"as nobody: {got['error']}")
    return got["ok"]


def start_job_as_nobody(socket: Any, argv: list[str], env: dict[str, str], mem: int,
                        core: int | None, hooked: bool = False, name: str | None = None,
                        policy: str | None = None, gpu: str | None = None,
                        drop: tuple[str, ...] = (), priority: str | None = None
                        ) -> dict[str, Any]:
    """A job of nobody's, as its user would start one without `vgpuctl run`
    (which nobody may not run here): the daemon admits it, its command runs
    as nobody with the job's environment (the hook preloaded only when
    hooked: an attacker leaves it out; the variables in `drop` left out too),
    and the daemon hears its pid. Returns
    {"job": id, "pid": pid}; the command outlives the call. (A root daemon
    opens its simulated GPU's state file to every user, mode 0666.)"""
    from pathlib import Path

    from vgpuctl.client.connection import Client

    def go() -> dict[str, Any]:
        with Client.connect(Path(socket)) as cl:
            r = cl.call("run", command=argv, cwd="/", mem=mem, core=core, name=name,
                        policy=policy, gpu=gpu, priority=priority)
        job_env = {k: v for k, v in {**env, **r["env"]}.items() if k not in drop}
        for k, v in r["prepend"].items():
            if k == "LD_PRELOAD" and not hooked:
                continue
            job_env[k] = v + (":" + job_env[k] if job_env.get(k) else "")
        if not hooked:
            job_env.pop("LD_PRELOAD", None)
        pid = os.fork()
        if pid == 0:
            try:
                null = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.closerange(3, 65536)
                os.execvpe(argv[0], argv, job_env)
            finally:
                os._exit(127)
        with Client.connect(Path(socket)) as cl:
            cl.call("started", job=r["job"]["id"], pid=pid)
        return {"job": r["job"]["id"], "pid": pid}

    return in_child_as_nobody(go)


def retried_alloc(size: int) -> str:
    """A co-tenant's program: its context, "ready", then (at a line on
    stdin) `size` bytes of GPU 0, tried every 50 ms until it succeeds or
    30 s pass ("ok TRIES", or "fail TRIES ERROR"); it then waits for a line."""
    return f"""
import sys, time
from cuda.bindings import driver as cu
cu.cuInit(0)
ctx = cu.cuDevicePrimaryCtxRetain(0)[1]
cu.cuCtxSetCurrent(ctx)
print("ready", flush=True)
sys.stdin.readline()
t0, tries = time.monotonic(), 0
while True:
    r = cu.cuMemAlloc({size})
    tries += 1
    if r[0] == cu.CUresult.CUDA_SUCCESS:
        print("ok", tries, flush=True)
        break
    if time.monotonic() - t0 > 30:
        print("fail", tries, r[0].name, flush=True)
        break
    time.sleep(0.05)
sys.stdin.readline()
"""
