"""The socket: a Unix stream server, one request line in, one reply line out.

Each connection is authenticated by SO_PEERCRED when it is accepted. A line
longer than MAX_LINE gets an error reply and the connection is closed (the
reader never holds more than about MAX_LINE of it); any other bad request
gets an error reply and the connection stays open. Whatever a client sends,
the other clients don't notice.

What one user can hold is bounded, so that no user can make the daemon
unusable for the others (docs/security.md, "The service"):

- connections: at most PER_UID per uid, and all together what the
  descriptor limit leaves (ConnectionLimits); root keeps ROOT_RESERVE of
  them for itself, so the operator's `ps` answers while others hold all
  theirs. A connection over a cap gets one error line and is closed at once,
  unless its user holds fewer than FAIR_MIN: then the user holding the most
  gives up the connection of theirs that asked least lately (sixteen users
  holding every connection with keep-alive pings shut a seventeenth out);
- a connection that sends no request for IDLE_S is closed (blank lines
  are not requests, and a line that never ends is none either);
- the listen backlog is BACKLOG (the kernel may cap it at somaxconn);
- what a client can make the daemon log (connections over a cap, lines
  over MAX_LINE, accept errors such as running out of descriptors, a
  connection that fails on a bug, which is answered `internal`) is logged
  once per burst (logs.Burst), with a count; a bad request is answered and
  not logged at all. The connection that could not be
  accepted is shed through a spare descriptor rather than left to spin
  the loop;
- `kill`'s /proc scan runs in the executor, one at a time however many
  requests ask for it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import stat
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpuctl.core import protocol as P
from vgpuctl.daemon import tracking
from vgpuctl.daemon.logs import Burst
from vgpuctl.daemon.supervisor import Peer, Supervisor
from vgpuctl.errors import DaemonConflict, StateError

log = logging.getLogger("vgpuctl.daemon")

PER_UID = 64            # connections one uid other than root may hold
MAX_CONNECTIONS = 1024  # connections in all, however many descriptors there are
ROOT_RESERVE = 32       # kept for root above what all the others may hold
FAIR_MIN = 4            # a user holding fewer gets one from the user holding the most
FD_HEADROOM = 128       # descriptors kept for the database, regions, NVML, threads
IDLE_S = 30.0           # a connection without a request for this long is closed
BACKLOG = 4096
ACCEPT_BATCH = 256      # accepts per wake-up, so that requests are served in between


def peer_credentials(sock: socket.socket) -> Peer:
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", data)
    return Peer(pid, uid, gid)


def unix_address(path: Path) -> tuple[str, int | None]:
    """A bindable/connectable name for path: itself, or when it is longer
    than sun_path allows, /proc/self/fd/<dirfd>/<name> (the dir fd is
    returned so the caller can close it)."""
    s = str(path)
    if len(s.encode()) < 100:
        return s, None
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{path.name}", fd


def listen(path: Path, mode: int) -> socket.socket:
    """Bind the daemon's socket, replacing a stale one but never a live one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    addr, fd = unix_address(path)
    try:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None:
            if not stat.S_ISSOCK(st.st_mode):
                raise StateError(f"{path} exists and is not a socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                try:
                    probe.connect(addr)
                except BlockingIOError:     # its backlog is full: alive and busy
                    pass
                raise DaemonConflict(f"another daemon already listens on {path}")
            except (TimeoutError, ConnectionRefusedError, FileNotFoundError):
                os.unlink(path)
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o777 & ~mode)
        try:
            sock.bind(addr)
        finally:
            os.umask(old)
        os.chmod(path, mode)
        sock.listen(BACKLOG)
        sock.setblocking(False)
        return sock
    finally:
        if fd is not None:
            os.close(fd)


@dataclass
class _Conn:
    """One connection, as the fair share sees it."""
    uid: int
    last: float                 # when it last sent a request (its start before one)
    busy: bool = False          # a request of it is being answered
    leaving: bool = False       # ended to make room for another user


@dataclass(frozen=True)
class ConnectionLimits:
    """How many connections the daemon holds: ``total`` in all (root's
    included), ``others`` for every uid but root's together, ``per_uid`` for
    one uid other than root."""

    total: int
    others: int
    per_uid: int = PER_UID

    @classmethod
    def for_descriptors(cls, nofile: int, per_uid: int = PER_UID) -> ConnectionLimits:
        """The limits for a descriptor limit: what FD_HEADROOM leaves, of
        which ROOT_RESERVE is root's alone."""
        total = max(8, min(MAX_CONNECTIONS, nofile - FD_HEADROOM))
        others = max(4, total - min(ROOT_RESERVE, total // 4))
        return cls(total=total, others=others, per_uid=min(per_uid, others))

    def refusal(self, uid: int, held: Counter[int]) -> str | None:
        """Why a new connection of uid is refused, given the connections held
        per uid; None: accept it."""
        everyone = sum(held.values())
        if everyone >= self.total:
            return f"the daemon holds its most connections ({self.total})"
        if uid == 0:
            return None
        if held[uid] >= self.per_uid:
            return f"uid {uid} holds its most connections ({self.per_uid}): close some"
        if everyone - held[0] >= self.others:
            return (f"the daemon holds its most connections for users ({self.others}); "
                    "try again shortly")
        return None

    @staticmethod
    def fair_victim(uid: int, held: Counter[int]) -> int | None:
        """The user who gives up a connection so that uid, refused and
        holding fewer than FAIR_MIN, gets one: the one holding the most
        (root never), if they hold at least two more than uid; None when
        no one does."""
        if uid == 0 or held[uid] >= FAIR_MIN:
            return None
        others = [(n, -u) for u, n in held.items() if u not in (0, uid)]
        if not others:
            return None
        n, neg = max(others)
        return -neg if n >= held[uid] + 2 else None


def descriptor_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (at most 65536), and
    return the soft limit then in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    want = min(want, 65536)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError):
            pass
    return soft


class Server:
    def __init__(self, sup: Supervisor, limits: ConnectionLimits | None = None,
                 idle_s: float | None = None) -> None:
        self.sup = sup
        self.limits = limits or ConnectionLimits.for_descriptors(descriptor_limit())
        self.idle_s = IDLE_S if idle_s is None else idle_s
        self._conns: set[asyncio.Task[None]] = set()
        self._held: Counter[int] = Counter()
        self._info: dict[asyncio.Task[None], _Conn] = {}
        self._lsock: socket.socket | None = None
        self._spare: int | None = None
        self._scan: asyncio.Future[Any] | None = None
        sup.scan = self._proc_table     # kill's /proc scan: shared, off the loop
        self._refused = Burst("connections refused over the caps")
        self._accept_failed = Burst("accept failed")
        self._overlong = Burst(f"lines over {P.MAX_LINE} bytes, disconnected")
        self._failed = Burst("connection failed (a bug: log_level debug shows where)",
                             logging.ERROR)

    async def start(self, sock: socket.socket) -> Server:
        self._lsock = sock
        self._spare = _open_spare()
        asyncio.get_running_loop().add_reader(sock.fileno(), self._accept_ready)
        log.debug("connection caps: %d in all, %d for users, %d per user; idle %.0f s",
                  self.limits.total, self.limits.others, self.limits.per_uid, self.idle_s)
        return self

    # -- accepting ---------------------------------------------------------------------
    def _accept_ready(self) -> None:
        assert self._lsock is not None
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self._lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._accept_error(e)
                return
            self._accepted(conn)

    def _accept_error(self, e: OSError) -> None:
        self._accept_failed.hit(f"{e.strerror or e} ({len(self._conns)} connections open)")
        if e.errno not in (errno.EMFILE, errno.ENFILE) or self._spare is None:
            self._pause(0.1)
            return
        # Out of descriptors: give the spare one up to take the waiting
        # connection off the backlog, tell it why, and take the spare back.
        os.close(self._spare)
        self._spare = None
        try:
            conn, _ = self._lsock.accept()  # type: ignore[union-attr]
        except OSError:
            conn = None
        if conn is not None:
            _refuse(conn, "the daemon is out of file descriptors; try again shortly")
        self._spare = _open_spare()
        if self._spare is None:
            self._pause(0.1)

    def _pause(self, seconds: float) -> None:
        """Stop accepting for a moment (the error would repeat at once)."""
        loop = asyncio.get_running_loop()
        sock = self._lsock
        if sock is None:
            return
        loop.remove_reader(sock.fileno())

        def resume() -> None:
            if self._lsock is sock and sock.fileno() >= 0:
                if self._spare is None:
                    self._spare = _open_spare()
                loop.add_reader(sock.fileno(), self._accept_ready)
        loop.call_later(seconds, resume)

    def _accepted(self, conn: socket.socket) -> None:
        try:
            peer = peer_credentials(conn)
        except OSError:
            conn.close()
            return
        loop = asyncio.get_running_loop()
        why = self.limits.refusal(peer.uid, self._held)
        if why is not None and not self._make_room(peer.uid, loop.time()):
            self._refused.hit(f"pid {peer.pid} (uid {peer.uid}): {why}")
            _refuse(conn, why)
            return
        self._held[peer.uid] += 1
        info = _Conn(peer.uid, loop.time())
        task = loop.create_task(self._client(conn, peer, info))
        self._conns.add(task)
        self._info[task] = info
        task.add_done_callback(lambda t: self._done(t, peer.uid))

    def _make_room(self, uid: int, now: float) -> bool:
        """For a user refused while holding fewer than FAIR_MIN: end the
        connection of the user holding the most that asked least lately (not
        one mid-request); whether one was ended (its count drops when its
        task ends: the new one is taken meanwhile)."""
        victim = ConnectionLimits.fair_victim(uid, self._held - self._leaving())
        if victim is None:
            return False
        conns = [(i.last, t) for t, i in self._info.items()
                 if i.uid == victim and not i.busy and not i.leaving]
        if not conns:
            return False
        _, task = min(conns, key=lambda c: c[0])
        self._info[task].leaving = True
        task.cancel()
        log.debug("uid %d gave up a connection to uid %d (fair share)", victim, uid)
        return True

    def _leaving(self) -> Counter[int]:
        return Counter(i.uid for i in self._info.values() if i.leaving)

    def _done(self, task: asyncio.Task[None], uid: int) -> None:
        self._conns.discard(task)
        self._info.pop(task, None)
        self._held[uid] -= 1
        if self._held[uid] <= 0:
            del self._held[uid]

    # -- one connection -----------------------------------------------------------------
    async def _client(self, conn: socket.socket, peer: Peer, info: _Conn) -> None:
        writer = None
        loop = asyncio.get_running_loop()
        try:
            # The reader's limit bounds what one line may hold in memory.
            reader, writer = await asyncio.open_unix_connection(sock=conn, limit=P.MAX_LINE)
            # Only a request resets the idle clock: blank lines, or a line
            # that never ends, don't hold a descriptor past idle_s.
            idle_until = loop.time() + self.idle_s
            while True:
                try:
                    line = await asyncio.wait_for(reader.readuntil(b"\n"),
                                                  idle_until - loop.time())
                except asyncio.TimeoutError:
                    break           # idle: its descriptor is someone else's now
                except asyncio.IncompleteReadError as e:
                    line = e.partial            # EOF: a last line without newline
                    if not line.strip():
                        break
                except asyncio.LimitOverrunError:
                    writer.write(P.encode(P.error(
                        "protocol", f"request longer than {P.MAX_LINE} bytes")))
                    await writer.drain()
                    self._overlong.hit(f"pid {peer.pid} (uid {peer.uid})")
                    break
                if not line.strip():
                    continue
                info.busy, info.last = True, loop.time()
                reply = await self.sup.reply(peer, line)
                writer.write(P.encode(reply))
                await asyncio.wait_for(writer.drain(), self.idle_s)
                info.busy = False
                if not line.endswith(b"\n"):
                    break
                idle_until = loop.time() + self.idle_s
        except (ConnectionError, OSError, asyncio.TimeoutError):
            pass
        except Exception as e:      # a bug: this connection ends, the others don't notice
            what = P.escape_controls(f"{type(e).__name__}: {e}")[:500]
            self._failed.hit(f"pid {peer.pid} (uid {peer.uid}): {what}")
            log.debug("connection of pid %d failed", peer.pid, exc_info=True)
            if writer is not None:      # the client hears why, if it still can
                try:
                    writer.write(P.encode(P.error("internal", f"internal error: {what}")))
                except Exception:
                    pass
        finally:
            if writer is not None:
                writer.close()
            else:
                conn.close()

    async def _proc_table(self) -> tracking.ProcTable:
        """A fresh /proc scan, shared by the requests that wait for one."""
        if self._scan is None or self._scan.done():
            self._scan = asyncio.get_running_loop().run_in_executor(None, tracking.scan)
        return await asyncio.shield(self._scan)

    async def close(self) -> None:
        if self._lsock is not None:
            try:
                asyncio.get_running_loop().remove_reader(self._lsock.fileno())
            except (ValueError, OSError):
                pass
            self._lsock.close()
            self._lsock = None
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
        for burst in (self._refused, self._accept_failed, self._overlong, self._failed):
            burst.cancel()
        for t in list(self._conns):
            t.cancel()
        if self._conns:
            await asyncio.wait(list(self._conns), timeout=1.0)


def _open_spare() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _refuse(conn: socket.socket, why: str) -> None:
    """One error line to a connection that is not served, then close it
    (without waiting: if the line does not fit, the client sees the close)."""
    try:
        conn.setblocking(False)
        conn.send(P.encode(P.error("unavailable", why, retry=True)))
    except OSError:
        pass
    finally:
        conn.close()
