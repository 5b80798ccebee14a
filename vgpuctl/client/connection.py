"""Talking to the daemon: connect to the first that answers, or start a user
daemon -- but never in the place of a system daemon: when this node has one
(its socket, runtime dir, config file or unit exists) or a shared daemon's
socket is left where we connect, `connect_or_start` waits for it, saying so,
until WAIT_S (``VGPU_DAEMON_WAIT``) and then fails (exit 3). A private daemon
would admit jobs outside the system daemon's admission and accounting.

Kept light on purpose (no dataclasses, no click): `vgpuctl run` imports this
module and little else, so that the time it adds to a command stays small
(see bench/run_overhead.py).
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vgpuctl.core import protocol as P
from vgpuctl.errors import DaemonConflict, DaemonUnavailable, ProtocolError
from vgpuctl.system import paths

MAX_REPLY = 256 << 20
START_TIMEOUT_S = 15.0
WAIT_S = 60.0            # how long `run` waits for a system daemon that does not answer
BUSY_RETRY_S = 0.01      # first pause after a full backlog (EAGAIN), doubling to 0.05 s


class Client:
    """One connection to a daemon; `call` sends a request and returns the
    reply's fields, raising the VgpuError an error reply stands for."""

    def __init__(self, path: Path, sock: socket.socket, timeout: float = 30.0) -> None:
        self.path = path
        self._sock = sock
        self._buf = b""
        self._timeout = timeout

    @classmethod
    def connect(cls, path: Path, timeout: float = 30.0) -> Client:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        name = str(path)
        fd = None
        if len(name.encode()) >= 100:     # too long for sun_path: go through the dir
            fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            name = f"/proc/self/fd/{fd}/{path.name}"
        deadline = time.monotonic() + timeout
        pause = BUSY_RETRY_S
        try:
            while True:
                try:
                    s.connect(name)
                    break
                except BlockingIOError:
                    # The daemon's listen backlog is full (a burst of
                    # connections): a Unix socket says EAGAIN. Try again.
                    if time.monotonic() + pause > deadline:
                        raise TimeoutError(errno.ETIMEDOUT, "the daemon is too busy to "
                                           "accept a connection") from None
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)
        except OSError:
            s.close()
            raise
        finally:
            if fd is not None:
                os.close(fd)
        return cls(path, s, timeout)

    def peer_pid(self) -> int:
        """The pid of the process at the other end (SO_PEERCRED): the
        daemon's, as the kernel says, not as a reply claims."""
        import struct

        cred = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                     struct.calcsize("3i"))
        return struct.unpack("3i", cred)[0]

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + self._timeout
        pause = BUSY_RETRY_S
        while True:
            reply = self._exchange(P.encode_request(op, **fields))
            if not P.may_retry(reply) or time.monotonic() + pause > deadline:
                break
            # Over one of the daemon's connection caps: it closed this
            # connection unread. Send the request again on a new one.
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
            self.close()
            try:
                fresh = Client.connect(self.path, max(0.1, deadline - time.monotonic()))
            except OSError:
                break
            self._sock, self._buf = fresh._sock, b""
        exc = P.reply_exception(reply)
        if exc is not None:
            raise exc
        return reply

    def _exchange(self, request: bytes) -> Any:
        """Send one request line, return the reply line decoded."""
        try:
            self._sock.sendall(request)
            line = self._readline()
        except TimeoutError:
            raise DaemonUnavailable(f"the daemon on {self.path} did not answer") from None
        except OSError as e:
            # A refusal may come before the request is sent in full: read it.
            early: bytes | None = (self._buf.partition(b"\n")[0] if b"\n" in self._buf
                                   else None)
            if early is not None:
                line = early
            else:
                try:
                    line = self._readline()
                except OSError:
                    raise DaemonUnavailable(f"lost the daemon on {self.path}: "
                                            f"{e.strerror or e}") from None
        import json
        try:
            return json.loads(line)
        except ValueError:
            raise ProtocolError(f"the daemon on {self.path} sent something that is not JSON") \
                from None

    def _readline(self) -> bytes:
        while b"\n" not in self._buf:
            chunk = self._sock.recv(1 << 16)
            if not chunk:
                raise ConnectionResetError(errno.ECONNRESET, "connection closed")
            self._buf += chunk
            if len(self._buf) > MAX_REPLY:
                raise ProtocolError("the daemon's reply is too long")
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def connect(socket_path: str | None = None, env: Mapping[str, str] | None = None,
            timeout: float = 30.0) -> Client:
    """A connection to the first daemon that answers: --socket, else
    $VGPU_SOCKET, else the system socket, else this user's socket. timeout:
    how long a reply may take (suspending a job copies its memory)."""
    tried = []
    for p in paths.client_sockets(socket_path, env):
        try:
            return Client.connect(p, timeout)
        except FileNotFoundError:
            tried.append(f"{p} (none)")
        except ConnectionRefusedError:
            tried.append(f"{p} (nobody listening)")
        except PermissionError:
            tried.append(f"{p} (permission denied)")
        except OSError as e:
            tried.append(f"{p} ({e.strerror or e})")
    raise DaemonUnavailable("no vgpuctl daemon answers: tried " + ", ".join(tried)
                            + "; " + advice(socket_path, env))


def advice(socket_path: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """What to do when no daemon answers on the sockets a client tries:
    where a system daemon is expected, that it is not running and how the
    node's administrator starts it; else how to start one."""
    socks = paths.client_sockets(socket_path, env)
    if paths.SYSTEM_SOCKET in socks:
        root = os.geteuid() == 0
        if paths.system_unit() is not None:
            how = "`systemctl start vgpud`"
            return ("the system daemon is not running: start it with " + how if root else
                    "the system daemon is not running: the node's administrator starts it "
                    "with " + how)
        sign = paths.system_daemon_sign()
        if sign is not None:
            return (f"the system daemon is not running ({sign} exists): "
                    + ("start it with `vgpuctl daemon`" if root else
                       "the node's administrator starts it (`vgpuctl daemon` as root)"))
    for p in socks:
        if paths.shared_socket(p):
            return f"the shared daemon whose socket is {p} is not running"
    return "start one with `vgpuctl daemon`"


def connect_or_start(socket_path: str | None = None, note: Any = None,
                     env: Mapping[str, str] | None = None) -> tuple[Client, Path | None]:
    """A connection for `vgpuctl run`: to the daemon that answers; else, when
    a system daemon is expected (see the module's doc), to it once it answers
    within the wait (note hears that we wait); else to a user daemon started
    now. Returns the client and the started daemon's log (None: none was
    started). DaemonUnavailable when the wait runs out."""
    try:
        return connect(socket_path, env), None
    except DaemonUnavailable:
        pass
    why = expected_daemon(socket_path, env)
    if why is None:
        return start_user_daemon(socket_path, env)
    return wait_connect(socket_path, why, note, env,
                        instead="a private daemon would run outside its admission"), None


def wait_connect(socket_path: str | None, why: str, note: Any = None,
                 env: Mapping[str, str] | None = None, instead: str = "") -> Client:
    """A connection to the daemon that answers, waiting for one that does not
    answer yet (a restart) until ``VGPU_DAEMON_WAIT`` seconds (WAIT_S) have
    passed: note hears that we wait, and why (and ``instead``, what not
    waiting would do). DaemonUnavailable when the wait runs out."""
    try:
        return connect(socket_path, env)
    except DaemonUnavailable as e:
        first = e
    e_ = os.environ if env is None else env
    try:
        wait = float(e_.get("VGPU_DAEMON_WAIT") or WAIT_S)
    except ValueError:
        wait = WAIT_S
    where = ", ".join(str(p) for p in paths.client_sockets(socket_path, env))
    if note is not None:
        note(f"no daemon answers on {where}, but {why}: waiting up to {wait:.0f} s for it"
             + (f" ({instead})" if instead else ""))
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        try:
            return connect(socket_path, env)
        except DaemonUnavailable as e:
            first = e
    raise DaemonUnavailable(f"{first}; waited {wait:.0f} s because {why}"
                            + (", and did not start a private daemon in its place"
                               if instead else ""))


def expected_daemon(socket_path: str | None = None,
                    env: Mapping[str, str] | None = None) -> str | None:
    """Why a daemon other than a private one of ours is expected on the
    sockets a client tries (a shared daemon's socket left there, or, on the
    default sockets, a system daemon set up on this node); None when
    starting a user daemon is right."""
    socks = paths.client_sockets(socket_path, env)
    for p in socks:
        if paths.shared_socket(p):
            return f"a shared daemon's socket is at {p}"
    if paths.SYSTEM_SOCKET in socks:
        sign = paths.system_daemon_sign()
        if sign is not None:
            return f"this node has a system daemon ({sign} exists)"
    return None


def start_user_daemon(socket_path: str | None = None,
                      env: Mapping[str, str] | None = None) -> tuple[Client, Path | None]:
    """Start a user daemon in the background (its own session, in /,
    logging to its state dir), wait until it says it listens, and connect.
    Returns the client and the log's path (None: another daemon, started
    beside this one, answered instead).

    The daemon is not a descendant of this process (see _spawn_detached):
    `vgpuctl run` becomes a subreaper, and the daemon tracks a launcher's
    children as its job's. It says how its start went on a pipe
    (`vgpuctl daemon --ready-fd`): ready, or the error that stopped it,
    raised here as the same VgpuError with its exit status. Another
    daemon that holds the lock (a `run` beside this one started it) is
    the one to wait for."""
    e = dict(os.environ if env is None else env)
    for k in ("VGPU_REGION", "VGPU_JOB"):
        e.pop(k, None)
    # Absolute before anything is created: the daemon runs in /.
    sock = paths.absolute(socket_path) if socket_path else paths.client_sockets(None, e)[-1]
    dp = paths.daemon_paths(True, socket=str(sock), env=e)
    paths.ensure_private_dir(dp.state_dir)
    log_path = dp.log
    deadline = time.monotonic() + START_TIMEOUT_S
    ready_r, ready_w = os.pipe()
    try:
        argv = [sys.executable, "-m", "vgpuctl", "daemon", "--user", "--socket", str(sock),
                "--ready-fd", str(ready_w)]
        pid = _spawn_detached(argv, e, log_path, ready_w)
        os.close(ready_w)
        ready_w = -1
        said = _read_ready(ready_r, deadline)
    finally:
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)
    if said is _TIMEOUT:
        try:
            os.kill(pid, signal.SIGTERM)     # it holds the pipe: alive, ours, of no use
        except OSError:
            pass
        raise DaemonUnavailable(f"started a user daemon but it was not ready within "
                                f"{START_TIMEOUT_S:.0f} s: stopped it (log: {log_path})")
    if said is None:
        raise DaemonUnavailable(f"the user daemon started for this command exited before it "
                                f"was ready, without saying why (killed?): see its log "
                                f"{log_path}")
    exc = P.reply_exception(said)
    if exc is None:
        try:
            return Client.connect(sock), log_path
        except OSError as err:
            raise DaemonUnavailable(f"the user daemon said it listens on {sock}, but: "
                                    f"{err.strerror or err} (log: {log_path})") from None
    if not isinstance(exc, DaemonConflict):
        code = said.get("exit")
        ok_code = isinstance(code, int) and not isinstance(code, bool) and 0 < code < 256
        raise type(exc)(f"cannot start a user daemon: {exc}",
                        exit_code=code if ok_code else None)
    # Another daemon holds the state dir's lock or listens on the socket:
    # a `vgpuctl run` beside this one started it. Wait for it to answer.
    while True:
        try:
            return Client.connect(sock), None
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise DaemonUnavailable(f"{exc}, but no daemon answers on {sock} within "
                                    f"{START_TIMEOUT_S:.0f} s (log: {log_path})")
        time.sleep(0.02)


_TIMEOUT: Any = object()


def _spawn_detached(argv: list[str], env: Mapping[str, str], log_path: Path,
                    keep_fd: int) -> int:
    """Start argv in its own session, in /, with stdin /dev/null, stdout
    and stderr appended to log_path (created owner-only: the log names
    every job's command and directory), and keep_fd open in it. Through a
    child that exits at once: the daemon is re-parented to init (or to
    this session's subreaper), never left a child of this process, which
    `vgpuctl run` makes a subreaper of what its command leaves behind.
    Returns the daemon's pid; DaemonUnavailable when it can't be started."""
    import subprocess

    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    pid_r, pid_w = os.pipe()
    try:
        os.fchmod(log_fd, 0o600)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        mid = os.fork()
        if mid == 0:    # the intermediate child: start the daemon, say its pid, exit
            code = 1
            try:
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_fd,
                                     stderr=log_fd, start_new_session=True, close_fds=True,
                                     pass_fds=(keep_fd,), env=dict(env), cwd="/")
                os.write(pid_w, f"{p.pid}\n".encode())
                code = 0
            except BaseException as exc:
                try:
                    os.write(pid_w, f"{type(exc).__name__}: {exc}\n".encode(errors="replace"))
                except BaseException:
                    pass
            finally:
                os._exit(code)
        os.close(pid_w)
        pid_w = -1
        got = b""
        while True:
            chunk = os.read(pid_r, 4096)
            if not chunk:
                break
            got += chunk
        os.waitpid(mid, 0)
    finally:
        os.close(log_fd)
        os.close(pid_r)
        if pid_w >= 0:
            os.close(pid_w)
    text = got.decode(errors="replace").strip()
    if not text.isdigit():
        raise DaemonUnavailable(f"could not start a user daemon: {text or 'no reason given'}")
    return int(text)


def _read_ready(fd: int, deadline: float) -> Any:
    """The line the daemon writes on its ready pipe, decoded: None when it
    closed the pipe without a line (it died), _TIMEOUT at the deadline."""
    import json
    import select

    got = b""
    while b"\n" not in got:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return _TIMEOUT
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        got += chunk
        if len(got) > P.MAX_LINE:
            break
    line = got.partition(b"\n")[0]
    if not line.strip():
        return None
    try:
        said = json.loads(line)
    except ValueError:
        said = None
    if not isinstance(said, dict):
        raise DaemonUnavailable(f"the user daemon said something that is not its start's "
                                f"report: {line[:200]!r}")
    return said
