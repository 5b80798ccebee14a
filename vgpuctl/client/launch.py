"""What `vgpuctl run` does: get the job admitted, run the command like exec,
report its pid and its end.

The click command (vgpuctl/cli/commands/run.py) checks the values and calls
`run_job`. Every job's start pays for this module's imports: keep them light
(no click, rich, asyncio; see bench/run_overhead.py). What it has to say
while the command runs goes through the `note` and `warn` it is given.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, NoReturn

from vgpuctl.client.connection import Client
from vgpuctl.errors import AdmissionRefused, DaemonUnavailable, NotFound, UsageError, VgpuError
from vgpuctl.system.notice import NOTICE_SIGNAL
from vgpuctl.system.procfs import read_stat

Say = Callable[[str], None]


def run_job(*, command: list[str], mem: int | None, core: int | None, policy: str | None,
            gpu: str | None, name: str | None, socket_path: str | None, verbose: bool,
            note: Say, warn: Say, quiet: bool = False, priority: str | None = None,
            gpus: int | None = None) -> int:
    """Admit and run command; returns its exit code (128+N for signal N).
    note tells the user what was done for them (a daemon started, the job's
    id and GPU; nothing when quiet), warn what the daemon warns of (a limit
    too small for a context) and, with verbose, what went wrong without
    stopping the command."""
    if not command:
        raise UsageError("no command given: vgpuctl run --mem SIZE [--core PCT] -- COMMAND...")
    if name is not None and not 1 <= len(name) <= 64:
        raise UsageError("--name: 1 to 64 characters")
    fields = {"command": list(command), "cwd": current_dir(), "name": name,
              "mem": mem, "core": core, "policy": policy, "gpu": gpu}
    if priority is not None:
        fields["priority"] = priority
    if gpus is not None:            # a daemon before several GPUs refuses the field
        fields["gpus"] = gpus
    from vgpuctl.client import connection as client

    cl, started = client.connect_or_start(socket_path, note=warn)
    with cl:
        try:
            reply = cl.call("run", **fields)
        except (AdmissionRefused, NotFound) as e:
            other = _other_sim(cl, None)
            if other is None:
                raise
            raise type(e)(f"{e}; {other}") from None
        other = _other_sim(cl, (reply.get("env") or {}).get("VGPU_SIM"))
        if other is not None:
            warn(other)
        job = reply["job"]
        if started is not None and not quiet:
            note(f"started a user daemon on {cl.path} (log: {started})")
        if not quiet:
            note(job_line(job) + (f" via {cl.path}" if verbose else ""))
        for w in reply.get("warnings") or []:
            warn(str(w))
        return launch(cl, job["id"], reply["env"], list(command),
                      warn=warn if verbose else None, prepend=reply.get("prepend"),
                      tell=warn)


def _other_sim(cl: Client, theirs: str | None) -> str | None:
    """Why the GPUs a job sees are not the ones this shell's VGPU_SIM asks
    for: the daemon that answered keeps the VGPU_SIM it started with (theirs;
    None: ask it); None when they agree or VGPU_SIM is not set here."""
    mine = os.environ.get("VGPU_SIM")
    if not mine:
        return None
    if theirs is None:
        try:
            info = cl.call("ping").get("daemon") or {}
        except VgpuError:
            return None
        if "sim" not in info:           # a daemon of before it said
            return None
        theirs = info["sim"]
    if theirs == mine:
        return None
    what = f"VGPU_SIM={theirs}" if theirs else "the node's GPUs, without VGPU_SIM"
    return (f"the daemon on {cl.path} runs with {what}, not your VGPU_SIM={mine}: a daemon "
            "keeps what it started with; `vgpuctl daemon stop`, then run again to start "
            "one with yours")


def _notice(path: Any, job_id: str, seen: tuple[Any, ...] | None,
            tell: Say | None) -> tuple[Any, ...] | None:
    """The daemon poked us: ask for our job and tell what changed since
    ``seen`` (its state, why it is suspended, its GPU); returns what is seen
    now. Nothing is asked when no one hears (tell None)."""
    if tell is None:
        return seen
    try:
        with Client.connect(path, timeout=5.0) as c:
            view = c.call("ps", job=job_id)["jobs"][0]
    except (OSError, VgpuError, KeyError, IndexError, TypeError):
        return seen
    now = (view.get("state"), view.get("suspend_reason"), view.get("gpu"))
    if now == seen:
        return seen
    line = notice_line(job_id, now, seen)
    if line:
        tell(line)
    return now


def notice_line(job_id: str, now: tuple[Any, ...], before: tuple[Any, ...] | None) -> str:
    """What the owner's terminal is told of a change to its job: (state,
    suspend_reason, gpu) now and before ("" when nothing to tell)."""
    state, reason, gpu = now
    if state == "suspended":
        if reason == "preempted":
            return (f"job {job_id} suspended: a job of a higher class needed its memory on "
                    f"GPU {gpu}; it resumes by itself when room returns (its CUDA calls "
                    "wait meanwhile)")
        if reason == "drained":
            return (f"job {job_id} suspended: GPU {gpu} was drained and no other GPU had "
                    "room; it resumes by itself when one has")
        return (f"job {job_id} suspended (vgpuctl suspend); its CUDA calls wait until "
                f"`vgpuctl resume {job_id}`")
    if state == "running" and before is not None and (before[0] == "suspended"
                                                      or before[2] != gpu):
        moved = before[2] is not None and before[2] != gpu
        return f"job {job_id} {'moved to' if moved else 'resumed on'} GPU {gpu}"
    if state == "running" and before is None:
        return f"job {job_id} resumed on GPU {gpu}"
    return ""


def current_dir() -> str:
    """The current directory, for the job's record. One that was deleted
    (the command runs in it all the same, as from a shell) is recorded as
    the kernel names it: its old path and " (deleted)"."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        try:
            return os.readlink("/proc/self/cwd")
        except OSError:
            return "(deleted)"


def job_line(job: Mapping[str, Any]) -> str:
    """What `run` says of the job it started: its id (for `set`, `kill`) and
    its GPU, with the UUID short."""
    indices = job.get("gpus") or [job["gpu"]]
    uuids = job.get("gpu_uuids") or [job.get("gpu_uuid")]
    shorts = []
    for u in uuids:
        uuid = str(u or "")
        shorts.append(uuid[:12] if uuid.startswith("GPU-") else uuid[:8])
    if len(indices) == 1:
        return f"job {job['id']} on GPU {indices[0]} ({shorts[0]})"
    return (f"job {job['id']} on GPUs {','.join(str(i) for i in indices)} "
            f"({', '.join(shorts)})")


# Forwarded to the command. A signal the kernel sent to the whole foreground
# process group (Ctrl-C, Ctrl-\, a hangup) has reached the command already:
# those come with si_code SI_KERNEL and are not sent twice.
FORWARD = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT,
           signal.SIGUSR1, signal.SIGUSR2)
SI_KERNEL = 0x80
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the subreaper of its descendants (Linux 3.4+): an
    orphan below it (a double fork, `setsid cmd &`) is re-parented to it,
    not to init, so the daemon keeps it in the job. False where prctl
    refuses."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _left_behind(since: int) -> list[int]:
    """Our live children started at or after `since` (clock ticks since
    boot): what the command left, re-parented to us. A user daemon that
    `run` started before the command is not among them."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = read_stat(name)
            if st is not None and st[0] == me and st[2] not in ("Z", "X") and st[1] >= since:
                out.append(int(name))
    return out


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


def _tell(cl: Client, op: str, warn: Say | None, **fields: Any) -> Client | None:
    """Send a request whose failure must not stop the command (the daemon
    may be restarting: the job runs on under its last limits). Reconnects
    once. Returns the client to use next, None when the daemon is gone;
    says why through warn, if given."""
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
            if warn is not None:
                warn(f"{op}: {e}")
            return cl
    if warn is not None:
        warn(f"the daemon did not get `{op}`")
    return None


def launch(cl: Client, job_id: str, env_add: Mapping[str, str], command: list[str],
           warn: Say | None = None, prepend: Mapping[str, str] | None = None,
           tell: Say | None = None) -> int:
    """Run command as the job's root process, like exec: it keeps the
    terminal and stdin, gets the signals sent to us, and its exit code
    (128+N for signal N) is returned. Tells the daemon its pid and its end;
    warn hears when the daemon could not be told.

    As a subreaper it then waits for every descendant the command left
    behind (a background child, a double fork) before it reports the
    command's end: until then they are the job's, under its limits, and
    the signals it gets go to them.

    tell hears what became of the job when the daemon pokes us (it was
    suspended, resumed or moved by someone else: vgpuctl.system.notice)."""
    env: MutableMapping[str, str] = job_env(os.environ, env_add, prepend)
    block = {signal.SIGCHLD, NOTICE_SIGNAL, *FORWARD}
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, block)
    reaper = become_subreaper()
    pid = os.fork()
    if pid == 0:  # the command
        _exec_command(command, env, old)
    maybe: Client | None = _tell(cl, "started", warn, job=job_id, pid=pid)
    if maybe is not None:
        # Not held while the command runs: a user's connections are capped
        # (a burst of jobs would fill them); `exited` comes on a new one.
        maybe.close()
    status = _wait(cl.path, job_id, pid, block, reaper, tell)
    code = os.waitstatus_to_exitcode(status) if status is not None else 1
    if maybe is not None:
        _tell_exited(maybe.path, job_id, code, warn)
    signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return code if code >= 0 else 128 - code


def _exec_command(command: list[str], env: Mapping[str, str],
                  mask: set[signal.Signals]) -> NoReturn:
    """In the forked child: become the command, with the signal mask and
    dispositions it would have had; exit 127 or 126 when it can't run."""
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s in (signal.SIGPIPE, signal.SIGXFSZ):   # Python ignores these
            signal.signal(s, signal.SIG_DFL)
        os.execvpe(command[0], command, env)
    except OSError as e:
        # The one error line not written by vgpuctl.cli.main: this is the
        # forked child, which must end in os._exit (never unwind into the
        # parent's CLI edge), so it writes the edge's form to fd 2 itself.
        os.write(2, f"vgpuctl: error: cannot run {command[0]}: {e.strerror}\n".encode())
        os._exit(127 if e.errno == errno.ENOENT else 126)
    finally:
        os._exit(127)


def _wait(path: Any, job_id: str, pid: int, block: set[signal.Signals], reaper: bool,
          tell: Say | None) -> int | None:
    """Wait for the command to end and, as a subreaper, for what it left
    behind; meanwhile pass on the signals we get and tell what the daemon's
    pokes say. Returns the command's wait status (None: we have no child
    left and never saw it end)."""
    stat = read_stat(pid)
    since = stat[1] if stat is not None else 0
    status: int | None = None
    seen: tuple[Any, ...] | None = None
    while True:
        info = signal.sigtimedwait(block, 1.0)
        if info is not None and info.si_signo == NOTICE_SIGNAL:
            seen = _notice(path, job_id, seen, tell)
        elif info is not None and _to_forward(info):
            _forward(info.si_signo, [pid] if status is None else _left_behind(since))
        gone, status = _reap(pid, status)
        if gone or _all_ended(status, reaper, since):
            return status


def _to_forward(info: signal.struct_siginfo) -> bool:
    """Whether a signal we got is for the command: not SIGCHLD, nor one the
    kernel sent the whole process group (the command has it already)."""
    return info.si_signo != signal.SIGCHLD and info.si_code != SI_KERNEL


def _forward(signo: int, targets: list[int]) -> None:
    """Send signal signo to each of targets that is still there."""
    for target in targets:
        try:
            os.kill(target, signo)
        except ProcessLookupError:
            pass


def _reap(pid: int, status: int | None) -> tuple[bool, int | None]:
    """Reap the command, and (subreaper) whatever it left, that have ended,
    without waiting. Returns whether we have no child left, and the
    command's wait status (status: the one known before)."""
    while True:
        try:
            done, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True, status
        if done == 0:
            return False, status
        if done == pid:
            status = st


def _all_ended(status: int | None, reaper: bool, since: int) -> bool:
    """Whether the command has ended (status: its wait status, None while
    it runs) and, where we are a subreaper, left nothing alive behind it
    (since: its start, in clock ticks since boot)."""
    return status is not None and (not reaper or not _left_behind(since))


def _tell_exited(path: Any, job_id: str, code: int, warn: Say | None) -> None:
    """Tell the daemon, on a new connection, how the command ended (code:
    its exit code, or minus the signal that killed it)."""
    fields = {"code": code} if code >= 0 else {"signal": -code}
    maybe: Client | None
    try:
        maybe = _tell(Client.connect(path), "exited", warn, job=job_id, **fields)
    except OSError:
        maybe = None
        if warn is not None:
            warn("the daemon did not get `exited`")
    if maybe is not None:
        maybe.close()
