"""The socket: a Unix stream server, one request line in, one reply line out.

Each connection is authenticated by SO_PEERCRED when it is accepted. A line
longer than MAX_LINE gets an error reply and the connection is closed (the
reader never holds more than about MAX_LINE of it); any other bad request
gets an error reply and the connection stays open. Whatever a client sends,
the other clients don't notice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
import struct
from pathlib import Path

from vgpuctl.core import protocol as P
from vgpuctl.daemon.supervisor import Peer, Supervisor
from vgpuctl.errors import DaemonConflict, DaemonUnavailable

log = logging.getLogger("vgpuctl.daemon")


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
                raise DaemonUnavailable(f"{path} exists and is not a socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.settimeout(1.0)
                probe.connect(addr)
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
        sock.listen(128)
        sock.setblocking(False)
        return sock
    finally:
        if fd is not None:
            os.close(fd)


class Server:
    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self, sock: socket.socket) -> asyncio.AbstractServer:
        # The reader's limit bounds what one line may hold in memory.
        return await asyncio.start_unix_server(self._client, sock=sock, limit=P.MAX_LINE)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        try:
            peer = peer_credentials(writer.get_extra_info("socket"))
        except OSError:
            writer.close()
            return
        try:
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError as e:
                    line = e.partial            # EOF: a last line without newline
                    if not line.strip():
                        break
                except asyncio.LimitOverrunError:
                    writer.write(P.encode(P.error(
                        "protocol", f"request longer than {P.MAX_LINE} bytes")))
                    await writer.drain()
                    log.warning("pid %d (uid %d) sent a line over %d bytes: disconnected",
                                peer.pid, peer.uid, P.MAX_LINE)
                    break
                if not line.strip():
                    continue
                reply = self.sup.handle_line(peer, line)
                writer.write(P.encode(reply))
                await writer.drain()
                if not line.endswith(b"\n"):
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            if task is not None:
                self._conns.discard(task)
            writer.close()

    async def close(self) -> None:
        for t in list(self._conns):
            t.cancel()
        if self._conns:
            await asyncio.wait(list(self._conns), timeout=1.0)
