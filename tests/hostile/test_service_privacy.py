"""What `ps` and `status` give other users (issue 20): every user read every
job's command line and working directory (its arguments, paths, tokens
passed on the command line). Now another user sees a job's id, name, user,
GPU, limits and usage, not its command or directory, unless the operator
sets public_commands."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.daemon import needs_native, wait_for
from support.hostile import in_child_as_nobody

from vgpuctl.client.connection import Client

pytestmark = needs_native

SECRET = ["python3", "train.py", "--token", "hunter2"]


def _ps_as_nobody(socket) -> dict:
    def go():
        with Client.connect(Path(socket)) as cl:
            return cl.call("ps", all=True)
    return in_child_as_nobody(go)


@pytest.mark.parametrize("public", [False, True])
def test_other_users_see_a_jobs_limits_and_usage_not_its_command(daemon_factory, public):
    d = daemon_factory(config=f"public_commands = {str(public).lower()}\n")
    with d.client() as c:
        job = c.call("run", command=SECRET, cwd="/home/alice/secret-project", mem=1 << 30,
                     core=30)["job"]
    mine = _ps_as_nobody(d.socket)
    seen = next(j for j in mine["jobs"] if j["id"] == job["id"])
    assert (seen["user"], seen["mem_limit"], seen["core"], seen["gpu"]) == (
        "root", 1 << 30, 30, job["gpu"])
    if public:
        assert seen["command"] == SECRET and seen["cwd"] == "/home/alice/secret-project"
    else:
        assert seen["command"] is None and seen["cwd"] is None
        assert "hunter2" not in str(mine) and "secret-project" not in str(mine)
    # Its owner (here root, also the operator) sees everything.
    own = d.job(job["id"])
    assert own["command"] == SECRET and own["cwd"] == "/home/alice/secret-project"
    # Ended jobs the same (`ps --all`).
    d.call("exited", job=job["id"], code=0)
    wait_for(lambda: d.jobs() == [], what="the job to end")
    ended = next(j for j in _ps_as_nobody(d.socket)["jobs"] if j["id"] == job["id"])
    assert (ended["command"] is None) is not public


def test_a_user_sees_their_own_jobs_command(daemon_factory):
    d = daemon_factory()

    def go():
        with Client.connect(Path(d.socket)) as cl:
            r = cl.call("run", command=SECRET, cwd="/", mem=1 << 30)
            return cl.call("ps", job=r["job"]["id"])["jobs"][0]
    seen = in_child_as_nobody(go)
    assert seen["command"] == SECRET and seen["user"] != "root"
    # ... and the table shows it, not a blank, to them; to root too.
    assert SECRET[-1] in d.cli("ps").stdout


def test_a_command_line_full_of_escapes_acts_on_no_terminal(daemon_factory):
    """A job's user puts terminal escape sequences (set the window title,
    clear the screen, a carriage return and a fake row) in its command and
    directory; whoever reads `ps` in CSV gets them written as escapes, and
    one line per job."""
    d = daemon_factory(config="public_commands = true\n")
    evil = ["sh", "-c", "\x1b]0;pwned\x07\x1b[2J\rok\nfake,row"]
    with d.client() as c:
        c.call("run", command=evil, cwd="/tmp/\x1b[31mred", mem=1 << 30)
    for fields in ("id,command,cwd", None):
        args = ["ps", "--format", "csv"] + (["--fields", fields] if fields else [])
        out = d.cli(*args).stdout
        assert "\x1b" not in out and "\r" not in out and "\x07" not in out, repr(out)
        assert len(out.splitlines()) == 2, repr(out)       # the header and one row
    out = d.cli("ps", "--format", "csv", "--fields", "command,cwd").stdout
    assert "\\x1b]0;pwned\\x07\\x1b[2J\\rok\\nfake,row" in out
    assert "/tmp/\\x1b[31mred" in out


def test_a_user_reports_their_own_jobs_where_the_database_is_roots(daemon_factory):
    """`vgpuctl report` by a user who may not read the daemon's database
    (the system daemon's is root's): the daemon answers with that user's
    own jobs, as sacct shows a user theirs, and never another's."""
    import contextlib
    import io
    import json

    # what the report's path imports, imported here: nobody can't read them
    import vgpuctl.cli.commands.report  # noqa: F401
    import vgpuctl.core.accounting  # noqa: F401
    from vgpuctl.cli import _run

    d = daemon_factory()
    with d.client() as c:
        theirs = c.call("run", command=SECRET, cwd="/", mem=1 << 30, name="roots")["job"]
        c.call("exited", job=theirs["id"], code=0)

    def go():
        with Client.connect(Path(d.socket)) as cl:
            mine = cl.call("run", command=["python3", "mine.py"], cwd="/", mem=1 << 30,
                           name="mine")["job"]
            cl.call("exited", job=mine["id"], code=0)
        os.environ.update(VGPU_STATE_DIR=str(d.state), VGPU_SOCKET=str(d.socket))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = _run(["report", "--since", "1h", "--format", "json"])
        return {"id": mine["id"], "code": code, "out": out.getvalue(), "err": err.getvalue()}
    got = in_child_as_nobody(go)
    assert got["code"] == 0, got
    rows = json.loads(got["out"])
    assert [(r["job_id"], r["name"]) for r in rows] == [(got["id"], "mine")]
    assert "hunter2" not in got["out"]
    # root, who reads the database, sees both
    res = d.cli("report", "--since", "1h", "--format", "json", "--state-dir", str(d.state))
    assert {r["name"] for r in json.loads(res.stdout)} == {"roots", "mine"}


def test_a_user_asking_for_reports_in_a_loop_is_slowed(daemon_factory):
    """Each report reads the window's rows of the database: a user other
    than root gets one a second (two at once), then is asked to retry
    (`retry`: vgpuctl's client asks again by itself); root is never slowed."""
    import json

    from vgpuctl.core import protocol as P

    d = daemon_factory()

    def go():
        import socket as S
        out = []
        with S.socket(S.AF_UNIX, S.SOCK_STREAM) as s:
            s.connect(str(d.socket))
            f = s.makefile("rwb")
            for _ in range(4):
                f.write(P.encode_request("report", since=0.0, until=1e9))
                f.flush()
                reply = json.loads(f.readline())
                out.append("ok" if reply.get("ok") else
                           "retry" if reply["error"].get("retry") else reply["error"]["message"])
        return out
    assert in_child_as_nobody(go) == ["ok", "ok", "retry", "retry"]
    with d.client() as c:            # root
        assert all(c.call("report", since=0.0, until=1e9)["everyone"] for _ in range(4))
