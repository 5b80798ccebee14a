"""The caps that keep one user from taking the daemon: connections per uid
and in all with root's reserve, and the decision `vgpuctl run` makes when
no daemon answers (never a private daemon where a system one is expected)."""

from __future__ import annotations

import socket
from collections import Counter
from pathlib import Path

from vgpuctl.client.connection import expected_daemon
from vgpuctl.daemon.server import ConnectionLimits
from vgpuctl.system import paths


def test_one_user_holds_at_most_its_cap():
    lim = ConnectionLimits.for_descriptors(1024)
    assert lim.refusal(1000, Counter({1000: lim.per_uid - 1})) is None
    assert "holds its most" in lim.refusal(1000, Counter({1000: lim.per_uid}))


def test_root_keeps_a_reserve_when_the_others_hold_theirs():
    lim = ConnectionLimits.for_descriptors(1024)
    assert lim.total <= 1024 - 100 and lim.others < lim.total
    held = Counter({1000 + i: 1 for i in range(lim.others)})
    assert lim.refusal(2000, held) is not None
    assert lim.refusal(0, held) is None
    held[0] = lim.total - lim.others
    assert lim.refusal(0, held) is not None


def test_shared_socket_left_behind_means_wait(tmp_path: Path):
    sock = tmp_path / "vgpud.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()
    sock.chmod(0o600)          # a private daemon's: starting a new one is right
    assert expected_daemon(str(sock), {}) is None
    sock.chmod(0o666)          # a shared (system) daemon's: wait for it
    assert "shared daemon" in expected_daemon(str(sock), {})


def test_a_system_daemon_is_known_by_its_files(tmp_path: Path):
    unit = tmp_path / "vgpud.service"
    assert paths.system_daemon_sign((tmp_path / "none",)) is None
    unit.write_text("[Service]\n")
    assert paths.system_daemon_sign((tmp_path / "none", unit)) == unit


def test_the_unit_gives_the_daemon_room_for_its_connections():
    unit = Path(__file__).parents[2] / "etc" / "systemd" / "vgpud.service"
    lines = [ln.strip() for ln in unit.read_text().splitlines()]
    nofile = [int(ln.split("=", 1)[1]) for ln in lines if ln.startswith("LimitNOFILE=")]
    assert nofile and ConnectionLimits.for_descriptors(nofile[0]).total == 1024


def test_a_request_refused_unread_is_sent_again_on_a_new_connection(tmp_path: Path):
    """A connection over a cap is refused before its request is read (the
    reply says retry): the client tries again, so a burst of one user's
    jobs waits a moment instead of failing."""
    import threading

    from vgpuctl.client.connection import Client
    from vgpuctl.core import protocol as P

    path = tmp_path / "vgpud.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(8)
    seen: list[bytes] = []

    def serve() -> None:
        for i in range(2):
            conn, _ = srv.accept()
            with conn:
                if i == 0:                      # over the cap: refused unread
                    conn.sendall(P.encode(P.error("unavailable", "full", retry=True)))
                    continue
                seen.append(conn.recv(4096))
                conn.sendall(P.encode(P.ok(pong=True)))
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with Client.connect(path, timeout=10) as c:
        assert c.call("ping")["pong"] is True
    t.join(10)
    srv.close()
    assert seen == [P.encode_request("ping")]
