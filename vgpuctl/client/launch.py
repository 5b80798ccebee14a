"""What `vgpuctl run` does: check its arguments, get the job admitted, run the
command like exec, report its pid and its end.

`fast_main` is the way in from `vgpuctl.__main__`: it parses `run`'s few
options itself, so that neither click nor the other commands are imported
on the path that every job's start pays for. The click command
(vgpuctl/commands/run.py) calls `run_job` too, for `--help` and for callers
of `vgpuctl.cli`.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

from vgpuctl.cli import args as cliargs
from vgpuctl.client.connection import Client
from vgpuctl.errors import DaemonUnavailable, UsageError, VgpuError

_VALUE_OPTIONS = {"--mem": "mem", "--core": "core", "--gpu": "gpu", "--policy": "policy",
                  "--name": "name", "--socket": "socket_path"}
_FLAGS = {"-v": "verbose", "--verbose": "verbose"}


def parse_argv(argv: list[str]) -> tuple[dict[str, Any], list[str]] | None:
    """Options and command of `vgpuctl run ARGV`, or None when click should
    handle it (--help). Options stop at `--` or at the first word that is not
    an option; an unknown option before the command is a usage error."""
    opts: dict[str, Any] = {v: None for v in _VALUE_OPTIONS.values()}
    opts["verbose"] = False
    i = 0
    command: list[str] = []
    while i < len(argv):
        a = argv[i]
        if a == "--":
            command = argv[i + 1:]
            break
        if a in ("-h", "--help"):
            return None
        if a in _FLAGS:
            opts[_FLAGS[a]] = True
            i += 1
            continue
        name, eq, value = a.partition("=")
        if name in _VALUE_OPTIONS:
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"{name} needs a value")
                i += 1
                value = argv[i]
            opts[_VALUE_OPTIONS[name]] = value
            i += 1
            continue
        if a.startswith("-") and len(a) > 1:
            raise UsageError(f"no such option: {a} (see vgpuctl run --help)")
        command = argv[i:]
        break
    return opts, command


def fast_main(argv: list[str]) -> int | None:
    """`vgpuctl run ARGV` without click; None: let click handle it."""
    parsed = parse_argv(argv)
    if parsed is None:
        return None
    opts, command = parsed
    return run_job(command=command, **opts)


def run_job(*, mem: str | None, core: str | None, gpu: str | None, policy: str | None,
            name: str | None, socket_path: str | None, verbose: bool,
            command: list[str]) -> int:
    """Admit and run command; returns its exit code (128+N for signal N)."""
    if not command:
        raise UsageError("no command given: vgpuctl run --mem SIZE [--core PCT] -- COMMAND...")
    if name is not None and not 1 <= len(name) <= 64:
        raise UsageError("--name: 1 to 64 characters")
    fields = {"command": list(command), "cwd": os.getcwd(), "name": name,
              "mem": cliargs.mem(mem), "core": cliargs.core(core),
              "policy": cliargs.policy(policy), "gpu": gpu}
    from vgpuctl.client import connection as client

    started = None
    try:
        cl = client.connect(socket_path)
    except DaemonUnavailable:
        cl, started = client.start_user_daemon(socket_path)
    with cl:
        reply = cl.call("run", **fields)
        job = reply["job"]
        if started is not None:
            print(f"vgpuctl: started a user daemon on {cl.path} (log: {started})",
                  file=sys.stderr)
        if verbose:
            print(f"vgpuctl: job {job['id']} on GPU {job['gpu']} ({job['gpu_uuid']}) "
                  f"via {cl.path}", file=sys.stderr)
        return launch(cl, job["id"], reply["env"], list(command), verbose,
                      prepend=reply.get("prepend"))


# Forwarded to the command. A signal the kernel sent to the whole foreground
# process group (Ctrl-C, Ctrl-\, a hangup) has reached the command already:
# those come with si_code SI_KERNEL and are not sent twice.
FORWARD = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT,
           signal.SIGUSR1, signal.SIGUSR2)
SI_KERNEL = 0x80


def job_env(base: Mapping[str, str], add: Mapping[str, str],
            prepend: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's environment: base with the daemon's variables set, and
    its paths put first on path-list variables (LD_PRELOAD: the hook;
    LD_LIBRARY_PATH: the simulated GPU's libraries), once."""
    env = dict(base)
    env.update(add)
    for k, first in (prepend or {}).items():
        # ld.so splits LD_PRELOAD at spaces and colons, LD_LIBRARY_PATH at colons.
        old = env.get(k, "").replace(" ", ":") if k == "LD_PRELOAD" else env.get(k, "")
        env[k] = ":".join([first, *[p for p in old.split(":") if p and p != first]])
    return env


def _tell(cl: Client, op: str, verbose: bool, **fields: Any) -> Client | None:
    """Send a request whose failure must not stop the command (the daemon
    may be restarting: the job runs on under its last limits). Reconnects
    once. Returns the client to use next, None when the daemon is gone."""
    for attempt in (0, 1):
        try:
            cl.call(op, **fields)
            return cl
        except DaemonUnavailable:
            cl.close()
            if attempt:
                break
            try:
                cl = Client.connect(cl.path)
            except OSError:
                break
        except VgpuError as e:
            if verbose:
                print(f"vgpuctl: warning: {op}: {e}", file=sys.stderr)
            return cl
    if verbose:
        print(f"vgpuctl: warning: the daemon did not get `{op}`", file=sys.stderr)
    return None


def launch(cl: Client, job_id: str, env_add: Mapping[str, str], command: list[str],
           verbose: bool = False, prepend: Mapping[str, str] | None = None) -> int:
    """Run command as the job's root process, like exec: it keeps the
    terminal and stdin, gets the signals sent to us, and its exit code
    (128+N for signal N) is returned. Tells the daemon its pid and its end."""
    env: MutableMapping[str, str] = job_env(os.environ, env_add, prepend)
    block = {signal.SIGCHLD, *FORWARD}
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, block)
    pid = os.fork()
    if pid == 0:  # the command
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
            for s in (signal.SIGPIPE, signal.SIGXFSZ):   # Python ignores these
                signal.signal(s, signal.SIG_DFL)
            os.execvpe(command[0], command, env)
        except OSError as e:
            os.write(2, f"vgpuctl: error: cannot run {command[0]}: {e.strerror}\n".encode())
            os._exit(127 if e.errno == errno.ENOENT else 126)
        finally:
            os._exit(127)
    maybe: Client | None = _tell(cl, "started", verbose, job=job_id, pid=pid)
    status = None
    while status is None:
        info = signal.sigtimedwait(block, 1.0)
        if info is not None and info.si_signo != signal.SIGCHLD and info.si_code != SI_KERNEL:
            try:
                os.kill(pid, info.si_signo)
            except ProcessLookupError:
                pass
        try:
            done, st = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            break
        if done == pid:
            status = st
    code = os.waitstatus_to_exitcode(status) if status is not None else 1
    fields = {"code": code} if code >= 0 else {"signal": -code}
    if maybe is not None:
        maybe = _tell(maybe, "exited", verbose, job=job_id, **fields)
        if maybe is not None:
            maybe.close()
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return code if code >= 0 else 128 - code
