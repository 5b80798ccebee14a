"""Bad requests neither flood the log nor fool the daemon: JSON nested 2,000
deep is a `protocol` error reply, never a traceback, and the daemon serves
on."""

from __future__ import annotations

import json
import socket
from typing import Any

from vgpuctl.core import protocol as P


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

